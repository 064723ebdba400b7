//! Scheduler traces (`docs/scheduler-trace.md`): parsing and
//! validation. Every error names the offending field the way a user would
//! find it in the file, e.g. `requests[3].prompt: expected an array of token
//! ids`.
//!
//! Every size a trace names is bounded (`MAX_*` here and in `config`), so a
//! hostile or fuzzed trace is refused with such an error instead of making
//! the replay allocate without bound or overflow: the limits are far above
//! any real trace (the largest benchmark trace is 13 MB with 3,600
//! requests, 147,712 blocks and 600 steps; the decode ones allow 100,000
//! steps).

use crate::block_hash::HashAlgo;
use crate::config::{SchedulerConfig, SchedulingPolicy, MAX_MODEL_LEN};
use crate::error::FieldError;
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::fmt;

/// Largest trace text `Trace::from_json` parses (256 MiB). The parsed JSON
/// tree takes up to ~16 times the text (a one-digit token is 2 bytes of text
/// and a 32-byte value), so this also bounds the parser's memory.
pub const MAX_TRACE_BYTES: usize = 256 << 20;
/// Most requests in a trace (2^20).
pub const MAX_REQUESTS: usize = 1 << 20;
/// Most aborts in a trace (2^20).
pub const MAX_ABORTS: usize = 1 << 20;
/// Largest `max_steps`, `arrival_step` and abort `step` (2^24). Steps run
/// one by one (each writes a log line), and arrival steps become exact f64
/// arrival times only while they stay small.
pub const MAX_STEPS: u64 = 1 << 24;
/// Most tokens in a request's `output` and most `max_tokens` (2^24, the
/// scheduler's `MAX_MODEL_LEN`: no request can emit more).
pub const MAX_OUTPUT_TOKENS: usize = MAX_MODEL_LEN;
/// Most `stop_token_ids` of one request (2^16).
pub const MAX_STOP_TOKEN_IDS: usize = 1 << 16;

/// "16777216 (2^24)" for a power of two, the number alone otherwise.
fn limit(max: u64) -> String {
    if max.is_power_of_two() {
        format!("{max} (2^{})", max.ilog2())
    } else {
        max.to_string()
    }
}

/// A malformed or undefined trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// JSON path of the field, e.g. `requests[3].prompt`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for TraceError {}

pub(crate) fn fail<T>(
    path: impl Into<String>,
    message: impl Into<String>,
) -> Result<T, TraceError> {
    Err(TraceError {
        path: path.into(),
        message: message.into(),
    })
}

/// One scripted request.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    pub id: String,
    pub arrival_step: u64,
    pub priority: i64,
    pub prompt: Vec<u32>,
    /// What the scripted model emits, in order.
    pub output: Vec<u32>,
    pub max_tokens: usize,
    pub min_tokens: usize,
    pub eos_token_id: Option<u32>,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    /// Entry `j`: the drafts proposed right after the request's `j`-th
    /// sampling step (speculative decoding; empty without it).
    pub drafts: Vec<Vec<u32>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TraceAbort {
    pub step: u64,
    pub id: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub name: String,
    pub config: SchedulerConfig,
    pub requests: Vec<TraceRequest>,
    pub aborts: Vec<TraceAbort>,
    pub max_steps: u64,
    /// The trace names its KV cache groups (`config.kv_cache_groups`): the
    /// decision log then lists `new_blocks` per group.
    pub grouped: bool,
}

struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn new(path: &str, v: &'a Value) -> Result<Self, TraceError> {
        match v.as_object() {
            Some(map) => Ok(Obj {
                path: path.to_string(),
                map,
            }),
            None => fail(path, "expected an object"),
        }
    }

    fn field_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    fn uint(&self, key: &str, default: Option<u64>) -> Result<u64, TraceError> {
        match self.get(key) {
            None if default.is_some() => Ok(default.unwrap_or_default()),
            None => fail(
                self.field_path(key),
                "missing (expected a non-negative integer)",
            ),
            Some(v) => v.as_u64().map_or_else(
                || fail(self.field_path(key), "expected a non-negative integer"),
                Ok,
            ),
        }
    }

    /// `uint`, refusing values above `max`.
    fn uint_at_most(&self, key: &str, default: Option<u64>, max: u64) -> Result<u64, TraceError> {
        let v = self.uint(key, default)?;
        if v > max {
            return fail(
                self.field_path(key),
                format!("must be at most {}, got {v}", limit(max)),
            );
        }
        Ok(v)
    }

    fn int(&self, key: &str, default: i64) -> Result<i64, TraceError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_i64()
                .map_or_else(|| fail(self.field_path(key), "expected an integer"), Ok),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool, TraceError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .map_or_else(|| fail(self.field_path(key), "expected true or false"), Ok),
        }
    }

    /// An array of at most `max` token ids.
    fn tokens(&self, key: &str, required: bool, max: usize) -> Result<Vec<u32>, TraceError> {
        let path = self.field_path(key);
        let Some(v) = self.get(key) else {
            return if required {
                fail(path, "missing (expected an array of token ids)")
            } else {
                Ok(Vec::new())
            };
        };
        let Some(arr) = v.as_array() else {
            return fail(path, "expected an array of token ids");
        };
        if arr.len() > max {
            return fail(
                path,
                format!(
                    "holds {} tokens, more than the limit of {}",
                    arr.len(),
                    limit(max as u64)
                ),
            );
        }
        arr.iter()
            .enumerate()
            .map(
                |(i, t)| match t.as_u64().and_then(|t| u32::try_from(t).ok()) {
                    Some(t) => Ok(t),
                    None => fail(
                        format!("{path}[{i}]"),
                        "expected a token id (an integer in 0..2^32)",
                    ),
                },
            )
            .collect()
    }

    fn id(&self, key: &str) -> Result<String, TraceError> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
            Some(_) => fail(self.field_path(key), "expected a string"),
            None => fail(self.field_path(key), "missing (expected a string)"),
        }
    }
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

impl Trace {
    /// Parses and validates a trace from JSON text of at most
    /// `MAX_TRACE_BYTES`.
    pub fn from_json(text: &str) -> Result<Trace, TraceError> {
        if text.len() > MAX_TRACE_BYTES {
            return fail(
                "",
                format!(
                    "the trace is {} bytes, more than the limit of {} MiB",
                    text.len(),
                    MAX_TRACE_BYTES >> 20
                ),
            );
        }
        let root: Value = serde_json::from_str(text).map_err(|e| TraceError {
            path: String::new(),
            message: format!("not valid JSON: {e}"),
        })?;
        Self::from_value(&root)
    }

    pub fn from_value(root: &Value) -> Result<Trace, TraceError> {
        let top = Obj::new("", root)?;
        let name = match top.get("name") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return fail("name", "expected a string"),
        };
        let Some(cfg_value) = top.get("config") else {
            return fail("config", "missing (expected an object)");
        };
        let c = Obj::new("config", cfg_value)?;
        let policy = match c.get("policy") {
            None => SchedulingPolicy::Fcfs,
            Some(Value::String(s)) => s.parse().map_err(|m: String| TraceError {
                path: "config.policy".into(),
                message: m,
            })?,
            Some(_) => return fail("config.policy", "expected \"fcfs\" or \"priority\""),
        };
        let block_size = usize_of(c.uint("block_size", None)?);
        let prefix_caching = c.boolean("enable_prefix_caching", false)?;
        let groups = crate::trace_groups::parse_kv_cache_groups(
            c.get("kv_cache_groups"),
            block_size,
            prefix_caching,
        )?;
        let grouped = groups.is_some();
        let mut config = SchedulerConfig {
            block_size,
            num_gpu_blocks: usize_of(c.uint("num_gpu_blocks", None)?),
            max_num_batched_tokens: usize_of(c.uint("max_num_batched_tokens", None)?),
            max_num_scheduled_tokens: None,
            max_num_seqs: usize_of(c.uint("max_num_seqs", None)?),
            max_model_len: usize_of(c.uint("max_model_len", None)?),
            enable_chunked_prefill: c.boolean("enable_chunked_prefill", false)?,
            enable_prefix_caching: prefix_caching,
            long_prefill_token_threshold: usize_of(
                c.uint("long_prefill_token_threshold", Some(0))?,
            ),
            policy,
            reserve_full_sequence: true,
            num_lookahead_tokens: 0,
            num_speculative_tokens: 0,
            num_draft_slots: 0,
            prefix_caching_hash_algo: HashAlgo::Sha256,
            hash_seed: None,
            enable_kv_cache_events: false,
            watermark: 0.0,
            kv_cache_groups: groups
                .unwrap_or_else(|| vec![crate::kv_cache::KvCacheGroupSpec::FULL]),
            ..SchedulerConfig::default()
        };
        crate::trace_speculative::apply_speculative_config(
            c.get("speculative_config"),
            &mut config,
        )?;
        config
            .validate_basic()
            .map_err(|e: FieldError| TraceError {
                path: format!("config.{}", e.field),
                message: e.message,
            })?;

        let requests = match top.get("requests") {
            None => Vec::new(),
            Some(Value::Array(items)) if items.len() > MAX_REQUESTS => {
                return fail(
                    "requests",
                    format!(
                        "{} requests, more than the limit of {}",
                        items.len(),
                        limit(MAX_REQUESTS as u64)
                    ),
                )
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| parse_request(i, v, &config))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return fail("requests", "expected an array of requests"),
        };
        let mut seen = HashSet::new();
        for (i, r) in requests.iter().enumerate() {
            if !seen.insert(r.id.as_str()) {
                return fail(
                    format!("requests[{i}].id"),
                    format!("duplicate request id {:?}", r.id),
                );
            }
        }

        let aborts = match top.get("aborts") {
            None => Vec::new(),
            Some(Value::Array(items)) if items.len() > MAX_ABORTS => {
                return fail(
                    "aborts",
                    format!(
                        "{} aborts, more than the limit of {}",
                        items.len(),
                        limit(MAX_ABORTS as u64)
                    ),
                )
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let a = Obj::new(&format!("aborts[{i}]"), v)?;
                    Ok(TraceAbort {
                        step: a.uint_at_most("step", None, MAX_STEPS)?,
                        id: a.id("id")?,
                    })
                })
                .collect::<Result<Vec<_>, TraceError>>()?,
            Some(_) => return fail("aborts", "expected an array of {\"step\", \"id\"} objects"),
        };
        let max_steps = top.uint_at_most("max_steps", Some(10_000), MAX_STEPS)?;
        Ok(Trace {
            name,
            config,
            requests,
            aborts,
            max_steps,
            grouped,
        })
    }
}

fn parse_request(i: usize, v: &Value, cfg: &SchedulerConfig) -> Result<TraceRequest, TraceError> {
    let r = Obj::new(&format!("requests[{i}]"), v)?;
    // The real bound (shorter than max_model_len) is checked below, with
    // its own message; this one only keeps a huge array from being copied.
    let prompt = r.tokens("prompt", true, MAX_MODEL_LEN)?;
    if prompt.is_empty() {
        return fail(r.field_path("prompt"), "the prompt is empty");
    }
    if prompt.len() >= cfg.max_model_len {
        return fail(
            r.field_path("prompt"),
            format!(
                "{} tokens: a prompt must be shorter than max_model_len ({})",
                prompt.len(),
                cfg.max_model_len
            ),
        );
    }
    let output = r.tokens("output", true, MAX_OUTPUT_TOKENS)?;
    let max_tokens = usize_of(r.uint_at_most(
        "max_tokens",
        Some(output.len() as u64),
        MAX_OUTPUT_TOKENS as u64,
    )?);
    if max_tokens == 0 {
        return fail(r.field_path("max_tokens"), "must be at least 1");
    }
    if output.len() < max_tokens {
        return fail(
            r.field_path("output"),
            format!(
                "holds {} tokens, fewer than max_tokens ({max_tokens})",
                output.len()
            ),
        );
    }
    let min_tokens = usize_of(r.uint("min_tokens", Some(0))?);
    if min_tokens > max_tokens {
        return fail(
            r.field_path("min_tokens"),
            format!("({min_tokens}) must be at most max_tokens ({max_tokens})"),
        );
    }
    let eos_token_id = match r.get("eos_token_id") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|t| u32::try_from(t).ok()) {
            Some(t) => Some(t),
            None => return fail(r.field_path("eos_token_id"), "expected null or a token id"),
        },
    };
    Ok(TraceRequest {
        id: r.id("id")?,
        arrival_step: r.uint_at_most("arrival_step", Some(0), MAX_STEPS)?,
        priority: r.int("priority", 0)?,
        prompt,
        output,
        max_tokens,
        min_tokens,
        eos_token_id,
        ignore_eos: r.boolean("ignore_eos", false)?,
        stop_token_ids: r.tokens("stop_token_ids", false, MAX_STOP_TOKEN_IDS)?,
        drafts: crate::trace_speculative::parse_drafts(
            r.field_path("drafts"),
            r.get("drafts"),
            cfg,
            max_tokens,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Trace::from_json(text).unwrap_err().to_string()
    }

    const CFG: &str = r#""config": {"block_size": 16, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128}"#;

    #[test]
    fn defaults_fill_in() {
        let t = Trace::from_json(&format!(
            r#"{{{CFG}, "requests": [{{"id": "a", "prompt": [1, 2], "output": [3, 4]}}]}}"#
        ))
        .unwrap();
        let r = &t.requests[0];
        assert_eq!(r.max_tokens, 2);
        assert_eq!(r.arrival_step, 0);
        assert_eq!(t.max_steps, 10_000);
        assert!(!t.config.enable_chunked_prefill);
        assert_eq!(t.config.policy, SchedulingPolicy::Fcfs);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"id": "a", "prompt": "hi", "output": [1]}"#,
                "requests[0].prompt: expected an array of token ids",
            ),
            (
                r#"{"id": "a", "prompt": [], "output": [1]}"#,
                "requests[0].prompt: the prompt is empty",
            ),
            (
                r#"{"id": "a", "prompt": [1, -2], "output": [1]}"#,
                "requests[0].prompt[1]: expected a token id",
            ),
            (
                r#"{"id": "a", "prompt": [1], "output": [1], "max_tokens": 3}"#,
                "requests[0].output: holds 1 tokens",
            ),
            (
                r#"{"id": "a", "prompt": [1], "output": [1], "ignore_eos": 1}"#,
                "requests[0].ignore_eos: expected true or false",
            ),
            (
                r#"{"prompt": [1], "output": [1]}"#,
                "requests[0].id: missing",
            ),
        ];
        for (req, want) in cases {
            let got = err(&format!(r#"{{{CFG}, "requests": [{req}]}}"#));
            assert!(
                got.starts_with(want),
                "{got:?} does not start with {want:?}"
            );
        }
        let dup = err(&format!(
            r#"{{{CFG}, "requests": [{{"id": "a", "prompt": [1], "output": [1]}}, {{"id": "a", "prompt": [1], "output": [1]}}]}}"#
        ));
        assert!(dup.starts_with("requests[1].id: duplicate"), "{dup}");
        let long: Vec<String> = (0..128).map(|i| i.to_string()).collect();
        let got = err(&format!(
            r#"{{{CFG}, "requests": [{{"id": "a", "prompt": [{}], "output": [1]}}]}}"#,
            long.join(",")
        ));
        assert!(got.contains("shorter than max_model_len"), "{got}");
    }

    /// A trace with `field` of `config` (or the top level, or request /
    /// abort 0) set to `value` (JSON text).
    fn with_field(section: &str, field: &str, value: &str) -> String {
        let mut cfg = serde_json::json!({"block_size": 16, "num_gpu_blocks": 8,
            "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128});
        let mut req = serde_json::json!({"id": "a", "prompt": [1, 2], "output": [3, 4]});
        let mut abort = serde_json::json!({"step": 1, "id": "a"});
        let mut top = serde_json::json!({});
        let target = match section {
            "config" => &mut cfg,
            "request" => &mut req,
            "abort" => &mut abort,
            _ => &mut top,
        };
        let v: Value = serde_json::from_str(value).unwrap();
        target[field] = v;
        top["config"] = cfg;
        top["requests"] = serde_json::json!([req]);
        top["aborts"] = serde_json::json!([abort]);
        top.to_string()
    }

    #[test]
    fn sizes_are_bounded_naming_the_field() {
        let cases = [
            (
                "config",
                "num_gpu_blocks",
                "2147483648",
                "config.num_gpu_blocks: must be at most 16777216 (2^24), got 2147483648",
            ),
            (
                "config",
                "num_gpu_blocks",
                "9223372036854775808",
                "config.num_gpu_blocks: must be at most 16777216 (2^24)",
            ),
            (
                "config",
                "num_gpu_blocks",
                "100000000",
                "config.num_gpu_blocks: must be at most 16777216 (2^24), got 100000000",
            ),
            (
                "config",
                "num_gpu_blocks",
                "18446744073709551616",
                "config.num_gpu_blocks: expected a non-negative integer",
            ),
            (
                "config",
                "num_gpu_blocks",
                "1e8",
                "config.num_gpu_blocks: expected a non-negative integer",
            ),
            (
                "config",
                "block_size",
                "2147483648",
                "config.block_size: must be at most 65536 (2^16)",
            ),
            (
                "config",
                "max_num_seqs",
                "1099511627776",
                "config.max_num_seqs: must be at most 16777216 (2^24)",
            ),
            (
                "config",
                "max_num_batched_tokens",
                "9223372036854775807",
                "config.max_num_batched_tokens: must be at most 2147483648 (2^31)",
            ),
            (
                "config",
                "max_model_len",
                "2147483648",
                "config.max_model_len: must be at most 16777216 (2^24)",
            ),
            (
                "config",
                "long_prefill_token_threshold",
                "9007199254740992",
                "config.long_prefill_token_threshold: must be at most 2147483648 (2^31)",
            ),
            (
                "top",
                "max_steps",
                "2147483648",
                "max_steps: must be at most 16777216 (2^24), got 2147483648",
            ),
            (
                "request",
                "arrival_step",
                "9223372036854775808",
                "requests[0].arrival_step: must be at most 16777216 (2^24)",
            ),
            (
                "request",
                "max_tokens",
                "9223372036854775808",
                "requests[0].max_tokens: must be at most 16777216 (2^24)",
            ),
            (
                "request",
                "min_tokens",
                "9223372036854775808",
                "requests[0].min_tokens: (9223372036854775808) must be at most max_tokens",
            ),
            (
                "request",
                "priority",
                "9223372036854775808",
                "requests[0].priority: expected an integer",
            ),
            (
                "request",
                "arrival_step",
                "-1",
                "requests[0].arrival_step: expected a non-negative integer",
            ),
            (
                "request",
                "max_tokens",
                "1.5",
                "requests[0].max_tokens: expected a non-negative integer",
            ),
            (
                "abort",
                "step",
                "9223372036854775808",
                "aborts[0].step: must be at most 16777216 (2^24)",
            ),
        ];
        for (section, field, value, want) in cases {
            let got = err(&with_field(section, field, value));
            assert!(
                got.starts_with(want),
                "{field}={value}: {got:?} does not start with {want:?}"
            );
        }
        // The limits themselves are accepted.
        for (section, field, value) in [
            ("config", "num_gpu_blocks", "16777216"),
            ("top", "max_steps", "16777216"),
            ("request", "arrival_step", "16777216"),
        ] {
            Trace::from_json(&with_field(section, field, value)).unwrap();
        }
    }

    #[test]
    fn counts_are_bounded_naming_the_field() {
        let stops = vec!["1"; MAX_STOP_TOKEN_IDS + 1].join(",");
        let got = err(&with_field(
            "request",
            "stop_token_ids",
            &format!("[{stops}]"),
        ));
        assert_eq!(
            got,
            "requests[0].stop_token_ids: holds 65537 tokens, more than the limit of 65536 (2^16)"
        );
        // Empty objects keep the text small: the count is refused before any
        // request is looked at.
        let many = vec!["{}"; MAX_REQUESTS + 1].join(",");
        let got = err(&format!(r#"{{{CFG}, "requests": [{many}]}}"#));
        assert_eq!(
            got,
            "requests: 1048577 requests, more than the limit of 1048576 (2^20)"
        );
        let got = err(&format!(r#"{{{CFG}, "aborts": [{many}]}}"#));
        assert!(
            got.starts_with("aborts: 1048577 aborts, more than the limit"),
            "{got}"
        );
        let huge = " ".repeat(MAX_TRACE_BYTES + 1);
        let got = err(&huge);
        assert_eq!(
            got,
            "the trace is 268435457 bytes, more than the limit of 256 MiB"
        );
    }

    #[test]
    fn config_errors_name_the_field() {
        let bad = r#"{"config": {"block_size": 0, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128}}"#;
        assert!(err(bad).starts_with("config.block_size"));
        let bad = r#"{"config": {"block_size": 4, "num_gpu_blocks": 1, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128}}"#;
        assert!(err(bad).starts_with("config.num_gpu_blocks"));
        let bad = r#"{"config": {"block_size": 4, "num_gpu_blocks": 8, "max_num_batched_tokens": 0, "max_num_seqs": 2, "max_model_len": 128}}"#;
        assert!(err(bad).starts_with("config.max_num_batched_tokens"));
        let bad = r#"{"config": {"block_size": 4, "num_gpu_blocks": 8, "max_num_batched_tokens": 8, "max_num_seqs": 0, "max_model_len": 128}}"#;
        assert!(err(bad).starts_with("config.max_num_seqs"));
        let bad = r#"{"config": {"block_size": 4, "num_gpu_blocks": 8, "max_num_batched_tokens": 8, "max_num_seqs": 1, "max_model_len": 128, "policy": "lifo"}}"#;
        assert!(err(bad).starts_with("config.policy"));
        assert!(err("[1, 2]").starts_with("expected an object"));
        assert!(err("{").starts_with("not valid JSON"));
        assert!(err(r#"{"name": "x"}"#).starts_with("config: missing"));
    }
}
