//! The per-group half of the KV cache manager (vLLM's
//! `SingleTypeKVCacheManager`): one implementation per kind of attention.
//!
//! A manager owns its group's block tables (one per request slot) and
//! answers for its kind: how long a prefix-cache hit it can use, how many
//! blocks a table needs, which blocks it may release early. It never owns
//! blocks itself: the pool is shared by every group and passed in, so the
//! coordinator can check an allocation across all groups before any group
//! takes a block.
//!
//! A new kind of attention (sliding window, chunked local) is one more
//! implementation beside `full_attention.rs`, plugged in by the coordinator.

use super::GroupId;
use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;
use crate::request::{BlockId, TokenId};
use std::fmt::Debug;

pub trait SingleTypeKvCacheManager: Debug + Send {
    /// The group this manager keeps tables for.
    fn group(&self) -> GroupId;

    /// Tokens per block of this group.
    fn block_size(&self) -> usize;

    /// The block table of the request in `slot` (empty when it has none).
    fn block_ids(&self, slot: usize) -> &[BlockId];

    /// Leading blocks of the table already registered in the prefix cache.
    fn num_cached_blocks(&self, slot: usize) -> usize;

    /// The longest prefix of `hashes` (chained block hashes of the
    /// request's tokens) this kind can reuse within `max_tokens` tokens: the
    /// hit blocks go to `hit` (a null block where the kind needs none) and
    /// the hit's length in tokens is returned.
    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        hit: &mut Vec<BlockId>,
    ) -> usize;

    /// Releases the blocks of `slot` its kind no longer reads once
    /// `num_computed_tokens` tokens are computed (vLLM's
    /// `remove_skipped_blocks`). Full attention releases none.
    fn remove_skipped_blocks(
        &mut self,
        _pool: &mut BlockPool,
        _slot: usize,
        _num_computed_tokens: usize,
    ) {
    }

    /// Blocks the table of `slot` must take from the free queue to hold
    /// `num_tokens` tokens after adopting `hit` (a first allocation's prefix
    /// hit): the missing entries, plus the hit blocks that sit in the free
    /// queue (adopting them takes them out of it).
    fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: &[BlockId],
    ) -> usize;

    /// Adopts `hit` and takes fresh blocks from the pool so the table holds
    /// `num_tokens` tokens; `reserve_tokens` sizes a new table so it never
    /// reallocates. Returns the number of fresh blocks, now the table's
    /// tail. The caller has checked they fit.
    fn allocate(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: &[BlockId],
        reserve_tokens: usize,
    ) -> usize;

    /// Registers the full blocks among the first `num_tokens` tokens in the
    /// prefix cache under `hashes` (incrementally: blocks not yet
    /// registered). `tokens` are the request's token ids.
    fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        hashes: &[BlockHash],
        tokens: &[TokenId],
        num_tokens: usize,
    );

    /// Frees the table of `slot`, last entry first, and forgets it.
    fn free(&mut self, pool: &mut BlockPool, slot: usize);

    /// Every table, by slot (for the invariant checks).
    fn tables(&self) -> Box<dyn Iterator<Item = (usize, &[BlockId])> + '_>;
}
