//! The KV cache manager: answers the scheduler's two questions.
//!
//! "What is already cached for this request?" (`get_computed_blocks`, no
//! side effects) and "give me room for `n` more tokens" (`allocate_slots`,
//! which either succeeds completely or changes nothing). It owns every
//! block table; the scheduler only ever holds block ids it reads back from
//! here.
//!
//! Shaped as vLLM 0.33's: this facade (`KVCacheManager`: the admission
//! gate, the watermark, prefix-cache stats) over a [`KvCacheCoordinator`]
//! of the model's KV cache groups ([`KvCacheGroupSpec`]), each kept by its
//! own [`SingleTypeKvCacheManager`] over one shared [`BlockPool`]. Today's
//! models have one full-attention group; another kind of attention is one
//! more manager.
//!
//! Tables are indexed by the scheduler's request slot so that the per-step
//! hot path does no hashing of request ids.

mod coordinator;
mod full_attention;
mod group;
mod single_type;

pub use coordinator::{ComputedBlocks, KvCacheCoordinator};
pub use full_attention::FullAttentionManager;
pub use group::{GroupId, KvCacheGroupSpec};
pub use single_type::SingleTypeKvCacheManager;

use crate::block_hash::BlockHasher;
use crate::block_pool::BlockPool;
use crate::config::{at_most, MAX_BLOCK_SIZE, MAX_MODEL_LEN};
use crate::error::FieldError;
use crate::request::{BlockId, Request, RequestStatus};
use crate::stats::PrefixCacheStats;

/// What `allocate_slots` is asked for (vLLM's keyword arguments).
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotRequest<'a> {
    /// Tokens to compute this step.
    pub num_new_tokens: usize,
    /// Tokens of the prefix-cache hit adopted now (a first allocation).
    pub num_new_computed_tokens: usize,
    /// The hit's blocks per group (`get_computed_blocks`).
    pub new_computed_blocks: Option<&'a ComputedBlocks>,
    /// Extra slots for speculative tokens.
    pub num_lookahead_tokens: usize,
    /// The admission gate: also require room for all the request's known
    /// tokens.
    pub full_sequence_must_fit: bool,
    /// Other requests are scheduled this step (the watermark applies to a
    /// waiting or preempted request only then).
    pub has_scheduled_reqs: bool,
}

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    coordinator: KvCacheCoordinator,
    block_size: usize,
    max_model_len: usize,
    watermark_blocks: usize,
    hasher: Option<BlockHasher>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// One full-attention group. `hasher` is `Some` exactly when prefix
    /// caching is enabled. Sizes are checked here too (the errors name the
    /// `SchedulerConfig` field), not only by `SchedulerConfig::validate_basic`,
    /// because the pool is allocated here: an absurd size is an error, never
    /// an abort.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        watermark: f64,
        hasher: Option<BlockHasher>,
    ) -> Result<Self, FieldError> {
        Self::with_groups(
            num_blocks,
            block_size,
            max_model_len,
            watermark,
            hasher,
            &[KvCacheGroupSpec::Full],
        )
    }

    /// One manager per entry of `groups`, in order, over one pool.
    pub fn with_groups(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        watermark: f64,
        hasher: Option<BlockHasher>,
        groups: &[KvCacheGroupSpec],
    ) -> Result<Self, FieldError> {
        if let [KvCacheGroupSpec::Full] = groups {
            let unitary = FullAttentionManager::new(GroupId(0), block_size.max(1));
            return Self::build(
                num_blocks,
                block_size,
                max_model_len,
                watermark,
                hasher,
                KvCacheCoordinator::Unitary(unitary),
            );
        }
        let managers = groups
            .iter()
            .enumerate()
            .map(|(g, spec)| -> Box<dyn SingleTypeKvCacheManager> {
                match spec {
                    KvCacheGroupSpec::Full => {
                        Box::new(FullAttentionManager::new(GroupId(g as u32), block_size))
                    }
                }
            })
            .collect();
        Self::with_managers(
            num_blocks,
            block_size,
            max_model_len,
            watermark,
            hasher,
            managers,
        )
    }

    /// Over managers built elsewhere (a kind of attention this crate does
    /// not know yet, a test's): manager `i` must keep group `i`, with
    /// blocks of `block_size` tokens.
    pub fn with_managers(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        watermark: f64,
        hasher: Option<BlockHasher>,
        managers: Vec<Box<dyn SingleTypeKvCacheManager>>,
    ) -> Result<Self, FieldError> {
        if managers.is_empty() {
            return Err(FieldError::new("kv_cache_groups", "must not be empty"));
        }
        for (g, m) in managers.iter().enumerate() {
            if m.group() != GroupId(g as u32) {
                return Err(FieldError::new(
                    "kv_cache_groups",
                    format!("manager {g} keeps group {}", m.group().0),
                ));
            }
            if m.block_size() != block_size {
                return Err(FieldError::new(
                    "kv_cache_groups",
                    format!(
                        "group {g} has blocks of {} tokens, the scheduler's are {block_size}; \
                         groups of other block sizes are not supported",
                        m.block_size()
                    ),
                ));
            }
        }
        Self::build(
            num_blocks,
            block_size,
            max_model_len,
            watermark,
            hasher,
            KvCacheCoordinator::Hybrid(managers),
        )
    }

    fn build(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        watermark: f64,
        hasher: Option<BlockHasher>,
        coordinator: KvCacheCoordinator,
    ) -> Result<Self, FieldError> {
        if block_size == 0 {
            return Err(FieldError::new("block_size", "must be at least 1"));
        }
        at_most("block_size", block_size, MAX_BLOCK_SIZE)?;
        at_most("max_model_len", max_model_len, MAX_MODEL_LEN)?;
        if !(0.0..1.0).contains(&watermark) {
            return Err(FieldError::new(
                "watermark",
                format!("must be in [0, 1), got {watermark}"),
            ));
        }
        Ok(KvCacheManager {
            pool: BlockPool::new(num_blocks, hasher.is_some())?,
            coordinator,
            block_size,
            max_model_len,
            watermark_blocks: (watermark * num_blocks as f64).floor() as usize,
            hasher,
            stats: PrefixCacheStats::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn hasher(&self) -> Option<&BlockHasher> {
        self.hasher.as_ref()
    }
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn coordinator(&self) -> &KvCacheCoordinator {
        &self.coordinator
    }
    pub fn num_groups(&self) -> usize {
        self.coordinator.num_groups()
    }
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// The block table of the request in `slot`, in group 0.
    #[inline]
    pub fn block_ids(&self, slot: usize) -> &[BlockId] {
        self.coordinator.block_ids(GroupId(0), slot)
    }

    /// The block table of the request in `slot`, in `group`.
    pub fn group_block_ids(&self, group: GroupId, slot: usize) -> &[BlockId] {
        self.coordinator.block_ids(group, slot)
    }

    pub(crate) fn num_cached_blocks(&self, slot: usize) -> usize {
        self.coordinator
            .manager(GroupId(0))
            .map_or(0, |m| m.num_cached_blocks(slot))
    }

    /// The longest prefix-cache hit for `req` that leaves at least one
    /// token to compute (its logits are needed), its blocks per group in
    /// `hit`. Returns the hit in tokens, a multiple of the block size.
    pub fn get_computed_blocks(&self, req: &Request, hit: &mut ComputedBlocks) -> usize {
        hit.clear();
        if self.hasher.is_none() || !req.reads_prefix_cache() {
            return 0;
        }
        let max_len = req.num_tokens() - 1;
        self.coordinator
            .find_longest_cache_hit(&self.pool, &req.block_hashes, max_len, hit)
    }

    /// Makes room for `r.num_new_tokens` more tokens of `req` in the table
    /// of `slot` (see [`SlotRequest`]). Returns the number of group 0's
    /// freshly popped blocks, now at the end of its table, or `None` with
    /// no side effect when the pool is too small.
    pub fn allocate_slots(
        &mut self,
        slot: usize,
        req: &Request,
        r: SlotRequest<'_>,
    ) -> Option<usize> {
        debug_assert!(
            r.num_new_tokens > 0 || r.num_new_computed_tokens > 0,
            "nothing to allocate"
        );
        // Blocks the layers no longer read go back first, so they count as
        // free (and go even when the allocation then fails, as in vLLM).
        self.coordinator
            .remove_skipped_blocks(&mut self.pool, slot, req.num_computed_tokens);
        let total_computed =
            (req.num_computed_tokens + r.num_new_computed_tokens).min(self.max_model_len);
        let watermark = if r.has_scheduled_reqs
            && matches!(
                req.status,
                RequestStatus::Waiting | RequestStatus::Preempted
            ) {
            self.watermark_blocks
        } else {
            0
        };
        let free = self.pool.num_free_blocks();
        let hit = r.new_computed_blocks;
        if r.full_sequence_must_fit {
            let full = req.num_tokens().min(self.max_model_len);
            if self
                .coordinator
                .get_num_blocks_to_allocate(&self.pool, slot, full, hit)
                + watermark
                > free
            {
                return None;
            }
        }
        let slot_tokens =
            (total_computed + r.num_new_tokens + r.num_lookahead_tokens).min(self.max_model_len);
        if self
            .coordinator
            .get_num_blocks_to_allocate(&self.pool, slot, slot_tokens, hit)
            + watermark
            > free
        {
            return None;
        }

        // Both checks passed: from here on nothing can fail. A new table
        // gets room for every block the request can ever hold, so it never
        // reallocates while it decodes (saturating: `max_tokens` is the
        // caller's and may be huge).
        let reserve = req
            .num_prompt_tokens
            .saturating_add(req.max_tokens())
            .min(self.max_model_len)
            + r.num_lookahead_tokens;
        let fresh = self
            .coordinator
            .allocate(&mut self.pool, slot, slot_tokens, hit, reserve);
        let to_cache = (total_computed + r.num_new_tokens).min(req.num_tokens());
        self.cache_blocks(slot, req, to_cache);
        Some(fresh)
    }

    /// Registers the request's full blocks among its first `num_tokens`
    /// tokens in the prefix cache (incrementally: only blocks not yet
    /// registered), in every group.
    pub fn cache_blocks(&mut self, slot: usize, req: &Request, num_tokens: usize) {
        if self.hasher.is_none() {
            return;
        }
        self.coordinator.cache_blocks(
            &mut self.pool,
            slot,
            &req.block_hashes,
            req.all_token_ids(),
            num_tokens,
        );
    }

    /// Frees the request's blocks (each group's table last block first,
    /// group after group) and forgets its tables.
    pub fn free(&mut self, slot: usize) {
        self.coordinator.free(&mut self.pool, slot);
    }

    /// Counts an admission's lookup (only admissions are counted, so a
    /// lookup that then failed to fit is not).
    pub fn record_prefix_cache_stats(&mut self, req: &Request, hit_tokens: usize) {
        if self.hasher.is_none() || !req.reads_prefix_cache() {
            return;
        }
        let s = &mut self.stats;
        if req.num_preemptions > 0 {
            s.preempted_requests += 1;
            s.preempted_queries += req.num_tokens() as u64;
            s.preempted_hits += hit_tokens as u64;
        } else {
            s.requests += 1;
            s.queries += req.num_tokens() as u64;
            s.hits += hit_tokens as u64;
        }
    }

    /// The stats gathered since the last call; the counters restart.
    pub fn take_prefix_cache_stats(&mut self) -> PrefixCacheStats {
        std::mem::take(&mut self.stats)
    }

    pub fn prefix_cache_stats(&self) -> &PrefixCacheStats {
        &self.stats
    }

    /// Turns KV cache event queueing on or off (`kv_events.rs`).
    pub fn set_kv_cache_events(&mut self, on: bool) {
        self.pool.set_kv_cache_events(on);
    }

    /// The KV cache events queued since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<crate::kv_events::KvCacheEvent> {
        self.pool.take_events()
    }

    /// Drops every cached hash; only possible when no block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let ok = self.pool.reset_prefix_cache();
        if ok {
            self.stats.reset = true;
        }
        ok
    }

    /// Every table of every group, with its slot, for the invariant checks.
    pub(crate) fn tables(&self) -> Vec<(GroupId, usize, &[BlockId])> {
        self.coordinator.tables()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_groups;
