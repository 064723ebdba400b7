//! The one dispatch: `SLUICE_KERNEL` and `set_kernel_path` cap every kernel
//! family — matmul of every weight format, attention, RMSNorm, SwiGLU, the
//! residual add, RoPE, the sampler — each lowered only to what this CPU
//! runs. Checked on the kernels the model calls: a forward pass and a
//! sampling step in a child process started with `SLUICE_KERNEL` set, whose
//! families must report (`last_kernel_path`) that they ran on the capped
//! path, with outputs that agree with the portable path's. Its own test
//! binary, because the setting is process-wide.

use sluice_core::SamplingParams;
use sluice_model::kernels::{
    cpu_features, kernel_path, last_kernel_path, set_kernel_path, KernelFamily, KernelPath,
    QuantFormat,
};
use sluice_model::kv_cache::{KvCache, KvCacheConfig};
use sluice_model::model::{ForwardBatch, Model};
use sluice_model::sampling::RequestSampler;
use sluice_model::{builtin, load_dummy_as, LoadedModel};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// The tests below change the process-wide setting one at a time.
static SETTING: Mutex<()> = Mutex::new(());

#[test]
fn set_kernel_path_caps_every_family() {
    let _one = SETTING.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = cpu_features();
    for want in KernelPath::ALL {
        set_kernel_path(Some(want));
        for f in KernelFamily::ALL {
            let got = kernel_path(f);
            assert!(got <= want, "{f:?}: {got} above the request {want}");
            assert_eq!(got, cpu.clamp(f, want), "{f:?}");
            assert!(
                cpu.supports(f, got),
                "{f:?} on {got}: an illegal instruction"
            );
        }
    }
    set_kernel_path(Some(KernelPath::Portable));
    assert!(KernelFamily::ALL
        .iter()
        .all(|&f| kernel_path(f) == KernelPath::Portable));
    // `None` goes back to `SLUICE_KERNEL` (this test may run under it),
    // else the best path.
    set_kernel_path(None);
    let env = std::env::var("SLUICE_KERNEL")
        .ok()
        .and_then(|v| KernelPath::parse(&v).ok().flatten())
        .unwrap_or(KernelPath::Avx512);
    for f in KernelFamily::ALL {
        assert_eq!(kernel_path(f), cpu.clamp(f, env), "{f:?}");
    }
    eprintln!("{cpu}");
}

/// The weight formats the child runs the model in, each with the matmul
/// family it exercises and the largest relative difference of its logits
/// from the portable path's: f32 and f16 only differ by FMA roundings; on
/// AVX-512 bf16 rounds activations to bf16 (`vdpbf16ps`), and a quantized
/// model requantizes activations that moved by such a rounding.
const FORMATS: [(QuantFormat, KernelFamily, f32); 4] = [
    (QuantFormat::F32, KernelFamily::F32, 1e-4),
    (QuantFormat::F16, KernelFamily::F16, 1e-3),
    (QuantFormat::Bf16, KernelFamily::Bf16, 2e-2),
    (QuantFormat::Q8_0, KernelFamily::Quant, 2e-2),
];

/// Last-row logits of a 20-token prefill (long enough that RMSNorm, SwiGLU
/// and attention see more than one vector of work), then of a decode step.
fn logits(loaded: &LoadedModel) -> Vec<f32> {
    let model = Model::build(loaded).expect("weights load");
    let mut kv = KvCache::new(&loaded.config, KvCacheConfig::new(16, 4)).expect("kv cache");
    let vocab = loaded.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..20).map(|i| (i * 97 + 5) % vocab).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(&prompt, 0, &[0, 1], 16).expect("batch");
    batch.logits_rows.push(prompt.len() - 1);
    let mut out = model.forward(&batch, &mut kv).expect("prefill");
    let mut batch = ForwardBatch::default();
    batch
        .push_seq(&[7], prompt.len(), &[0, 1], 16)
        .expect("batch");
    batch.logits_rows.push(0);
    out.extend(model.forward(&batch, &mut kv).expect("decode"));
    out
}

/// Tokens and logprob bits of a few seeded top-k / top-p sampling steps.
fn sample(logits: &[f32]) -> (Vec<u32>, Vec<u32>) {
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        seed: Some(7),
        logprobs: Some(3),
        ..SamplingParams::default()
    };
    let mut sampler = RequestSampler::new(Arc::new(params), &[], 1);
    let (mut tokens, mut bits) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut row = logits.to_vec();
        let out = sampler.sample(&mut row, &tokens);
        tokens.push(out.token);
        let lp = out.logprobs.expect("logprobs asked for");
        bits.push(lp.sampled.logprob.to_bits());
        bits.extend(lp.top.iter().map(|t| t.logprob.to_bits()));
    }
    (tokens, bits)
}

/// Asserts that every family `families` ran on its cap of `want` here.
fn assert_ran_on(families: &[KernelFamily], want: KernelPath, what: &str) {
    let cpu = cpu_features();
    for &f in families {
        assert_eq!(
            last_kernel_path(f),
            Some(cpu.clamp(f, want)),
            "{what}: {f:?} did not run on the path the cap {want} gives it"
        );
    }
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

/// Run as a child with `SLUICE_KERNEL` set (see below): every family
/// reports the environment's cap, the model's kernels run on it, and their
/// outputs agree with the portable path's.
#[test]
fn child_runs_every_family_on_the_environment_cap() {
    let Ok(want) = std::env::var("SLUICE_DISPATCH_CHILD") else {
        return;
    };
    let _one = SETTING.lock().unwrap_or_else(|e| e.into_inner());
    let want = KernelPath::parse(&want)
        .expect("a path name")
        .expect("not auto");
    let cpu = cpu_features();
    eprintln!("SLUICE_KERNEL={want}: {cpu}");
    for f in KernelFamily::ALL {
        assert_eq!(kernel_path(f), cpu.clamp(f, want), "{f:?}");
    }
    let model_families = [
        KernelFamily::Attention,
        KernelFamily::RmsNorm,
        KernelFamily::SwiGlu,
        KernelFamily::Residual,
        KernelFamily::Rope,
    ];
    let (config, generation) = builtin::config("tiny").expect("built-in config");
    for (dtype, matmul, tolerance) in FORMATS {
        let loaded = load_dummy_as(config.clone(), generation.clone(), dtype, 3).expect("loads");
        let what = format!("{dtype:?}");
        let capped = logits(&loaded);
        assert_ran_on(&[matmul], want, &what);
        assert_ran_on(&model_families, want, &what);
        set_kernel_path(Some(KernelPath::Portable));
        let portable = logits(&loaded);
        assert_ran_on(&[matmul], KernelPath::Portable, &what);
        assert_ran_on(&model_families, KernelPath::Portable, &what);
        set_kernel_path(None);
        let d = max_rel_diff(&capped, &portable);
        eprintln!("{what}: max relative difference from portable {d:e}");
        assert!(d <= tolerance, "{what}: relative difference {d}");
        assert!(capped.iter().any(|&x| x != 0.0), "{what}: all-zero logits");
    }

    // The sampler's loops give the same bits on every path.
    let loaded = load_dummy_as(config, generation, QuantFormat::F32, 9).expect("loads");
    let all = logits(&loaded);
    let row = &all[..all.len() / 2];
    let capped = sample(row);
    assert_ran_on(&[KernelFamily::Sampling], want, "sampling");
    set_kernel_path(Some(KernelPath::Portable));
    let portable = sample(row);
    assert_ran_on(&[KernelFamily::Sampling], KernelPath::Portable, "sampling");
    set_kernel_path(None);
    assert_eq!(capped, portable, "sampling on {want} differs from portable");
}

#[test]
fn sluice_kernel_env_caps_every_family_in_a_new_process() {
    let exe = std::env::current_exe().expect("test binary");
    for name in ["portable", "avx2", "avx512"] {
        let status = Command::new(&exe)
            .args([
                "--exact",
                "child_runs_every_family_on_the_environment_cap",
                "--nocapture",
            ])
            .env("SLUICE_KERNEL", name)
            .env("SLUICE_DISPATCH_CHILD", name)
            .status()
            .expect("runs the child");
        assert!(status.success(), "SLUICE_KERNEL={name}: child failed");
    }
}
