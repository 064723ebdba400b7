//! Degenerate rows (all masked but one, NaN, infinities, empty filters)
//! and the 152k-vocabulary top-p path against the reference distribution.

use super::*;

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
