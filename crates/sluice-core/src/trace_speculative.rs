//! Speculative decoding in a trace: `config.speculative_config` (which
//! drafter the scheduler plans for, and how many drafts per step) and each
//! request's scripted `drafts`.
//!
//! The scheduler's share of speculative decoding depends on the method only
//! through two numbers, as in vLLM 0.33: the lookahead slots it allocates past
//! the scheduled tokens (`num_speculative_tokens` for a draft model, which
//! writes KV for its own proposals, 0 for `ngram`) and the input slots each
//! scheduled request reserves (1 for a draft model, 0 otherwise). `suffix`
//! asks the scheduler for what `ngram` does, so a trace names `ngram` for it.
//! Drafts themselves are scripted per request; whether the target accepts one
//! follows from the request's scripted `output` (`docs/scheduler-trace.md`).

use crate::config::SchedulerConfig;
use crate::output::PLACEHOLDER_TOKEN_ID;
use crate::trace::{fail, TraceError};
use serde_json::Value;

/// The most drafts a trace may schedule per request and step.
pub const MAX_SPECULATIVE_TOKENS: u64 = 256;

/// Applies `config.speculative_config` (absent: no speculative decoding) to
/// `cfg`.
pub(crate) fn apply_speculative_config(
    v: Option<&Value>,
    cfg: &mut SchedulerConfig,
) -> Result<(), TraceError> {
    let Some(v) = v else {
        return Ok(());
    };
    let at = "config.speculative_config";
    let Some(map) = v.as_object() else {
        return fail(at, "expected an object");
    };
    for key in map.keys() {
        if key != "method" && key != "num_speculative_tokens" {
            return fail(
                format!("{at}.{key}"),
                "unknown field (expected method, num_speculative_tokens)",
            );
        }
    }
    let draft_model = match map.get("method").and_then(Value::as_str) {
        Some("ngram") => false,
        Some("draft_model") => true,
        _ => {
            return fail(
                format!("{at}.method"),
                "expected \"ngram\" or \"draft_model\"",
            )
        }
    };
    let k = match map.get("num_speculative_tokens").and_then(Value::as_u64) {
        Some(k) if (1..=MAX_SPECULATIVE_TOKENS).contains(&k) => k as usize,
        Some(k) if k > MAX_SPECULATIVE_TOKENS => {
            return fail(
                format!("{at}.num_speculative_tokens"),
                format!("must be at most {MAX_SPECULATIVE_TOKENS}, got {k}"),
            )
        }
        _ => {
            return fail(
                format!("{at}.num_speculative_tokens"),
                "must be an integer >= 1",
            )
        }
    };
    cfg.num_speculative_tokens = k;
    cfg.num_lookahead_tokens = if draft_model { k } else { 0 };
    cfg.num_draft_slots = usize::from(draft_model);
    cfg.pad_spec_decode = true;
    Ok(())
}

/// `requests[i].drafts`: entry `j` holds the drafts proposed right after
/// the request's `j`-th sampling step, at most `num_speculative_tokens` of
/// them. Absent: the request never drafts.
pub(crate) fn parse_drafts(
    at: String,
    v: Option<&Value>,
    cfg: &SchedulerConfig,
    max_entries: usize,
) -> Result<Vec<Vec<u32>>, TraceError> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let k = cfg.num_speculative_tokens;
    if k == 0 {
        return fail(at, "drafts need config.speculative_config");
    }
    let Some(entries) = v.as_array() else {
        return fail(at, "expected an array of arrays of token ids");
    };
    if entries.len() > max_entries {
        return fail(
            at,
            format!(
                "holds {} entries, more than the {max_entries} sampling steps a request can have",
                entries.len()
            ),
        );
    }
    entries
        .iter()
        .enumerate()
        .map(|(j, e)| {
            let Some(tokens) = e.as_array() else {
                return fail(format!("{at}[{j}]"), "expected an array of token ids");
            };
            if tokens.len() > k {
                return fail(
                    format!("{at}[{j}]"),
                    format!(
                        "{} drafts, more than num_speculative_tokens ({k})",
                        tokens.len()
                    ),
                );
            }
            tokens
                .iter()
                .enumerate()
                .map(
                    |(t, d)| match d.as_u64().and_then(|d| u32::try_from(d).ok()) {
                        Some(d) if d != PLACEHOLDER_TOKEN_ID => Ok(d),
                        _ => fail(
                            format!("{at}[{j}][{t}]"),
                            "expected a token id (an integer in 0..2^32-1)",
                        ),
                    },
                )
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::trace::Trace;

    fn err(spec: &str, drafts: &str) -> String {
        let text = format!(
            r#"{{"config": {{"block_size": 4, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128{spec}}},
               "requests": [{{"id": "A", "prompt": [1, 2], "output": [3, 4, 5]{drafts}}}]}}"#
        );
        match Trace::from_json(&text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn methods_set_the_schedulers_share() {
        let spec = |m: &str| {
            let text = format!(
                r#"{{"config": {{"block_size": 4, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128,
                   "speculative_config": {{"method": "{m}", "num_speculative_tokens": 3}}}},
                   "requests": [{{"id": "A", "prompt": [1], "output": [2], "drafts": [[7, 8]]}}]}}"#
            );
            let t = Trace::from_json(&text).expect("valid trace");
            let c = &t.config;
            (
                c.num_speculative_tokens,
                c.num_lookahead_tokens,
                c.num_draft_slots,
                t.requests[0].drafts.clone(),
            )
        };
        assert_eq!(spec("ngram"), (3, 0, 0, vec![vec![7, 8]]));
        assert_eq!(spec("draft_model"), (3, 3, 1, vec![vec![7, 8]]));
    }

    #[test]
    fn errors_name_the_field() {
        let ngram = r#", "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}"#;
        for (spec, drafts, want) in [
            (
                r#", "speculative_config": 3"#,
                "",
                "config.speculative_config: expected an object",
            ),
            (
                r#", "speculative_config": {"method": "eagle", "num_speculative_tokens": 2}"#,
                "",
                "config.speculative_config.method: expected",
            ),
            (
                r#", "speculative_config": {"method": "ngram", "num_speculative_tokens": 0}"#,
                "",
                "config.speculative_config.num_speculative_tokens: must be an integer >= 1",
            ),
            (
                r#", "speculative_config": {"method": "ngram", "num_speculative_tokens": 999}"#,
                "",
                "config.speculative_config.num_speculative_tokens: must be at most 256, got 999",
            ),
            (
                r#", "speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}"#,
                "",
                "config.speculative_config.prompt_lookup_max: unknown field",
            ),
            (
                "",
                r#", "drafts": [[1]]"#,
                "requests[0].drafts: drafts need config.speculative_config",
            ),
            (
                ngram,
                r#", "drafts": [1]"#,
                "requests[0].drafts[0]: expected an array",
            ),
            (
                ngram,
                r#", "drafts": [[1, 2, 3]]"#,
                "requests[0].drafts[0]: 3 drafts, more than",
            ),
            (
                ngram,
                r#", "drafts": [[1, -2]]"#,
                "requests[0].drafts[0][1]: expected a token id",
            ),
            (
                ngram,
                r#", "drafts": [[4294967295]]"#,
                "requests[0].drafts[0][0]: expected a token id",
            ),
            (
                ngram,
                r#", "drafts": [[], [], [], [1]]"#,
                "requests[0].drafts: holds 4 entries",
            ),
        ] {
            let e = err(spec, drafts);
            assert!(
                e.starts_with(want),
                "{spec} {drafts}: got {e:?}, want {want:?}"
            );
        }
        assert_eq!(err(ngram, r#", "drafts": [[1, 2], [], [9]]"#), "");
    }
}
