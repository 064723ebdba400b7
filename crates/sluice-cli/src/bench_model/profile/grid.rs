//! The grid of step shapes a profile measures, chosen from the engine's
//! limits: prefill chunks × cached contexts, decode batch sizes × prompts.

use anyhow::{bail, Result};

/// The grid's limits (the engine's) and its repeats.
pub(super) struct GridLimits {
    pub max_num_batched_tokens: usize,
    pub max_batch: usize,
    pub max_model_len: usize,
    pub block_size: usize,
    pub repeats: usize,
}

/// The measured points: prefill chunk tokens × cached context, decode
/// batch sizes × prompt tokens.
#[derive(Debug, PartialEq)]
pub(super) struct Grid {
    pub chunks: Vec<usize>,
    pub contexts: Vec<usize>,
    pub batches: Vec<usize>,
    pub prompts: Vec<usize>,
}

/// `first, first·ratio, …` while below `last`, then `last` (if above
/// `first`); `[last]` when `last <= first`.
fn geometric(first: usize, ratio: usize, last: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut x = first;
    while x < last {
        v.push(x);
        x *= ratio;
    }
    v.push(last);
    v
}

impl Grid {
    pub fn new(l: &GridLimits) -> Result<Grid> {
        if l.max_model_len < 64 {
            bail!(
                "--profile-max-model-len: {} is too short for a grid (at least 64)",
                l.max_model_len
            );
        }
        if l.repeats + 3 >= l.max_model_len / 2 {
            bail!(
                "--repeats: {} leaves no room in the model length",
                l.repeats
            );
        }
        // The largest chunk leaves a quarter of the model length for cached
        // context.
        let max_chunk = l.max_num_batched_tokens.min(l.max_model_len / 4 * 3);
        let mut chunks = vec![1];
        chunks.extend(geometric(16, 2, max_chunk).into_iter().filter(|&c| c > 1));
        // Cached contexts are whole blocks (a prefix-cache hit is), up to
        // where the largest chunk still fits.
        let bs = l.block_size;
        let top = (l.max_model_len - 1 - max_chunk) / bs * bs;
        let mut contexts = vec![0];
        contexts.extend(
            geometric(128usize.div_ceil(bs) * bs, 4, top)
                .into_iter()
                .map(|x| x / bs * bs)
                .filter(|&x| x > 0),
        );
        contexts.dedup();
        let batches = geometric(1, 2, l.max_batch.max(1));
        // A decode row's context is its prompt plus what it sampled; the
        // longest prompt leaves room for the untimed step and the timed ones
        // of every batch size (`Bench::decode_column`).
        let Some(longest) = l
            .max_model_len
            .checked_sub(3 + l.repeats * batches.len())
            .filter(|&n| n >= 64)
        else {
            bail!(
                "--profile-max-model-len: {} leaves no room for {} timed steps at each of {} \
                 batch sizes",
                l.max_model_len,
                l.repeats,
                batches.len()
            );
        };
        let mut prompts = vec![1];
        prompts.extend(geometric(64, 4, longest + 1).into_iter().map(|m| m - 1));
        prompts.dedup();
        Ok(Grid {
            chunks,
            contexts,
            batches,
            prompts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grid_covers_the_engine_limits() {
        let g = Grid::new(&GridLimits {
            max_num_batched_tokens: 1024,
            max_batch: 32,
            max_model_len: 2048,
            block_size: 16,
            repeats: 3,
        })
        .unwrap();
        assert_eq!(g.chunks, [1, 16, 32, 64, 128, 256, 512, 1024]);
        // Up to where the largest chunk still fits: 2047 - 1024, in blocks.
        assert_eq!(g.contexts, [0, 128, 512, 1008]);
        assert_eq!(g.batches, [1, 2, 4, 8, 16, 32]);
        // Prompts: the longest leaves 3 timed steps plus the sampled token.
        assert_eq!(g.prompts, [1, 63, 255, 1023, 2027]);
        // A budget as long as the model: the chunks stop at ¾ of it.
        let g = Grid::new(&GridLimits {
            max_num_batched_tokens: 8192,
            max_batch: 4,
            max_model_len: 2048,
            block_size: 16,
            repeats: 3,
        })
        .unwrap();
        assert_eq!(*g.chunks.last().unwrap(), 1536);
        assert_eq!(g.contexts, [0, 128, 496]);
        assert_eq!(geometric(1, 2, 24), [1, 2, 4, 8, 16, 24]);
        assert_eq!(geometric(16, 4, 8), [8]);
    }
}
