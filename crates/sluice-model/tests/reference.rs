//! The runner computes the same function as Hugging Face transformers:
//! last-prompt-position logits, 32 greedy tokens and top-5 logprobs of every
//! fixture prompt, in f32, compared with `reference.json`.

mod common;

use common::*;

/// The logits at the last prompt position, one prompt at a time.
#[test]
fn prompt_last_logits_match_transformers() {
    for name in REFERENCE_FIXTURES {
        let f = fixture(name);
        for p in &f.prompts {
            let logits = prompt_last_logits(&f.model, &p.input_ids);
            let diff = max_abs_diff(&logits, &p.prompt_last_logits);
            assert!(diff <= ATOL, "{name}/{}: max |Δlogit| = {diff}", p.name);
        }
    }
}

/// Each prompt alone through scheduler + runner: the greedy tokens equal
/// transformers' exactly and the top-5 logprobs match within 1e-4.
#[test]
fn greedy_tokens_and_logprobs_match_transformers() {
    for name in REFERENCE_FIXTURES {
        let f = fixture(name);
        let runs = single_runs(&f, 32);
        for (p, run) in f.prompts.iter().zip(&runs) {
            assert_eq!(run.tokens, p.greedy_token_ids, "{name}/{}", p.name);
            assert_eq!(run.logprobs.len(), 32, "{name}/{}", p.name);
            for (step, (got, want)) in run.logprobs.iter().zip(&p.top_logprobs).enumerate() {
                let got = got.as_ref().expect("logprobs were asked for");
                assert_eq!(got.sampled.token_id, p.greedy_token_ids[step]);
                assert_eq!(got.rank, 1, "greedy picks the best token");
                assert_eq!(got.top.len(), 5);
                for (g, &(id, lp)) in got.top.iter().zip(want) {
                    assert_eq!(g.token_id, id, "{name}/{} step {step}", p.name);
                    assert!(
                        (g.logprob - lp).abs() <= ATOL,
                        "{name}/{} step {step}: logprob {} vs {lp}",
                        p.name,
                        g.logprob
                    );
                }
                assert!((got.sampled.logprob - want[0].1).abs() <= ATOL);
            }
        }
    }
}

/// The llama fixture's README check: its logits depend on the llama3 RoPE
/// scaling (plain RoPE moves them by up to 5.3), so matching them proves the
/// scaling, smooth band included, is implemented.
#[test]
fn llama3_rope_scaling_is_exercised() {
    let f = fixture("tiny-llama");
    let check = &f.reference["rope_scaling_check"];
    let smoothing_effect = check["max_abs_logit_diff_if_llama3_without_smoothing"]
        .as_f64()
        .unwrap();
    assert!(smoothing_effect > 100.0 * ATOL as f64);
    let inv_freq: Vec<f32> = check["inv_freq_llama3"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let got = f.model.ropes[0].inv_freq();
    assert_eq!(got.len(), inv_freq.len());
    for (g, w) in got.iter().zip(&inv_freq) {
        assert!((g - w).abs() <= w * 1e-6, "{g} vs {w}");
    }
}
