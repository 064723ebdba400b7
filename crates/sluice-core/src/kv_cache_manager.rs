//! The KV cache manager: answers the scheduler's two questions.
//!
//! "What is already cached for this request?" (`get_computed_blocks`, no side
//! effects) and "give me room for `n` more tokens" (`allocate_slots`, which
//! either succeeds completely or changes nothing). It owns every block table;
//! the scheduler only ever holds block ids it reads back from here.
//!
//! Tables are indexed by the scheduler's request slot so that the per-step hot
//! path does no hashing of request ids.

use crate::block_hash::BlockHasher;
use crate::block_pool::BlockPool;
use crate::config::{at_most, MAX_BLOCK_SIZE, MAX_MODEL_LEN};
use crate::error::FieldError;
use crate::request::{BlockId, Request, RequestStatus};
use crate::stats::PrefixCacheStats;

#[derive(Debug, Default, Clone)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    /// Leading blocks of `blocks` already registered in the prefix cache.
    num_cached: usize,
}

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    max_model_len: usize,
    watermark_blocks: usize,
    hasher: Option<BlockHasher>,
    tables: Vec<RequestBlocks>,
    stats: PrefixCacheStats,
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

impl KvCacheManager {
    /// `hasher` is `Some` exactly when prefix caching is enabled. Sizes are
    /// checked here too (the errors name the `SchedulerConfig` field), not
    /// only by `SchedulerConfig::validate_basic`, because the pool is
    /// allocated here: an absurd size is an error, never an abort.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        watermark: f64,
        hasher: Option<BlockHasher>,
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
            block_size,
            max_model_len,
            watermark_blocks: (watermark * num_blocks as f64).floor() as usize,
            hasher,
            tables: Vec::new(),
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
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// The block table of the request in `slot`.
    pub fn block_ids(&self, slot: usize) -> &[BlockId] {
        self.tables.get(slot).map_or(&[], |t| &t.blocks)
    }

    pub(crate) fn num_cached_blocks(&self, slot: usize) -> usize {
        self.tables.get(slot).map_or(0, |t| t.num_cached)
    }

    /// The longest run of cached blocks for `req` that leaves at least one
    /// token to compute (its logits are needed), written to `hit_blocks`.
    /// Returns the hit in tokens, a multiple of the block size.
    pub fn get_computed_blocks(&self, req: &Request, hit_blocks: &mut Vec<BlockId>) -> usize {
        hit_blocks.clear();
        if self.hasher.is_none() || !req.reads_prefix_cache() {
            return 0;
        }
        let max_len = req.num_tokens() - 1;
        let max_blocks = (max_len / self.block_size).min(req.block_hashes.len());
        for h in &req.block_hashes[..max_blocks] {
            match self.pool.get_cached_block(h) {
                Some(b) => hit_blocks.push(b),
                // Hashes are chained: every later block misses too.
                None => break,
            }
        }
        hit_blocks.len() * self.block_size
    }

    /// Blocks a table needs to hold `num_tokens`, counting prefix-hit blocks
    /// that are free (touching them takes them out of the free queue).
    fn blocks_needed(&self, held: usize, num_tokens: usize, hit_blocks: &[BlockId]) -> usize {
        let required = cdiv(num_tokens, self.block_size);
        let evictable = hit_blocks
            .iter()
            .filter(|&&b| self.pool.ref_cnt(b) == 0)
            .count();
        required.saturating_sub(held + hit_blocks.len()) + evictable
    }

    /// Makes room for `num_new_tokens` more tokens of `req` (plus lookahead),
    /// adopting `hit_blocks` (the prefix hit of `hit_tokens` tokens) on a first
    /// allocation. With `full_sequence_must_fit` (the admission gate), it also
    /// requires room for all of the request's known tokens. Returns the number
    /// of freshly popped blocks, now at the end of the table, or `None` with no
    /// side effect when the pool is too small.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_slots(
        &mut self,
        slot: usize,
        req: &Request,
        num_new_tokens: usize,
        hit_tokens: usize,
        hit_blocks: &[BlockId],
        num_lookahead_tokens: usize,
        full_sequence_must_fit: bool,
        has_scheduled_reqs: bool,
    ) -> Option<usize> {
        debug_assert!(num_new_tokens > 0 || hit_tokens > 0, "nothing to allocate");
        let held = self.block_ids(slot).len();
        let total_computed = (req.num_computed_tokens + hit_tokens).min(self.max_model_len);
        let watermark = if has_scheduled_reqs
            && matches!(
                req.status,
                RequestStatus::Waiting | RequestStatus::Preempted
            ) {
            self.watermark_blocks
        } else {
            0
        };
        let free = self.pool.num_free_blocks();
        if full_sequence_must_fit {
            let full = req.num_tokens().min(self.max_model_len);
            if self.blocks_needed(held, full, hit_blocks) + watermark > free {
                return None;
            }
        }
        let slot_tokens =
            (total_computed + num_new_tokens + num_lookahead_tokens).min(self.max_model_len);
        if self.blocks_needed(held, slot_tokens, hit_blocks) + watermark > free {
            return None;
        }

        // Both checks passed: from here on nothing can fail.
        let block_size = self.block_size;
        let Self { pool, tables, .. } = self;
        if slot >= tables.len() {
            tables.resize_with(slot + 1, RequestBlocks::default);
        }
        let table = &mut tables[slot];
        if table.blocks.is_empty() {
            // Room for every block the request can ever hold, so that its
            // table never reallocates while it decodes.
            // Saturating: `max_tokens` is the caller's and may be huge.
            let max_tokens = req
                .num_prompt_tokens
                .saturating_add(req.max_tokens())
                .min(self.max_model_len);
            let want = cdiv(max_tokens + num_lookahead_tokens, block_size);
            table.blocks.reserve(want);
        }
        if !hit_blocks.is_empty() {
            pool.touch(hit_blocks);
            table.blocks.extend_from_slice(hit_blocks);
            table.num_cached = table.blocks.len();
        }
        let want = cdiv(slot_tokens, block_size).saturating_sub(table.blocks.len());
        pool.get_new_blocks(want, &mut table.blocks);
        let to_cache = (total_computed + num_new_tokens).min(req.num_tokens());
        self.cache_blocks(slot, req, to_cache);
        Some(want)
    }

    /// Registers the request's full blocks among its first `num_tokens` tokens
    /// in the prefix cache (incrementally: only blocks not yet registered).
    pub fn cache_blocks(&mut self, slot: usize, req: &Request, num_tokens: usize) {
        if self.hasher.is_none() {
            return;
        }
        let full = num_tokens.min(req.block_hashes.len() * self.block_size) / self.block_size;
        let Self { pool, tables, .. } = self;
        let Some(table) = tables.get_mut(slot) else {
            return;
        };
        if table.num_cached >= full {
            return;
        }
        let start = table.num_cached;
        let b = self.block_size;
        pool.cache_full_blocks(
            &table.blocks[start..full],
            &req.block_hashes[start..full],
            start.checked_sub(1).map(|p| &req.block_hashes[p]),
            &req.all_token_ids()[start * b..full * b],
            b,
        );
        table.num_cached = full;
    }

    /// Frees the request's blocks, last block first, and forgets its table.
    pub fn free(&mut self, slot: usize) {
        let Self { pool, tables, .. } = self;
        if let Some(t) = tables.get_mut(slot) {
            pool.free_blocks(t.blocks.iter().rev().copied());
            t.blocks.clear();
            t.num_cached = 0;
        }
    }

    /// Counts an admission's lookup (only admissions are counted, so a lookup
    /// that then failed to fit is not).
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

    /// Every non-null block in any table, with its multiplicity, for the
    /// invariant checks.
    pub(crate) fn tables(&self) -> impl Iterator<Item = (usize, &[BlockId])> {
        self.tables
            .iter()
            .enumerate()
            .map(|(i, t)| (i, t.blocks.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::HashAlgo;
    use crate::request::NewRequest;
    use crate::sampling_params::SamplingParams;

    fn manager(num_blocks: usize, block_size: usize, caching: bool) -> KvCacheManager {
        let hasher = caching.then(|| BlockHasher::new(HashAlgo::Sha256, block_size, None));
        KvCacheManager::new(num_blocks, block_size, 4096, 0.0, hasher).unwrap()
    }

    fn request(m: &KvCacheManager, prompt: Vec<u32>) -> Request {
        Request::from_new(
            NewRequest::new("r", prompt, SamplingParams::greedy(8)),
            m.hasher(),
        )
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_token() {
        let mut m = manager(16, 16, true);
        let a = request(&m, (0..32).collect());
        assert_eq!(m.allocate_slots(0, &a, 32, 0, &[], 0, true, false), Some(2));
        let b = request(&m, (0..32).collect());
        let mut hit = Vec::new();
        // max_len = 31: only the first block can hit.
        assert_eq!(m.get_computed_blocks(&b, &mut hit), 16);
        assert_eq!(hit, vec![1]);
        // A 33-token prompt with the same start hits both blocks.
        let c = request(&m, (0..33).collect());
        assert_eq!(m.get_computed_blocks(&c, &mut hit), 32);
        assert_eq!(hit, vec![1, 2]);
        // Lookups have no side effects.
        assert_eq!(m.pool().ref_cnt(1), 1);
    }

    #[test]
    fn prompt_logprobs_requests_never_read_the_cache() {
        let mut m = manager(16, 4, true);
        let a = request(&m, (0..9).collect());
        m.allocate_slots(0, &a, 9, 0, &[], 0, true, false).unwrap();
        let params = SamplingParams {
            prompt_logprobs: Some(1),
            ..SamplingParams::greedy(4)
        };
        let b = Request::from_new(NewRequest::new("b", (0..9).collect(), params), m.hasher());
        let mut hit = Vec::new();
        assert_eq!(m.get_computed_blocks(&b, &mut hit), 0);
    }

    /// `docs/scheduler-semantics.md` §Worked examples, E1 (B = 4, N = 10, a
    /// 10-token prompt).
    #[test]
    fn hits_revive_freed_blocks_and_the_gate_counts_them() {
        let mut m = manager(10, 4, true);
        let a = request(&m, (0..10).collect());
        assert_eq!(m.allocate_slots(0, &a, 10, 0, &[], 0, true, false), Some(3));
        assert_eq!(m.block_ids(0), &[1, 2, 3]);
        m.free(0);
        let queue: Vec<u32> = m.pool().free_queue().iter().collect();
        assert_eq!(queue, vec![3, 4, 5, 6, 7, 8, 9, 2, 1]);

        let b = request(&m, (0..10).collect());
        let mut hit = Vec::new();
        assert_eq!(m.get_computed_blocks(&b, &mut hit), 8);
        // Gate: 3 - 2 held/hit + 2 evictable hit blocks = 3 <= 9.
        assert_eq!(m.allocate_slots(1, &b, 2, 8, &hit, 0, true, false), Some(1));
        assert_eq!(m.block_ids(1), &[1, 2, 3]);
        assert_eq!(m.num_free_blocks(), 6);
    }

    #[test]
    fn without_caching_freed_blocks_are_reused_last_first() {
        let mut m = manager(10, 4, false);
        let a = request(&m, (0..10).collect());
        m.allocate_slots(0, &a, 10, 0, &[], 0, true, false).unwrap();
        m.free(0);
        let b = request(&m, (0..10).collect());
        let mut hit = Vec::new();
        assert_eq!(m.get_computed_blocks(&b, &mut hit), 0);
        m.allocate_slots(1, &b, 10, 0, &[], 0, true, false).unwrap();
        assert_eq!(m.block_ids(1), &[3, 2, 1]);
    }

    #[test]
    fn full_sequence_gate_needs_room_for_every_known_token() {
        let mut m = manager(5, 4, false); // 4 usable blocks
        let a = request(&m, (0..17).collect()); // needs 5 blocks in all
        assert_eq!(m.allocate_slots(0, &a, 4, 0, &[], 0, true, false), None);
        // A failed call changes nothing.
        assert_eq!(m.num_free_blocks(), 4);
        assert!(m.block_ids(0).is_empty());
        // Without the gate, the first chunk fits.
        assert_eq!(m.allocate_slots(0, &a, 4, 0, &[], 0, false, false), Some(1));
    }

    #[test]
    fn usage_and_prefix_stats() {
        let mut m = manager(5, 4, true);
        assert_eq!(m.usage(), 0.0);
        let a = request(&m, (0..8).collect());
        m.allocate_slots(0, &a, 8, 0, &[], 0, true, false).unwrap();
        assert_eq!(m.usage(), 0.5);
        m.record_prefix_cache_stats(&a, 4);
        let s = m.take_prefix_cache_stats();
        assert_eq!((s.requests, s.queries, s.hits), (1, 8, 4));
        assert_eq!(m.prefix_cache_stats().requests, 0);
        assert!(!m.reset_prefix_cache());
        m.free(0);
        assert!(m.reset_prefix_cache());
        assert!(m.prefix_cache_stats().reset);
    }
}
