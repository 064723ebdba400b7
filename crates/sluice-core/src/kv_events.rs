//! KV cache events: what the KV cache manager tells the outside world about
//! its prefix cache, in vLLM 0.33's terms (`vllm/distributed/kv_events.py`),
//! so that a prefix-aware router (llm-d's precise prefix-cache scorer, the
//! Gateway API Inference Extension) can track which replica holds which
//! blocks.
//!
//! A `BlockStored` is emitted when blocks become cached (one per call of
//! vLLM's `cache_full_blocks`), a `BlockRemoved` when a cached block is
//! evicted for reuse, `AllBlocksCleared` on a prefix-cache reset; the
//! scheduler hands out the events queued during a step once, at the end of
//! `update_from_output` (`Scheduler::take_kv_cache_events`), in the order
//! they happened.
//!
//! Semantics (vLLM's `BlockPool`): `BlockStored` lists every block of one
//! `cache_full_blocks` call, also a block whose hash was already registered
//! under the same block, with `parent_block_hash` the hash of the block
//! before the first one (`None` from a request's first block) and the blocks'
//! tokens concatenated. `BlockRemoved` carries one hash, when a block popped
//! for reuse drops a hash the cache map held. A replica's cached set is
//! therefore "stored minus removed, emptied on `AllBlocksCleared`" as a
//! multiset: one hash can be stored by two blocks (vLLM does not
//! de-duplicate) and is gone only after both are removed.

/// vLLM's external block hash: the low 64 bits of the block's hash read as
/// a big-endian integer (vLLM's default,
/// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`).
pub type ExternalBlockHash = u64;

/// One KV cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCacheEvent {
    BlockStored {
        block_hashes: Vec<ExternalBlockHash>,
        /// The hash of the block before the first one stored (`None` for a
        /// request's first block).
        parent_block_hash: Option<ExternalBlockHash>,
        /// The stored blocks' tokens, concatenated.
        token_ids: Vec<u32>,
        block_size: usize,
        /// Always `None`: sluice has no LoRA adapters.
        lora_id: Option<u64>,
        /// `None` (vLLM: the default medium, GPU).
        medium: Option<String>,
        /// The group that stored them, for a model of several KV cache
        /// groups (`None`: one plain full-attention group, no group fields).
        group: Option<EventGroup>,
    },
    BlockRemoved {
        block_hashes: Vec<ExternalBlockHash>,
        medium: Option<String>,
        /// The group the hash was registered in (as `group`).
        group_idx: Option<u32>,
    },
    AllBlocksCleared,
}

/// What a `BlockStored` says of its group (vLLM's `group_idx`,
/// `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventGroup {
    pub group_idx: u32,
    pub kind: &'static str,
    pub sliding_window: Option<usize>,
}

fn push_u64s(out: &mut String, xs: impl IntoIterator<Item = u64>) {
    out.push('[');
    for (i, x) in xs.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&x.to_string());
    }
    out.push(']');
}

fn push_opt_fields(out: &mut String, lora_id: Option<u64>, medium: Option<&str>) {
    if let Some(l) = lora_id {
        out.push_str(&format!(",\"lora_id\":{l}"));
    }
    if let Some(m) = medium {
        out.push_str(",\"medium\":");
        out.push_str(&serde_json::to_string(m).unwrap_or_default());
    }
}

impl KvCacheEvent {
    /// The event as compact JSON, keys in vLLM's field order and fields that
    /// are `None` left out (except `parent_block_hash`, written as `null`):
    /// the format of the golden files in `tests/data/kv-events/`.
    pub fn to_json(&self) -> String {
        let mut o = String::with_capacity(64);
        match self {
            KvCacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                group,
            } => {
                o.push_str("{\"type\":\"BlockStored\",\"block_hashes\":");
                push_u64s(&mut o, block_hashes.iter().copied());
                o.push_str(",\"parent_block_hash\":");
                match parent_block_hash {
                    Some(p) => o.push_str(&p.to_string()),
                    None => o.push_str("null"),
                }
                o.push_str(",\"token_ids\":");
                push_u64s(&mut o, token_ids.iter().map(|&t| u64::from(t)));
                o.push_str(&format!(",\"block_size\":{block_size}"));
                push_opt_fields(&mut o, *lora_id, medium.as_deref());
                if let Some(g) = group {
                    o.push_str(&format!(
                        ",\"group_idx\":{},\"kv_cache_spec_kind\":\"{}\",\"kv_cache_spec_sliding_window\":",
                        g.group_idx, g.kind
                    ));
                    match g.sliding_window {
                        Some(w) => o.push_str(&w.to_string()),
                        None => o.push_str("null"),
                    }
                }
            }
            KvCacheEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            } => {
                o.push_str("{\"type\":\"BlockRemoved\",\"block_hashes\":");
                push_u64s(&mut o, block_hashes.iter().copied());
                push_opt_fields(&mut o, None, medium.as_deref());
                if let Some(g) = group_idx {
                    o.push_str(&format!(",\"group_idx\":{g}"));
                }
            }
            KvCacheEvent::AllBlocksCleared => o.push_str("{\"type\":\"AllBlocksCleared\""),
        }
        o.push('}');
        o
    }
}

/// One line of a KV events log: the events published after engine step
/// `step`, as `{"step": N, "events": [...]}` in compact JSON.
pub fn step_events_json(step: u64, events: &[KvCacheEvent]) -> String {
    let mut o = format!("{{\"step\":{step},\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        o.push_str(&e.to_json());
    }
    o.push_str("]}");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_the_golden_format() {
        let stored = KvCacheEvent::BlockStored {
            block_hashes: vec![1, u64::MAX],
            parent_block_hash: None,
            token_ids: vec![3, 4],
            block_size: 1,
            lora_id: None,
            medium: None,
            group: None,
        };
        let removed = KvCacheEvent::BlockRemoved {
            block_hashes: vec![7],
            medium: Some("GPU".into()),
            group_idx: None,
        };
        assert_eq!(
            step_events_json(2, &[stored, removed, KvCacheEvent::AllBlocksCleared]),
            "{\"step\":2,\"events\":[{\"type\":\"BlockStored\",\"block_hashes\":[1,18446744073709551615],\
             \"parent_block_hash\":null,\"token_ids\":[3,4],\"block_size\":1},\
             {\"type\":\"BlockRemoved\",\"block_hashes\":[7],\"medium\":\"GPU\"},\
             {\"type\":\"AllBlocksCleared\"}]}"
        );
    }
}
