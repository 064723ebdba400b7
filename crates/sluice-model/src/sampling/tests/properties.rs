//! Property tests: any parameters on any logits never panic, never pick a
//! masked token, and agree with naive argmax / f64 log-softmax.

use super::*;
use proptest::prelude::*;
use sluice_core::TokenLogprob;

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
