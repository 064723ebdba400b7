//! The per-group half of the KV cache manager (vLLM's
//! `SingleTypeKVCacheManager`): one implementation per kind of attention.
//!
//! A manager owns its group's block tables (one per request slot) and
//! answers for its kind: how long a prefix-cache hit it can use, which
//! blocks it may release early (replaced by the null block), how many
//! blocks admission must reserve, which full blocks it registers. It never
//! owns blocks itself: the pool is shared by every group and passed in, so
//! the coordinator can check an allocation across all groups before any
//! group takes a block.
//!
//! A new kind of attention is one more file implementing this trait,
//! usually over [`GroupTables`] (the bookkeeping every kind shares), plus
//! one arm in `KvCacheManager::with_groups`.

use super::{ComputedBlocks, GroupId, KvCacheGroupSpec};
use crate::block_hash::BlockHash;
use crate::block_pool::{BlockPool, NULL_BLOCK};
use crate::request::{BlockId, TokenId};
use std::fmt::Debug;

/// What `cache_blocks` needs beside the table: the request's chained hashes
/// (at the hash block size), its tokens, and the positions a later hit may
/// resume at (vLLM's replay boundaries: `prompt − 1` and the shared-prefix
/// junction of the admitting lookup, when there was one).
#[derive(Clone, Copy, Debug)]
pub struct CacheInput<'a> {
    pub hashes: &'a [BlockHash],
    pub tokens: &'a [TokenId],
    pub boundaries: &'a [usize],
    /// The scheduler block size (hits are multiples of it).
    pub alignment: usize,
}

/// A kind of attention's rules over its group's tables. A kind says what
/// differs — its hit rule, the tokens it no longer reads, its admission
/// cap, which blocks it registers — and inherits the rest, written once
/// over [`GroupTables`] (as vLLM's subclasses over their base class).
pub trait SingleTypeKvCacheManager: Debug + Send {
    /// The tables this manager keeps (the bookkeeping every kind shares).
    fn group_tables(&self) -> &GroupTables;

    fn group_tables_mut(&mut self) -> &mut GroupTables;

    /// The group's spec (its kind and block size).
    fn spec(&self) -> KvCacheGroupSpec;

    /// The group this manager keeps tables for.
    fn group(&self) -> GroupId {
        self.group_tables().group
    }

    /// Tokens per block of this group.
    fn block_size(&self) -> usize {
        self.group_tables().block_size
    }

    /// The block table of the request in `slot` (empty when it has none).
    fn block_ids(&self, slot: usize) -> &[BlockId] {
        self.group_tables().block_ids(slot)
    }

    /// Leading blocks of the table already registered in the prefix cache.
    fn num_cached_blocks(&self, slot: usize) -> usize {
        self.group_tables().num_cached(slot)
    }

    /// Leading blocks no layer of this kind reads once `num_computed_tokens`
    /// are computed.
    fn num_skipped_blocks(&self, num_computed_tokens: usize) -> usize {
        self.num_skipped_tokens(num_computed_tokens) / self.block_size()
    }

    /// Tokens no layer of this kind reads any more once
    /// `num_computed_tokens` are computed (vLLM's `get_num_skipped_tokens`).
    fn num_skipped_tokens(&self, _num_computed_tokens: usize) -> usize {
        0
    }

    /// The most blocks admission reserves for one request (vLLM's
    /// `max_admission_blocks_per_request`): a kind that recycles blocks never
    /// holds more than this at once. `None`: no cap.
    fn admission_cap_blocks(&self) -> Option<usize> {
        None
    }

    /// The longest prefix of `hashes` (chained at the hash block size) this
    /// kind can reuse within `max_tokens`, a multiple of `alignment`, for
    /// every group of `groups` at once (groups of one spec are looked up
    /// together: a position counts only when all of them hold it). The hit
    /// blocks of each group go to `hit` (the null block where the kind needs
    /// none); the hit's length in tokens is returned.
    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        alignment: usize,
        groups: &[GroupId],
        hit: &mut ComputedBlocks,
    ) -> usize;

    /// Releases the blocks of `slot` its kind no longer reads once
    /// `num_computed_tokens` tokens are computed, replacing them with the
    /// null block (vLLM's `remove_skipped_blocks`).
    fn remove_skipped_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_computed_tokens: usize,
    ) {
        let skipped = self.num_skipped_blocks(num_computed_tokens);
        if skipped > 0 {
            self.group_tables_mut().remove_leading(pool, slot, skipped);
        }
    }

    /// Blocks the table of `slot` must take from the free queue to hold
    /// `num_tokens` tokens after adopting `hit` (a first allocation's prefix
    /// hit, `total_computed` tokens computed with it); `admission` applies
    /// the kind's admission cap.
    fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: &[BlockId],
        total_computed: usize,
        admission: bool,
    ) -> usize {
        let skipped = self.num_skipped_blocks(total_computed);
        let cap = if admission {
            self.admission_cap_blocks()
        } else {
            None
        };
        self.group_tables()
            .num_blocks_to_allocate(pool, slot, num_tokens, hit, skipped, cap)
    }

    /// Adopts `hit` as the start of a new table (entries the kind no longer
    /// reads at `total_computed` become the null block).
    fn add_hit(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        hit: &[BlockId],
        total_computed: usize,
    ) {
        let skipped = self.num_skipped_blocks(total_computed);
        self.group_tables_mut().add_hit(pool, slot, hit, skipped);
    }

    /// Takes fresh blocks from the pool so the table holds `num_tokens`
    /// tokens; `reserve_tokens` sizes a new table so it never reallocates.
    /// Returns the number of fresh blocks, now the table's tail. The caller
    /// has checked they fit.
    fn allocate_new(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        reserve_tokens: usize,
    ) -> usize {
        self.group_tables_mut()
            .allocate_new(pool, slot, num_tokens, reserve_tokens)
    }

    /// Registers the full blocks among the first `num_tokens` tokens in the
    /// prefix cache (incrementally: blocks not yet registered), those the
    /// kind keeps.
    fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        input: CacheInput<'_>,
        num_tokens: usize,
    );

    /// Frees the table of `slot`, last entry first, and forgets it.
    fn free(&mut self, pool: &mut BlockPool, slot: usize) {
        self.group_tables_mut().free(pool, slot);
    }

    /// Every table, by slot (for the invariant checks).
    fn tables(&self) -> Box<dyn Iterator<Item = (usize, &[BlockId])> + '_> {
        self.group_tables().iter()
    }
}

#[derive(Debug, Default, Clone)]
struct Table {
    blocks: Vec<BlockId>,
    /// Leading entries of `blocks` registered (or deliberately left out).
    num_cached: usize,
}

/// The block tables of one group, indexed by request slot (so the per-step
/// hot path never hashes a request id), with the bookkeeping every kind
/// shares (vLLM's `SingleTypeKVCacheManager` base class).
#[derive(Debug)]
pub struct GroupTables {
    pub group: GroupId,
    pub block_size: usize,
    /// Hash blocks per block of this group (block size / hash block size).
    pub hash_stride: usize,
    tables: Vec<Table>,
}

impl GroupTables {
    pub fn new(group: GroupId, block_size: usize, hash_block_size: usize) -> Self {
        GroupTables {
            group,
            block_size: block_size.max(1),
            hash_stride: (block_size / hash_block_size.max(1)).max(1),
            tables: Vec::new(),
        }
    }

    #[inline]
    pub fn block_ids(&self, slot: usize) -> &[BlockId] {
        self.tables.get(slot).map_or(&[], |t| &t.blocks)
    }

    pub fn num_cached(&self, slot: usize) -> usize {
        self.tables.get(slot).map_or(0, |t| t.num_cached)
    }

    /// The hash of this group's block `j`: the hash ending where it ends.
    #[inline]
    pub fn hash_of<'h>(&self, hashes: &'h [BlockHash], j: usize) -> Option<&'h BlockHash> {
        hashes.get((j + 1) * self.hash_stride - 1)
    }

    /// Blocks of this group the hashes cover.
    pub fn num_hashed_blocks(&self, hashes: &[BlockHash]) -> usize {
        hashes.len() / self.hash_stride
    }

    fn table_mut(&mut self, slot: usize) -> &mut Table {
        if slot >= self.tables.len() {
            self.tables.resize_with(slot + 1, Table::default);
        }
        &mut self.tables[slot]
    }

    /// Frees entries `0..n` from the highest down to the first null one
    /// (released earlier), each replaced by the null block, freed together
    /// highest entry first (vLLM's `_remove_blocks_in_range`).
    pub fn remove_leading(&mut self, pool: &mut BlockPool, slot: usize, n: usize) {
        let Some(t) = self.tables.get_mut(slot) else {
            return;
        };
        let n = n.min(t.blocks.len());
        let mut first_kept = n;
        while first_kept > 0 && t.blocks[first_kept - 1] != NULL_BLOCK {
            first_kept -= 1;
        }
        if first_kept == n {
            return;
        }
        pool.free_blocks(t.blocks[first_kept..n].iter().rev().copied());
        t.blocks[first_kept..n].fill(NULL_BLOCK);
    }

    /// vLLM's `get_num_blocks_to_allocate`: the missing entries beyond both
    /// the held ones and the skipped ones, plus the adopted hit blocks that
    /// sit in the free queue.
    pub fn num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: &[BlockId],
        skipped_blocks: usize,
        cap: Option<usize>,
    ) -> usize {
        let mut required = num_tokens.div_ceil(self.block_size);
        if let Some(c) = cap {
            required = required.min(c);
        }
        let held = self.block_ids(slot).len();
        if hit.is_empty() && held > 0 {
            return required.saturating_sub(held);
        }
        let local = hit.len() + held;
        let fresh = required.saturating_sub(skipped_blocks.max(local));
        let skip_hit = skipped_blocks.saturating_sub(held).min(hit.len());
        let evictable = hit[skip_hit..]
            .iter()
            .filter(|&&b| b != NULL_BLOCK && pool.ref_cnt(b) == 0)
            .count();
        fresh + evictable
    }

    /// vLLM's `add_local_computed_blocks`: the hit becomes the table, its
    /// first `skipped_blocks` entries the null block, all marked cached.
    pub fn add_hit(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        hit: &[BlockId],
        skipped_blocks: usize,
    ) {
        let t = self.table_mut(slot);
        debug_assert!(t.blocks.is_empty(), "a hit is adopted by a new table only");
        let kept = &hit[skipped_blocks.min(hit.len())..];
        pool.touch(kept);
        t.blocks.resize(skipped_blocks, NULL_BLOCK);
        t.blocks.extend_from_slice(kept);
        t.num_cached = t.blocks.len();
    }

    pub fn allocate_new(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        reserve_tokens: usize,
    ) -> usize {
        let b = self.block_size;
        let t = self.table_mut(slot);
        if t.blocks.is_empty() {
            t.blocks.reserve(reserve_tokens.div_ceil(b));
        }
        let want = num_tokens.div_ceil(b).saturating_sub(t.blocks.len());
        pool.get_new_blocks(want, &mut t.blocks);
        want
    }

    /// vLLM's `cache_blocks` (base class): registers the newly full entries
    /// for which `keep(entry)` holds; the event still spans them all.
    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        input: CacheInput<'_>,
        num_tokens: usize,
        keep: impl Fn(usize) -> bool,
    ) {
        let b = self.block_size;
        let full = num_tokens.min(self.num_hashed_blocks(input.hashes) * b) / b;
        let stride = self.hash_stride;
        let group = self.group;
        let Some(t) = self.tables.get_mut(slot) else {
            return;
        };
        if t.num_cached >= full {
            return;
        }
        let start = t.num_cached;
        let hash = |j: usize| input.hashes[(j + 1) * stride - 1];
        pool.cache_full_blocks(
            group,
            &t.blocks[start..full],
            &|i| hash(start + i),
            &|i| keep(start + i),
            start
                .checked_sub(1)
                .map(|p| &input.hashes[(p + 1) * stride - 1]),
            &input.tokens[start * b..full * b],
            b,
        );
        t.num_cached = full;
    }

    pub fn free(&mut self, pool: &mut BlockPool, slot: usize) {
        if let Some(t) = self.tables.get_mut(slot) {
            pool.free_blocks(t.blocks.iter().rev().copied());
            t.blocks.clear();
            t.num_cached = 0;
        }
    }

    pub fn iter(&self) -> Box<dyn Iterator<Item = (usize, &[BlockId])> + '_> {
        Box::new(
            self.tables
                .iter()
                .enumerate()
                .map(|(i, t)| (i, t.blocks.as_slice())),
        )
    }
}

/// The blocks every group of `groups` holds under `hash`, pushed to their
/// hit lists; `false` (nothing pushed) when one of them holds none.
pub(super) fn push_cached(
    pool: &BlockPool,
    hash: &BlockHash,
    groups: &[GroupId],
    hit: &mut ComputedBlocks,
) -> bool {
    // One group (the common case): one lookup.
    if let [g] = groups {
        return match pool.get_cached_block(hash, *g) {
            Some(b) => {
                hit.list_mut(*g).push(b);
                true
            }
            None => false,
        };
    }
    if groups
        .iter()
        .any(|&g| pool.get_cached_block(hash, g).is_none())
    {
        return false;
    }
    for &g in groups {
        if let Some(b) = pool.get_cached_block(hash, g) {
            hit.list_mut(g).push(b);
        }
    }
    true
}
