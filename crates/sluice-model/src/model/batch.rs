//! The flattened input of one forward pass: every scheduled token of every
//! request in one list, with what attention needs to find each request's
//! keys (vLLM's input ids / positions / slot mapping / query start locations
//! / sequence lengths / block tables).
//!
//! Promises: `push_seq` refuses a block table that does not cover the
//! sequence, so the forward pass can index the cache without checks beyond
//! block ids being inside the pool (which `Model::forward` verifies).

use anyhow::{bail, Result};
use std::ops::Range;

/// One request's part of the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqSlice {
    /// Index of the request's first token in the flattened batch.
    pub query_start: usize,
    /// Tokens of this request in the step (a prefill chunk or 1 for decode).
    pub query_len: usize,
    /// Tokens with KV after this step: the computed tokens before it plus
    /// `query_len`. The query tokens sit at the last `query_len` positions.
    pub context_len: usize,
    /// The request's block table, as a range of `ForwardBatch::block_tables`.
    pub block_table: Range<usize>,
}

/// A step's flattened batch. Buffers are kept across steps (`clear` keeps
/// the capacity), so building a batch allocates nothing once warm.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    pub input_ids: Vec<u32>,
    pub positions: Vec<usize>,
    /// Cache slot of every token: `block_table[p / bs] * bs + p % bs`.
    pub slot_mapping: Vec<usize>,
    pub seqs: Vec<SeqSlice>,
    pub block_tables: Vec<u32>,
    /// Token rows whose logits are wanted, in output order.
    pub logits_rows: Vec<usize>,
}

impl ForwardBatch {
    pub fn clear(&mut self) {
        self.input_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.seqs.clear();
        self.block_tables.clear();
        self.logits_rows.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// Appends a request's `tokens`, which start at position
    /// `num_computed_tokens` (the tokens before it already have KV in the
    /// cache through `block_table`). Returns the index of its first row.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        num_computed_tokens: usize,
        block_table: &[u32],
        block_size: usize,
    ) -> Result<usize> {
        let query_start = self.input_ids.len();
        let context_len = num_computed_tokens + tokens.len();
        let needed = context_len.div_ceil(block_size);
        if tokens.is_empty() {
            bail!("a sequence in the batch has no tokens");
        }
        if block_table.len() < needed {
            bail!(
                "block table of {} blocks cannot hold {context_len} tokens at block size {block_size}",
                block_table.len()
            );
        }
        let table_start = self.block_tables.len();
        self.block_tables.extend_from_slice(&block_table[..needed]);
        self.input_ids.extend_from_slice(tokens);
        for p in num_computed_tokens..context_len {
            self.positions.push(p);
            self.slot_mapping
                .push(block_table[p / block_size] as usize * block_size + p % block_size);
        }
        self.seqs.push(SeqSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            block_table: table_start..self.block_tables.len(),
        });
        Ok(query_start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_block_table() {
        let mut b = ForwardBatch::default();
        b.push_seq(&[1, 2, 3], 0, &[5, 9], 2).unwrap();
        b.push_seq(&[7], 4, &[3, 4, 8], 2).unwrap();
        assert_eq!(b.positions, vec![0, 1, 2, 4]);
        assert_eq!(b.slot_mapping, vec![10, 11, 18, 16]);
        assert_eq!(b.seqs[1].query_start, 3);
        assert_eq!(b.seqs[1].context_len, 5);
        assert!(b.push_seq(&[1, 2], 3, &[1, 2], 2).is_err());
    }
}
