//! Full attention (vLLM's `FullAttentionManager`): a layer reads every
//! earlier token, so a request's table grows block by block and keeps every
//! block until the request ends; a prefix-cache hit is the longest run of
//! registered leading blocks, rounded down to the scheduler block size.

use super::single_type::{push_cached, CacheInput, GroupTables, SingleTypeKvCacheManager};
use super::{ComputedBlocks, GroupId, KvCacheGroupSpec};
use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;
use crate::prefix_cache::CacheKey;

#[derive(Debug)]
pub struct FullAttentionManager {
    t: GroupTables,
}

impl FullAttentionManager {
    /// A group whose blocks are hashed at its own block size.
    pub fn new(group: GroupId, block_size: usize) -> Self {
        Self::with_hash_block_size(group, block_size, block_size)
    }

    pub fn with_hash_block_size(group: GroupId, block_size: usize, hash_block_size: usize) -> Self {
        FullAttentionManager {
            t: GroupTables::new(group, block_size, hash_block_size),
        }
    }
}

impl SingleTypeKvCacheManager for FullAttentionManager {
    fn group_tables(&self) -> &GroupTables {
        &self.t
    }

    fn group_tables_mut(&mut self) -> &mut GroupTables {
        &mut self.t
    }

    fn spec(&self) -> KvCacheGroupSpec {
        KvCacheGroupSpec::FULL.with_block_size(self.t.block_size)
    }

    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        alignment: usize,
        groups: &[GroupId],
        hit: &mut ComputedBlocks,
    ) -> usize {
        for &g in groups {
            hit.list_mut(g).clear();
        }
        let b = self.t.block_size;
        let max_blocks = (max_tokens / b).min(self.t.num_hashed_blocks(hashes));
        let mut n = 0;
        while n < max_blocks {
            let Some(h) = self.t.hash_of(hashes, n) else {
                break;
            };
            // Hashes are chained: after a miss every later block misses too.
            if !push_cached(pool, h, groups, hit) {
                break;
            }
            n += 1;
        }
        let mut len = n * b;
        len -= len % alignment.max(1);
        for &g in groups {
            hit.list_mut(g).truncate(len.div_ceil(b));
        }
        len
    }

    /// Every newly full block; then, with blocks larger than the hash block
    /// size, vLLM's `_cache_partial_tail_block`: the prompt's last hash
    /// boundary a resend can reach (`prompt − 1`, rounded down to the hash
    /// block size), when it falls inside a block already computed, becomes a
    /// second key of that block. Only a finer-grained lookup than these
    /// kinds make could hit it, but it is published and evicted like any.
    fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        input: CacheInput<'_>,
        num_tokens: usize,
    ) {
        self.t.cache_blocks(pool, slot, input, num_tokens, |_| true);
        let stride = self.t.hash_stride;
        if stride == 1 {
            return;
        }
        let b = self.t.block_size;
        let h = b / stride;
        let limit = input.boundaries.first().copied().unwrap_or(0);
        let m = (limit / h).min(input.hashes.len());
        let boundary = m * h;
        if boundary == 0 || boundary > num_tokens || boundary.is_multiple_of(b) {
            return;
        }
        let Some(&block) = self.t.block_ids(slot).get(boundary / b) else {
            return;
        };
        let key = CacheKey::new(input.hashes[m - 1], self.t.group);
        let parent = m.checked_sub(2).map(|p| &input.hashes[p]);
        pool.cache_partial_block(block, key, parent, &input.tokens[boundary - h..boundary]);
    }
}
