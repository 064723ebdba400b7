//! Sliding-window attention (vLLM's `SlidingWindowManager`): a layer reads
//! the last `window` tokens only, so blocks wholly before the window go back
//! to the pool while the request runs (their entries become the null
//! block). A prefix-cache hit needs only the `ceil((window − 1)/b)` blocks
//! just before its end, so the group registers only the blocks a later hit
//! can use (vLLM's default retention: the tails ending at the replay
//! boundaries), and admission reserves at most what the window can hold.

use super::single_type::{push_cached, CacheInput, GroupTables, SingleTypeKvCacheManager};
use super::{AttentionKind, ComputedBlocks, GroupId, KvCacheGroupSpec};
use crate::block_hash::BlockHash;
use crate::block_pool::{BlockPool, NULL_BLOCK};

#[derive(Debug)]
pub struct SlidingWindowManager {
    t: GroupTables,
    window: usize,
    cap_blocks: usize,
}

impl SlidingWindowManager {
    /// `max_num_batched_tokens` and `max_model_len` size the admission cap
    /// (vLLM's `SlidingWindowSpec.max_admission_blocks_per_request`).
    pub fn new(
        group: GroupId,
        window: usize,
        block_size: usize,
        hash_block_size: usize,
        max_num_batched_tokens: usize,
        max_model_len: usize,
    ) -> Self {
        let t = GroupTables::new(group, block_size, hash_block_size);
        let cap_blocks = KvCacheGroupSpec::sliding_window(window).max_blocks_per_request(
            t.block_size,
            max_num_batched_tokens,
            max_model_len,
        );
        SlidingWindowManager {
            t,
            window,
            cap_blocks,
        }
    }

    /// Blocks a hit must find just before its end.
    fn contiguous_blocks(&self) -> usize {
        self.window.saturating_sub(1).div_ceil(self.t.block_size)
    }
}

impl SingleTypeKvCacheManager for SlidingWindowManager {
    fn group_tables(&self) -> &GroupTables {
        &self.t
    }

    fn group_tables_mut(&mut self) -> &mut GroupTables {
        &mut self.t
    }

    fn spec(&self) -> KvCacheGroupSpec {
        KvCacheGroupSpec {
            kind: AttentionKind::SlidingWindow {
                window: self.window,
            },
            block_size: Some(self.t.block_size),
        }
    }

    /// The tokens before the window of the next token.
    fn num_skipped_tokens(&self, num_computed_tokens: usize) -> usize {
        (num_computed_tokens + 1).saturating_sub(self.window)
    }

    fn admission_cap_blocks(&self) -> Option<usize> {
        Some(self.cap_blocks)
    }

    /// Scans right to left for `contiguous_blocks` registered blocks whose
    /// run ends on an `alignment` boundary; entries before the run are the
    /// null block. Without such a run, the run from entry 0 is the hit
    /// (rounded down to the alignment).
    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        alignment: usize,
        groups: &[GroupId],
        hit: &mut ComputedBlocks,
    ) -> usize {
        let b = self.t.block_size;
        let need = self.contiguous_blocks();
        let max_blocks = (max_tokens / b).min(self.t.num_hashed_blocks(hashes));
        for &g in groups {
            let l = hit.list_mut(g);
            l.clear();
            l.resize(max_blocks, NULL_BLOCK);
        }
        let mut run = 0;
        let mut found = false;
        let mut scratch = ComputedBlocks::default();
        for i in (0..max_blocks).rev() {
            let Some(h) = self.t.hash_of(hashes, i) else {
                run = 0;
                continue;
            };
            scratch.clear();
            if push_cached(pool, h, groups, &mut scratch) {
                if run == 0 && b != alignment && !((i + 1) * b).is_multiple_of(alignment) {
                    continue;
                }
                for &g in groups {
                    let blk = scratch.group(g)[0];
                    hit.list_mut(g)[i] = blk;
                }
                run += 1;
                if run >= need {
                    for &g in groups {
                        hit.list_mut(g).truncate(i + run);
                    }
                    found = true;
                    break;
                }
            } else {
                run = 0;
            }
        }
        let first = groups[0];
        if !found {
            for &g in groups {
                hit.list_mut(g).truncate(run);
            }
            while b != alignment && !(hit.group(first).len() * b).is_multiple_of(alignment) {
                for &g in groups {
                    hit.list_mut(g).pop();
                }
            }
        }
        hit.group(first).len() * b
    }

    /// Registers only the `contiguous_blocks` entries ending at each replay
    /// boundary (rounded down to the alignment): the only ones a later
    /// lookup can hit (vLLM's `reachable_block_mask`, retention interval 0).
    fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        input: CacheInput<'_>,
        num_tokens: usize,
    ) {
        let b = self.t.block_size;
        let need = self.contiguous_blocks();
        let align = input.alignment.max(1);
        let ends: smallvec::SmallVec<[usize; 2]> = input
            .boundaries
            .iter()
            .map(|&p| p / align * align / b)
            .collect();
        self.t.cache_blocks(pool, slot, input, num_tokens, |j| {
            ends.iter().any(|&end| j < end && j + need >= end)
        });
    }
}
