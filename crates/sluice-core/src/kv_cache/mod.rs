//! The KV cache manager: answers the scheduler's two questions.
//!
//! "What is already cached for this request?" (`get_computed_blocks`, no
//! side effects) and "give me room for `n` more tokens" (`allocate_slots`,
//! which either succeeds completely or takes no block; a failed attempt may
//! still release blocks no layer reads any more, as vLLM's). It owns every
//! block table; the scheduler only ever holds block ids it reads back from
//! here.
//!
//! Shaped as vLLM 0.33's: this facade (`KVCacheManager`: the admission
//! gate, the watermark, prefix-cache stats) over a [`KvCacheCoordinator`]
//! of the model's KV cache groups ([`KvCacheGroupSpec`]), each kept by its
//! own [`SingleTypeKvCacheManager`] over one shared [`BlockPool`]: full
//! attention, sliding window and chunked local attention, each in its own
//! file; another kind of attention is one more manager.
//!
//! Tables are indexed by the scheduler's request slot so that the per-step
//! hot path does no hashing of request ids.

mod chunked_local;
mod coordinator;
mod full_attention;
mod group;
mod layer_groups;
mod single_type;
mod sliding_window;

pub use chunked_local::ChunkedLocalAttentionManager;
pub use coordinator::{ComputedBlocks, FreshBlocks, GroupsCoordinator, KvCacheCoordinator};
pub use full_attention::FullAttentionManager;
pub use group::{block_layout, AttentionKind, GroupId, KvCacheGroupSpec};
pub use layer_groups::{GroupingPolicy, LayerGroups};
pub use single_type::{CacheInput, GroupTables, SingleTypeKvCacheManager};
pub use sliding_window::SlidingWindowManager;

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
    /// Per slot: the shared-prefix boundary of the lookup that admitted the
    /// request (0: none), a position a sliding-window group keeps cached.
    shared_prefix_boundary: Vec<usize>,
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
        let unitary = FullAttentionManager::new(GroupId(0), block_size.max(1));
        Self::build(
            num_blocks,
            block_size,
            max_model_len,
            watermark,
            hasher,
            KvCacheCoordinator::Unitary(unitary),
        )
    }

    /// One manager per entry of `groups`, in order, over one pool.
    /// `block_size` is the default group block size; the manager's own is
    /// their least common multiple (`block_layout`), and `hasher` must chain
    /// hashes at their greatest common divisor. `max_num_batched_tokens`
    /// sizes the admission caps of the kinds that recycle blocks.
    pub fn with_groups(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        max_num_batched_tokens: usize,
        watermark: f64,
        hasher: Option<BlockHasher>,
        groups: &[KvCacheGroupSpec],
    ) -> Result<Self, FieldError> {
        if groups.is_empty() {
            return Err(FieldError::new("kv_cache_groups", "must not be empty"));
        }
        if block_size == 0 {
            return Err(FieldError::new("block_size", "must be at least 1"));
        }
        for (g, spec) in groups.iter().enumerate() {
            let b = spec.block_size_or(block_size);
            if b == 0 {
                return Err(FieldError::new(
                    "kv_cache_groups",
                    format!("group {g}: block_size must be at least 1"),
                ));
            }
            at_most("block_size", b, MAX_BLOCK_SIZE)?;
        }
        let caching = hasher.is_some();
        let (sched_bs, hash_bs) = block_layout(groups, block_size, caching);
        at_most("block_size", sched_bs, MAX_BLOCK_SIZE)?;
        if groups.len() == 1 && groups[0].kind == AttentionKind::Full {
            let b = groups[0].block_size_or(block_size);
            let unitary = FullAttentionManager::new(GroupId(0), b);
            return Self::build(
                num_blocks,
                b,
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
                let id = GroupId(g as u32);
                let b = spec.block_size_or(block_size);
                match spec.kind {
                    AttentionKind::Full => {
                        Box::new(FullAttentionManager::with_hash_block_size(id, b, hash_bs))
                    }
                    AttentionKind::SlidingWindow { window } => Box::new(SlidingWindowManager::new(
                        id,
                        window,
                        b,
                        hash_bs,
                        max_num_batched_tokens,
                        max_model_len,
                    )),
                    AttentionKind::ChunkedLocal { chunk } => {
                        Box::new(ChunkedLocalAttentionManager::new(
                            id,
                            chunk,
                            b,
                            hash_bs,
                            max_num_batched_tokens,
                            max_model_len,
                        ))
                    }
                }
            })
            .collect();
        let mut kv = Self::with_managers(
            num_blocks,
            sched_bs,
            max_model_len,
            watermark,
            hasher,
            managers,
        )?;
        // A model of several groups: its events name their group.
        kv.name_groups_in_events(groups, block_size);
        Ok(kv)
    }

    /// KV cache events name their group and its spec (vLLM's `group_idx`,
    /// `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`): always with
    /// several groups, and for one group when the caller wants the fields
    /// (a trace that names its groups).
    pub fn name_groups_in_events(&mut self, groups: &[KvCacheGroupSpec], block_size: usize) {
        let specs = groups
            .iter()
            .map(|g| g.with_block_size(g.block_size_or(block_size)))
            .collect();
        self.pool.set_group_specs(specs);
    }

    /// Over managers built elsewhere (a kind of attention this crate does
    /// not know yet, a test's): manager `i` must keep group `i`, with
    /// blocks dividing `block_size` (the scheduler block size).
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
            if m.block_size() == 0 || !block_size.is_multiple_of(m.block_size()) {
                return Err(FieldError::new(
                    "kv_cache_groups",
                    format!(
                        "group {g} has blocks of {} tokens, which do not divide the \
                         scheduler's {block_size}",
                        m.block_size()
                    ),
                ));
            }
        }
        let caching = hasher.is_some();
        let groups = GroupsCoordinator::new(managers, block_size);
        let coordinator = if caching {
            KvCacheCoordinator::Hybrid(groups)
        } else {
            KvCacheCoordinator::NoPrefixCache(groups)
        };
        Self::build(
            num_blocks,
            block_size,
            max_model_len,
            watermark,
            hasher,
            coordinator,
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
            shared_prefix_boundary: Vec::new(),
        })
    }

    /// The scheduler block size: the least common multiple of the groups'
    /// (a hit is a whole number of blocks in every group).
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

    /// Each group's block size, in group order.
    pub fn group_block_sizes(&self) -> Vec<usize> {
        (0..self.num_groups())
            .filter_map(|g| self.coordinator.manager(GroupId(g as u32)))
            .map(|m| m.block_size())
            .collect()
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
    /// `hit`. Returns the hit in tokens, a multiple of the scheduler block
    /// size.
    pub fn get_computed_blocks(&self, req: &Request, hit: &mut ComputedBlocks) -> usize {
        hit.clear();
        if self.hasher.is_none() || !req.reads_prefix_cache() {
            return 0;
        }
        let max_len = req.num_tokens() - 1;
        self.coordinator
            .find_longest_cache_hit(&self.pool, &req.block_hashes, max_len, hit)
    }

    /// Makes room for `r.num_new_tokens` more tokens of `req` in the tables
    /// of `slot` (see [`SlotRequest`]). Returns the number of each group's
    /// freshly popped blocks, now at the end of its table, or `None` with
    /// no allocation when the pool is too small (blocks out of a window may
    /// still have been released, as in vLLM).
    pub fn allocate_slots(
        &mut self,
        slot: usize,
        req: &Request,
        r: SlotRequest<'_>,
    ) -> Option<FreshBlocks> {
        debug_assert!(
            r.num_new_tokens > 0 || r.num_new_computed_tokens > 0,
            "nothing to allocate"
        );
        let local_computed = req.num_computed_tokens + r.num_new_computed_tokens;
        let total_computed = local_computed.min(self.max_model_len);
        let watermark = if r.has_scheduled_reqs
            && matches!(
                req.status,
                RequestStatus::Waiting | RequestStatus::Preempted
            ) {
            self.watermark_blocks
        } else {
            0
        };
        let hit = r.new_computed_blocks;
        if r.full_sequence_must_fit {
            let full = req.num_tokens().min(self.max_model_len);
            let need = self.coordinator.get_num_blocks_to_allocate(
                &self.pool,
                slot,
                full,
                hit,
                total_computed,
                true,
            );
            if need + watermark > self.pool.num_free_blocks() {
                return None;
            }
        }
        // Blocks the layers no longer read go back before counting, so they
        // count as free (and go even when the allocation then fails).
        self.coordinator
            .remove_skipped_blocks(&mut self.pool, slot, total_computed);
        let slot_tokens =
            (total_computed + r.num_new_tokens + r.num_lookahead_tokens).min(self.max_model_len);
        let need = self.coordinator.get_num_blocks_to_allocate(
            &self.pool,
            slot,
            slot_tokens,
            hit,
            local_computed,
            false,
        );
        if need + watermark > self.pool.num_free_blocks() {
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
        if let Some(h) = hit {
            if slot >= self.shared_prefix_boundary.len() {
                self.shared_prefix_boundary.resize(slot + 1, 0);
            }
            self.shared_prefix_boundary[slot] = h.shared_prefix_boundary;
        }
        let fresh = self.coordinator.allocate(
            &mut self.pool,
            slot,
            slot_tokens,
            hit.map(|h| (h, local_computed)),
            reserve,
        );
        let to_cache = (total_computed + r.num_new_tokens).min(req.num_tokens());
        self.cache_blocks(slot, req, to_cache);
        Some(fresh)
    }

    /// Registers the request's full blocks among its first `num_tokens`
    /// tokens in the prefix cache (incrementally: only blocks not yet
    /// registered), in every group, each keeping what its kind can hit.
    pub fn cache_blocks(&mut self, slot: usize, req: &Request, num_tokens: usize) {
        if self.hasher.is_none() {
            return;
        }
        let mut boundaries = [req.num_prompt_tokens.saturating_sub(1), 0];
        let mut n = 1;
        if let Some(&f) = self.shared_prefix_boundary.get(slot) {
            if f > 0 {
                boundaries[1] = f;
                n = 2;
            }
        }
        let input = CacheInput {
            hashes: &req.block_hashes,
            tokens: req.all_token_ids(),
            boundaries: &boundaries[..n],
            alignment: self.block_size,
        };
        self.coordinator
            .cache_blocks(&mut self.pool, slot, input, num_tokens);
    }

    /// Frees the request's blocks (each group's table last block first,
    /// group after group) and forgets its tables.
    pub fn free(&mut self, slot: usize) {
        self.coordinator.free(&mut self.pool, slot);
        if let Some(f) = self.shared_prefix_boundary.get_mut(slot) {
            *f = 0;
        }
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
