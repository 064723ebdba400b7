//! Drafters for speculative decoding: after each step, propose the tokens
//! a request is likely to generate next, for the runner to verify in one
//! forward pass the step after (`runner/verify.rs`).
//!
//! A drafter only ever changes how many steps the outputs take, never the
//! outputs: a wrong draft is rejected by verification. The methods are
//! vLLM's, each one file: [`NgramDrafter`] (`ngram`, prompt lookup),
//! [`SuffixDrafter`] (`suffix`, suffix decoding over the request's own
//! tokens and a cache of earlier responses) and [`DraftModelDrafter`]
//! (`draft_model`, a smaller model with the target's vocabulary). [`SpeculativeConfig`] is
//! `--speculative-config`, parsed and checked as vLLM checks it.

mod config;
mod draft_model;
mod ngram;
mod suffix;
mod suffix_tree;

pub use config::{SpeculativeConfig, SpeculativeMethod, MAX_SPECULATIVE_TOKENS};
pub use draft_model::DraftModelDrafter;
pub use ngram::NgramDrafter;
pub use suffix::{SuffixDrafter, SuffixParams};
pub use suffix_tree::{SuffixDraft, SuffixTree};

use sluice_core::{RequestId, TokenId};

/// What a drafter sees of one request after a step.
#[derive(Clone, Copy, Debug)]
pub struct DraftRequest<'a> {
    pub req_id: &'a RequestId,
    /// Prompt, then every output so far (the step's sampled tokens
    /// included).
    pub token_ids: &'a [TokenId],
    pub num_prompt_tokens: usize,
    /// The engine's context limit (`--max-model-len`): proposals never
    /// reach past it (each method caps them as vLLM's does).
    pub max_model_len: usize,
}

/// Proposes draft tokens for running requests.
pub trait Drafter: Send {
    /// Writes at most `k` draft tokens for `req` into `drafts` (empty:
    /// nothing to propose). `drafts` arrives empty.
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>);

    /// `req_id` finished (or was aborted): state kept for it may go.
    fn finish(&mut self, _req_id: &RequestId) {}
}
