//! One request as the scheduler sees it.
//!
//! Progress is a single pointer, `num_computed_tokens`, into the request's
//! known tokens (prompt followed by outputs): there is no prefill or decode
//! phase. Each step raises it toward `num_tokens_with_spec`; a "decode" is just
//! a gap of one token. A preempted request drops back to zero and recomputes
//! prompt and outputs alike.

use crate::block_hash::{BlockHash, BlockHasher};
use crate::sampling_params::SamplingParams;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A request id as callers spell it. Cheap to clone.
pub type RequestId = Arc<str>;
/// A KV cache block id; 0 is the reserved null block.
pub type BlockId = u32;
/// A token id.
pub type TokenId = u32;

/// Lifecycle of a request. The order matters: everything after `Preempted` is
/// finished (vLLM's `RequestStatus.is_finished`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestStatus {
    Waiting,
    /// Waits until its grammar is compiled; skipped by the waiting loop.
    WaitingForGrammar,
    WaitingForRemoteKvs,
    WaitingForStreamingReq,
    Running,
    Preempted,
    FinishedStopped,
    FinishedLengthCapped,
    FinishedAborted,
    FinishedIgnored,
    FinishedError,
    FinishedRepetition,
}

impl RequestStatus {
    pub fn is_finished(self) -> bool {
        self > RequestStatus::Preempted
    }

    /// Waiting statuses the waiting loop must skip rather than admit.
    pub fn is_blocked(self) -> bool {
        matches!(
            self,
            RequestStatus::WaitingForGrammar
                | RequestStatus::WaitingForRemoteKvs
                | RequestStatus::WaitingForStreamingReq
        )
    }

    /// The finish reason a finished status reports (`None` if not finished).
    pub fn finish_reason(self) -> Option<FinishReason> {
        Some(match self {
            RequestStatus::FinishedStopped => FinishReason::Stop,
            RequestStatus::FinishedLengthCapped | RequestStatus::FinishedIgnored => {
                FinishReason::Length
            }
            RequestStatus::FinishedAborted => FinishReason::Abort,
            RequestStatus::FinishedError => FinishReason::Error,
            RequestStatus::FinishedRepetition => FinishReason::Repetition,
            _ => return None,
        })
    }
}

/// Why a request finished, as reported to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    Error,
    Repetition,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
            FinishReason::Repetition => "repetition",
        }
    }
}

/// Which stop condition fired, when it was more specific than EOS or length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// One of `stop_token_ids`.
    Token(TokenId),
    RepetitionDetected,
}

/// What a caller hands to `Scheduler::add_request`.
#[derive(Clone, Debug)]
pub struct NewRequest {
    pub id: RequestId,
    pub prompt_token_ids: Vec<TokenId>,
    pub sampling_params: Arc<SamplingParams>,
    /// Lower runs first under the priority policy.
    pub priority: i64,
    /// Orders requests of equal priority (earlier first); the caller's clock.
    pub arrival_time: f64,
    /// Isolates prefix-cache sharing between tenants.
    pub cache_salt: Option<String>,
    /// Starts in `WaitingForGrammar` until `Scheduler::set_grammar_ready`.
    pub needs_grammar: bool,
    /// Prompt tokens whose KV arrives from elsewhere (the prefill instance
    /// of a prefill/decode-disaggregated pair: vLLM's KV connector with a
    /// synchronous load). At the first admission they count as computed
    /// beyond the local prefix hit and get blocks, but use no token budget;
    /// at least the last token is still computed here, for its logits. A
    /// preempted request recomputes them. 0 for every ordinary request.
    pub num_external_computed_tokens: usize,
}

impl NewRequest {
    pub fn new(id: impl Into<RequestId>, prompt: Vec<TokenId>, params: SamplingParams) -> Self {
        Self {
            id: id.into(),
            prompt_token_ids: prompt,
            sampling_params: Arc::new(params),
            priority: 0,
            arrival_time: 0.0,
            cache_salt: None,
            needs_grammar: false,
            num_external_computed_tokens: 0,
        }
    }
}

/// The scheduler's record of one request.
#[derive(Debug)]
pub struct Request {
    pub(crate) id: RequestId,
    pub(crate) all_token_ids: Vec<TokenId>,
    pub(crate) num_prompt_tokens: usize,
    pub(crate) num_computed_tokens: usize,
    pub(crate) spec_token_ids: Vec<TokenId>,
    pub(crate) status: RequestStatus,
    pub(crate) priority: i64,
    pub(crate) arrival_time: f64,
    pub(crate) sampling_params: Arc<SamplingParams>,
    pub(crate) num_preemptions: u32,
    pub(crate) block_hashes: Vec<BlockHash>,
    pub(crate) stop_reason: Option<StopReason>,
    pub(crate) cache_salt: Option<String>,
    pub(crate) is_prefill_chunk: bool,
    /// Prefix-cache hit at the first admission (vLLM's
    /// `prefill_stats.num_cached_tokens`); `None` until admitted.
    pub(crate) num_cached_tokens: Option<usize>,
    /// `NewRequest::num_external_computed_tokens`, zeroed once admitted.
    pub(crate) num_external_computed_tokens: usize,
}

impl Request {
    pub(crate) fn from_new(new: NewRequest, hasher: Option<&BlockHasher>) -> Self {
        let mut r = Request {
            id: new.id,
            num_prompt_tokens: new.prompt_token_ids.len(),
            all_token_ids: new.prompt_token_ids,
            num_computed_tokens: 0,
            spec_token_ids: Vec::new(),
            status: if new.needs_grammar {
                RequestStatus::WaitingForGrammar
            } else {
                RequestStatus::Waiting
            },
            priority: new.priority,
            arrival_time: new.arrival_time,
            sampling_params: new.sampling_params,
            num_preemptions: 0,
            block_hashes: Vec::new(),
            stop_reason: None,
            cache_salt: new.cache_salt,
            is_prefill_chunk: false,
            num_cached_tokens: None,
            num_external_computed_tokens: new.num_external_computed_tokens,
        };
        if let Some(h) = hasher {
            h.extend(
                &r.all_token_ids,
                r.cache_salt.as_deref(),
                &mut r.block_hashes,
            );
        }
        r
    }

    /// Reserves room for every token the request can reach (prompt plus
    /// `max_tokens`, capped by `max_model_len`) and their block hashes, so
    /// that appending outputs never reallocates: a steady decode step
    /// allocates nothing per request.
    pub(crate) fn reserve_for_outputs(&mut self, max_model_len: usize, block_size: usize) {
        // Saturating: `max_tokens` is the caller's and may be huge; the
        // reservation is capped by `max_model_len` (itself bounded by
        // `MAX_MODEL_LEN`).
        let total = self
            .num_prompt_tokens
            .saturating_add(self.sampling_params.max_tokens)
            .min(max_model_len);
        self.all_token_ids
            .reserve_exact(total.saturating_sub(self.all_token_ids.len()));
        let blocks = total / block_size.max(1);
        self.block_hashes
            .reserve_exact(blocks.saturating_sub(self.block_hashes.len()));
    }

    pub fn id(&self) -> &RequestId {
        &self.id
    }
    pub fn status(&self) -> RequestStatus {
        self.status
    }
    pub fn priority(&self) -> i64 {
        self.priority
    }
    pub fn arrival_time(&self) -> f64 {
        self.arrival_time
    }
    pub fn sampling_params(&self) -> &Arc<SamplingParams> {
        &self.sampling_params
    }
    pub fn prompt_token_ids(&self) -> &[TokenId] {
        &self.all_token_ids[..self.num_prompt_tokens]
    }
    pub fn output_token_ids(&self) -> &[TokenId] {
        &self.all_token_ids[self.num_prompt_tokens..]
    }
    pub fn all_token_ids(&self) -> &[TokenId] {
        &self.all_token_ids
    }
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }
    /// Prompt plus outputs.
    pub fn num_tokens(&self) -> usize {
        self.all_token_ids.len()
    }
    pub fn num_output_tokens(&self) -> usize {
        self.all_token_ids.len() - self.num_prompt_tokens
    }
    pub fn num_tokens_with_spec(&self) -> usize {
        self.all_token_ids.len() + self.spec_token_ids.len()
    }
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }
    pub fn num_preemptions(&self) -> u32 {
        self.num_preemptions
    }
    pub fn max_tokens(&self) -> usize {
        self.sampling_params.max_tokens
    }
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_reason
    }
    pub fn spec_token_ids(&self) -> &[TokenId] {
        &self.spec_token_ids
    }
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }
    pub fn is_finished(&self) -> bool {
        self.status.is_finished()
    }
    /// Prefix-cache hit recorded at the first admission.
    pub fn num_cached_tokens(&self) -> Option<usize> {
        self.num_cached_tokens
    }
    /// Whether this request may adopt blocks from the prefix cache: not when
    /// it wants prompt logprobs, which need logits at every prompt position.
    pub fn reads_prefix_cache(&self) -> bool {
        self.sampling_params.prompt_logprobs.is_none()
    }

    pub(crate) fn append_output_token(&mut self, token: TokenId, hasher: Option<&BlockHasher>) {
        self.all_token_ids.push(token);
        if let Some(h) = hasher {
            h.extend(
                &self.all_token_ids,
                self.cache_salt.as_deref(),
                &mut self.block_hashes,
            );
        }
    }

    /// vLLM's `check_stop`, run after each appended token: EOS, then stop
    /// token ids, then length (`max_model_len` or `max_tokens`). `min_tokens`
    /// does not gate EOS or stop tokens here; the sampler masks them instead.
    /// Sets the finished status and returns true when the request stops.
    pub(crate) fn check_stop(&mut self, max_model_len: usize) -> bool {
        let Some(&last) = self.all_token_ids.last() else {
            return false;
        };
        let params = &self.sampling_params;
        if Some(last) == params.eos_token_id {
            self.status = RequestStatus::FinishedStopped;
            return true;
        }
        if params.stop_token_ids.contains(&last) {
            self.status = RequestStatus::FinishedStopped;
            self.stop_reason = Some(StopReason::Token(last));
            return true;
        }
        if self.num_tokens() >= max_model_len || self.num_output_tokens() >= params.max_tokens {
            self.status = RequestStatus::FinishedLengthCapped;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(params: SamplingParams) -> Request {
        Request::from_new(NewRequest::new("r", vec![1, 2, 3], params), None)
    }

    #[test]
    fn status_order_defines_finished() {
        assert!(!RequestStatus::Preempted.is_finished());
        assert!(!RequestStatus::Running.is_finished());
        assert!(RequestStatus::FinishedStopped.is_finished());
        assert!(RequestStatus::FinishedRepetition.is_finished());
        assert_eq!(
            RequestStatus::FinishedIgnored.finish_reason(),
            Some(FinishReason::Length)
        );
        assert_eq!(RequestStatus::Waiting.finish_reason(), None);
    }

    #[test]
    fn stop_checks_run_eos_then_stop_tokens_then_length() {
        // The EOS is also the max_tokens-th output: `stop` wins over `length`.
        let mut r = req(SamplingParams {
            max_tokens: 1,
            eos_token_id: Some(9),
            ..SamplingParams::default()
        });
        r.append_output_token(9, None);
        assert!(r.check_stop(100));
        assert_eq!(r.status, RequestStatus::FinishedStopped);
        assert_eq!(r.stop_reason, None);

        // A stop token on the last allowed output: `stop`, with its reason.
        let mut r = req(SamplingParams {
            max_tokens: 1,
            stop_token_ids: vec![5],
            ..SamplingParams::default()
        });
        r.append_output_token(5, None);
        assert!(r.check_stop(100));
        assert_eq!(r.status, RequestStatus::FinishedStopped);
        assert_eq!(r.stop_reason, Some(StopReason::Token(5)));

        // min_tokens does not gate EOS in the scheduler.
        let mut r = req(SamplingParams {
            max_tokens: 10,
            min_tokens: 5,
            eos_token_id: Some(9),
            ..SamplingParams::default()
        });
        r.append_output_token(9, None);
        assert!(r.check_stop(100));

        // Length by max_model_len (3 prompt + 1 output = 4).
        let mut r = req(SamplingParams {
            max_tokens: 10,
            ..SamplingParams::default()
        });
        r.append_output_token(1, None);
        assert!(r.check_stop(4));
        assert_eq!(r.status, RequestStatus::FinishedLengthCapped);

        // ignore_eos leaves eos_token_id unset: the EOS token is inert.
        let mut r = req(SamplingParams {
            max_tokens: 10,
            ignore_eos: true,
            ..SamplingParams::default()
        });
        r.append_output_token(9, None);
        assert!(!r.check_stop(100));
    }
}
