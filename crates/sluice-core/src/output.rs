//! What crosses the scheduler's boundary each step.
//!
//! `SchedulerOutput` goes to the model runner: full data for requests it has
//! never seen, only deltas (new block ids, progress) for the ones it already
//! holds, as in vLLM. `ModelRunnerOutput` comes back with the sampled tokens,
//! and `update_from_output` turns it into one `EngineCoreOutput` per request
//! that produced tokens or finished.

use crate::request::{BlockId, FinishReason, RequestId, StopReason, TokenId};
use crate::sampling_params::SamplingParams;
use smallvec::SmallVec;
use std::sync::Arc;

/// Identifies a live request inside the scheduler without hashing its id.
/// Stale after the request is freed (the generation no longer matches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReqHandle {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// A request the runner has not seen: everything it needs to build its state.
#[derive(Clone, Debug)]
pub struct NewRequestData {
    pub req_id: RequestId,
    pub prompt_token_ids: Vec<TokenId>,
    pub sampling_params: Arc<SamplingParams>,
    /// The whole block table of each KV cache group, in group order
    /// (vLLM's tuple of lists), prefix-hit blocks and null entries included.
    pub block_ids: Vec<Vec<BlockId>>,
    /// Tokens whose KV is already present (the prefix hit), before this step.
    pub num_computed_tokens: usize,
}

/// A request the runner already holds, scheduled again.
#[derive(Clone, Debug)]
pub struct CachedRequest {
    pub req_id: RequestId,
    /// Re-admitted after a preemption: its block table is *replaced* by
    /// `new_block_ids` (the whole table) instead of extended.
    pub resumed: bool,
    /// Progress before this step.
    pub num_computed_tokens: usize,
    pub num_output_tokens: usize,
    /// `start..end` into `CachedRequestData::group_bounds` (one entry per
    /// group); `None` when no group added a block.
    new_blocks: Option<(u32, u32)>,
    /// For resumed requests: every known token (prompt and outputs), so a
    /// runner that dropped the request on preemption can rebuild it.
    pub all_token_ids: Option<Vec<TokenId>>,
}

/// Scheduled running requests, then resumed ones (vLLM's `CachedRequestData`).
/// New block ids live in one flat array (with one `start..end` per group
/// per request) so a decode step allocates nothing per request.
#[derive(Clone, Debug, Default)]
pub struct CachedRequestData {
    pub reqs: Vec<CachedRequest>,
    block_ids: Vec<BlockId>,
    group_bounds: Vec<(u32, u32)>,
}

/// One request's new block ids, one list per KV cache group in group order
/// (vLLM's tuple of lists).
#[derive(Clone, Copy, Debug)]
pub struct GroupBlockIds<'a> {
    ids: &'a [BlockId],
    bounds: &'a [(u32, u32)],
}

impl<'a> GroupBlockIds<'a> {
    pub fn num_groups(&self) -> usize {
        self.bounds.len()
    }

    /// The ids of group `g` (empty past the last group).
    pub fn group(&self, g: usize) -> &'a [BlockId] {
        self.bounds
            .get(g)
            .map_or(&[], |&(s, e)| &self.ids[s as usize..e as usize])
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a [BlockId]> + 'a {
        let ids = self.ids;
        self.bounds
            .iter()
            .map(move |&(s, e)| &ids[s as usize..e as usize])
    }
}

impl CachedRequestData {
    /// `new_blocks`: the request's new block ids of each group, in order.
    pub(crate) fn push<'b>(
        &mut self,
        req_id: RequestId,
        resumed: bool,
        num_computed_tokens: usize,
        num_output_tokens: usize,
        new_blocks: impl IntoIterator<Item = &'b [BlockId]>,
        all_token_ids: Option<Vec<TokenId>>,
    ) {
        let first = self.group_bounds.len() as u32;
        let mut any = false;
        for blocks in new_blocks {
            let start = self.block_ids.len() as u32;
            self.block_ids.extend_from_slice(blocks);
            self.group_bounds.push((start, self.block_ids.len() as u32));
            any |= !blocks.is_empty();
        }
        let new_blocks = if any {
            Some((first, self.group_bounds.len() as u32))
        } else {
            self.group_bounds.truncate(first as usize);
            None
        };
        self.reqs.push(CachedRequest {
            req_id,
            resumed,
            num_computed_tokens,
            num_output_tokens,
            new_blocks,
            all_token_ids,
        });
    }

    pub fn len(&self) -> usize {
        self.reqs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Room for `n` requests; in a decode step about one in `block_size`
    /// gets a new block, so `n` block ids rarely need a second allocation.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.reqs.reserve(n);
        self.block_ids.reserve(n);
        self.group_bounds.reserve(n);
    }

    /// Blocks added for entry `i`, per group (the whole tables if it
    /// resumed), or `None` when no group added one.
    pub fn new_block_ids(&self, i: usize) -> Option<GroupBlockIds<'_>> {
        self.reqs[i].new_blocks.map(|(s, e)| GroupBlockIds {
            ids: &self.block_ids,
            bounds: &self.group_bounds[s as usize..e as usize],
        })
    }
}

/// One scheduled request and its token count, in scheduling order.
#[derive(Clone, Debug)]
pub struct ScheduledRequest {
    pub req_id: RequestId,
    pub handle: ReqHandle,
    pub num_tokens: usize,
}

/// Draft tokens an executor proposes for the next step (vLLM's
/// `DraftTokenIds`): per request, the tokens the target model is to verify.
/// The engine hands them to `Scheduler::update_draft_token_ids`.
pub type DraftTokenIds = Vec<(RequestId, Vec<TokenId>)>;

/// The decision of one `schedule()` call.
#[derive(Clone, Debug, Default)]
pub struct SchedulerOutput {
    pub scheduled_new_reqs: Vec<NewRequestData>,
    pub scheduled_cached_reqs: CachedRequestData,
    /// Running requests first (in running order), then admissions (in
    /// admission order). Every entry is > 0.
    pub num_scheduled_tokens: Vec<ScheduledRequest>,
    pub total_num_scheduled_tokens: usize,
    /// Draft tokens to verify per request (speculative decoding only).
    pub scheduled_spec_decode_tokens: Vec<(RequestId, Vec<TokenId>)>,
    /// Every request preempted since the previous `schedule()`, in order.
    pub preempted_req_ids: Vec<RequestId>,
    /// Every request finished since the previous `schedule()`: the runner
    /// drops their state.
    pub finished_req_ids: Vec<RequestId>,
    /// The allowed tokens of this step's structured-output requests (vLLM's
    /// `GrammarOutput`): not made by `schedule()`, but filled in by the
    /// engine from the requests' grammar matchers before the step runs.
    pub grammar_bitmask: Option<GrammarBitmask>,
}

/// One allowed-token bitmask row per constrained request of a step: token
/// `t` of row `i` is allowed when bit `t % 32` of word `t / 32` is set.
/// The runner sets every other token's logit to -inf before sampling
/// (vLLM applies its grammar bitmask to the raw logits, ahead of the
/// sampler, so logprobs are those of the masked distribution).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GrammarBitmask {
    /// Words per row (`vocab_size.div_ceil(32)`).
    pub words_per_row: usize,
    /// The request of each row, in row order.
    pub req_ids: Vec<RequestId>,
    /// `req_ids.len() × words_per_row` words.
    pub words: Vec<u32>,
}

impl GrammarBitmask {
    pub fn new(words_per_row: usize) -> Self {
        GrammarBitmask {
            words_per_row,
            ..Default::default()
        }
    }

    /// Appends a row for `req_id` (all zeros) and returns it to fill.
    pub fn push_row(&mut self, req_id: RequestId) -> &mut [u32] {
        self.req_ids.push(req_id);
        let start = self.words.len();
        self.words.resize(start + self.words_per_row, 0);
        &mut self.words[start..]
    }

    /// Row `i`'s words.
    pub fn row(&self, i: usize) -> &[u32] {
        let start = i * self.words_per_row;
        self.words
            .get(start..start + self.words_per_row)
            .unwrap_or(&[])
    }

    /// Each row with its request, in row order.
    pub fn rows(&self) -> impl Iterator<Item = (&str, &[u32])> {
        self.req_ids
            .iter()
            .enumerate()
            .map(|(i, id)| (&**id, self.row(i)))
    }

    pub fn is_empty(&self) -> bool {
        self.req_ids.is_empty()
    }
}

/// A scheduled draft that no drafter proposed: vLLM pads a request admitted
/// with one token left to the uniform `1 + k` rows of a speculative decode
/// step with these (`-1` in vLLM and in decision logs). One never matches a
/// sampled token, so it and every row after it are rejected.
pub const PLACEHOLDER_TOKEN_ID: TokenId = TokenId::MAX;

impl SchedulerOutput {
    /// The drafts scheduled for `req_id` to verify, placeholders included
    /// (empty when none; a scan of the few requests that have drafts).
    pub fn spec_tokens_of(&self, req_id: &str) -> &[TokenId] {
        self.scheduled_spec_decode_tokens
            .iter()
            .find(|(id, _)| &**id == req_id)
            .map_or(&[][..], |(_, d)| &d[..])
    }

    /// The proposed drafts scheduled for `req_id`: `spec_tokens_of` up to
    /// its first placeholder, the most that verification can accept.
    pub fn proposed_drafts_of(&self, req_id: &str) -> &[TokenId] {
        let d = self.spec_tokens_of(req_id);
        let n = d
            .iter()
            .position(|&t| t == PLACEHOLDER_TOKEN_ID)
            .unwrap_or(d.len());
        &d[..n]
    }

    /// Tokens scheduled for `req_id` (a linear scan; for tests and tools).
    pub fn num_scheduled(&self, req_id: &str) -> Option<usize> {
        self.num_scheduled_tokens
            .iter()
            .find(|s| &*s.req_id == req_id)
            .map(|s| s.num_tokens)
    }

    pub fn is_empty(&self) -> bool {
        self.total_num_scheduled_tokens == 0
    }
}

/// One token's logprob.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token_id: TokenId,
    pub logprob: f32,
}

/// Logprobs at one sampled position: the chosen token (with its rank in the
/// distribution, 1 = best) and the top-N.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleLogprobs {
    pub sampled: TokenLogprob,
    pub rank: usize,
    pub top: Vec<TokenLogprob>,
}

/// Prompt logprobs of one request: for each prompt position after the first,
/// the logprob of the actual token and the top-N (position 0 has none).
#[derive(Clone, Debug, PartialEq)]
pub struct PromptLogprobs {
    pub req_id: RequestId,
    pub positions: Vec<SampleLogprobs>,
}

/// What the model runner returns for one `SchedulerOutput`. Entry `i` belongs
/// to `num_scheduled_tokens[i]`; a request still mid-prefill samples nothing.
#[derive(Clone, Debug, Default)]
pub struct ModelRunnerOutput {
    offsets: Vec<u32>,
    tokens: Vec<TokenId>,
    /// When any request asked for logprobs: one entry per sampled token,
    /// aligned with the flattened tokens (`None` for requests that did not
    /// ask).
    pub logprobs: Option<Vec<Option<SampleLogprobs>>>,
    pub prompt_logprobs: Vec<PromptLogprobs>,
}

impl ModelRunnerOutput {
    pub fn with_capacity(num_reqs: usize) -> Self {
        let mut offsets = Vec::with_capacity(num_reqs + 1);
        offsets.push(0);
        ModelRunnerOutput {
            offsets,
            tokens: Vec::with_capacity(num_reqs),
            logprobs: None,
            prompt_logprobs: Vec::new(),
        }
    }

    /// Appends the next request's sampled tokens (empty for a prefill chunk).
    pub fn push(&mut self, sampled: &[TokenId]) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.tokens.extend_from_slice(sampled);
        self.offsets.push(self.tokens.len() as u32);
    }

    pub fn num_reqs(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Tokens sampled for entry `i` (empty if out of range).
    pub fn sampled(&self, i: usize) -> &[TokenId] {
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&s), Some(&e)) => &self.tokens[s as usize..e as usize],
            _ => &[],
        }
    }

    /// Logprobs of entry `i`'s sampled tokens, if any were computed.
    pub fn sample_logprobs(&self, i: usize) -> Option<&[Option<SampleLogprobs>]> {
        let lp = self.logprobs.as_ref()?;
        let (s, e) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        lp.get(s as usize..e as usize)
    }
}

/// New tokens of one request in one step; inline for the usual one token.
pub type TokenVec = SmallVec<[TokenId; 4]>;

/// A request's progress reported by `update_from_output`.
#[derive(Clone, Debug)]
pub struct EngineCoreOutput {
    pub req_id: RequestId,
    /// Position in `num_scheduled_tokens` (and in the `ModelRunnerOutput`),
    /// for fetching logprobs.
    pub index: usize,
    pub new_token_ids: TokenVec,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    /// Prompt tokens served from the prefix cache at first admission.
    pub num_cached_tokens: usize,
}
