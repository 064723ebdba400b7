//! Chunked-local attention (vLLM's `ChunkedLocalAttentionManager`): a layer
//! reads the tokens of its own `chunk`-token chunk only, so once a chunk is
//! computed its blocks go back to the pool (entries become the null block).
//! A prefix-cache hit counts every entry before the current chunk as
//! computed and looks up the rest; every full block is registered.

use super::single_type::{push_cached, CacheInput, GroupTables, SingleTypeKvCacheManager};
use super::{AttentionKind, ComputedBlocks, GroupId, KvCacheGroupSpec};
use crate::block_hash::BlockHash;
use crate::block_pool::{BlockPool, NULL_BLOCK};

#[derive(Debug)]
pub struct ChunkedLocalAttentionManager {
    t: GroupTables,
    chunk: usize,
    cap_blocks: usize,
}

impl ChunkedLocalAttentionManager {
    /// `max_num_batched_tokens` and `max_model_len` size the admission cap
    /// (vLLM's chunked-local `max_admission_blocks_per_request`).
    pub fn new(
        group: GroupId,
        chunk: usize,
        block_size: usize,
        hash_block_size: usize,
        max_num_batched_tokens: usize,
        max_model_len: usize,
    ) -> Self {
        let t = GroupTables::new(group, block_size, hash_block_size);
        let cap_blocks = KvCacheGroupSpec::chunked_local(chunk).max_blocks_per_request(
            t.block_size,
            max_num_batched_tokens,
            max_model_len,
        );
        ChunkedLocalAttentionManager {
            t,
            chunk: chunk.max(1),
            cap_blocks,
        }
    }
}

impl SingleTypeKvCacheManager for ChunkedLocalAttentionManager {
    fn group_tables(&self) -> &GroupTables {
        &self.t
    }

    fn group_tables_mut(&mut self) -> &mut GroupTables {
        &mut self.t
    }

    fn spec(&self) -> KvCacheGroupSpec {
        KvCacheGroupSpec {
            kind: AttentionKind::ChunkedLocal { chunk: self.chunk },
            block_size: Some(self.t.block_size),
        }
    }

    /// The tokens of the chunks before the one the next token is in.
    fn num_skipped_tokens(&self, num_computed_tokens: usize) -> usize {
        num_computed_tokens / self.chunk * self.chunk
    }

    fn admission_cap_blocks(&self) -> Option<usize> {
        Some(self.cap_blocks)
    }

    /// Entries before the chunk of `max_tokens` are the null block (no layer
    /// reads them); from there, the run of registered entries. The trace
    /// reader refuses a block size other than `alignment` with prefix
    /// caching on, as vLLM asserts it here.
    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        _alignment: usize,
        groups: &[GroupId],
        hit: &mut ComputedBlocks,
    ) -> usize {
        let b = self.t.block_size;
        let max_blocks = max_tokens / b;
        let start = max_tokens / self.chunk * self.chunk / b;
        for &g in groups {
            let l = hit.list_mut(g);
            l.clear();
            l.resize(start, NULL_BLOCK);
        }
        for i in start..max_blocks {
            let Some(h) = self.t.hash_of(hashes, i) else {
                break;
            };
            if !push_cached(pool, h, groups, hit) {
                break;
            }
        }
        hit.group(groups[0]).len() * b
    }

    fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        input: CacheInput<'_>,
        num_tokens: usize,
    ) {
        self.t.cache_blocks(pool, slot, input, num_tokens, |_| true);
    }
}
