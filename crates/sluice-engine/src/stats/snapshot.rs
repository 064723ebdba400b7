//! `EngineStats`: the snapshot readers get (gauges, cumulative counters,
//! histograms), and `FinishCounts`, its finished completions by reason.
//! Copying a snapshot into a previous one reuses its buffers.

use super::admission::AdmissionRejections;
use super::histogram::Histogram;
use serde::Serialize;
use sluice_core::FinishReason;

/// Finished completions by reason: vLLM's `vllm:request_success` and its
/// five `finished_reason` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FinishCounts {
    pub stop: u64,
    pub length: u64,
    pub abort: u64,
    pub error: u64,
    pub repetition: u64,
}

impl FinishCounts {
    pub(super) fn add(&mut self, reason: FinishReason) {
        match reason {
            FinishReason::Stop => self.stop += 1,
            FinishReason::Length => self.length += 1,
            FinishReason::Abort => self.abort += 1,
            FinishReason::Error => self.error += 1,
            FinishReason::Repetition => self.repetition += 1,
        }
    }

    /// `(finished_reason label, count)` in vLLM's order.
    pub fn by_reason(&self) -> [(&'static str, u64); 5] {
        [
            ("stop", self.stop),
            ("length", self.length),
            ("abort", self.abort),
            ("error", self.error),
            ("repetition", self.repetition),
        ]
    }

    pub fn total(&self) -> u64 {
        self.by_reason().iter().map(|(_, n)| n).sum()
    }
}

/// A snapshot of the engine. Counters are cumulative since start; the
/// finished-request histograms count each finished completion (see the
/// module docs for which ones).
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct EngineStats {
    /// Unix time (seconds) the engine started: every family's `_created`.
    pub started_unix_secs: f64,
    /// `vllm:num_requests_running`.
    pub num_running_reqs: usize,
    /// `vllm:num_requests_waiting` (scheduler requests, so `n` counts `n`
    /// times; includes requests accepted but not yet handed to the
    /// scheduler).
    pub num_waiting_reqs: usize,
    /// Of those, the ones the scheduler skipped (blocked; vLLM's
    /// `num_skipped_waiting_reqs`): `num_requests_waiting_by_reason
    /// {reason="deferred"}`; the rest is `capacity`.
    pub num_deferred_waiting_reqs: usize,
    /// `vllm:kv_cache_usage_perc`, in 0..=1.
    pub kv_cache_usage: f64,
    pub num_kv_blocks: usize,
    pub num_free_kv_blocks: usize,
    /// `vllm:prefix_cache_queries`: prompt tokens looked up at admission
    /// (not re-admissions after preemption).
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits` (and `prompt_tokens_cached_by_source
    /// {source="device"}`): of those, tokens found in the cache.
    pub prefix_cache_hits: u64,
    /// `vllm:num_preemptions`.
    pub num_preemptions: u64,
    /// `vllm:prompt_tokens`: whole prompts of completions that produced
    /// their first token (counted then, once per completion).
    pub prompt_tokens: u64,
    /// Of those, the tokens computed (`prompt_tokens_by_source
    /// {source="local_compute"}`).
    pub prompt_tokens_computed: u64,
    /// ... and the ones served from the prefix cache (`prompt_tokens_cached`,
    /// `prompt_tokens_by_source{source="local_cache_hit"}`).
    pub prompt_tokens_cached: u64,
    /// `vllm:generation_tokens`: tokens of the completions (those after a
    /// stop string are not part of one).
    pub generation_tokens: u64,
    pub num_steps: u64,
    /// Structured outputs: steps that computed grammar bitmasks, the rows
    /// computed, and the seconds spent computing them (on the engine
    /// thread, before the model runs; sluice's own figures, not vLLM's).
    pub grammar_mask_steps: u64,
    pub grammar_mask_rows: u64,
    pub grammar_mask_seconds: f64,
    /// Speculative decoding, as vLLM's `SpecDecodingStats` counts it
    /// (`vllm:spec_decode_num_drafts` and the like): verifications (one per
    /// request per step that had drafts scheduled), draft tokens verified,
    /// and of those the ones accepted (drafts are taken up to the first
    /// that differs from the sampled token).
    pub spec_decode_num_drafts: u64,
    pub spec_decode_num_draft_tokens: u64,
    pub spec_decode_num_accepted_tokens: u64,
    /// Accepted drafts by position in their step's run (index 0: the
    /// first draft); as long as the longest run verified.
    pub spec_decode_accepted_per_pos: Vec<u64>,
    /// `vllm:request_success{finished_reason}`.
    pub finished: FinishCounts,
    /// `vllm:admission_rejections{reason}` (filled in by `Engine::stats`).
    pub admission_rejections: AdmissionRejections,
    /// `vllm:iteration_tokens_total`: per step with at least one output,
    /// prompt tokens computed for completions whose first token came that
    /// step + tokens generated.
    pub iteration_tokens: Histogram,
    /// `vllm:time_to_first_token_seconds`: arrival to first token.
    pub time_to_first_token: Histogram,
    /// `vllm:inter_token_latency_seconds`: between consecutive outputs of a
    /// completion (one observation per output, not per token).
    pub inter_token_latency: Histogram,
    /// `vllm:e2e_request_latency_seconds`: arrival to finish.
    pub e2e_latency: Histogram,
    /// `vllm:request_queue_time_seconds`: arrival to first scheduled.
    pub queue_time: Histogram,
    /// `vllm:request_prefill_time_seconds`: first scheduled to first token.
    pub prefill_time: Histogram,
    /// `vllm:request_decode_time_seconds`: first token to last token.
    pub decode_time: Histogram,
    /// `vllm:request_inference_time_seconds`: first scheduled to last token.
    pub inference_time: Histogram,
    /// `vllm:request_time_per_output_token_seconds`: decode time / (tokens
    /// - 1), 0 for completions of fewer than 2 tokens.
    pub time_per_output_token: Histogram,
    /// `vllm:request_prompt_tokens`.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`.
    pub request_generation_tokens: Histogram,
    /// `vllm:request_params_max_tokens`: `max_tokens` as the engine got it.
    pub request_params_max_tokens: Histogram,
    /// `vllm:request_prefill_kv_computed_tokens`: prompt minus prefix-cache
    /// hit.
    pub request_prefill_kv_computed_tokens: Histogram,
    /// `vllm:request_num_preemptions`.
    pub request_num_preemptions: Histogram,
    /// `vllm:request_params_n`: once per request (all its completions).
    pub request_params_n: Histogram,
    /// `vllm:request_max_num_generation_tokens`: once per request, the most
    /// tokens one of its completions generated.
    pub request_max_num_generation_tokens: Histogram,
}

impl Clone for EngineStats {
    fn clone(&self) -> Self {
        let mut s = EngineStats::default();
        s.clone_from(self);
        s
    }

    /// Copies into `self`'s buffers: publishing a snapshot every step
    /// allocates nothing.
    fn clone_from(&mut self, src: &Self) {
        // Destructured without `..`: a new field fails to compile until it
        // is copied here.
        let EngineStats {
            started_unix_secs,
            num_running_reqs,
            num_waiting_reqs,
            num_deferred_waiting_reqs,
            kv_cache_usage,
            num_kv_blocks,
            num_free_kv_blocks,
            prefix_cache_queries,
            prefix_cache_hits,
            num_preemptions,
            prompt_tokens,
            prompt_tokens_computed,
            prompt_tokens_cached,
            generation_tokens,
            num_steps,
            grammar_mask_steps,
            grammar_mask_rows,
            grammar_mask_seconds,
            spec_decode_num_drafts,
            spec_decode_num_draft_tokens,
            spec_decode_num_accepted_tokens,
            spec_decode_accepted_per_pos,
            finished,
            admission_rejections,
            iteration_tokens,
            time_to_first_token,
            inter_token_latency,
            e2e_latency,
            queue_time,
            prefill_time,
            decode_time,
            inference_time,
            time_per_output_token,
            request_prompt_tokens,
            request_generation_tokens,
            request_params_max_tokens,
            request_prefill_kv_computed_tokens,
            request_num_preemptions,
            request_params_n,
            request_max_num_generation_tokens,
        } = src;
        self.started_unix_secs = *started_unix_secs;
        self.num_running_reqs = *num_running_reqs;
        self.num_waiting_reqs = *num_waiting_reqs;
        self.num_deferred_waiting_reqs = *num_deferred_waiting_reqs;
        self.kv_cache_usage = *kv_cache_usage;
        self.num_kv_blocks = *num_kv_blocks;
        self.num_free_kv_blocks = *num_free_kv_blocks;
        self.prefix_cache_queries = *prefix_cache_queries;
        self.prefix_cache_hits = *prefix_cache_hits;
        self.num_preemptions = *num_preemptions;
        self.prompt_tokens = *prompt_tokens;
        self.prompt_tokens_computed = *prompt_tokens_computed;
        self.prompt_tokens_cached = *prompt_tokens_cached;
        self.generation_tokens = *generation_tokens;
        self.num_steps = *num_steps;
        self.grammar_mask_steps = *grammar_mask_steps;
        self.grammar_mask_rows = *grammar_mask_rows;
        self.grammar_mask_seconds = *grammar_mask_seconds;
        self.spec_decode_num_drafts = *spec_decode_num_drafts;
        self.spec_decode_num_draft_tokens = *spec_decode_num_draft_tokens;
        self.spec_decode_num_accepted_tokens = *spec_decode_num_accepted_tokens;
        self.spec_decode_accepted_per_pos
            .clone_from(spec_decode_accepted_per_pos);
        self.finished = *finished;
        self.admission_rejections = *admission_rejections;
        self.iteration_tokens.clone_from(iteration_tokens);
        self.time_to_first_token.clone_from(time_to_first_token);
        self.inter_token_latency.clone_from(inter_token_latency);
        self.e2e_latency.clone_from(e2e_latency);
        self.queue_time.clone_from(queue_time);
        self.prefill_time.clone_from(prefill_time);
        self.decode_time.clone_from(decode_time);
        self.inference_time.clone_from(inference_time);
        self.time_per_output_token.clone_from(time_per_output_token);
        self.request_prompt_tokens.clone_from(request_prompt_tokens);
        self.request_generation_tokens
            .clone_from(request_generation_tokens);
        self.request_params_max_tokens
            .clone_from(request_params_max_tokens);
        self.request_prefill_kv_computed_tokens
            .clone_from(request_prefill_kv_computed_tokens);
        self.request_num_preemptions
            .clone_from(request_num_preemptions);
        self.request_params_n.clone_from(request_params_n);
        self.request_max_num_generation_tokens
            .clone_from(request_max_num_generation_tokens);
    }
}
