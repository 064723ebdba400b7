//! The sampler's loops give the same tokens and logprob bits on every
//! kernel path of `KernelFamily::Sampling`.

use super::*;
use crate::kernels::{thread_cap, KernelPath};

#[test]
fn every_simd_level_gives_bit_identical_results() {
    // The AVX-512, AVX2 and baseline builds of the kernels must agree
    // exactly (tokens and logprob bits), or seeded streams would depend on
    // the machine. Only levels this CPU supports are actually compared.
    let v = 6_000;
    let logits: Vec<f32> = (0..v)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (h as f32 / (1u64 << 24) as f32) * 16.0 - 8.0
        })
        .collect();
    let configs = [
        SamplingParams {
            logprobs: Some(5),
            ..random(0.9)
        },
        SamplingParams {
            top_k: 40,
            top_p: 0.8,
            ..random(1.2)
        },
        SamplingParams {
            top_k: 2000,
            min_p: 0.01,
            ..random(0.6)
        },
        SamplingParams {
            top_k: 3000,
            top_p: 0.7,
            ..random(1.0)
        },
        SamplingParams {
            top_p: 0.95,
            logprobs: Some(3),
            ..random(1.0)
        },
        SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy(1)
        },
    ];
    let run_at = |params: &SamplingParams| {
        let mut s = RequestSampler::new(Arc::new(params.clone()), &[], 9);
        let mut outputs = Vec::new();
        let mut lps = Vec::new();
        for step in 0..20 {
            let mut row = logits.clone();
            row.rotate_left(step * 97);
            let out = s.sample(&mut row, &outputs);
            outputs.push(out.token);
            if let Some(lp) = out.logprobs {
                lps.push(lp.sampled.logprob.to_bits());
                lps.extend(lp.top.iter().map(|x| x.logprob.to_bits()));
            }
        }
        (outputs, lps)
    };
    let run = |cap: KernelPath, params: &SamplingParams| thread_cap::with(cap, || run_at(params));
    for params in &configs {
        let best = run(KernelPath::Avx512, params);
        assert_eq!(
            best,
            run(KernelPath::Avx2, params),
            "AVX2 differs for {params:?}"
        );
        assert_eq!(
            best,
            run(KernelPath::Portable, params),
            "baseline differs for {params:?}"
        );
    }
}
