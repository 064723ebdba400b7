//! The KV cache coordinator (vLLM's `KVCacheCoordinator`): the groups of a
//! model behind one interface, sharing one block pool.
//!
//! `Unitary` is the one-group case every plain decoder has (vLLM's
//! `UnitaryKVCacheCoordinator`): each call goes straight to its manager, so
//! the hot path pays no indirection. `Hybrid` holds one manager per group
//! (vLLM's `HybridKVCacheCoordinator`): an allocation is counted over all
//! groups before any group takes a block (all or nothing), a prefix-cache
//! hit is the length every group agrees on, and a request's tables are
//! freed group after group, in group order.

use super::full_attention::FullAttentionManager;
use super::single_type::SingleTypeKvCacheManager;
use super::GroupId;
use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;
use crate::request::{BlockId, TokenId};

/// A request's prefix-cache hit: the hit blocks of each group, in group
/// order. Kept in the scheduler's scratch between steps, so a lookup
/// allocates nothing once warm.
#[derive(Debug, Default, Clone)]
pub struct ComputedBlocks {
    per_group: Vec<Vec<BlockId>>,
}

impl ComputedBlocks {
    pub fn new(num_groups: usize) -> Self {
        ComputedBlocks {
            per_group: vec![Vec::new(); num_groups],
        }
    }

    /// The hit blocks of `group`.
    pub fn group(&self, group: GroupId) -> &[BlockId] {
        self.per_group.get(group.index()).map_or(&[], Vec::as_slice)
    }

    /// No group has a hit block.
    pub fn is_empty(&self) -> bool {
        self.per_group.iter().all(Vec::is_empty)
    }

    pub fn clear(&mut self) {
        self.per_group.iter_mut().for_each(Vec::clear);
    }

    fn resize(&mut self, num_groups: usize) {
        self.per_group.resize_with(num_groups, Vec::new);
    }
}

#[derive(Debug)]
pub enum KvCacheCoordinator {
    /// One full-attention group.
    Unitary(FullAttentionManager),
    /// Several groups, one manager each, in group order.
    Hybrid(Vec<Box<dyn SingleTypeKvCacheManager>>),
}

impl KvCacheCoordinator {
    pub fn num_groups(&self) -> usize {
        match self {
            KvCacheCoordinator::Unitary(_) => 1,
            KvCacheCoordinator::Hybrid(m) => m.len(),
        }
    }

    /// The manager of `group`.
    pub fn manager(&self, group: GroupId) -> Option<&dyn SingleTypeKvCacheManager> {
        match self {
            KvCacheCoordinator::Unitary(m) => (group.0 == 0).then_some(m as _),
            KvCacheCoordinator::Hybrid(v) => v.get(group.index()).map(|m| &**m),
        }
    }

    #[inline]
    pub fn block_ids(&self, group: GroupId, slot: usize) -> &[BlockId] {
        match self {
            KvCacheCoordinator::Unitary(m) if group.0 == 0 => m.block_ids(slot),
            KvCacheCoordinator::Unitary(_) => &[],
            KvCacheCoordinator::Hybrid(v) => {
                v.get(group.index()).map_or(&[], |m| m.block_ids(slot))
            }
        }
    }

    /// The longest hit every group can use within `max_tokens` tokens, its
    /// blocks per group in `hit`. With several groups each is asked in
    /// turn with the current bound, which shrinks to its answer, until a
    /// whole pass leaves the bound unchanged: then every group's blocks
    /// cover exactly the agreed length.
    pub fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        hit: &mut ComputedBlocks,
    ) -> usize {
        match self {
            KvCacheCoordinator::Unitary(m) => {
                hit.resize(1);
                m.find_longest_cache_hit(pool, hashes, max_tokens, &mut hit.per_group[0])
            }
            KvCacheCoordinator::Hybrid(managers) => {
                hit.resize(managers.len());
                let mut bound = max_tokens;
                loop {
                    let mut shrunk = false;
                    for (m, blocks) in managers.iter().zip(&mut hit.per_group) {
                        let found = m.find_longest_cache_hit(pool, hashes, bound, blocks);
                        if found < bound {
                            bound = found;
                            shrunk = true;
                        }
                    }
                    if !shrunk {
                        return bound;
                    }
                }
            }
        }
    }

    /// Releases blocks every group's kind no longer reads.
    pub fn remove_skipped_blocks(&mut self, pool: &mut BlockPool, slot: usize, computed: usize) {
        if let KvCacheCoordinator::Hybrid(managers) = self {
            for m in managers {
                m.remove_skipped_blocks(pool, slot, computed);
            }
        }
    }

    /// Blocks all groups together must take from the free queue.
    #[inline]
    pub fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: Option<&ComputedBlocks>,
    ) -> usize {
        match self {
            KvCacheCoordinator::Unitary(m) => {
                let h = hit.map_or(&[][..], |h| h.group(GroupId(0)));
                m.get_num_blocks_to_allocate(pool, slot, num_tokens, h)
            }
            KvCacheCoordinator::Hybrid(managers) => managers
                .iter()
                .map(|m| {
                    let h = hit.map_or(&[][..], |h| h.group(m.group()));
                    m.get_num_blocks_to_allocate(pool, slot, num_tokens, h)
                })
                .sum(),
        }
    }

    /// Every group adopts its hit and takes its fresh blocks, in group
    /// order (after every group's hit blocks left the free queue, as
    /// vLLM's `allocate_new_computed_blocks` precedes `allocate_new_blocks`).
    /// Returns group 0's fresh blocks.
    pub fn allocate(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: Option<&ComputedBlocks>,
        reserve_tokens: usize,
    ) -> usize {
        match self {
            KvCacheCoordinator::Unitary(m) => {
                let h = hit.map_or(&[][..], |h| h.group(GroupId(0)));
                m.allocate(pool, slot, num_tokens, h, reserve_tokens)
            }
            KvCacheCoordinator::Hybrid(managers) => {
                if let Some(hit) = hit {
                    for m in managers.iter_mut() {
                        let h = hit.group(m.group());
                        if !h.is_empty() {
                            m.allocate(pool, slot, 0, h, reserve_tokens);
                        }
                    }
                }
                let mut first = 0;
                for (g, m) in managers.iter_mut().enumerate() {
                    let fresh = m.allocate(pool, slot, num_tokens, &[], reserve_tokens);
                    if g == 0 {
                        first = fresh;
                    }
                }
                first
            }
        }
    }

    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        hashes: &[BlockHash],
        tokens: &[TokenId],
        num_tokens: usize,
    ) {
        match self {
            KvCacheCoordinator::Unitary(m) => {
                m.cache_blocks(pool, slot, hashes, tokens, num_tokens)
            }
            KvCacheCoordinator::Hybrid(managers) => {
                for m in managers {
                    m.cache_blocks(pool, slot, hashes, tokens, num_tokens);
                }
            }
        }
    }

    /// Frees the request's tables, group after group.
    pub fn free(&mut self, pool: &mut BlockPool, slot: usize) {
        match self {
            KvCacheCoordinator::Unitary(m) => m.free(pool, slot),
            KvCacheCoordinator::Hybrid(managers) => {
                for m in managers {
                    m.free(pool, slot);
                }
            }
        }
    }

    /// Every table of every group: (group, slot, blocks).
    pub fn tables(&self) -> Vec<(GroupId, usize, &[BlockId])> {
        let mut all = Vec::new();
        for g in 0..self.num_groups() {
            let group = GroupId(g as u32);
            if let Some(m) = self.manager(group) {
                all.extend(m.tables().map(|(slot, t)| (group, slot, t)));
            }
        }
        all
    }
}
