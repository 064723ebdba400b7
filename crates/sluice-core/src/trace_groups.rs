//! `config.kv_cache_groups` of a trace: the model's KV cache groups.
//!
//! Absent, the model has one full-attention group and the decision log keeps
//! its one-list `new_blocks`; present, it must be a non-empty list of group
//! objects, each refused with the exact field path when malformed, so a bad
//! trace never reaches the scheduler.

use crate::config::{MAX_BLOCK_SIZE, MAX_MODEL_LEN};
use crate::kv_cache::{block_layout, AttentionKind, KvCacheGroupSpec};
use crate::trace::TraceError;
use serde_json::Value;

fn fail<T>(path: String, message: impl Into<String>) -> Result<T, TraceError> {
    Err(TraceError {
        path,
        message: message.into(),
    })
}

/// An integer ≥ 1 and at most `max` at `path`.
fn positive(path: String, v: Option<&Value>, max: u64) -> Result<usize, TraceError> {
    match v.and_then(Value::as_u64) {
        Some(n) if n >= 1 && n <= max => Ok(n as usize),
        Some(n) if n > max => fail(path, format!("must be at most {max}, got {n}")),
        _ => fail(path, "must be an integer >= 1"),
    }
}

fn parse_group(i: usize, v: &Value) -> Result<KvCacheGroupSpec, TraceError> {
    let at = format!("config.kv_cache_groups[{i}]");
    let Some(map) = v.as_object() else {
        return fail(at, "expected an object");
    };
    let (kind, field) = match map.get("kind").and_then(Value::as_str) {
        Some("full") => ("full", None),
        Some("sliding_window") => ("sliding_window", Some("sliding_window")),
        Some("chunked_local") => ("chunked_local", Some("attention_chunk_size")),
        _ => {
            return fail(
                format!("{at}.kind"),
                "must be one of full, sliding_window, chunked_local",
            )
        }
    };
    let mut extra: Vec<&String> = map
        .keys()
        .filter(|k| !matches!(k.as_str(), "kind" | "block_size") && Some(k.as_str()) != field)
        .collect();
    extra.sort();
    if let Some(k) = extra.first() {
        return fail(
            format!("{at}.{k}"),
            format!("unknown field for kind {kind}"),
        );
    }
    let size = |name: &str, max: u64| positive(format!("{at}.{name}"), map.get(name), max);
    let kind = match field {
        None => AttentionKind::Full,
        Some(f) if kind == "sliding_window" => AttentionKind::SlidingWindow {
            window: size(f, MAX_MODEL_LEN as u64)?,
        },
        Some(f) => AttentionKind::ChunkedLocal {
            chunk: size(f, MAX_MODEL_LEN as u64)?,
        },
    };
    let block_size = match map.get("block_size") {
        None => None,
        Some(_) => Some(size("block_size", MAX_BLOCK_SIZE as u64)?),
    };
    Ok(KvCacheGroupSpec { kind, block_size })
}

/// The groups of `v` (`None` when the field is absent). With prefix caching
/// on, a chunked-local group must have the scheduler block size (vLLM fails
/// an assertion at its first lookup otherwise).
pub(crate) fn parse_kv_cache_groups(
    v: Option<&Value>,
    block_size: usize,
    prefix_caching: bool,
) -> Result<Option<Vec<KvCacheGroupSpec>>, TraceError> {
    let Some(v) = v else {
        return Ok(None);
    };
    let items = match v.as_array() {
        Some(items) if !items.is_empty() => items,
        _ => return fail("config.kv_cache_groups".into(), "must be a non-empty list"),
    };
    let groups = items
        .iter()
        .enumerate()
        .map(|(i, g)| parse_group(i, g))
        .collect::<Result<Vec<_>, _>>()?;
    let (sched_bs, _) = block_layout(&groups, block_size.max(1), prefix_caching);
    if sched_bs > MAX_BLOCK_SIZE {
        return fail(
            "config.kv_cache_groups".into(),
            format!("the groups' block sizes have an LCM of {sched_bs}, above {MAX_BLOCK_SIZE}"),
        );
    }
    if prefix_caching {
        for (i, g) in groups.iter().enumerate() {
            if matches!(g.kind, AttentionKind::ChunkedLocal { .. })
                && g.block_size_or(block_size) != sched_bs
            {
                return fail(
                    format!("config.kv_cache_groups[{i}].block_size"),
                    format!(
                        "a chunked_local group needs block size {sched_bs} (the LCM of all \
                         group block sizes) when prefix caching is on"
                    ),
                );
            }
        }
    }
    Ok(Some(groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(v: Value, prefix: bool) -> String {
        parse_kv_cache_groups(Some(&v), 16, prefix)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn errors_name_the_field() {
        use serde_json::json;
        assert!(err(json!([]), true).starts_with("config.kv_cache_groups:"));
        assert!(err(json!({}), true).starts_with("config.kv_cache_groups:"));
        assert!(err(json!([1]), true).starts_with("config.kv_cache_groups[0]:"));
        assert!(
            err(json!([{"kind": "mamba"}]), true).starts_with("config.kv_cache_groups[0].kind:")
        );
        assert!(err(json!([{"kind": "full", "sliding_window": 4}]), true)
            .starts_with("config.kv_cache_groups[0].sliding_window: unknown field"));
        assert!(
            err(json!([{"kind": "full"}, {"kind": "sliding_window"}]), true)
                .starts_with("config.kv_cache_groups[1].sliding_window:")
        );
        assert!(err(
            json!([{"kind": "sliding_window", "sliding_window": 0}]),
            true
        )
        .starts_with("config.kv_cache_groups[0].sliding_window:"));
        assert!(err(
            json!([{"kind": "chunked_local", "attention_chunk_size": 1.5}]),
            true
        )
        .starts_with("config.kv_cache_groups[0].attention_chunk_size:"));
        assert!(err(json!([{"kind": "full", "block_size": -1}]), true)
            .starts_with("config.kv_cache_groups[0].block_size:"));
        let mixed = json!([{"kind": "full", "block_size": 32},
                           {"kind": "chunked_local", "attention_chunk_size": 64}]);
        assert!(err(mixed.clone(), true).starts_with("config.kv_cache_groups[1].block_size:"));
        assert_eq!(err(mixed, false), "");
    }
}
