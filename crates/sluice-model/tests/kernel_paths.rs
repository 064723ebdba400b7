//! The forward pass at the benchmark model's real layer widths (hidden 896,
//! intermediate 4864, 14/2 heads; 2 layers and a 4096-token vocabulary to
//! stay quick) gives the same logits on the SIMD kernel paths this CPU
//! selects as on the portable path, for a prefill and for a decode step, in
//! f32 and bf16. The fixtures are too narrow to exercise the kernels'
//! blocking at these sizes; this catches a fast path that skips or repeats
//! part of a weight matrix.

use sluice_model::kernels::{set_kernel_path, KernelPath};
use sluice_model::kv_cache::{KvCache, KvCacheConfig};
use sluice_model::model::{ForwardBatch, Model};
use sluice_model::{builtin, load_dummy, DType, LoadedModel};

/// Logits of a 9-token prefill's last row, then of one decode step.
fn logits(loaded: &LoadedModel) -> (Vec<f32>, Vec<f32>) {
    let model = Model::build(loaded).unwrap();
    let mut kv = KvCache::new(&loaded.config, KvCacheConfig::new(16, 3)).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 397 + 11) % 4096).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(&prompt, 0, &[2, 1], 16).unwrap();
    batch.logits_rows.push(prompt.len() - 1);
    let prefill = model.forward(&batch, &mut kv).unwrap();
    let mut batch = ForwardBatch::default();
    batch.push_seq(&[77], prompt.len(), &[2, 1], 16).unwrap();
    batch.logits_rows.push(0);
    let decode = model.forward(&batch, &mut kv).unwrap();
    (prefill, decode)
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

#[test]
fn simd_paths_agree_with_portable_at_benchmark_widths() {
    let (mut config, generation) = builtin::config("qwen2.5-0.5b").unwrap();
    config.num_hidden_layers = 2;
    config.vocab_size = 4096;
    config.eos_token_ids.clear();
    // bf16 on AVX-512 rounds activations to bf16 inside the dot products
    // (vdpbf16ps), so it is held to bf16 precision.
    for (dtype, tolerance) in [(DType::F32, 1e-4), (DType::Bf16, 2e-2)] {
        let loaded = load_dummy(config.clone(), generation.clone(), dtype, 5).unwrap();
        set_kernel_path(None);
        let (fast_prefill, fast_decode) = logits(&loaded);
        set_kernel_path(Some(KernelPath::Portable));
        let (slow_prefill, slow_decode) = logits(&loaded);
        set_kernel_path(None);
        let p = max_rel_diff(&fast_prefill, &slow_prefill);
        let d = max_rel_diff(&fast_decode, &slow_decode);
        eprintln!("{dtype:?}: max relative difference prefill {p:e}, decode {d:e}");
        assert!(p <= tolerance, "{dtype:?} prefill: relative difference {p}");
        assert!(d <= tolerance, "{dtype:?} decode: relative difference {d}");
        assert!(fast_decode.iter().any(|&x| x != 0.0));
    }
}
