//! Per-call cost of the sampler at a Qwen2-sized vocabulary (an ignored
//! benchmark, not a test).

use super::*;

/// Thread CPU time in ns (Linux), so timings survive a loaded machine;
/// falls back to 0 (then only wall time means anything).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Rough per-call cost at a Qwen2-sized vocabulary, on a peaked row (normal
/// logits, sd 2.5, with a few tokens 10-13 above: the shape of real LM
/// output) and on a flat one (uniform in [-10, 10], where top-p's nucleus
/// holds thousands of tokens: the worst case). Not a test of anything; run
/// with `cargo test --release -p sluice-model --lib sampling_timing --
/// --ignored --nocapture --test-threads=1`.
#[test]
#[ignore]
fn sampling_timing_152k() {
    let v = 152_064;
    let hash = |i: u64, salt: u64| {
        let x = (i ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((x >> 40) as f64 + 0.5) / (1u64 << 24) as f64
    };
    let flat: Vec<f32> = (0..v as u64)
        .map(|i| (hash(i, 1) * 20.0 - 10.0) as f32)
        .collect();
    let mut peaked: Vec<f32> = (0..v as u64)
        .map(|i| {
            let (u1, u2) = (hash(i, 2), hash(i, 3));
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (2.5 * z) as f32
        })
        .collect();
    for j in 0..8 {
        peaked[(j * 7919) % v] = 13.0 - j as f32 * 0.4;
    }
    let cases: Vec<(&str, SamplingParams)> = vec![
        ("greedy", SamplingParams::greedy(1)),
        ("temperature 0.8", random(0.8)),
        (
            "top_k=50",
            SamplingParams {
                top_k: 50,
                ..random(0.8)
            },
        ),
        (
            "top_k=5000",
            SamplingParams {
                top_k: 5000,
                ..random(0.8)
            },
        ),
        (
            "top_p=0.9",
            SamplingParams {
                top_p: 0.9,
                ..random(0.8)
            },
        ),
        (
            "min_p=0.05",
            SamplingParams {
                min_p: 0.05,
                ..random(0.8)
            },
        ),
        (
            "top_k=50,top_p=0.9,min_p=0.05",
            SamplingParams {
                top_k: 50,
                top_p: 0.9,
                min_p: 0.05,
                ..random(0.8)
            },
        ),
        (
            "rep/freq/pres penalties",
            SamplingParams {
                repetition_penalty: 1.1,
                frequency_penalty: 0.3,
                presence_penalty: 0.2,
                ..random(0.8)
            },
        ),
        (
            "greedy+logprobs=5",
            SamplingParams {
                logprobs: Some(5),
                ..SamplingParams::greedy(1)
            },
        ),
        (
            "top_p=0.9+logprobs=20",
            SamplingParams {
                top_p: 0.9,
                logprobs: Some(20),
                ..random(0.8)
            },
        ),
    ];
    // 512 prompt tokens, 1024-2023 outputs so far.
    let outputs: Vec<u32> = (0..4096u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % v as u32)
        .collect();
    println!(
        "{:>32}  {:>12}  {:>12}   (µs CPU per call, incl. copying the row)",
        "", "peaked", "flat"
    );
    let only = std::env::var("SAMPLING_TIMING_ONLY").ok();
    for (name, params) in cases {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let mut per_row = Vec::new();
        for logits in [&peaked, &flat] {
            let mut s = RequestSampler::new(Arc::new(params.clone()), &outputs[..512], 1);
            let mut row = logits.clone();
            let iters = 1000;
            let cpu = thread_cpu_ns();
            for i in 0..iters {
                row.copy_from_slice(logits);
                std::hint::black_box(s.sample(&mut row, &outputs[..1024 + i]));
            }
            per_row.push((thread_cpu_ns() - cpu) as f64 / 1e3 / iters as f64);
        }
        println!("{name:>32}  {:>12.1}  {:>12.1}", per_row[0], per_row[1]);
    }
}
