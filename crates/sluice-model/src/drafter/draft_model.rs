//! vLLM's `draft_model` speculative method: a smaller model with the
//! target's vocabulary proposes k tokens greedily (vLLM's default
//! `draft_sample_method: greedy`, whose probabilities verification treats
//! as one-hot), one forward pass per token, on its own CPU backend and KV
//! cache (same block scheme: a block table per request from its own pool).
//!
//! Promises: the draft's KV of a request is reused across steps up to the
//! longest prefix its inputs share with the request's tokens (the accepted
//! drafts), so each step computes only the new tokens plus k − 1 drafts;
//! a request whose draft KV does not fit (the pool is full) or that reaches
//! the draft's own context length gets no proposal, never an error; a
//! finished request's blocks return to the pool.

use super::{DraftRequest, Drafter};
use crate::kv_cache::KvCacheConfig;
use crate::model::ForwardBatch;
use crate::runner::{CpuBackend, ForwardBackend};
use crate::LoadedModel;
use anyhow::{bail, Result};
use sluice_core::kv_cache::GroupingPolicy;
use sluice_core::{RequestId, TokenId};
use std::collections::HashMap;

/// One request's state in the draft's cache.
#[derive(Default)]
struct DraftSeq {
    blocks: Vec<u32>,
    /// The tokens whose K/V the draft cache holds, positions 0.., in order.
    fed: Vec<TokenId>,
}

/// A draft model (vLLM's `draft_model` method).
pub struct DraftModelDrafter {
    backend: CpuBackend,
    block_size: usize,
    /// The draft's own context length (`max_position_embeddings`).
    max_len: usize,
    free: Vec<u32>,
    seqs: HashMap<RequestId, DraftSeq>,
    batch: ForwardBatch,
    logits: Vec<f32>,
}

impl DraftModelDrafter {
    /// A drafter over `draft` with a KV pool of `num_blocks` blocks of
    /// `block_size` tokens (block 0 is the null block, never used). Refuses
    /// a draft whose vocabulary size differs from `target_vocab`, as vLLM.
    pub fn new(draft: &LoadedModel, target_vocab: usize, kv: KvCacheConfig) -> Result<Self> {
        let draft_vocab = draft.config.vocab_size;
        if draft_vocab != target_vocab {
            bail!(
                "Target and draft model should have the same vocabulary size. Target model \
                 vocab_size={target_vocab}. Draft model vocab_size={draft_vocab}. Using models \
                 with different tokenizers can cause out-of-bounds errors during speculative \
                 decoding."
            );
        }
        let kv = kv.with_grouping(GroupingPolicy {
            hybrid: false,
            ..GroupingPolicy::default()
        });
        if kv.num_blocks < 2 {
            bail!(
                "the draft model's KV cache holds {} blocks; it needs at least 2",
                kv.num_blocks
            );
        }
        let backend = CpuBackend::new(draft, kv)?;
        Ok(DraftModelDrafter {
            block_size: kv.block_size,
            max_len: draft.config.max_position_embeddings,
            free: (1..kv.num_blocks as u32).rev().collect(),
            seqs: HashMap::new(),
            batch: ForwardBatch::default(),
            logits: Vec::new(),
            backend,
        })
    }

    /// Blocks free in the draft's pool.
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Runs `tokens` from position `start` of `seq` and returns the
    /// greedy next token after the last.
    fn step(&mut self, seq: &DraftSeq, tokens: &[TokenId], start: usize) -> Result<TokenId> {
        self.batch.clear();
        let row = self
            .batch
            .push_seq(tokens, start, &seq.blocks, self.block_size)?;
        self.batch.logits_rows.push(row + tokens.len() - 1);
        self.backend.forward(&self.batch)?;
        self.backend.logits(0..1, &mut self.logits)?;
        let vocab = self.backend.vocab_size();
        // Ties: the lowest id, as an argmax scan.
        let mut best = 0usize;
        for (i, &l) in self.logits[..vocab].iter().enumerate() {
            if l > self.logits[best] {
                best = i;
            }
        }
        Ok(best as TokenId)
    }

    fn propose_inner(&mut self, req: &DraftRequest<'_>, k: usize) -> Result<Vec<TokenId>> {
        let t = req.token_ids;
        let mut seq = self.seqs.remove(req.req_id).unwrap_or_default();
        // The cache is valid up to the first position where what it was
        // fed differs from the request's tokens (a rejected draft); the
        // last token is always run, its logits give the first draft.
        let common = seq
            .fed
            .iter()
            .zip(t)
            .take_while(|(a, b)| a == b)
            .count()
            .min(t.len() - 1);
        seq.fed.truncate(common);
        // K/V for every token and all drafts but the last.
        let need = (t.len() + k - 1).div_ceil(self.block_size);
        if need > seq.blocks.len() + self.free.len() {
            // Not enough room: this request's blocks go back, no proposal.
            self.free.append(&mut seq.blocks);
            return Ok(Vec::new());
        }
        while seq.blocks.len() < need {
            seq.blocks.push(self.free.pop().expect("counted above"));
        }
        let mut drafts = Vec::with_capacity(k);
        let first = self.step(&seq, &t[common..], common);
        seq.fed.extend_from_slice(&t[common..]);
        let mut next = match first {
            Ok(d) => d,
            Err(e) => {
                self.seqs.insert(req.req_id.clone(), seq);
                return Err(e);
            }
        };
        drafts.push(next);
        while drafts.len() < k {
            let pos = seq.fed.len();
            let d = self.step(&seq, &[next], pos);
            seq.fed.push(next);
            match d {
                Ok(d) => next = d,
                Err(e) => {
                    self.seqs.insert(req.req_id.clone(), seq);
                    return Err(e);
                }
            }
            drafts.push(next);
        }
        self.seqs.insert(req.req_id.clone(), seq);
        Ok(drafts)
    }
}

impl Drafter for DraftModelDrafter {
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>) {
        let t = req.token_ids;
        // vLLM: never past the context; and never past the draft's own.
        let limit = req.max_model_len.min(self.max_len);
        let k = k.min(limit.saturating_sub(t.len()));
        if k == 0 || t.is_empty() {
            return;
        }
        // A failed draft pass only costs the proposal: verification never
        // depends on it.
        if let Ok(d) = self.propose_inner(req, k) {
            drafts.extend(d);
        }
    }

    fn finish(&mut self, req_id: &RequestId) {
        if let Some(seq) = self.seqs.remove(req_id) {
            self.free.extend(seq.blocks);
        }
    }
}
