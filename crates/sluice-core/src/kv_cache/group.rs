//! KV cache groups: which layers keep which tokens.
//!
//! vLLM groups a model's attention layers by what their KV cache must keep
//! (`KVCacheGroupSpec`): every layer of a plain decoder attends to all
//! earlier tokens, so it has one full-attention group; a hybrid model
//! (sliding-window or chunked-local layers beside full ones) has one group
//! per layer kind of its repeating pattern. The scheduler's KV cache manager
//! keeps one block table per group per request, all drawn from one pool.
//!
//! Block sizes: a group may have its own (`block_size`); the scheduler's
//! granularity is then their least common multiple and prefix hashes are
//! chained at their greatest common divisor (`block_layout`), as vLLM's
//! engine core derives them.

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Every earlier token: the table grows with the sequence and keeps
    /// every block until the request ends.
    Full,
    /// The last `window` tokens, the token's own included.
    SlidingWindow { window: usize },
    /// The tokens of the token's own `chunk`-token chunk.
    ChunkedLocal { chunk: usize },
}

/// One KV cache group: its attention kind and, when it differs from the
/// scheduler's `block_size`, its own block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheGroupSpec {
    pub kind: AttentionKind,
    /// Tokens per block of this group; `None` = `SchedulerConfig::block_size`.
    pub block_size: Option<usize>,
}

impl KvCacheGroupSpec {
    /// Full attention with the default block size (every plain decoder).
    pub const FULL: KvCacheGroupSpec = KvCacheGroupSpec {
        kind: AttentionKind::Full,
        block_size: None,
    };

    pub fn sliding_window(window: usize) -> Self {
        KvCacheGroupSpec {
            kind: AttentionKind::SlidingWindow { window },
            block_size: None,
        }
    }

    pub fn chunked_local(chunk: usize) -> Self {
        KvCacheGroupSpec {
            kind: AttentionKind::ChunkedLocal { chunk },
            block_size: None,
        }
    }

    pub fn with_block_size(self, block_size: usize) -> Self {
        KvCacheGroupSpec {
            block_size: Some(block_size),
            ..self
        }
    }

    /// The name of the kind, as in traces (`kind`).
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            AttentionKind::Full => "full",
            AttentionKind::SlidingWindow { .. } => "sliding_window",
            AttentionKind::ChunkedLocal { .. } => "chunked_local",
        }
    }

    /// The kind as vLLM's KV cache events name it (`kv_cache_spec_kind`).
    pub fn event_kind_name(&self) -> &'static str {
        match self.kind {
            AttentionKind::Full => "full_attention",
            AttentionKind::SlidingWindow { .. } => "sliding_window",
            AttentionKind::ChunkedLocal { .. } => "chunked_local_attention",
        }
    }

    /// The window, for events (`kv_cache_spec_sliding_window`).
    pub fn sliding_window_tokens(&self) -> Option<usize> {
        match self.kind {
            AttentionKind::SlidingWindow { window } => Some(window),
            _ => None,
        }
    }

    /// This group's block size, given the scheduler's default.
    pub fn block_size_or(&self, default: usize) -> usize {
        self.block_size.unwrap_or(default)
    }

    /// The most blocks of `block_size` tokens this group holds for one
    /// request at once (vLLM's `max_admission_blocks_per_request`): every
    /// block of a `max_model_len` sequence under full attention; under a
    /// window, the window plus one step's tokens (and a block for the
    /// window's ragged start); under chunked-local attention, a chunk plus
    /// one step's tokens.
    pub fn max_blocks_per_request(
        &self,
        block_size: usize,
        max_num_batched_tokens: usize,
        max_model_len: usize,
    ) -> usize {
        let b = block_size.max(1);
        match self.kind {
            AttentionKind::Full => max_model_len.div_ceil(b),
            AttentionKind::SlidingWindow { window } => {
                let span = window
                    .saturating_sub(1)
                    .saturating_add(max_num_batched_tokens)
                    .min(max_model_len);
                span.div_ceil(b) + 1
            }
            AttentionKind::ChunkedLocal { chunk } => chunk
                .saturating_add(max_num_batched_tokens)
                .min(max_model_len)
                .div_ceil(b),
        }
    }
}

/// The block sizes the groups imply: `(scheduler, hash)`. The scheduler's
/// is the least common multiple of the group block sizes (a prefix hit is a
/// whole number of blocks in every group); hashes are chained at their
/// greatest common divisor, so every group's block ends on a hash boundary.
/// Without prefix caching vLLM hashes nothing and sets both to the LCM.
pub fn block_layout(
    groups: &[KvCacheGroupSpec],
    default_block_size: usize,
    prefix_caching: bool,
) -> (usize, usize) {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut lcm = 0usize;
    let mut g = 0usize;
    for s in groups.iter().map(|s| s.block_size_or(default_block_size)) {
        g = gcd(g, s);
        lcm = if lcm == 0 {
            s
        } else {
            // Saturating: absurd sizes are refused by the callers' bounds.
            (lcm / gcd(lcm, s)).saturating_mul(s)
        };
    }
    if lcm == 0 {
        return (default_block_size, default_block_size);
    }
    if prefix_caching {
        (lcm, g)
    } else {
        (lcm, lcm)
    }
}
