//! Logprobs: raw log-softmax values, ranks with ties, prompt logprobs.

use super::*;

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
