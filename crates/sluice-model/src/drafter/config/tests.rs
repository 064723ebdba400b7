//! `--speculative-config` parsing: vLLM's defaults, and an error naming
//! the field for every bad value.

use super::*;

fn ok(json: &str) -> SpeculativeConfig {
    SpeculativeConfig::parse(json).unwrap_or_else(|e| panic!("{json}: {e:#}"))
}

fn err(json: &str) -> String {
    match SpeculativeConfig::parse(json) {
        Ok(c) => panic!("{json} was accepted: {c:?}"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn vllm_defaults() {
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 4}"#);
    assert_eq!(c.method, SpeculativeMethod::Ngram { min_n: 5, max_n: 5 });
    assert_eq!(c.num_speculative_tokens, 4);
    assert_eq!(c.num_lookahead_tokens(), 0);
    // One bound given: both take it.
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}"#);
    assert_eq!(c.method, SpeculativeMethod::Ngram { min_n: 3, max_n: 3 });
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}"#);
    assert_eq!(c.method, SpeculativeMethod::Ngram { min_n: 2, max_n: 2 });
    // A model of "ngram" means the method.
    let c = ok(r#"{"model": "ngram", "num_speculative_tokens": 2}"#);
    assert_eq!(c.method.name(), "ngram");
    // Suffix: k defaults to the tree depth.
    let c = ok(r#"{"method": "suffix"}"#);
    assert_eq!(c.method, SpeculativeMethod::Suffix(SuffixParams::default()));
    assert_eq!(c.num_speculative_tokens, 24);
    let c = ok(r#"{"method": "suffix", "suffix_decoding_max_tree_depth": 8,
                  "suffix_decoding_min_token_prob": 0.5}"#);
    assert_eq!(c.num_speculative_tokens, 8);
    // Any other model is a draft model, which reserves lookahead slots.
    let c = ok(r#"{"model": "draft.gguf", "num_speculative_tokens": 3}"#);
    assert_eq!(
        c.method,
        SpeculativeMethod::DraftModel {
            model: "draft.gguf".into()
        }
    );
    assert_eq!(c.num_lookahead_tokens(), 3);
}

#[test]
fn bad_values_name_the_field() {
    for (json, want) in [
        ("[1]", "expected a JSON object"),
        ("{", "not valid JSON"),
        (r#"{"method": "ngram"}"#, "num_speculative_tokens must be provided"),
        (r#"{"method": "ngram", "num_speculative_tokens": 0}"#, "greater than zero (0)"),
        (r#"{"method": "ngram", "num_speculative_tokens": 33}"#, "num_speculative_tokens=33 must be <= 32"),
        (r#"{"method": "ngram", "num_speculative_tokens": "3"}"#, "num_speculative_tokens: expected an integer"),
        (r#"{"method": "bogus", "num_speculative_tokens": 3}"#, "unknown speculative method \"bogus\""),
        (r#"{"method": "eagle3", "num_speculative_tokens": 3}"#, "\"eagle3\" is a vLLM method sluice does not run"),
        (r#"{"num_speculative_tokens": 3}"#, "without speculative model"),
        (r#"{"method": "draft_model", "num_speculative_tokens": 3}"#, "model: the draft_model method needs"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}"#,
         "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}"#, "prompt_lookup_min: must be >= 1"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 4}"#,
         "suffix_decoding_max_tree_depth: does not apply to the ngram method"),
        (r#"{"method": "suffix", "suffix_decoding_max_tree_depth": 0}"#, "suffix_decoding_max_tree_depth=0 must be >= 1"),
        (r#"{"method": "suffix", "suffix_decoding_max_cached_requests": -1}"#, "suffix_decoding_max_cached_requests=-1 must be >= 0"),
        (r#"{"method": "suffix", "suffix_decoding_max_spec_factor": -0.5}"#, "suffix_decoding_max_spec_factor=-0.5 must be >= 0"),
        (r#"{"method": "suffix", "suffix_decoding_min_token_prob": 1.5}"#, "suffix_decoding_min_token_prob=1.5 must be in [0, 1]"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "bogus_field": 1}"#, "bogus_field: unknown field"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}"#,
         "draft_tensor_parallel_size: a field of vLLM's speculative config that sluice does not implement"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}"#,
         "draft_sample_method: \"probabilistic\" is not supported"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 1}"#,
         "disable_by_batch_size: expect the batch size threshold"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4,
             "num_speculative_tokens_per_batch_size": [[1, 4, 3]]}"#, "not both"),
        (r#"{"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[2, 4, 3]]}"#,
         "num_speculative_tokens_per_batch_size: The first batch-size range must start at 1"),
    ] {
        let e = err(json);
        assert!(e.contains(want), "{json}: {e:?} does not say {want:?}");
    }
}

#[test]
fn disable_by_batch_size_turns_drafting_off_above_n() {
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4}"#);
    assert_eq!(c.k_by_batch_size(6), [0, 3, 3, 3, 3, 0, 0]);
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 3}"#);
    assert!(c.k_by_batch_size(3)[1..].iter().all(|&k| k == 3));
}

#[test]
fn synthetic_acceptance_as_vllm_resolves_it() {
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 4,
                  "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}"#);
    assert_eq!(c.synthetic_acceptance_rates, Some(vec![1.0, 0.5, 0.0, 0.0]));
    let c = ok(r#"{"method": "ngram", "num_speculative_tokens": 2,
                  "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.8, 0.6]}"#);
    assert_eq!(c.synthetic_acceptance_rates, Some(vec![0.8, 0.6]));
    for (json, want) in [
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "synthetic_acceptance_length": 2}"#,
            "only valid with rejection_sample_method='synthetic'",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic"}"#,
            "requires exactly one of",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
             "synthetic_acceptance_rates": [0.5, 0.6]}"#,
            "must be non-increasing",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
             "synthetic_acceptance_rates": [0.5]}"#,
            "must have length 2",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
             "synthetic_acceptance_length": 3.5}"#,
            "must be in [1, 3], got 3.5",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "fly"}"#,
            "does not implement",
        ),
    ] {
        let e = err(json);
        assert!(e.contains(want), "{json}: {e:?} does not say {want:?}");
    }
}
