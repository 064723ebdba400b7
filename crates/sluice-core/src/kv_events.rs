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
    },
    BlockRemoved {
        block_hashes: Vec<ExternalBlockHash>,
        medium: Option<String>,
    },
    AllBlocksCleared,
}
