//! The flattened input of one forward pass: every scheduled token of every
//! request in one list, with what attention needs to find each request's
//! keys (vLLM's input ids / positions / slot mapping / query start locations
//! / sequence lengths / block tables), with one slot mapping and one set of
//! block tables per KV cache group (a hybrid model's sliding-window layers
//! read their own tables).
//!
//! Promises: `push_seq` refuses block tables that do not cover the
//! sequence, or a number of tables other than the batch's groups, so the
//! forward pass can index the cache without checks beyond block ids being
//! inside the pool (which `Model::forward` verifies). A request's tables
//! have the same length in every group, so `SeqSlice::block_table` is one
//! range for all of them.

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
    /// The request's block table, as a range of each group's
    /// `ForwardBatch::block_tables`.
    pub block_table: Range<usize>,
}

/// A step's flattened batch. Buffers are kept across steps (`clear` keeps
/// the capacity), so building a batch allocates nothing once warm.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    pub input_ids: Vec<u32>,
    pub positions: Vec<usize>,
    /// Per KV cache group, the cache slot of every token:
    /// `block_table[p / bs] * bs + p % bs` of that group's table.
    pub slot_mapping: Vec<Vec<usize>>,
    pub seqs: Vec<SeqSlice>,
    /// Per KV cache group, every request's table one after the other.
    pub block_tables: Vec<Vec<u32>>,
    /// Token rows whose logits are wanted, in output order.
    pub logits_rows: Vec<usize>,
}

impl ForwardBatch {
    pub fn clear(&mut self) {
        self.input_ids.clear();
        self.positions.clear();
        self.slot_mapping.iter_mut().for_each(Vec::clear);
        self.seqs.clear();
        self.block_tables.iter_mut().for_each(Vec::clear);
        self.logits_rows.clear();
    }

    /// KV cache groups of the batch (1 until a request brings more).
    pub fn num_groups(&self) -> usize {
        self.block_tables.len().max(1)
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// Appends a request's `tokens`, which start at position
    /// `num_computed_tokens` (the tokens before it already have KV in the
    /// cache through `block_table`), for a model with one KV cache group.
    /// Returns the index of its first row.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        num_computed_tokens: usize,
        block_table: &[u32],
        block_size: usize,
    ) -> Result<usize> {
        self.push_seq_groups(tokens, num_computed_tokens, &[block_table], block_size)
    }

    /// [`push_seq`](Self::push_seq) with one block table per KV cache group.
    /// Entries of a sliding-window group's table before its window may be
    /// the null block (0): attention never reads them.
    pub fn push_seq_groups<T: AsRef<[u32]>>(
        &mut self,
        tokens: &[u32],
        num_computed_tokens: usize,
        block_tables: &[T],
        block_size: usize,
    ) -> Result<usize> {
        let query_start = self.input_ids.len();
        let context_len = num_computed_tokens + tokens.len();
        let needed = context_len.div_ceil(block_size);
        if tokens.is_empty() {
            bail!("a sequence in the batch has no tokens");
        }
        if self.seqs.is_empty() {
            // The first sequence sets the batch's groups (`resize_with`
            // keeps the buffers of groups that stay).
            self.block_tables.resize_with(block_tables.len(), Vec::new);
            self.slot_mapping.resize_with(block_tables.len(), Vec::new);
        } else if block_tables.len() != self.block_tables.len() {
            bail!(
                "a sequence brings {} block tables, the batch has {} KV cache groups",
                block_tables.len(),
                self.block_tables.len()
            );
        }
        if block_tables.is_empty() {
            bail!("a sequence in the batch has no block table");
        }
        for table in block_tables {
            let table = table.as_ref();
            if table.len() < needed {
                bail!(
                    "block table of {} blocks cannot hold {context_len} tokens at block size \
                     {block_size}",
                    table.len()
                );
            }
        }
        let table_start = self.block_tables[0].len();
        for (g, table) in block_tables.iter().enumerate() {
            let table = table.as_ref();
            self.block_tables[g].extend_from_slice(&table[..needed]);
            self.slot_mapping[g].extend(
                (num_computed_tokens..context_len)
                    .map(|p| table[p / block_size] as usize * block_size + p % block_size),
            );
        }
        self.input_ids.extend_from_slice(tokens);
        self.positions.extend(num_computed_tokens..context_len);
        self.seqs.push(SeqSlice {
            query_start,
            query_len: tokens.len(),
            context_len,
            block_table: table_start..table_start + needed,
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
        assert_eq!(b.slot_mapping, vec![vec![10, 11, 18, 16]]);
        assert_eq!(b.seqs[1].query_start, 3);
        assert_eq!(b.seqs[1].context_len, 5);
        assert!(b.push_seq(&[1, 2], 3, &[1, 2], 2).is_err());
    }

    #[test]
    fn each_group_has_its_own_slots_and_tables() {
        let mut b = ForwardBatch::default();
        // Group 1's first entry is the null block (out of its window).
        b.push_seq_groups(&[1, 2], 3, &[vec![5, 9, 4], vec![0, 7, 6]], 2)
            .unwrap();
        assert_eq!(b.slot_mapping, vec![vec![19, 8], vec![15, 12]]);
        assert_eq!(b.block_tables, vec![vec![5, 9, 4], vec![0, 7, 6]]);
        assert_eq!(b.seqs[0].block_table, 0..3);
        let e = b.push_seq(&[1], 0, &[3], 2).unwrap_err();
        assert!(e.to_string().contains("2 KV cache groups"), "{e}");
        b.clear();
        b.push_seq(&[1], 0, &[3], 2).unwrap();
        assert_eq!(b.num_groups(), 1);
        assert_eq!(b.slot_mapping, vec![vec![6]]);
    }
}
