//! Full attention (vLLM's `FullAttentionManager`): a layer reads every
//! earlier token, so a request's table grows block by block and keeps every
//! block until the request ends; a prefix-cache hit is the longest run of
//! registered leading blocks.

use super::single_type::SingleTypeKvCacheManager;
use super::GroupId;
use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;
use crate::request::{BlockId, TokenId};

#[derive(Debug, Default, Clone)]
struct Table {
    blocks: Vec<BlockId>,
    /// Leading blocks of `blocks` already registered in the prefix cache.
    num_cached: usize,
}

/// The block tables of one full-attention group, indexed by request slot
/// (so the per-step hot path never hashes a request id).
#[derive(Debug)]
pub struct FullAttentionManager {
    group: GroupId,
    block_size: usize,
    tables: Vec<Table>,
}

impl FullAttentionManager {
    pub fn new(group: GroupId, block_size: usize) -> Self {
        FullAttentionManager {
            group,
            block_size,
            tables: Vec::new(),
        }
    }
}

impl SingleTypeKvCacheManager for FullAttentionManager {
    fn group(&self) -> GroupId {
        self.group
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    #[inline]
    fn block_ids(&self, slot: usize) -> &[BlockId] {
        self.tables.get(slot).map_or(&[], |t| &t.blocks)
    }

    fn num_cached_blocks(&self, slot: usize) -> usize {
        self.tables.get(slot).map_or(0, |t| t.num_cached)
    }

    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        hit: &mut Vec<BlockId>,
    ) -> usize {
        hit.clear();
        let max_blocks = (max_tokens / self.block_size).min(hashes.len());
        for h in &hashes[..max_blocks] {
            match pool.get_cached_block(h, self.group) {
                Some(b) => hit.push(b),
                // Hashes are chained: every later block misses too.
                None => break,
            }
        }
        hit.len() * self.block_size
    }

    #[inline]
    fn get_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: &[BlockId],
    ) -> usize {
        let held = self.block_ids(slot).len();
        let required = num_tokens.div_ceil(self.block_size);
        let evictable = hit.iter().filter(|&&b| pool.ref_cnt(b) == 0).count();
        required.saturating_sub(held + hit.len()) + evictable
    }

    fn allocate(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        hit: &[BlockId],
        reserve_tokens: usize,
    ) -> usize {
        if slot >= self.tables.len() {
            self.tables.resize_with(slot + 1, Table::default);
        }
        let table = &mut self.tables[slot];
        if table.blocks.is_empty() {
            table
                .blocks
                .reserve(reserve_tokens.div_ceil(self.block_size));
        }
        if !hit.is_empty() {
            pool.touch(hit);
            table.blocks.extend_from_slice(hit);
            table.num_cached = table.blocks.len();
        }
        let want = num_tokens
            .div_ceil(self.block_size)
            .saturating_sub(table.blocks.len());
        pool.get_new_blocks(want, &mut table.blocks);
        want
    }

    fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        hashes: &[BlockHash],
        tokens: &[TokenId],
        num_tokens: usize,
    ) {
        let b = self.block_size;
        let full = num_tokens.min(hashes.len() * b) / b;
        let Some(table) = self.tables.get_mut(slot) else {
            return;
        };
        if table.num_cached >= full {
            return;
        }
        let start = table.num_cached;
        pool.cache_full_blocks(
            self.group,
            &table.blocks[start..full],
            &hashes[start..full],
            start.checked_sub(1).map(|p| &hashes[p]),
            &tokens[start * b..full * b],
            b,
        );
        table.num_cached = full;
    }

    fn free(&mut self, pool: &mut BlockPool, slot: usize) {
        if let Some(t) = self.tables.get_mut(slot) {
            pool.free_blocks(t.blocks.iter().rev().copied());
            t.blocks.clear();
            t.num_cached = 0;
        }
    }

    fn tables(&self) -> Box<dyn Iterator<Item = (usize, &[BlockId])> + '_> {
        Box::new(
            self.tables
                .iter()
                .enumerate()
                .map(|(i, t)| (i, t.blocks.as_slice())),
        )
    }
}
