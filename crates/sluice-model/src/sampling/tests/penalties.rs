//! Repetition / frequency / presence penalties, logit bias and min_tokens:
//! each moves or masks exactly the logits vLLM's sampler does.

use super::*;

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
