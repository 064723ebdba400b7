//! `ModelRunner`: turns each `SchedulerOutput` into one forward pass and a
//! `ModelRunnerOutput`.
//!
//! The runner is the device-independent half: request states, the
//! flattened batch (block tables, slot mapping), which rows need logits,
//! sampling and logprobs. The forward pass itself is a [`ForwardBackend`]
//! (`backend.rs`): [`CpuBackend`] (the CPU model and its paged KV cache) by
//! default, or any other implementation through
//! [`ModelRunner::with_backend`] (a CUDA backend, a simulated model).
//!
//! Data flow of `execute`:
//! 1. update the persistent request states from the step's deltas
//!    (finished → dropped; new → created; cached → progress and appended
//!    blocks; resumed → block table replaced). Preempted requests keep their
//!    state — tokens and, above all, the sampler with its seeded generator —
//!    so a recomputed request continues exactly where it stopped;
//! 2. build one flattened batch in scheduling order (input ids, positions,
//!    slot mapping, per-request query start / length / context length and
//!    block table), mixing prefill chunks and decodes;
//! 3. run the backend's forward pass; attention writes the step's K/V at
//!    the slot mapping and reads through the block tables;
//! 4. compute logits only for requests whose computed tokens reach all their
//!    known tokens after this step (plus prompt rows of requests that asked
//!    for prompt logprobs), sample, append each sampled token to the
//!    runner's own copy of the request, and report it. A request with k
//!    drafts scheduled (`scheduled_spec_decode_tokens`) has them as inputs
//!    after its last known token and k + 1 sampling rows, verified in order
//!    (`verify.rs`): it reports the accepted drafts plus one token, exactly
//!    the tokens it would have sampled one step at a time.
//!
//! Promises: a malformed `SchedulerOutput` (unknown request, block id
//! outside the pool, tokens scheduled past what is known) is an error, never
//! a panic; after a warm-up step a decode step allocates only the output it
//! returns.

mod backend;
mod registry;
mod state;
mod verify;

pub use self::backend::{CpuBackend, ForwardBackend};
pub use self::registry::{
    BackendEntry, BackendFactory, BackendRegistry, BackendRequest, SpeculationRequest,
    DEFAULT_BACKEND,
};

use self::state::RequestState;
use crate::drafter::DraftRequest;
use crate::kv_cache::KvCacheConfig;
use crate::model::{ForwardBatch, LoadedModel, Model};
use crate::sampling::{prompt_logprobs, RequestSampler};
use anyhow::{anyhow, bail, Result};
use sluice_core::output::PromptLogprobs;
use sluice_core::{
    ModelRunnerOutput, RequestId, SampleLogprobs, SchedulerOutput, TokenId, PLACEHOLDER_TOKEN_ID,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Prompt rows whose logits are computed at once for prompt logprobs
/// (bounds the logits buffer at `rows × vocab`).
const PROMPT_LOGITS_CHUNK: usize = 64;

/// What one scheduled request contributes to the current step.
#[derive(Clone, Copy, Debug)]
struct StepEntry {
    /// Row in the logits of the sampling rows, if the request samples
    /// (the first of its 1 + `num_drafts` rows).
    sample_row: Option<usize>,
    /// Drafts scheduled for the request this step, verified in order.
    num_drafts: usize,
    /// First and end prompt position whose next-token logprobs this step
    /// reports (empty range when none).
    prompt_lp: (usize, usize),
    /// Index of the first prompt-logprob row in `ForwardBatch::logits_rows`.
    prompt_lp_row: usize,
}

/// Executes scheduler steps on one backend (by default the CPU model with
/// its paged KV cache).
pub struct ModelRunner<B: ForwardBackend = CpuBackend> {
    backend: B,
    requests: HashMap<RequestId, RequestState>,
    /// Draws default seeds for requests without one.
    seed_state: u64,
    batch: ForwardBatch,
    entries: Vec<StepEntry>,
    logits: Vec<f32>,
    /// Input ids of a request with drafts (its known tokens, then the
    /// drafts), reused between requests and steps.
    draft_inputs: Vec<TokenId>,
    /// One request's tokens of this step, reused.
    step_tokens: Vec<TokenId>,
    /// The backend's KV cache groups (fixed for its life).
    num_kv_groups: usize,
}

impl ModelRunner<CpuBackend> {
    /// A runner over `loaded` with a KV cache of `kv_config` (allocated
    /// lazily: pages are committed as blocks are first written).
    pub fn new(loaded: &LoadedModel, kv_config: KvCacheConfig) -> Result<Self> {
        Ok(Self::with_backend(CpuBackend::new(loaded, kv_config)?))
    }

    /// A runner over weights already read.
    pub fn with_model(model: Arc<Model>, kv_config: KvCacheConfig) -> Result<Self> {
        Ok(Self::with_backend(CpuBackend::with_model(
            model, kv_config,
        )?))
    }

    pub fn model(&self) -> &Arc<Model> {
        self.backend.model()
    }
}

impl<B: ForwardBackend> ModelRunner<B> {
    /// A runner over any forward backend.
    pub fn with_backend(backend: B) -> Self {
        ModelRunner {
            num_kv_groups: backend.kv_cache_groups().len(),
            backend,
            requests: HashMap::new(),
            seed_state: 0,
            batch: ForwardBatch::default(),
            entries: Vec::new(),
            logits: Vec::new(),
            draft_inputs: Vec::new(),
            step_tokens: Vec::new(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Seeds the generator that picks a seed for each request that brings
    /// none.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed_state = seed;
        self
    }

    /// Blocks in the pool, null block included: the scheduler's
    /// `num_gpu_blocks`.
    pub fn num_kv_blocks(&self) -> usize {
        self.backend.num_kv_blocks()
    }

    pub fn block_size(&self) -> usize {
        self.backend.block_size()
    }

    /// The KV cache groups of the backend's cache, in the scheduler's order.
    pub fn kv_cache_groups(&self) -> Vec<sluice_core::kv_cache::KvCacheGroupSpec> {
        self.backend.kv_cache_groups()
    }

    /// How the backend's KV cache stores its elements, if it says.
    pub fn kv_cache_dtype(&self) -> Option<crate::kv_cache::KvDtype> {
        self.backend.kv_cache_dtype()
    }

    /// Token ids the backend's model accepts: `0..vocab_size`.
    pub fn vocab_size(&self) -> usize {
        self.backend.vocab_size()
    }

    /// Requests whose state the runner holds (running and preempted).
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// What a drafter sees of a request after a step: its tokens (prompt,
    /// then outputs, the step's sampled tokens included). `None` for a
    /// request the runner does not hold. (A structured-output request's
    /// drafts are checked against its grammar by the engine, which sends
    /// one mask row per verified position.)
    pub fn draft_view<'a>(
        &'a self,
        req_id: &'a RequestId,
        max_model_len: usize,
    ) -> Option<DraftRequest<'a>> {
        let state = self.requests.get(req_id)?;
        Some(DraftRequest {
            req_id,
            token_ids: &state.token_ids,
            num_prompt_tokens: state.num_prompt_tokens,
            max_model_len,
        })
    }

    fn next_default_seed(&mut self) -> u64 {
        // splitmix64 step
        self.seed_state = self.seed_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Runs one scheduler step.
    pub fn execute(&mut self, so: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        self.update_states(so)?;
        let mut out = ModelRunnerOutput::with_capacity(so.num_scheduled_tokens.len());
        if so.num_scheduled_tokens.is_empty() {
            return Ok(out);
        }
        let num_sample_rows = self.build_batch(so)?;
        let vocab = self.backend.vocab_size();
        self.backend.forward(&self.batch)?;
        self.backend.logits(0..num_sample_rows, &mut self.logits)?;

        let any_logprobs = so
            .num_scheduled_tokens
            .iter()
            .zip(&self.entries)
            .any(|(s, e)| {
                e.sample_row.is_some() && self.requests[&s.req_id].params.logprobs.is_some()
            });
        let mut logprobs: Option<Vec<Option<SampleLogprobs>>> =
            any_logprobs.then(|| Vec::with_capacity(num_sample_rows));
        // Structured-output rows by request (a handful per step): the
        // first row of each request and how many it has (1 + its drafts).
        let mut grammar_rows: HashMap<&str, (usize, usize)> = HashMap::new();
        for (i, id) in so
            .grammar_bitmask
            .iter()
            .flat_map(|m| m.req_ids.iter().enumerate())
        {
            grammar_rows.entry(&**id).or_insert((i, 0)).1 += 1;
        }
        for (sched, entry) in so.num_scheduled_tokens.iter().zip(&self.entries) {
            let state = self
                .requests
                .get_mut(&sched.req_id)
                .ok_or_else(|| anyhow!("request {} vanished during the step", sched.req_id))?;
            state.num_computed_tokens += sched.num_tokens;
            let Some(row) = entry.sample_row else {
                out.push(&[]);
                continue;
            };
            let mask = match (grammar_rows.get(&*sched.req_id), &so.grammar_bitmask) {
                (Some(&(first, n)), Some(mask)) => {
                    state.uses_grammar = true;
                    let w = mask.words_per_row;
                    mask.words
                        .get(first * w..(first + n) * w)
                        .map(|rows| (rows, w))
                }
                _ => None,
            };
            let rows = &mut self.logits[row * vocab..(row + 1 + entry.num_drafts) * vocab];
            let drafts = if entry.num_drafts == 0 {
                &[][..]
            } else {
                so.spec_tokens_of(&sched.req_id)
            };
            self.step_tokens.clear();
            verify::sample_rows(
                state,
                &sched.req_id,
                rows,
                vocab,
                drafts,
                mask,
                &mut self.step_tokens,
                logprobs.as_mut(),
            )?;
            out.push(&self.step_tokens);
        }
        out.logprobs = logprobs;
        out.prompt_logprobs = self.prompt_logprobs(so, num_sample_rows)?;
        Ok(out)
    }

    /// Step 1: apply finished / new / cached / resumed deltas.
    fn update_states(&mut self, so: &SchedulerOutput) -> Result<()> {
        for id in &so.finished_req_ids {
            self.requests.remove(id);
        }
        let num_blocks = self.backend.num_kv_blocks();
        let num_groups = self.num_kv_groups;
        for new in &so.scheduled_new_reqs {
            check_groups(&new.req_id, new.block_ids.len(), num_groups)?;
            for table in &new.block_ids {
                check_blocks(&new.req_id, table, num_blocks)?;
            }
            let seed = self.next_default_seed();
            let sampler =
                RequestSampler::new(new.sampling_params.clone(), &new.prompt_token_ids, seed);
            self.requests
                .insert(new.req_id.clone(), RequestState::new(new, sampler));
        }
        let cached = &so.scheduled_cached_reqs;
        for (i, c) in cached.reqs.iter().enumerate() {
            let state = self.requests.get_mut(&c.req_id).ok_or_else(|| {
                anyhow!(
                    "scheduler output refers to request {} which the runner never received \
                     as new (or already finished)",
                    c.req_id
                )
            })?;
            let groups = cached.new_block_ids(i);
            if let Some(g) = groups {
                check_groups(&c.req_id, g.num_groups(), num_groups)?;
                for k in 0..g.num_groups() {
                    check_blocks(&c.req_id, g.group(k), num_blocks)?;
                }
            }
            state.apply_cached(c, |k| groups.map_or(&[][..], |g| g.group(k)))?;
        }
        Ok(())
    }

    /// Step 2: the flattened batch and which rows need logits. Returns the
    /// number of sampling rows (they come first in `logits_rows`).
    fn build_batch(&mut self, so: &SchedulerOutput) -> Result<usize> {
        let bs = self.backend.block_size();
        self.batch.clear();
        self.entries.clear();
        let mut num_sample_rows = 0;
        for sched in &so.num_scheduled_tokens {
            let drafts = so.spec_tokens_of(&sched.req_id);
            let state = self.requests.get(&sched.req_id).ok_or_else(|| {
                anyhow!(
                    "request {} is scheduled but unknown to the runner",
                    sched.req_id
                )
            })?;
            let start = state.num_computed_tokens;
            let end = start + sched.num_tokens;
            let known = state.token_ids.len();
            verify::check_span(&sched.req_id, start, end, known, drafts.len())?;
            let inputs = if drafts.is_empty() {
                &state.token_ids[start..end]
            } else {
                self.draft_inputs.clear();
                self.draft_inputs
                    .extend_from_slice(&state.token_ids[start..]);
                // A placeholder row (vLLM's padding) computes any token: it
                // is rejected whatever the row gives.
                self.draft_inputs.extend(drafts.iter().map(|&d| {
                    if d == PLACEHOLDER_TOKEN_ID {
                        0
                    } else {
                        d
                    }
                }));
                &self.draft_inputs[..]
            };
            let first_row = self
                .batch
                .push_seq_groups(inputs, start, &state.block_tables, bs)
                .map_err(|e| anyhow!("request {}: {e}", sched.req_id))?;
            // The row of the last known token, then one per draft.
            let samples = end >= known;
            let sample_row = samples.then(|| {
                let last_known_row = first_row + (known - 1 - start);
                self.batch
                    .logits_rows
                    .extend(last_known_row..=last_known_row + drafts.len());
                num_sample_rows += 1 + drafts.len();
                num_sample_rows - 1 - drafts.len()
            });
            // Prompt positions p in this chunk whose next token is a prompt
            // token (p + 1 < prompt length) and not yet reported.
            let prompt_lp = if state.params.prompt_logprobs.is_some() {
                let lo = start.max(state.num_prompt_logprobs_done);
                let hi = end.min(state.num_prompt_tokens.saturating_sub(1));
                (lo, hi.max(lo))
            } else {
                (start, start)
            };
            self.entries.push(StepEntry {
                sample_row,
                num_drafts: drafts.len(),
                prompt_lp,
                // A batch row for now; turned into a logits row below.
                prompt_lp_row: first_row + (prompt_lp.0 - start),
            });
        }
        // Prompt-logprob rows follow the sampling rows.
        for e in &mut self.entries {
            let (lo, hi) = e.prompt_lp;
            let batch_row = e.prompt_lp_row;
            e.prompt_lp_row = self.batch.logits_rows.len();
            self.batch
                .logits_rows
                .extend(batch_row..batch_row + (hi - lo));
        }
        Ok(num_sample_rows)
    }

    /// Step 4b: prompt logprobs for the prompt rows of this step, computed in
    /// bounded chunks of rows.
    fn prompt_logprobs(
        &mut self,
        so: &SchedulerOutput,
        num_sample_rows: usize,
    ) -> Result<Vec<PromptLogprobs>> {
        let mut result = Vec::new();
        if self.batch.logits_rows.len() == num_sample_rows {
            return Ok(result);
        }
        let vocab = self.backend.vocab_size();
        for (sched, entry) in so.num_scheduled_tokens.iter().zip(&self.entries) {
            let (lo, hi) = entry.prompt_lp;
            if lo == hi {
                continue;
            }
            let state = self
                .requests
                .get_mut(&sched.req_id)
                .ok_or_else(|| anyhow!("request {} vanished during the step", sched.req_id))?;
            let top_n = state.params.prompt_logprobs.unwrap_or(0);
            let mut positions = Vec::with_capacity(hi - lo);
            let mut p = lo;
            while p < hi {
                let n = (hi - p).min(PROMPT_LOGITS_CHUNK);
                let row = entry.prompt_lp_row + (p - lo);
                self.backend.logits(row..row + n, &mut self.logits)?;
                positions.extend(prompt_logprobs(
                    &self.logits[..n * vocab],
                    vocab,
                    &state.token_ids[p + 1..p + 1 + n],
                    top_n,
                ));
                p += n;
            }
            state.num_prompt_logprobs_done = hi;
            result.push(PromptLogprobs {
                req_id: sched.req_id.clone(),
                positions,
            });
        }
        Ok(result)
    }
}

/// A request brings one block table per KV cache group of the backend's
/// cache (the scheduler was configured with the executor's groups).
fn check_groups(req_id: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        bail!(
            "request {req_id}: the scheduler output has block tables for {got} KV cache \
             groups; this model's KV cache has {want}"
        );
    }
    Ok(())
}

fn check_blocks(req_id: &str, blocks: &[u32], num_blocks: usize) -> Result<()> {
    if let Some(&b) = blocks.iter().find(|&&b| b as usize >= num_blocks) {
        bail!("request {req_id}: block id {b} is outside the KV cache ({num_blocks} blocks)");
    }
    Ok(())
}
