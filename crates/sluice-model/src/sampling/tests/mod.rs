//! Behavioural tests of the sampler. Statistical checks use fixed seeds and
//! loose bounds, so they are deterministic (a given build either passes or
//! fails, every run) and far from the edge.
//!
//! Files by concept: `filters` (greedy, temperature, top-k/p, min-p),
//! `penalties`, `streams` (seeding), `logprobs`, `degenerate` (edge rows),
//! `kernel_paths` (the same bits on every path), `properties` (proptest),
//! `timing` (an ignored benchmark); the shared helpers are below.

use super::*;

mod degenerate;
mod filters;
mod kernel_paths;
mod logprobs;
mod penalties;
mod properties;
mod streams;
mod timing;

fn sampler(params: SamplingParams) -> RequestSampler {
    RequestSampler::new(Arc::new(params), &[], 7)
}

fn random(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(1234),
        ..SamplingParams::default()
    }
}

/// Samples `n` tokens from the same logits, feeding outputs back as a runner
/// would, and returns the count per token.
fn histogram(s: &mut RequestSampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut counts = vec![0; logits.len()];
    let mut outputs = Vec::with_capacity(n);
    let mut row = logits.to_vec();
    for _ in 0..n {
        row.copy_from_slice(logits);
        let t = s.sample(&mut row, &outputs).token;
        counts[t as usize] += 1;
        outputs.push(t);
    }
    counts
}

/// Softmax in f64 over `logits / t`, with -inf entries at zero.
fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x) / t));
    let e: Vec<f64> = logits
        .iter()
        .map(|&x| (f64::from(x) / t - m).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Pearson's chi-square of observed counts against probabilities (cells
/// with zero probability must be empty).
fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            if p == 0.0 {
                assert_eq!(c, 0, "a token of zero probability was drawn");
                0.0
            } else {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            }
        })
        .sum()
}

fn argmax_naive(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

const LOGITS8: [f32; 8] = [1.0, 2.0, 0.5, 3.0, -1.0, 0.0, 2.5, 1.5];
