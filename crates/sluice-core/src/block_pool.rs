//! The KV block pool: reference counts, the free queue and the prefix cache.
//!
//! Block 0 is the null block: never free, never in a full-attention table.
//! A block is in the free queue exactly when its reference count is 0; a free
//! block may still carry a hash, and then a later request can revive it with
//! `touch` (a prefix hit) until `get_new_blocks` pops and evicts it. Freeing
//! follows vLLM's order exactly, since it fixes which block ids later requests
//! receive: see `free_blocks`.
//!
//! With KV cache events on, the pool also queues what changed in its prefix
//! cache, in vLLM's terms and order (`kv_events.rs`): a `BlockStored` per
//! `cache_full_blocks` call, a `BlockRemoved` per evicted hash, an
//! `AllBlocksCleared` per successful reset. Off, the queue does not exist and
//! the hot path pays one branch.

use crate::block_hash::BlockHash;
use crate::config::{at_most, MAX_NUM_GPU_BLOCKS};
use crate::error::FieldError;
use crate::free_queue::FreeBlockQueue;
use crate::kv_cache::{GroupId, KvCacheGroupSpec};
use crate::kv_events::EventGroup;
use crate::kv_events::KvCacheEvent;
use crate::prefix_cache::{CacheKey, CachedBlockMap};
use crate::request::BlockId;
use smallvec::SmallVec;
use std::collections::HashMap;

pub const NULL_BLOCK: BlockId = 0;

#[derive(Debug)]
pub struct BlockPool {
    num_blocks: usize,
    enable_caching: bool,
    ref_cnt: Vec<u32>,
    hash: Vec<Option<CacheKey>>,
    free: FreeBlockQueue,
    cached: CachedBlockMap,
    evict_first: Vec<BlockId>,
    evict_last: Vec<BlockId>,
    /// Queued KV cache events; `None` when events are off.
    events: Option<Vec<KvCacheEvent>>,
    /// Second keys of a block beside its hash (vLLM's
    /// `cached_block_hashes_by_block`): the partial prompt-tail key a
    /// full-attention block larger than the hash block size gets. Empty for
    /// every layout with one block size.
    extra_keys: HashMap<BlockId, SmallVec<[CacheKey; 1]>>,
    /// Per group, what its events say of it (vLLM's `group_idx` and spec
    /// fields); empty for a model of one plain full-attention group, whose
    /// events carry none.
    group_specs: Vec<KvCacheGroupSpec>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, null block included. Refuses (naming
    /// `num_gpu_blocks`, the option it comes from) a pool without the null
    /// block, one past `MAX_NUM_GPU_BLOCKS`, or one whose bookkeeping cannot
    /// be allocated: everything here is sized up front, so nothing later
    /// allocates per block.
    pub fn new(num_blocks: usize, enable_caching: bool) -> Result<Self, FieldError> {
        const FIELD: &str = "num_gpu_blocks";
        if num_blocks == 0 {
            return Err(FieldError::new(
                FIELD,
                "a block pool needs at least the null block",
            ));
        }
        at_most(FIELD, num_blocks, MAX_NUM_GPU_BLOCKS)?;
        let oom = |what: &str, e: std::collections::TryReserveError| {
            FieldError::new(
                FIELD,
                format!("cannot allocate the {what} of {num_blocks} blocks: {e}"),
            )
        };
        let mut ref_cnt = Vec::new();
        ref_cnt
            .try_reserve_exact(num_blocks)
            .map_err(|e| oom("reference counts", e))?;
        ref_cnt.resize(num_blocks, 0);
        let mut hash = Vec::new();
        hash.try_reserve_exact(num_blocks)
            .map_err(|e| oom("block hashes", e))?;
        hash.resize(num_blocks, None);
        // `num_blocks <= MAX_NUM_GPU_BLOCKS`, so the ids fit a `BlockId`.
        let free = FreeBlockQueue::new(num_blocks, 1..num_blocks as BlockId)
            .map_err(|m| FieldError::new(FIELD, m))?;
        let cached = if enable_caching {
            CachedBlockMap::try_with_capacity(num_blocks).map_err(|m| FieldError::new(FIELD, m))?
        } else {
            CachedBlockMap::default()
        };
        Ok(BlockPool {
            num_blocks,
            enable_caching,
            ref_cnt,
            hash,
            free,
            cached,
            evict_first: Vec::new(),
            evict_last: Vec::new(),
            events: None,
            extra_keys: HashMap::new(),
            group_specs: Vec::new(),
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }
    pub fn caching_enabled(&self) -> bool {
        self.enable_caching
    }

    /// Fraction of usable blocks in use: `1 - free / (N - 1)`.
    pub fn usage(&self) -> f64 {
        let usable = self.num_blocks - 1;
        if usable == 0 {
            0.0
        } else {
            1.0 - self.free.len() as f64 / usable as f64
        }
    }

    /// Turns KV cache event queueing on or off (off drops the queue).
    pub fn set_kv_cache_events(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// Events name their group and its spec (a model of several groups).
    pub fn set_group_specs(&mut self, specs: Vec<KvCacheGroupSpec>) {
        self.group_specs = specs;
    }

    fn event_group(&self, group: GroupId) -> Option<EventGroup> {
        self.group_specs.get(group.index()).map(|s| EventGroup {
            group_idx: group.0,
            kind: s.event_kind_name(),
            sliding_window: s.sliding_window_tokens(),
        })
    }

    pub fn kv_cache_events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// The events queued since the last call, oldest first (vLLM's
    /// `take_events`).
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        match &mut self.events {
            Some(q) => std::mem::take(q),
            None => Vec::new(),
        }
    }

    pub fn ref_cnt(&self, block: BlockId) -> u32 {
        self.ref_cnt[block as usize]
    }
    pub fn block_hash(&self, block: BlockId) -> Option<&BlockHash> {
        self.hash[block as usize].as_ref().map(|k| &k.hash)
    }
    pub fn free_queue(&self) -> &FreeBlockQueue {
        &self.free
    }
    pub fn cached_map(&self) -> &CachedBlockMap {
        &self.cached
    }

    /// The earliest cached block for `hash`.
    pub fn get_cached_block(&self, hash: &BlockHash, group: GroupId) -> Option<BlockId> {
        self.cached.get(&CacheKey::new(*hash, group))
    }

    /// Pops `n` blocks from the free head into `out`, evicting any cached hash
    /// they carry. The caller has checked `n <= num_free_blocks()`.
    pub fn get_new_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) {
        assert!(
            n <= self.free.len(),
            "cannot get {n} free blocks from the pool"
        );
        for _ in 0..n {
            let Some(b) = self.free.pop_front() else {
                unreachable!("free queue shorter than its count");
            };
            if self.enable_caching {
                self.evict(b);
            }
            debug_assert_eq!(self.ref_cnt[b as usize], 0);
            self.ref_cnt[b as usize] = 1;
            out.push(b);
        }
    }

    /// vLLM's `_maybe_evict_cached_block`: drops the block's hash, with a
    /// `BlockRemoved` for it if the map held it.
    fn evict(&mut self, block: BlockId) {
        if let Some(k) = self.hash[block as usize].take() {
            if self.cached.remove(&k, block) {
                self.removed(&k);
            }
        }
        if !self.extra_keys.is_empty() {
            for k in self.extra_keys.remove(&block).unwrap_or_default() {
                if self.cached.remove(&k, block) {
                    self.removed(&k);
                }
            }
        }
    }

    /// vLLM's `cache_partial_block` for a block already registered whole:
    /// adds `key` as a second key of `block` (the prompt's last hash boundary
    /// inside it, `tokens` the hash block ending there, `parent` the hash
    /// before it), with a `BlockStored` of that one hash block the first
    /// time.
    pub fn cache_partial_block(
        &mut self,
        block: BlockId,
        key: CacheKey,
        parent: Option<&BlockHash>,
        tokens: &[u32],
    ) {
        if block == NULL_BLOCK {
            return;
        }
        if self.hash[block as usize] == Some(key) || self.cached.contains(&key, block) {
            return;
        }
        if self.hash[block as usize].is_none() {
            self.hash[block as usize] = Some(key);
        } else {
            self.extra_keys.entry(block).or_default().push(key);
        }
        self.cached.insert(key, block);
        let event_group = self.event_group(key.group);
        if let Some(q) = &mut self.events {
            q.push(KvCacheEvent::BlockStored {
                block_hashes: vec![key.hash.external()],
                parent_block_hash: parent.map(BlockHash::external),
                token_ids: tokens.to_vec(),
                block_size: tokens.len(),
                lora_id: None,
                medium: None,
                group: event_group,
            });
        }
    }

    fn removed(&mut self, k: &CacheKey) {
        let group_idx = self.event_group(k.group).map(|g| g.group_idx);
        if let Some(q) = &mut self.events {
            q.push(KvCacheEvent::BlockRemoved {
                block_hashes: vec![k.hash.external()],
                medium: None,
                group_idx,
            });
        }
    }

    /// Takes a reference on prefix-hit blocks, unlinking free ones.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if b == NULL_BLOCK {
                continue;
            }
            if self.ref_cnt[b as usize] == 0 {
                self.free.remove(b);
            }
            self.ref_cnt[b as usize] += 1;
        }
    }

    /// Drops one reference on each block, given in eviction order (the caller
    /// passes a block table reversed). Blocks reaching zero without a hash (or
    /// with caching off) go to the head, in that order, to be reused first;
    /// hashed ones go to the tail, to be evicted last.
    pub fn free_blocks(&mut self, ordered: impl Iterator<Item = BlockId>) {
        let mut first = std::mem::take(&mut self.evict_first);
        let mut last = std::mem::take(&mut self.evict_last);
        for b in ordered {
            if b == NULL_BLOCK {
                continue;
            }
            let rc = &mut self.ref_cnt[b as usize];
            debug_assert!(*rc > 0, "double free of block {b}");
            *rc -= 1;
            if *rc == 0 {
                if self.enable_caching && self.hash[b as usize].is_some() {
                    last.push(b);
                } else {
                    first.push(b);
                }
            }
        }
        self.free.prepend_n(&first);
        self.free.append_n(&last);
        first.clear();
        last.clear();
        self.evict_first = first;
        self.evict_last = last;
    }

    /// Registers `blocks[i]` under `hash(i)` for each block whose `keep(i)`
    /// holds. `parent` (the hash of the block before `blocks[0]`, `None` for
    /// a request's first block), `token_ids` (the blocks' tokens, kept or
    /// not) and `block_size` only feed the `BlockStored` event, which, as in
    /// vLLM, lists every kept non-null block of the call, also those already
    /// registered, and is published even when none is kept.
    #[allow(clippy::too_many_arguments)]
    pub fn cache_full_blocks(
        &mut self,
        group: GroupId,
        blocks: &[BlockId],
        hash: &dyn Fn(usize) -> BlockHash,
        keep: &dyn Fn(usize) -> bool,
        parent: Option<&BlockHash>,
        token_ids: &[u32],
        block_size: usize,
    ) {
        if blocks.is_empty() {
            return;
        }
        for (i, &b) in blocks.iter().enumerate() {
            if b == NULL_BLOCK || !keep(i) {
                continue;
            }
            let key = CacheKey::new(hash(i), group);
            if self.hash[b as usize] == Some(key) || self.cached.contains(&key, b) {
                continue;
            }
            if let Some(old) = self.hash[b as usize].take() {
                // A block belongs to one group's table at a time and is
                // hashed once; stay consistent anyway (vLLM reports the old
                // hash removed).
                if self.cached.remove(&old, b) {
                    self.removed(&old);
                }
            }
            self.hash[b as usize] = Some(key);
            self.cached.insert(key, b);
        }
        let event_group = self.event_group(group);
        if let Some(q) = &mut self.events {
            q.push(KvCacheEvent::BlockStored {
                block_hashes: blocks
                    .iter()
                    .enumerate()
                    .filter(|&(i, &b)| b != NULL_BLOCK && keep(i))
                    .map(|(i, _)| hash(i).external())
                    .collect(),
                parent_block_hash: parent.map(BlockHash::external),
                token_ids: token_ids.to_vec(),
                block_size,
                lora_id: None,
                medium: None,
                group: event_group,
            });
        }
    }

    /// Drops every cached hash. Succeeds only when no block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.free.len() != self.num_blocks - 1 {
            return false;
        }
        self.cached.clear(); // keeps its capacity
        self.hash.iter_mut().for_each(|h| *h = None);
        self.extra_keys.clear();
        if let Some(q) = &mut self.events {
            q.push(KvCacheEvent::AllBlocksCleared);
        }
        true
    }

    /// Invariants of the pool alone (`docs/scheduler-semantics.md`
    /// §Invariants, I20, I22, I24 and I27).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.free.check_consistency()?;
        if self.free.contains(NULL_BLOCK) {
            return Err("null block is in the free queue".into());
        }
        for b in 1..self.num_blocks as BlockId {
            let in_queue = self.free.contains(b);
            let rc = self.ref_cnt[b as usize];
            if in_queue != (rc == 0) {
                return Err(format!("block {b}: ref_cnt {rc} but in_queue={in_queue}"));
            }
            if let Some(k) = &self.hash[b as usize] {
                if !self.cached.contains(k, b) {
                    return Err(format!("block {b} has a hash the map does not hold"));
                }
            }
        }
        for (k, blocks) in self.cached.iter() {
            for &b in blocks {
                let second = self.extra_keys.get(&b).is_some_and(|ks| ks.contains(k));
                if self.hash[b as usize].as_ref() != Some(k) && !second {
                    return Err(format!("map entry for block {b} does not match its hash"));
                }
            }
        }
        if !self.enable_caching
            && (!self.cached.is_empty() || self.hash.iter().any(Option::is_some))
        {
            return Err("caching is off but a block carries a hash".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G0: GroupId = GroupId(0);

    fn h(x: u8) -> BlockHash {
        BlockHash([x; 32])
    }

    fn queue(p: &BlockPool) -> Vec<BlockId> {
        p.free_queue().iter().collect()
    }

    #[test]
    fn absurd_pools_are_refused_not_allocated() {
        for n in [0, MAX_NUM_GPU_BLOCKS + 1, 1 << 31, usize::MAX] {
            let e = BlockPool::new(n, true).unwrap_err();
            assert_eq!(e.field, "num_gpu_blocks", "{n}: {e}");
        }
    }

    #[test]
    fn null_block_is_reserved() {
        let p = BlockPool::new(5, false).unwrap();
        assert_eq!(queue(&p), vec![1, 2, 3, 4]);
        assert_eq!(p.num_free_blocks(), 4);
        assert_eq!(p.usage(), 0.0);
    }

    #[test]
    fn without_caching_the_pool_is_a_lifo_stack() {
        let mut p = BlockPool::new(10, false).unwrap();
        let mut a = Vec::new();
        p.get_new_blocks(3, &mut a);
        assert_eq!(a, vec![1, 2, 3]);
        p.free_blocks(a.iter().rev().copied());
        // Freed [1,2,3] reversed: the head is 3, 2, 1.
        assert_eq!(&queue(&p)[..4], &[3, 2, 1, 4]);
        let mut b = Vec::new();
        p.get_new_blocks(2, &mut b);
        assert_eq!(b, vec![3, 2]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn with_caching_hashed_blocks_go_to_the_tail_for_lru() {
        // docs/scheduler-semantics.md §Worked examples, E1: B = 4, N = 10, a
        // 10-token prompt.
        let mut p = BlockPool::new(10, true).unwrap();
        let mut a = Vec::new();
        p.get_new_blocks(3, &mut a);
        p.cache_full_blocks(G0, &a[..2], &|i| [h(1), h(2)][i], &|_| true, None, &[], 4);
        p.free_blocks(a.iter().rev().copied());
        assert_eq!(queue(&p), vec![3, 4, 5, 6, 7, 8, 9, 2, 1]);
        assert_eq!(p.get_cached_block(&h(1), G0), Some(1));
        // A hit revives blocks 1 and 2 out of the free queue.
        p.touch(&[1, 2]);
        assert_eq!(p.num_free_blocks(), 7);
        assert_eq!(p.ref_cnt(1), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn popping_a_cached_free_block_evicts_its_hash() {
        let mut p = BlockPool::new(3, true).unwrap();
        let mut a = Vec::new();
        p.get_new_blocks(2, &mut a);
        p.cache_full_blocks(G0, &a, &|i| [h(1), h(2)][i], &|_| true, None, &[], 4);
        p.free_blocks(a.iter().rev().copied());
        assert_eq!(queue(&p), vec![2, 1]);
        let mut b = Vec::new();
        p.get_new_blocks(1, &mut b);
        assert_eq!(b, vec![2]);
        assert_eq!(p.get_cached_block(&h(2), G0), None);
        assert_eq!(p.get_cached_block(&h(1), G0), Some(1));
        p.check_invariants().unwrap();
    }

    #[test]
    fn shared_blocks_stay_out_of_the_queue_until_the_last_reference() {
        let mut p = BlockPool::new(4, true).unwrap();
        let mut a = Vec::new();
        p.get_new_blocks(1, &mut a);
        p.cache_full_blocks(G0, &a, &|i| [h(9)][i], &|_| true, None, &[], 4);
        p.touch(&a);
        p.free_blocks(a.iter().copied());
        assert_eq!(p.num_free_blocks(), 2);
        p.free_blocks(a.iter().copied());
        assert_eq!(p.num_free_blocks(), 3);
        assert_eq!(queue(&p).last(), Some(&1));
    }

    #[test]
    fn events_follow_vllms_block_pool() {
        use crate::kv_events::KvCacheEvent as E;
        let mut p = BlockPool::new(3, true).unwrap();
        p.set_kv_cache_events(true);
        let mut a = Vec::new();
        p.get_new_blocks(2, &mut a);
        p.cache_full_blocks(G0, &a[..1], &|i| [h(1)][i], &|_| true, None, &[5, 6], 2);
        p.cache_full_blocks(
            G0,
            &a[1..],
            &|i| [h(2)][i],
            &|_| true,
            Some(&h(1)),
            &[7, 8],
            2,
        );
        p.free_blocks(a.iter().rev().copied());
        let mut b = Vec::new();
        p.get_new_blocks(1, &mut b); // evicts block 2's hash
        p.free_blocks(b.iter().copied());
        assert!(p.reset_prefix_cache());
        let ext = |x: u8| h(x).external();
        assert_eq!(
            p.take_events(),
            vec![
                E::BlockStored {
                    block_hashes: vec![ext(1)],
                    parent_block_hash: None,
                    token_ids: vec![5, 6],
                    block_size: 2,
                    lora_id: None,
                    medium: None,
                    group: None,
                },
                E::BlockStored {
                    block_hashes: vec![ext(2)],
                    parent_block_hash: Some(ext(1)),
                    token_ids: vec![7, 8],
                    block_size: 2,
                    lora_id: None,
                    medium: None,
                    group: None,
                },
                E::BlockRemoved {
                    block_hashes: vec![ext(2)],
                    medium: None,
                    group_idx: None,
                },
                E::AllBlocksCleared,
            ]
        );
        assert!(p.take_events().is_empty());
        p.set_kv_cache_events(false);
        assert!(p.reset_prefix_cache());
        assert!(p.take_events().is_empty());
    }

    #[test]
    fn reset_prefix_cache_needs_an_idle_pool() {
        let mut p = BlockPool::new(4, true).unwrap();
        let mut a = Vec::new();
        p.get_new_blocks(1, &mut a);
        p.cache_full_blocks(G0, &a, &|i| [h(3)][i], &|_| true, None, &[], 4);
        assert!(!p.reset_prefix_cache());
        p.free_blocks(a.iter().copied());
        assert!(p.reset_prefix_cache());
        assert_eq!(p.get_cached_block(&h(3), G0), None);
        p.check_invariants().unwrap();
    }
}
