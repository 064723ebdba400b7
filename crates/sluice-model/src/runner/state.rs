//! What the runner remembers about one request between steps (vLLM's
//! `CachedRequestState`): its tokens, block table, progress and sampler.
//!
//! Promises: `token_ids` is the prompt followed by every output token the
//! scheduler has accepted; the block table is the scheduler's, extended by
//! appended blocks or replaced wholesale on resumption.

use crate::sampling::{RequestSampler, Sampled};
use anyhow::{bail, Result};
use sluice_core::output::CachedRequest;
use sluice_core::{NewRequestData, SamplingParams};
use std::sync::Arc;

pub(super) struct RequestState {
    pub(super) params: Arc<SamplingParams>,
    /// Prompt, then outputs.
    pub(super) token_ids: Vec<u32>,
    pub(super) num_prompt_tokens: usize,
    /// One block table per KV cache group.
    pub(super) block_tables: Vec<Vec<u32>>,
    /// Tokens with KV in the cache before the current step.
    pub(super) num_computed_tokens: usize,
    /// Prompt positions whose logprobs were already reported (so a
    /// recompute after preemption does not report them twice).
    pub(super) num_prompt_logprobs_done: usize,
    /// Whether a structured-output bitmask was ever applied to its rows:
    /// such a request gets no drafts (one bitmask row per request cannot
    /// constrain the positions after a draft).
    pub(super) uses_grammar: bool,
    sampler: RequestSampler,
}

impl RequestState {
    pub(super) fn new(new: &NewRequestData, sampler: RequestSampler) -> Self {
        RequestState {
            params: new.sampling_params.clone(),
            token_ids: new.prompt_token_ids.clone(),
            num_prompt_tokens: new.prompt_token_ids.len(),
            block_tables: new.block_ids.clone(),
            num_computed_tokens: new.num_computed_tokens,
            num_prompt_logprobs_done: 0,
            uses_grammar: false,
            sampler,
        }
    }

    /// Applies a running or resumed request's delta: `new_blocks(g)` is
    /// what group `g`'s table gains (or, resumed, becomes).
    pub(super) fn apply_cached<'a>(
        &mut self,
        c: &CachedRequest,
        new_blocks: impl Fn(usize) -> &'a [u32],
    ) -> Result<()> {
        for (g, table) in self.block_tables.iter_mut().enumerate() {
            if c.resumed {
                table.clear();
            }
            table.extend_from_slice(new_blocks(g));
        }
        if let Some(all) = &c.all_token_ids {
            if all.len() < self.num_prompt_tokens
                || all[..self.num_prompt_tokens] != self.token_ids[..self.num_prompt_tokens]
            {
                bail!(
                    "request {}: resumed with tokens that do not start with its prompt",
                    c.req_id
                );
            }
            self.token_ids.clear();
            self.token_ids.extend_from_slice(all);
        }
        let known = self.num_prompt_tokens + c.num_output_tokens;
        if self.token_ids.len() < known {
            bail!(
                "request {}: the scheduler knows {} output tokens, the runner only {}",
                c.req_id,
                c.num_output_tokens,
                self.token_ids.len() - self.num_prompt_tokens
            );
        }
        // The scheduler is the authority on which outputs were kept.
        self.token_ids.truncate(known);
        self.num_computed_tokens = c.num_computed_tokens;
        Ok(())
    }

    /// Samples the next token from this request's logits row and appends it.
    pub(super) fn sample(&mut self, logits: &mut [f32]) -> Sampled {
        let sampled = self
            .sampler
            .sample(logits, &self.token_ids[self.num_prompt_tokens..]);
        self.token_ids.push(sampled.token);
        sampled
    }
}
