//! KV cache groups: which layers keep which tokens.
//!
//! vLLM groups a model's attention layers by what their KV cache must keep
//! (`KVCacheGroupSpec`): every layer of a plain decoder attends to all
//! earlier tokens, so it has one full-attention group; a hybrid model
//! (sliding-window layers beside full ones) has one group per layer kind of
//! its repeating pattern. The scheduler's KV cache manager keeps one block
//! table per group per request, all drawn from one pool.

use serde::{Deserialize, Serialize};

/// A group's index: its position in `SchedulerConfig::kv_cache_groups`, and
/// the group part of a prefix-cache key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u32);

impl GroupId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a group's layers attend to, as far as the scheduler cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KvCacheGroupSpec {
    /// Every earlier token: the block table grows with the sequence and
    /// keeps every block until the request ends.
    Full,
}

impl KvCacheGroupSpec {
    /// The name of the kind, as in traces (`kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            KvCacheGroupSpec::Full => "full",
        }
    }
}
