//! The KV cache coordinator (vLLM's `KVCacheCoordinator`): the groups of a
//! model behind one interface, sharing one block pool.
//!
//! Three shapes, as in vLLM:
//! - `Unitary`: one full-attention group (every plain decoder); each call
//!   goes straight to its manager, so the hot path pays no indirection.
//! - `Hybrid`: any groups with prefix caching on (vLLM's
//!   `HybridKVCacheCoordinator`, and its `UnitaryKVCacheCoordinator` over a
//!   single group of another kind): a hit is the fixed point every kind of
//!   group agrees on.
//! - `NoPrefixCache`: any groups with prefix caching off
//!   (`KVCacheCoordinatorNoPrefixCache`): no lookups, nothing registered.
//!
//! In every shape an allocation is counted over all groups before any group
//! takes a block (all or nothing), every group adopts its hit before any
//! group takes a fresh block, and a request's tables are freed group after
//! group, in group order.

use super::full_attention::FullAttentionManager;
use super::single_type::{CacheInput, SingleTypeKvCacheManager};
use super::{AttentionKind, GroupId, KvCacheGroupSpec};
use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;
use crate::request::BlockId;
use smallvec::SmallVec;

/// Fresh blocks per group of one allocation, in group order.
pub type FreshBlocks = SmallVec<[usize; 2]>;

/// A request's prefix-cache hit: the hit blocks of each group, in group
/// order, and where the first kind's hit ended (vLLM's shared-prefix
/// boundary when a later kind cut it short, else 0). Kept in the
/// scheduler's scratch between steps, so a lookup allocates nothing once
/// warm.
#[derive(Debug, Default, Clone)]
pub struct ComputedBlocks {
    per_group: Vec<Vec<BlockId>>,
    pub shared_prefix_boundary: usize,
}

impl ComputedBlocks {
    pub fn new(num_groups: usize) -> Self {
        ComputedBlocks {
            per_group: vec![Vec::new(); num_groups],
            shared_prefix_boundary: 0,
        }
    }

    /// The hit blocks of `group`.
    pub fn group(&self, group: GroupId) -> &[BlockId] {
        self.per_group.get(group.index()).map_or(&[], Vec::as_slice)
    }

    /// The hit list of `group`, to fill.
    pub fn list_mut(&mut self, group: GroupId) -> &mut Vec<BlockId> {
        if group.index() >= self.per_group.len() {
            self.per_group.resize_with(group.index() + 1, Vec::new);
        }
        &mut self.per_group[group.index()]
    }

    /// No group has a hit block.
    pub fn is_empty(&self) -> bool {
        self.per_group.iter().all(Vec::is_empty)
    }

    pub fn clear(&mut self) {
        self.per_group.iter_mut().for_each(Vec::clear);
        self.shared_prefix_boundary = 0;
    }

    fn resize(&mut self, num_groups: usize) {
        self.per_group.resize_with(num_groups, Vec::new);
    }
}

/// Groups of one spec, looked up together (vLLM's `SpecGroup`).
#[derive(Debug)]
struct Kind {
    groups: Vec<GroupId>,
    full: bool,
}

/// Several groups, one manager each, in group order.
#[derive(Debug)]
pub struct GroupsCoordinator {
    managers: Vec<Box<dyn SingleTypeKvCacheManager>>,
    /// Full-attention kinds first, then the others, each in order of first
    /// appearance.
    kinds: Vec<Kind>,
    /// The scheduler block size: hits are multiples of it.
    alignment: usize,
    /// One manager: vLLM's unitary coordinator (hits and registration at
    /// the group's own block size, no rounding).
    unitary: bool,
}

impl GroupsCoordinator {
    pub fn new(managers: Vec<Box<dyn SingleTypeKvCacheManager>>, alignment: usize) -> Self {
        let mut kinds: Vec<(KvCacheGroupSpec, Kind)> = Vec::new();
        for m in &managers {
            let spec = m.spec();
            match kinds.iter_mut().find(|(s, _)| *s == spec) {
                Some((_, k)) => k.groups.push(m.group()),
                None => kinds.push((
                    spec,
                    Kind {
                        groups: vec![m.group()],
                        full: spec.kind == AttentionKind::Full,
                    },
                )),
            }
        }
        // Stable: full attention first, its scan gives the tightest bound.
        kinds.sort_by_key(|(_, k)| !k.full);
        let unitary = managers.len() == 1;
        GroupsCoordinator {
            managers,
            kinds: kinds.into_iter().map(|(_, k)| k).collect(),
            alignment: alignment.max(1),
            unitary,
        }
    }

    /// vLLM's hybrid fixed point: each kind in turn answers with the
    /// current bound as its maximum and its answer becomes the bound (a
    /// full-attention kind is asked once, later only trimmed); passes repeat
    /// until one leaves the bound unchanged, except that one full kind and
    /// one other need a single pass.
    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        hit: &mut ComputedBlocks,
    ) -> usize {
        hit.resize(self.managers.len());
        hit.clear();
        let align = if self.unitary {
            self.managers[0].block_size()
        } else {
            self.alignment
        };
        let simple = self.kinds.len() == 2 && self.kinds[0].full;
        let mut bound = max_tokens;
        let mut full_answer: Option<usize> = None;
        let mut longest = 0;
        loop {
            let mut curr = bound;
            for kind in &self.kinds {
                if kind.full {
                    if let Some(a) = full_answer {
                        curr = curr.min(a);
                        continue;
                    }
                }
                let m = &self.managers[kind.groups[0].index()];
                curr = m.find_longest_cache_hit(pool, hashes, curr, align, &kind.groups, hit);
                if kind.full {
                    full_answer = Some(curr);
                }
                longest = longest.max(curr);
            }
            if curr >= bound {
                break;
            }
            bound = curr;
            if simple {
                break;
            }
        }
        for kind in self.kinds.iter().filter(|k| k.full) {
            for &g in &kind.groups {
                let b = self.managers[g.index()].block_size();
                hit.list_mut(g).truncate(bound.div_ceil(b));
            }
        }
        hit.shared_prefix_boundary = if longest > bound { longest } else { 0 };
        bound
    }

    /// The tokens a group may register after `num_tokens` are computed: a
    /// later hit can only end on the scheduler block size.
    fn cacheable(&self, num_tokens: usize) -> usize {
        if self.unitary {
            num_tokens
        } else {
            num_tokens / self.alignment * self.alignment
        }
    }
}

#[derive(Debug)]
pub enum KvCacheCoordinator {
    /// One full-attention group.
    Unitary(FullAttentionManager),
    /// Any groups, prefix caching on.
    Hybrid(GroupsCoordinator),
    /// Any groups, prefix caching off.
    NoPrefixCache(GroupsCoordinator),
}

impl KvCacheCoordinator {
    fn groups(&self) -> Option<&GroupsCoordinator> {
        match self {
            KvCacheCoordinator::Unitary(_) => None,
            KvCacheCoordinator::Hybrid(c) | KvCacheCoordinator::NoPrefixCache(c) => Some(c),
        }
    }

    fn groups_mut(&mut self) -> Option<&mut GroupsCoordinator> {
        match self {
            KvCacheCoordinator::Unitary(_) => None,
            KvCacheCoordinator::Hybrid(c) | KvCacheCoordinator::NoPrefixCache(c) => Some(c),
        }
    }

    pub fn num_groups(&self) -> usize {
        self.groups().map_or(1, |c| c.managers.len())
    }

    /// The manager of `group`.
    pub fn manager(&self, group: GroupId) -> Option<&dyn SingleTypeKvCacheManager> {
        match self {
            KvCacheCoordinator::Unitary(m) => (group.0 == 0).then_some(m as _),
            KvCacheCoordinator::Hybrid(c) | KvCacheCoordinator::NoPrefixCache(c) => {
                c.managers.get(group.index()).map(|m| &**m)
            }
        }
    }

    #[inline]
    pub fn block_ids(&self, group: GroupId, slot: usize) -> &[BlockId] {
        match self {
            KvCacheCoordinator::Unitary(m) if group.0 == 0 => m.block_ids(slot),
            _ => self.manager(group).map_or(&[], |m| m.block_ids(slot)),
        }
    }

    /// The longest prefix-cache hit within `max_tokens` tokens, its blocks
    /// per group in `hit`.
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
                hit.clear();
                let b = m.block_size();
                m.find_longest_cache_hit(pool, hashes, max_tokens, b, &[GroupId(0)], hit)
            }
            KvCacheCoordinator::Hybrid(c) => {
                c.find_longest_cache_hit(pool, hashes, max_tokens, hit)
            }
            KvCacheCoordinator::NoPrefixCache(c) => {
                hit.resize(c.managers.len());
                hit.clear();
                0
            }
        }
    }

    /// Releases blocks every group's kind no longer reads.
    pub fn remove_skipped_blocks(&mut self, pool: &mut BlockPool, slot: usize, computed: usize) {
        if let Some(c) = self.groups_mut() {
            for m in &mut c.managers {
                m.remove_skipped_blocks(pool, slot, computed);
            }
        }
    }

    /// Blocks all groups together must take from the free queue;
    /// `admission` applies each kind's admission cap.
    #[inline]
    pub fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: Option<&ComputedBlocks>,
        total_computed: usize,
        admission: bool,
    ) -> usize {
        let h = |g: GroupId| hit.map_or(&[][..], |h| h.group(g));
        match self {
            KvCacheCoordinator::Unitary(m) => m.get_num_blocks_to_allocate(
                pool,
                slot,
                num_tokens,
                h(GroupId(0)),
                total_computed,
                admission,
            ),
            KvCacheCoordinator::Hybrid(c) | KvCacheCoordinator::NoPrefixCache(c) => c
                .managers
                .iter()
                .map(|m| {
                    m.get_num_blocks_to_allocate(
                        pool,
                        slot,
                        num_tokens,
                        h(m.group()),
                        total_computed,
                        admission,
                    )
                })
                .sum(),
        }
    }

    /// Every group adopts its hit (when given), then every group takes its
    /// fresh blocks, in group order (vLLM's `allocate_new_computed_blocks`
    /// before `allocate_new_blocks`). Returns each group's fresh blocks.
    pub fn allocate(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: Option<(&ComputedBlocks, usize)>,
        reserve_tokens: usize,
    ) -> FreshBlocks {
        match self {
            KvCacheCoordinator::Unitary(m) => {
                if let Some((h, computed)) = hit {
                    if m.block_ids(slot).is_empty() {
                        m.add_hit(pool, slot, h.group(GroupId(0)), computed);
                    }
                }
                let mut fresh = FreshBlocks::new();
                fresh.push(m.allocate_new(pool, slot, num_tokens, reserve_tokens));
                fresh
            }
            KvCacheCoordinator::Hybrid(c) | KvCacheCoordinator::NoPrefixCache(c) => {
                if let Some((h, computed)) = hit {
                    for m in c.managers.iter_mut() {
                        if m.block_ids(slot).is_empty() {
                            m.add_hit(pool, slot, h.group(m.group()), computed);
                        }
                    }
                }
                c.managers
                    .iter_mut()
                    .map(|m| m.allocate_new(pool, slot, num_tokens, reserve_tokens))
                    .collect()
            }
        }
    }

    /// Registers the newly full blocks of every group (none without prefix
    /// caching).
    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        input: CacheInput<'_>,
        num_tokens: usize,
    ) {
        match self {
            KvCacheCoordinator::Unitary(m) => m.cache_blocks(pool, slot, input, num_tokens),
            KvCacheCoordinator::Hybrid(c) => {
                let n = c.cacheable(num_tokens);
                let input = CacheInput {
                    alignment: c.alignment,
                    ..input
                };
                for m in &mut c.managers {
                    m.cache_blocks(pool, slot, input, n);
                }
            }
            KvCacheCoordinator::NoPrefixCache(_) => {}
        }
    }

    /// Frees the request's tables, group after group.
    pub fn free(&mut self, pool: &mut BlockPool, slot: usize) {
        match self {
            KvCacheCoordinator::Unitary(m) => m.free(pool, slot),
            KvCacheCoordinator::Hybrid(c) | KvCacheCoordinator::NoPrefixCache(c) => {
                for m in &mut c.managers {
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
