//! Behavioural tests of the sampler. Statistical checks use fixed seeds and
//! loose bounds, so they are deterministic (a given build either passes or
//! fails, every run) and far from the edge.

use super::*;
use proptest::prelude::*;
use sluice_core::TokenLogprob;

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

#[test]
fn greedy_is_argmax() {
    let mut s = sampler(SamplingParams::greedy(16));
    let mut row = LOGITS8;
    assert_eq!(s.sample(&mut row, &[]).token, 3);
    // First of tied maxima, as torch.argmax.
    let mut row = [0.0, 4.0, 1.0, 4.0];
    assert_eq!(s.sample(&mut row, &[]).token, 1);
}

#[test]
fn temperature_shapes_the_distribution() {
    // 8 cells = 7 degrees of freedom: P(chi2 > 40) ≈ 1.6e-6, so a correct
    // sampler is nowhere near the bound while a wrong temperature (which
    // moves several cells by hundreds of counts) is far above it.
    for t in [0.7f32, 1.0, 1.6] {
        let mut s = sampler(random(t));
        let counts = histogram(&mut s, &LOGITS8, 40_000);
        let chi = chi_square(&counts, &softmax(&LOGITS8, f64::from(t)));
        assert!(
            chi < 40.0,
            "temperature {t}: chi-square {chi}, counts {counts:?}"
        );
        // And a neighbouring temperature is clearly rejected.
        let wrong = chi_square(&counts, &softmax(&LOGITS8, f64::from(t) * 1.3));
        assert!(
            wrong > 200.0,
            "temperature {t}: wrong-shape chi-square only {wrong}"
        );
    }
}

#[test]
fn top_k_one_equals_greedy() {
    let mut s = sampler(SamplingParams {
        top_k: 1,
        ..random(1.5)
    });
    let mut g = sampler(SamplingParams::greedy(16));
    let mut outputs = Vec::new();
    for i in 0..50 {
        let logits: Vec<f32> = (0..100)
            .map(|j| ((i * 31 + j * 17) % 97) as f32 * 0.1)
            .collect();
        let (mut a, mut b) = (logits.clone(), logits.clone());
        let t = s.sample(&mut a, &outputs).token;
        assert_eq!(t, g.sample(&mut b, &outputs).token);
        assert_eq!(t as usize, argmax_naive(&logits));
        outputs.push(t);
    }
}

#[test]
fn top_k_keeps_k_tokens_in_proportion() {
    let mut s = sampler(SamplingParams {
        top_k: 3,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &LOGITS8, 20_000);
    // Top 3: ids 3 (3.0), 6 (2.5), 1 (2.0), renormalised.
    let mut kept = LOGITS8;
    for (i, x) in kept.iter_mut().enumerate() {
        if ![1, 3, 6].contains(&i) {
            *x = f32::NEG_INFINITY;
        }
    }
    let chi = chi_square(&counts, &softmax(&kept, 1.0));
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn top_k_keeps_ties_at_the_kth_value() {
    // k = 2 but three tokens share the 2nd largest value: all survive
    // (vLLM's `logits < kth_value` mask), and the heap shortcut must not
    // drop the third.
    let logits = [5.0f32, 4.0, 4.0, 4.0, 0.0];
    let mut s = sampler(SamplingParams {
        top_k: 2,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &logits, 20_000);
    let mut kept = logits;
    kept[4] = f32::NEG_INFINITY;
    let chi = chi_square(&counts, &softmax(&kept, 1.0));
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn large_top_k_uses_selection_and_masks_the_rest() {
    // k above the heap limit: the k-th value comes from quickselect.
    let v = 5000;
    let logits: Vec<f32> = (0..v).map(|i| ((i * 7919) % v) as f32 / 1000.0).collect();
    let k = 2000;
    let mut sorted = logits.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[k - 1];
    let mut s = sampler(SamplingParams {
        top_k: k as i32,
        ..random(0.2)
    });
    let mut outputs = Vec::new();
    for _ in 0..300 {
        let mut row = logits.clone();
        let t = s.sample(&mut row, &outputs).token;
        assert!(logits[t as usize] >= kth);
        outputs.push(t);
    }
}

#[test]
fn tiny_top_p_keeps_only_the_max() {
    for top_k in [0, 5] {
        let mut s = sampler(SamplingParams {
            top_p: 1e-6,
            top_k,
            ..random(2.0)
        });
        let counts = histogram(&mut s, &LOGITS8, 500);
        assert_eq!(counts[3], 500, "top_k {top_k}: {counts:?}");
    }
}

#[test]
fn top_p_keeps_the_nucleus_in_proportion() {
    // Probabilities 0.5, 0.25, 0.125, 0.125 (exact in binary). With p = 0.7
    // the mass before token 2 is 0.75 >= 0.7, so tokens 0 and 1 remain.
    let logits = [
        0.0f32,
        -std::f32::consts::LN_2,
        -2.0 * std::f32::consts::LN_2,
        -2.0 * std::f32::consts::LN_2,
    ];
    let mut s = sampler(SamplingParams {
        top_p: 0.7,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &logits, 20_000);
    let chi = chi_square(&counts, &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]);
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn min_p_drops_tokens_below_the_fraction_of_the_max() {
    // Probabilities ∝ 1, 0.5, 0.25, 0.1: min_p = 0.3 keeps the first two.
    let logits = [0.0f32, 0.5f32.ln(), 0.25f32.ln(), 0.1f32.ln()];
    let mut s = sampler(SamplingParams {
        min_p: 0.3,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &logits, 20_000);
    let chi = chi_square(&counts, &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]);
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn min_p_applies_before_top_p() {
    // p = 0.5, 0.3, 0.2. min_p 0.5 leaves {0, 1} renormalised to 0.625 /
    // 0.375; top_p 0.6 then keeps token 0 alone. (Top-p first would keep
    // {0, 1}: the order is vLLM's and it matters.)
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    for top_k in [0, 2] {
        let mut s = sampler(SamplingParams {
            min_p: 0.5,
            top_p: 0.6,
            top_k,
            ..random(1.0)
        });
        assert_eq!(
            histogram(&mut s, &logits, 300),
            vec![300, 0, 0],
            "top_k {top_k}"
        );
    }
}

#[test]
fn repetition_penalty_on_prompt_and_output_tokens() {
    let params = Arc::new(SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy(16)
    });
    // Token 0 (logit 3) is in the prompt: 3 / 2 = 1.5 < 2.0 of token 1.
    let mut s = RequestSampler::new(params.clone(), &[0], 0);
    let mut row = [3.0f32, 2.0, -1.0];
    assert_eq!(s.sample(&mut row, &[]).token, 1);
    assert_eq!(row, [1.5, 2.0, -1.0]);
    // Token 1 then appears in the output: 2 / 2 = 1 < 1.5.
    let mut row = [3.0f32, 2.0, -1.0];
    assert_eq!(s.sample(&mut row, &[1]).token, 0);
    assert_eq!(row, [1.5, 1.0, -1.0]);
    // Negative logits are multiplied.
    let mut s = RequestSampler::new(params, &[2], 0);
    let mut row = [-1.5f32, -1.0, -0.6];
    assert_eq!(s.sample(&mut row, &[]).token, 1);
    assert_eq!(row, [-1.5, -1.0, -1.2]);
}

#[test]
fn frequency_penalty_scales_with_count() {
    let mut s = sampler(SamplingParams {
        frequency_penalty: 0.4,
        ..SamplingParams::greedy(16)
    });
    let base = [2.0f32, 1.5, 1.0];
    let mut row = base;
    // Token 0 twice: 2 - 0.8 = 1.2 < 1.5.
    assert_eq!(s.sample(&mut row, &[0, 0]).token, 1);
    assert_eq!(row, [2.0 - 0.4 * 2.0, 1.5, 1.0]);
    // Once only: 1.6 still wins.
    let mut s = sampler(SamplingParams {
        frequency_penalty: 0.4,
        ..SamplingParams::greedy(16)
    });
    let mut row = base;
    assert_eq!(s.sample(&mut row, &[0]).token, 0);
}

#[test]
fn presence_penalty_ignores_count_and_prompt() {
    let params = Arc::new(SamplingParams {
        presence_penalty: 0.75,
        ..SamplingParams::greedy(16)
    });
    let mut s = RequestSampler::new(params.clone(), &[1, 1, 1], 0);
    let mut row = [2.0f32, 1.5, 0.0];
    // Prompt occurrences don't count; one or three output occurrences cost
    // the same 0.75.
    assert_eq!(s.sample(&mut row, &[2]).token, 0);
    assert_eq!(row, [2.0, 1.5, -0.75]);
    let mut s = RequestSampler::new(params, &[], 0);
    let mut row = [2.0f32, 1.5, 0.0];
    assert_eq!(s.sample(&mut row, &[0, 0, 0]).token, 1);
    assert_eq!(row, [1.25, 1.5, 0.0]);
}

#[test]
fn logit_bias_changes_the_choice_and_last_duplicate_wins() {
    let mut s = sampler(SamplingParams {
        logit_bias: vec![(2, 5.0), (0, -1.0), (2, 1.0), (99, 100.0)],
        ..SamplingParams::greedy(16)
    });
    let mut row = [1.0f32, 1.5, 0.0];
    // Token 2 gets +1 (the later entry), not +5 or +6; id 99 is ignored.
    assert_eq!(s.sample(&mut row, &[]).token, 1);
    assert_eq!(row, [0.0, 1.5, 1.0]);
    let mut s = sampler(SamplingParams {
        logit_bias: vec![(2, 3.0)],
        ..SamplingParams::greedy(16)
    });
    let mut row = [1.0f32, 1.5, 0.0];
    assert_eq!(s.sample(&mut row, &[]).token, 2);
}

#[test]
fn min_tokens_masks_eos_and_stop_ids_until_reached() {
    let params = SamplingParams {
        min_tokens: 2,
        eos_token_id: Some(0),
        stop_token_ids: vec![1, 50_000],
        ..SamplingParams::greedy(16)
    };
    let mut s = sampler(params);
    let logits = [9.0f32, 8.0, 1.0, 0.5];
    for outputs in [&[][..], &[2]] {
        let mut row = logits;
        assert_eq!(s.sample(&mut row, outputs).token, 2, "outputs {outputs:?}");
        assert_eq!(row[0], f32::NEG_INFINITY);
        assert_eq!(row[1], f32::NEG_INFINITY);
    }
    let mut row = logits;
    assert_eq!(s.sample(&mut row, &[2, 2]).token, 0);
    assert_eq!(row, logits);
}

#[test]
fn min_tokens_masks_eos_when_ignored_through_stop_ids_only() {
    // With ignore_eos the engine leaves eos_token_id unset: only the stop
    // ids are masked.
    let mut s = sampler(SamplingParams {
        min_tokens: 1,
        eos_token_id: None,
        stop_token_ids: vec![3],
        ..random(1.0)
    });
    let logits = [0.0f32, 0.0, 0.0, 10.0];
    let counts = histogram(&mut s, &logits, 1);
    assert_eq!(counts[3], 0);
}

#[test]
fn same_seed_same_stream_whatever_the_batch() {
    let params = SamplingParams {
        top_p: 0.9,
        top_k: 50,
        seed: Some(42),
        ..SamplingParams::default()
    };
    let logits: Vec<Vec<f32>> = (0..64)
        .map(|i| {
            (0..1000)
                .map(|j| (((i * 7 + j * 13) % 101) as f32) * 0.05)
                .collect()
        })
        .collect();
    let run = |others: usize, default_seed: u64| {
        let mut s = RequestSampler::new(Arc::new(params.clone()), &[1, 2, 3], default_seed);
        let mut noise: Vec<RequestSampler> = (0..others)
            .map(|o| RequestSampler::new(Arc::new(random(1.0)), &[], o as u64))
            .collect();
        let mut outputs = Vec::new();
        for row in &logits {
            // Other requests sample before ours in the same step.
            for n in &mut noise {
                n.sample(&mut row.clone(), &outputs);
            }
            let t = s.sample(&mut row.clone(), &outputs).token;
            outputs.push(t);
        }
        outputs
    };
    let alone = run(0, 1);
    assert_eq!(
        alone,
        run(5, 2),
        "batch composition or default seed changed a seeded stream"
    );
    let other_seed = {
        let mut p = params.clone();
        p.seed = Some(43);
        let mut s = RequestSampler::new(Arc::new(p), &[1, 2, 3], 1);
        let mut outputs = Vec::new();
        for row in &logits {
            let t = s.sample(&mut row.clone(), &outputs).token;
            outputs.push(t);
        }
        outputs
    };
    assert_ne!(alone, other_seed);
}

#[test]
fn unseeded_requests_use_the_default_seed() {
    let p = Arc::new(SamplingParams::default());
    let draw = |seed: u64| {
        let mut s = RequestSampler::new(p.clone(), &[], seed);
        histogram_stream(&mut s)
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

fn histogram_stream(s: &mut RequestSampler) -> Vec<u32> {
    let logits = [0.0f32; 64];
    let mut outputs = Vec::new();
    for _ in 0..32 {
        let t = s.sample(&mut logits.clone(), &outputs).token;
        outputs.push(t);
    }
    outputs
}

#[test]
fn rebuilt_sampler_continues_the_stream() {
    // A runner that drops and rebuilds the sampler (after a preemption)
    // gets the same tokens, because draw n depends on (seed, n) only.
    let p = Arc::new(random(1.0));
    let mut a = RequestSampler::new(p.clone(), &[], 0);
    let full = histogram_stream(&mut a);
    let mut b = RequestSampler::new(p, &[], 0);
    let logits = [0.0f32; 64];
    let t = b.sample(&mut logits.clone(), &full[..10]).token;
    assert_eq!(t, full[10]);
}

#[test]
fn logprobs_are_raw_log_softmax_with_rank() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919 % 1000) as f32) / 97.0 - 3.0)
        .collect();
    let mut s = sampler(SamplingParams {
        logprobs: Some(5),
        temperature: 0.3,
        repetition_penalty: 1.7,
        logit_bias: vec![(3, 4.0)],
        top_k: 40,
        ..random(1.0)
    });
    let want = softmax(&logits, 1.0);
    let mut outputs = Vec::new();
    for _ in 0..20 {
        let mut row = logits.clone();
        let out = s.sample(&mut row, &outputs);
        let lp = out.logprobs.expect("logprobs requested");
        let t = out.token;
        assert_eq!(lp.sampled.token_id, t);
        // Raw distribution: no temperature, penalty or bias in it.
        assert!((f64::from(lp.sampled.logprob) - want[t as usize].ln()).abs() < 1e-5);
        let better = logits.iter().filter(|&&x| x > logits[t as usize]).count();
        assert_eq!(lp.rank, better + 1);
        assert_eq!(lp.top.len(), 5);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        for (got, &id) in lp.top.iter().zip(&order) {
            assert_eq!(got.token_id as usize, id);
            assert!((f64::from(got.logprob) - want[id].ln()).abs() < 1e-5);
        }
        outputs.push(t);
    }
}

#[test]
fn logprobs_rank_counts_ties_and_zero_top_n() {
    let mut s = sampler(SamplingParams {
        logprobs: Some(0),
        ..SamplingParams::greedy(16)
    });
    let mut row = [1.0f32, 3.0, 3.0, 0.0];
    let lp = s.sample(&mut row, &[]).logprobs.expect("requested");
    // Greedy picks id 1; id 2 ties it, and vLLM counts `>=`.
    assert_eq!(lp.sampled.token_id, 1);
    assert_eq!(lp.rank, 2);
    assert!(lp.top.is_empty());
    // Asking for more than the vocabulary returns the whole vocabulary.
    let mut s = sampler(SamplingParams {
        logprobs: Some(1000),
        ..SamplingParams::greedy(16)
    });
    let lp = s
        .sample(&mut [1.0f32, 3.0, 3.0, 0.0], &[])
        .logprobs
        .expect("requested");
    let ids: Vec<u32> = lp.top.iter().map(|x| x.token_id).collect();
    assert_eq!(ids, vec![1, 2, 0, 3]);
}

#[test]
fn prompt_logprobs_hand_example() {
    // vocab 3. Row 0: [0, ln 3, 0] -> probs 1/5, 3/5, 1/5, next token 0.
    // Row 1: [ln 2, ln 2, 0] -> 2/5, 2/5, 1/5, next token 2.
    let ln = |x: f32| x.ln();
    let logits = [0.0, ln(3.0), 0.0, ln(2.0), ln(2.0), 0.0];
    let rows = prompt_logprobs(&logits, 3, &[0, 2], 2);
    assert_eq!(rows.len(), 2);
    let close = |a: f32, b: f64| (f64::from(a) - b.ln()).abs() < 1e-6;
    assert_eq!(rows[0].sampled.token_id, 0);
    assert!(close(rows[0].sampled.logprob, 0.2));
    assert_eq!(rows[0].rank, 3, "ties with id 2 at 1/5, behind id 1");
    assert_eq!(
        rows[0].top.iter().map(|x| x.token_id).collect::<Vec<_>>(),
        vec![1, 0]
    );
    assert!(close(rows[0].top[0].logprob, 0.6));
    assert_eq!(rows[1].sampled.token_id, 2);
    assert!(close(rows[1].sampled.logprob, 0.2));
    assert_eq!(rows[1].rank, 3);
    assert_eq!(
        rows[1].top.iter().map(|x| x.token_id).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert!(close(rows[1].top[1].logprob, 0.4));
    // Mismatched shapes shrink to the rows that exist; out-of-range next
    // tokens get -inf; vocab 0 gives nothing.
    let rows = prompt_logprobs(&logits[..5], 3, &[7, 1], 1);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].sampled.logprob, f32::NEG_INFINITY);
    assert_eq!(rows[0].rank, 3);
    assert!(prompt_logprobs(&logits, 0, &[0], 1).is_empty());
}

#[test]
fn all_but_one_masked_gives_that_token_without_nan() {
    let v = 3000;
    for (top_k, top_p, min_p) in [
        (0, 1.0, 0.0),
        (20, 1.0, 0.0),
        (0, 0.9, 0.0),
        (2000, 0.5, 0.1),
    ] {
        let mut s = sampler(SamplingParams {
            top_k,
            top_p,
            min_p,
            logprobs: Some(3),
            ..random(0.8)
        });
        let mut outputs = Vec::new();
        for step in 0..20 {
            let keep = (step * 131) % v;
            let mut row = vec![f32::NEG_INFINITY; v];
            row[keep] = -3.0;
            let out = s.sample(&mut row, &outputs);
            assert_eq!(out.token as usize, keep);
            let lp = out.logprobs.expect("requested");
            assert_eq!(lp.sampled.logprob, 0.0);
            assert_eq!(lp.rank, 1);
            assert!(lp.top.iter().all(|x| !x.logprob.is_nan()));
            assert!(row.iter().all(|x| !x.is_nan()));
            outputs.push(out.token);
        }
    }
}

#[test]
fn degenerate_rows_never_panic() {
    let mut s = sampler(SamplingParams {
        logprobs: Some(4),
        top_k: 3,
        top_p: 0.5,
        min_p: 0.2,
        min_tokens: 3,
        eos_token_id: Some(0),
        ..random(1.0)
    });
    let out = s.sample(&mut [], &[]);
    assert_eq!(out.token, 0);
    // Everything masked, NaN, +inf, the only token a stop token.
    let rows: [&[f32]; 5] = [
        &[f32::NEG_INFINITY; 4],
        &[f32::NAN; 4],
        &[1.0, f32::INFINITY, f32::NAN, f32::INFINITY],
        &[5.0],
        &[f32::MAX, f32::MAX, -f32::MAX, 0.0],
    ];
    for row in rows {
        let mut r = row.to_vec();
        let out = s.sample(&mut r, &[]);
        assert!((out.token as usize) < row.len().max(1));
        let lp = out.logprobs.expect("requested");
        assert!(
            lp.top.iter().all(|x| !x.logprob.is_nan()),
            "{row:?}: {lp:?}"
        );
        assert!(!lp.sampled.logprob.is_nan());
    }
    // +inf: the first +inf token, which then holds all the mass.
    let out = s.sample(&mut [1.0, f32::INFINITY, 0.0, f32::INFINITY], &[1, 1, 1]);
    assert_eq!(out.token, 1);
    let lp = out.logprobs.expect("requested");
    assert!((lp.sampled.logprob - (-std::f32::consts::LN_2)).abs() < 1e-6);
}

#[test]
fn large_vocab_top_p_matches_reference_distribution() {
    // A 152k vocabulary through the histogram nucleus path: every drawn
    // token must be inside the exact nucleus.
    let v = 152_064;
    let logits: Vec<f32> = (0..v)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (h as f32 / (1u64 << 24) as f32) * 12.0 - 6.0
        })
        .collect();
    let probs = softmax(&logits, 1.0);
    let mut order: Vec<usize> = (0..v).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    // f32 arithmetic may move the cut by a token whose preceding mass is
    // within rounding of p: accept anything whose mass before is < p + 1e-6.
    let p = 0.3;
    let mut acc = 0.0;
    let mut nucleus = vec![false; v];
    for &i in &order {
        if acc >= p + 1e-6 {
            break;
        }
        acc += probs[i];
        nucleus[i] = true;
    }
    let mut s = sampler(SamplingParams {
        top_p: p as f32,
        ..random(1.0)
    });
    let mut outputs = Vec::new();
    for _ in 0..40 {
        let t = s.sample(&mut logits.clone(), &outputs).token;
        assert!(nucleus[t as usize], "token {t} outside the nucleus");
        outputs.push(t);
    }
}

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
    let run = |cap: u8, params: &SamplingParams| {
        kernels::SIMD_CAP.with(|c| c.set(cap));
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
        kernels::SIMD_CAP.with(|c| c.set(2));
        (outputs, lps)
    };
    for params in &configs {
        let best = run(2, params);
        assert_eq!(best, run(1, params), "AVX2 differs for {params:?}");
        assert_eq!(best, run(0, params), "baseline differs for {params:?}");
    }
}

fn arb_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -30.0f32..30.0,
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NAN),
        1 => Just(f32::MAX),
        1 => Just(0.0f32),
    ]
}

fn arb_params() -> impl Strategy<Value = SamplingParams> {
    (
        (
            prop_oneof![
                Just(0.0f32),
                0.01f32..3.0,
                Just(f32::NAN),
                Just(-1.0f32),
                Just(f32::INFINITY)
            ],
            prop_oneof![Just(1.0f32), 0.0f32..1.0, Just(f32::NAN), Just(2.0f32)],
            -2i32..8,
            prop_oneof![Just(0.0f32), 0.0f32..1.0, Just(f32::NAN), Just(5.0f32)],
        ),
        (
            -2.0f32..2.0,
            -2.0f32..2.0,
            prop_oneof![Just(1.0f32), 0.1f32..3.0, Just(0.0f32)],
        ),
        (
            0usize..4,
            prop::option::of(0u32..20),
            prop::collection::vec(0u32..20, 0..3),
        ),
        (
            prop::collection::vec((0u32..20, -5.0f32..5.0), 0..3),
            prop::option::of(0usize..30),
            any::<u64>(),
        ),
    )
        .prop_map(
            |((t, tp, tk, mp), (pres, freq, rep), (mt, eos, stops), (bias, lp, seed))| {
                SamplingParams {
                    temperature: t,
                    top_p: tp,
                    top_k: tk,
                    min_p: mp,
                    presence_penalty: pres,
                    frequency_penalty: freq,
                    repetition_penalty: rep,
                    min_tokens: mt,
                    eos_token_id: eos,
                    stop_token_ids: stops,
                    logit_bias: bias,
                    logprobs: lp,
                    seed: Some(seed),
                    ..SamplingParams::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn any_params_any_logits_never_panic(
        params in arb_params(),
        logits in prop::collection::vec(arb_f32(), 0..40),
        prompt in prop::collection::vec(0u32..40, 0..6),
        outputs in prop::collection::vec(0u32..40, 0..6),
    ) {
        let mut s = RequestSampler::new(Arc::new(params.clone()), &prompt, 3);
        let mut row = logits.clone();
        let out = s.sample(&mut row, &outputs);
        prop_assert!((out.token as usize) < logits.len().max(1));
        prop_assert_eq!(out.logprobs.is_some(), params.logprobs.is_some());
        if let Some(lp) = out.logprobs {
            prop_assert!(lp.top.len() <= logits.len());
            prop_assert!(lp.top.iter().all(|x| !x.logprob.is_nan()));
            prop_assert!(!lp.sampled.logprob.is_nan());
            prop_assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        }
    }

    #[test]
    fn sampled_token_is_never_a_masked_one(
        logits in prop::collection::vec(-20.0f32..20.0, 2..300),
        mask in prop::collection::vec(any::<bool>(), 300),
        top_k in -1i32..10,
        top_p in 0.05f32..=1.0,
        min_p in 0.0f32..0.5,
        temperature in prop_oneof![Just(0.0f32), 0.1f32..3.0],
        seed in any::<u64>(),
    ) {
        let mut row = logits.clone();
        for (x, &m) in row.iter_mut().zip(&mask) {
            if m {
                *x = f32::NEG_INFINITY;
            }
        }
        prop_assume!(row.iter().any(|x| x.is_finite()));
        let raw = row.clone();
        let mut s = RequestSampler::new(
            Arc::new(SamplingParams { temperature, top_k, top_p, min_p, seed: Some(seed), ..SamplingParams::default() }),
            &[],
            0,
        );
        let t = s.sample(&mut row, &[]).token as usize;
        prop_assert!(raw[t].is_finite());
        // Never below the k-th largest when top-k is on.
        if top_k > 0 && (top_k as usize) < raw.len() {
            let mut sorted = raw.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            prop_assert!(raw[t] >= sorted[top_k as usize - 1]);
        }
        // min-p against the scaled maximum.
        if temperature > 0.0 && min_p > 0.0 {
            let m = raw.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let ratio = (f64::from(raw[t] - m) / f64::from(temperature)).exp();
            prop_assert!(ratio >= f64::from(min_p) * (1.0 - 1e-3));
        }
    }

    #[test]
    fn greedy_matches_naive_argmax(logits in prop::collection::vec(-100.0f32..100.0, 1..3000)) {
        let mut s = sampler(SamplingParams::greedy(1));
        prop_assert_eq!(s.sample(&mut logits.clone(), &[]).token as usize, argmax_naive(&logits));
    }

    #[test]
    fn logprobs_match_f64_log_softmax(logits in prop::collection::vec(-40.0f32..40.0, 1..2000), n in 0usize..8) {
        let rows = prompt_logprobs(&logits, logits.len(), &[0], n);
        let want = softmax(&logits, 1.0);
        let lp = &rows[0];
        prop_assert!((f64::from(lp.sampled.logprob) - want[0].ln()).abs() < 1e-4 + want[0].ln().abs() * 1e-6);
        for TokenLogprob { token_id, logprob } in &lp.top {
            let w = want[*token_id as usize].ln();
            prop_assert!((f64::from(*logprob) - w).abs() < 1e-4 + w.abs() * 1e-6);
        }
        prop_assert_eq!(lp.top.len(), n.min(logits.len()));
    }
}

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
