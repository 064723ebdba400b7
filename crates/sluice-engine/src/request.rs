//! What callers hand the engine and what flows back on a request's stream.
//!
//! One `GenerateRequest` may ask for `n` completions; each `RequestOutput`
//! belongs to one of them (`index`) and carries only what is new since the
//! previous output of that completion (token ids, text, logprobs), so a
//! server can forward it as one SSE chunk. The last output of a completion
//! has `finished` set; the stream ends after every completion finished.

use sluice_core::{FinishReason, SampleLogprobs, SamplingParams, TokenId};

/// A request to generate from a tokenized prompt.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// The caller's id (e.g. the OpenAI response id), unique among live
    /// requests; the engine picks one (`req-N`) when `None`.
    pub request_id: Option<String>,
    pub prompt_token_ids: Vec<TokenId>,
    /// `eos_token_id` and `stop_token_ids` are completed by the engine from
    /// the model's EOS ids (unless `ignore_eos`); `n` completions are
    /// generated, child `i` with seed `seed + i` when a seed is set.
    pub sampling_params: SamplingParams,
    /// Lower runs first under the `priority` scheduling policy.
    pub priority: i64,
    /// Isolates prefix-cache sharing between tenants.
    pub cache_salt: Option<String>,
    /// Structured outputs: every completion's tokens obey this constraint
    /// (compiled off the engine thread; the request waits in the
    /// scheduler's grammar state meanwhile).
    pub structured: Option<sluice_structured::Constraint>,
    /// The constraint holds only after the completion has generated this
    /// token sequence (a reasoning parser's end of thinking, `</think>`:
    /// vLLM applies the grammar to the answer, not the thinking). `None`:
    /// from the first token.
    pub structured_after: Option<Vec<TokenId>>,
    /// Who sent the request (a server's client key: a gateway header, the
    /// OpenAI `user`, or a label of the API key). Carried, not yet acted on.
    pub client_key: Option<String>,
}

impl GenerateRequest {
    pub fn new(prompt_token_ids: Vec<TokenId>, sampling_params: SamplingParams) -> Self {
        GenerateRequest {
            request_id: None,
            prompt_token_ids,
            sampling_params,
            priority: 0,
            cache_salt: None,
            structured: None,
            structured_after: None,
            client_key: None,
        }
    }

    pub fn with_constraint(mut self, constraint: sluice_structured::Constraint) -> Self {
        self.structured = Some(constraint);
        self
    }

    pub fn with_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

/// Which stop condition ended a completion with finish reason `stop`, when
/// it was more specific than the model's EOS (OpenAI / vLLM `stop_reason`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// One of `stop_token_ids` (or an extra EOS id of the model).
    Token(TokenId),
    /// One of the `stop` strings.
    String(String),
}

/// How a completion ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// `stop` (EOS, stop token, stop string), `length` (`max_tokens` or the
    /// context), `abort` (caller went away, explicit abort, shutdown) or
    /// `error` (the model failed).
    pub reason: FinishReason,
    /// `None` for EOS, length, abort and error.
    pub stop_reason: Option<StopReason>,
    /// Tokens this completion produced (its `completion_tokens`).
    pub num_output_tokens: usize,
    /// Prompt tokens this completion found in the prefix cache.
    pub num_cached_tokens: usize,
    /// For `error`: what failed.
    pub error: Option<String>,
}

/// New output of one completion.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutput {
    /// Which of the request's `n` completions (0-based).
    pub index: usize,
    /// New token ids. Kept even when their text is not shown (the EOS or
    /// stop token, tokens inside a stop string).
    pub token_ids: Vec<TokenId>,
    /// New text: always whole characters. Text that could be the start of a
    /// stop string is held back until it is known not to be one.
    pub text: String,
    /// With `logprobs` set: one entry per `token_ids` entry.
    pub logprobs: Vec<SampleLogprobs>,
    /// With `prompt_logprobs` set: once, on completion 0's first output,
    /// one entry per prompt position after the first.
    pub prompt_logprobs: Option<Vec<SampleLogprobs>>,
    /// Set on the completion's last output.
    pub finished: Option<Finished>,
}

/// Token counts of a request (OpenAI `usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Summed over the `n` completions.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (the largest hit among
    /// the completions).
    pub cached_tokens: usize,
}

impl Usage {
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.completion_tokens
    }
}
