//! Engine statistics for metrics: gauges (running, waiting, KV usage),
//! cumulative counters and per-request histograms, in the units, bucket
//! boundaries and observation rules of vLLM 0.33's Prometheus metrics
//! (`vllm/v1/metrics/stats.py`, `loggers.py`, `buckets.py`) so the server
//! can export them under vLLM's names unchanged (`docs/metrics.md`).
//!
//! The engine thread owns a `StatsCollector` and publishes an `EngineStats`
//! snapshot after each step; readers copy the snapshot (`Engine::stats`).
//! Recording is O(1) per output and allocates nothing: histograms are
//! fixed-size count arrays, and publishing copies into the previous
//! snapshot's buffers (`Clone::clone_from`).
//!
//! Which requests are counted (one per completion, so `n` > 1 counts `n`):
//! every completion that finishes, whatever ends it, is in
//! `finished` (vLLM's `request_success`) under its reason AND in the
//! finished-request histograms (e2e, prompt / generation tokens,
//! `max_tokens`, prefill KV computed, preemptions, time per output token).
//! vLLM drops a request its client cancelled from all of them; sluice keeps
//! it (under `abort`) so that the counter and the histograms always agree
//! and a load test with hang-ups still adds up. The phase histograms
//! (queue, prefill, decode, inference) are observed for every finished
//! completion whose phase boundaries exist: one aborted before it was
//! scheduled has no queue time, one aborted before its first token no
//! prefill time.

use serde::Serialize;
use sluice_core::{FinishReason, SchedulerStats};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// vLLM's `REQUEST_LATENCY_BUCKETS` (e2e, queue, prefill, decode and
/// inference time), seconds.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's `TIME_TO_FIRST_TOKEN_BUCKETS`, seconds.
pub const TIME_TO_FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `INTER_TOKEN_LATENCY_BUCKETS` (also time per output token),
/// seconds.
pub const INTER_TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's `ITERATION_TOKENS_BUCKETS`: fixed, whatever the step budget.
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// vLLM's `REQUEST_PARAMS_N_BUCKETS`.
pub const REQUEST_PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// vLLM's `REQUEST_NUM_PREEMPTIONS_BUCKETS` (0 lands in `le="1.0"`).
pub const REQUEST_NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// Most bounds a histogram may have: the longest 1-2-5 series over a
/// `usize` `max_model_len` has 58, every fixed set fewer.
pub const MAX_BUCKETS: usize = 63;

/// vLLM's request-token buckets (`build_1_2_5_buckets`): 1, 2, 5, 10, 20,
/// 50, ... up to `max_model_len` included.
pub fn request_tokens_buckets(max_model_len: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            let Some(v) = m.checked_mul(scale).filter(|&v| v <= max_model_len) else {
                return out;
            };
            out.push(v as f64);
        }
        let Some(next) = scale.checked_mul(10) else {
            return out;
        };
        scale = next;
    }
}

/// A Prometheus histogram with at most `MAX_BUCKETS` bounds. The counts
/// live inline, so observing and copying a snapshot never allocate (the
/// bounds are copied only when they differ, i.e. on the first copy).
#[derive(Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds, ascending; `+Inf` is implicit.
    pub bounds: Vec<f64>,
    /// Observations per bucket, NOT cumulative; the first
    /// `bounds.len() + 1` are used (the last of those for
    /// `x > bounds[last]`), see `counts()`.
    counts: [u64; MAX_BUCKETS + 1],
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(&[])
    }
}

impl Serialize for Histogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Histogram", 4)?;
        st.serialize_field("bounds", &self.bounds)?;
        st.serialize_field("counts", self.counts())?;
        st.serialize_field("sum", &self.sum)?;
        st.serialize_field("count", &self.count)?;
        st.end()
    }
}

impl Clone for Histogram {
    fn clone(&self) -> Self {
        Histogram {
            bounds: self.bounds.clone(),
            counts: self.counts,
            sum: self.sum,
            count: self.count,
        }
    }

    fn clone_from(&mut self, src: &Self) {
        if self.bounds != src.bounds {
            self.bounds.clone_from(&src.bounds);
        }
        self.counts = src.counts;
        self.sum = src.sum;
        self.count = src.count;
    }
}

impl Histogram {
    /// A histogram over `bounds` (ascending); bounds past `MAX_BUCKETS` are
    /// dropped (no vLLM bucket set has that many).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds[..bounds.len().min(MAX_BUCKETS)].to_vec(),
            counts: [0; MAX_BUCKETS + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts `x` in the first bucket whose bound is >= `x` (Prometheus'
    /// `le`, prometheus_client's `bisect_left`).
    pub fn observe(&mut self, x: f64) {
        let i = self.bounds.partition_point(|&b| b < x);
        self.counts[i] += 1;
        self.sum += x;
        self.count += 1;
    }

    /// Observations per bucket, not cumulative, `+Inf` last.
    pub fn counts(&self) -> &[u64] {
        &self.counts[..self.bounds.len() + 1]
    }

    /// Cumulative counts per bound (Prometheus `le` buckets), `+Inf` last.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts()
            .iter()
            .scan(0u64, |acc, &c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }
}

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
    fn add(&mut self, reason: FinishReason) {
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

/// Requests `Engine::generate` refused because a queue limit was reached
/// (HTTP 503): vLLM's `vllm:admission_rejections{reason}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct AdmissionRejections {
    /// `EngineError::Overloaded`: `max_waiting_requests` reached.
    pub max_num_queued_reqs: u64,
    /// `EngineError::OverloadedTokens`: `max_waiting_tokens` reached.
    pub max_num_queued_tokens: u64,
}

/// The rejection counters, bumped on the callers' threads (refusals never
/// reach the engine thread).
#[derive(Debug, Default)]
pub struct AdmissionCounters {
    max_num_queued_reqs: AtomicU64,
    max_num_queued_tokens: AtomicU64,
}

impl AdmissionCounters {
    pub fn reject_queued_reqs(&self) {
        self.max_num_queued_reqs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reject_queued_tokens(&self) {
        self.max_num_queued_tokens.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> AdmissionRejections {
        AdmissionRejections {
            max_num_queued_reqs: self.max_num_queued_reqs.load(Ordering::Relaxed),
            max_num_queued_tokens: self.max_num_queued_tokens.load(Ordering::Relaxed),
        }
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

/// One finished completion: its timestamps and sizes, for the
/// finished-request families. Phases whose boundaries are `None` (never
/// scheduled, no token) are not observed.
#[derive(Clone, Copy, Debug)]
pub struct FinishedRequestStats {
    pub reason: FinishReason,
    /// When `Engine::generate` accepted it.
    pub arrival: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub finished: Instant,
    pub num_prompt_tokens: usize,
    /// Tokens of the completion (as in its usage).
    pub num_generation_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_tokens: usize,
    /// `max_tokens` as the engine got it.
    pub max_tokens: usize,
    pub num_preemptions: usize,
}

/// Accumulates stats on the engine thread.
#[derive(Debug)]
pub struct StatsCollector {
    stats: EngineStats,
    /// Tokens of the step under way, for `iteration_tokens`.
    step_tokens: u64,
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

impl StatsCollector {
    pub fn new(num_kv_blocks: usize, max_model_len: usize) -> Self {
        let tokens = request_tokens_buckets(max_model_len);
        let started_unix_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        StatsCollector {
            stats: EngineStats {
                started_unix_secs,
                num_kv_blocks,
                num_free_kv_blocks: num_kv_blocks.saturating_sub(1),
                iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
                time_to_first_token: Histogram::new(TIME_TO_FIRST_TOKEN_BUCKETS),
                inter_token_latency: Histogram::new(INTER_TOKEN_LATENCY_BUCKETS),
                e2e_latency: Histogram::new(REQUEST_LATENCY_BUCKETS),
                queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
                prefill_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
                decode_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
                inference_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
                time_per_output_token: Histogram::new(INTER_TOKEN_LATENCY_BUCKETS),
                request_prompt_tokens: Histogram::new(&tokens),
                request_generation_tokens: Histogram::new(&tokens),
                request_params_max_tokens: Histogram::new(&tokens),
                request_prefill_kv_computed_tokens: Histogram::new(&tokens),
                request_num_preemptions: Histogram::new(REQUEST_NUM_PREEMPTIONS_BUCKETS),
                request_params_n: Histogram::new(REQUEST_PARAMS_N_BUCKETS),
                request_max_num_generation_tokens: Histogram::new(&tokens),
                ..EngineStats::default()
            },
            step_tokens: 0,
        }
    }

    /// Takes the scheduler's gauges and adds its per-step counters.
    pub fn record_scheduler(&mut self, s: &SchedulerStats, num_pending: usize) {
        let st = &mut self.stats;
        st.num_running_reqs = s.num_running_reqs;
        st.num_waiting_reqs = s.num_waiting_reqs + s.num_skipped_waiting_reqs + num_pending;
        st.num_deferred_waiting_reqs = s.num_skipped_waiting_reqs;
        st.kv_cache_usage = s.kv_cache_usage;
        st.num_free_kv_blocks = s.num_free_blocks;
        st.num_preemptions = s.num_preemptions_total;
        st.prefix_cache_queries += s.prefix_cache_stats.queries;
        st.prefix_cache_hits += s.prefix_cache_stats.hits;
    }

    pub fn record_step(&mut self) {
        self.stats.num_steps += 1;
    }

    /// One step's grammar bitmasks: `rows` of them in `secs`.
    pub fn record_grammar_masks(&mut self, rows: usize, secs: f64) {
        self.stats.grammar_mask_steps += 1;
        self.stats.grammar_mask_rows += rows as u64;
        self.stats.grammar_mask_seconds += secs;
    }

    /// A completion's first output: its time to first token, and its
    /// prompt (counted now, as vLLM counts it, split into computed and
    /// cached tokens).
    pub fn record_first_token(
        &mut self,
        ttft_secs: f64,
        num_prompt_tokens: usize,
        num_cached_tokens: usize,
    ) {
        let st = &mut self.stats;
        st.time_to_first_token.observe(ttft_secs);
        let cached = num_cached_tokens.min(num_prompt_tokens) as u64;
        let computed = (num_prompt_tokens as u64) - cached;
        st.prompt_tokens += num_prompt_tokens as u64;
        st.prompt_tokens_cached += cached;
        st.prompt_tokens_computed += computed;
        self.step_tokens += computed;
    }

    pub fn record_inter_token(&mut self, itl_secs: f64) {
        self.stats.inter_token_latency.observe(itl_secs);
    }

    pub fn record_generation_tokens(&mut self, n: usize) {
        self.stats.generation_tokens += n as u64;
        self.step_tokens += n as u64;
    }

    /// Ends a step: `iteration_tokens` gets one observation when the step
    /// produced outputs (vLLM records one per output message).
    pub fn end_step(&mut self, had_outputs: bool) {
        if had_outputs {
            self.stats.iteration_tokens.observe(self.step_tokens as f64);
        }
        self.step_tokens = 0;
    }

    /// One finished completion (see the module docs: every one, aborted
    /// ones included).
    pub fn record_finished(&mut self, f: &FinishedRequestStats) {
        let st = &mut self.stats;
        st.finished.add(f.reason);
        st.e2e_latency.observe(secs(f.arrival, f.finished));
        st.request_prompt_tokens.observe(f.num_prompt_tokens as f64);
        st.request_generation_tokens
            .observe(f.num_generation_tokens as f64);
        // vLLM observes it only when truthy; the engine refuses 0.
        if f.max_tokens > 0 {
            st.request_params_max_tokens.observe(f.max_tokens as f64);
        }
        st.request_prefill_kv_computed_tokens
            .observe(f.num_prompt_tokens.saturating_sub(f.num_cached_tokens) as f64);
        st.request_num_preemptions.observe(f.num_preemptions as f64);
        if let Some(s) = f.first_scheduled {
            st.queue_time.observe(secs(f.arrival, s));
        }
        if let (Some(s), Some(t)) = (f.first_scheduled, f.first_token) {
            st.prefill_time.observe(secs(s, t));
        }
        if let (Some(t), Some(l)) = (f.first_token, f.last_token) {
            st.decode_time.observe(secs(t, l));
        }
        if let (Some(s), Some(l)) = (f.first_scheduled, f.last_token) {
            st.inference_time.observe(secs(s, l));
        }
        // vLLM: decode time over the tokens after the first, else 0.
        let tpot = match (f.first_token, f.last_token) {
            (Some(t), Some(l)) if f.num_generation_tokens > 1 => {
                secs(t, l) / (f.num_generation_tokens - 1) as f64
            }
            _ => 0.0,
        };
        st.time_per_output_token.observe(tpot);
    }

    /// A request whose `n` completions have all finished.
    pub fn record_request_finished(&mut self, n: usize, max_num_generation_tokens: usize) {
        self.stats.request_params_n.observe(n as f64);
        self.stats
            .request_max_num_generation_tokens
            .observe(max_num_generation_tokens as f64);
    }

    pub fn snapshot(&self) -> EngineStats {
        self.stats.clone()
    }

    /// Copies the stats into `out`, reusing its buffers.
    pub fn publish_into(&self, out: &mut EngineStats) {
        out.clone_from(&self.stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn histogram_buckets_are_le() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for x in [0.5, 1.0, 1.5, 3.0] {
            h.observe(x);
        }
        assert_eq!(h.counts(), &[2, 1, 1]);
        assert_eq!(h.cumulative(), vec![2, 3, 4]);
        assert_eq!(h.count, 4);
        assert_eq!(h.sum, 6.0);
    }

    #[test]
    fn token_buckets_follow_1_2_5() {
        assert_eq!(
            request_tokens_buckets(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(
            request_tokens_buckets(256),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]
        );
        assert_eq!(request_tokens_buckets(4096).len(), 11);
        // The whole usize range fits the inline counts.
        let all = request_tokens_buckets(usize::MAX);
        assert!(all.len() <= MAX_BUCKETS, "{}", all.len());
        assert_eq!(Histogram::new(&all).bounds.len(), all.len());
    }

    #[test]
    fn snapshots_copy_into_the_previous_buffers() {
        let mut c = StatsCollector::new(64, 256);
        let mut out = c.snapshot();
        c.stats.e2e_latency.observe(2.0);
        c.publish_into(&mut out);
        let bounds = out.request_prompt_tokens.bounds.as_ptr();
        c.stats.request_prompt_tokens.observe(7.0);
        c.publish_into(&mut out);
        assert_eq!(out.request_prompt_tokens.bounds.as_ptr(), bounds);
        assert_eq!(out, c.stats);
        assert_eq!(out.e2e_latency.count, 1);
        assert_eq!(out.clone(), out);
    }

    fn finished(reason: FinishReason, t0: Instant) -> FinishedRequestStats {
        FinishedRequestStats {
            reason,
            arrival: t0,
            first_scheduled: Some(t0 + Duration::from_millis(100)),
            first_token: Some(t0 + Duration::from_millis(300)),
            last_token: Some(t0 + Duration::from_millis(700)),
            finished: t0 + Duration::from_millis(800),
            num_prompt_tokens: 10,
            num_generation_tokens: 5,
            num_cached_tokens: 4,
            max_tokens: 16,
            num_preemptions: 0,
        }
    }

    #[test]
    fn a_finished_request_is_in_every_family_with_vllms_intervals() {
        let mut c = StatsCollector::new(64, 256);
        let t0 = Instant::now();
        c.record_finished(&finished(FinishReason::Length, t0));
        let s = c.snapshot();
        assert_eq!(s.finished.length, 1);
        let close = |h: &Histogram, v: f64| h.count == 1 && (h.sum - v).abs() < 1e-9;
        assert!(close(&s.e2e_latency, 0.8));
        assert!(close(&s.queue_time, 0.1));
        assert!(close(&s.prefill_time, 0.2));
        assert!(close(&s.decode_time, 0.4));
        assert!(close(&s.inference_time, 0.6));
        assert!(close(&s.time_per_output_token, 0.1));
        assert!(close(&s.request_prompt_tokens, 10.0));
        assert!(close(&s.request_generation_tokens, 5.0));
        assert!(close(&s.request_params_max_tokens, 16.0));
        assert!(close(&s.request_prefill_kv_computed_tokens, 6.0));
        assert!(close(&s.request_num_preemptions, 0.0));
        assert_eq!(s.request_num_preemptions.counts()[0], 1, "0 is in le=1");
    }

    #[test]
    fn aborted_requests_count_everywhere_but_phases_they_never_reached() {
        let mut c = StatsCollector::new(64, 256);
        let t0 = Instant::now();
        // Aborted while waiting: never scheduled, no token.
        c.record_finished(&FinishedRequestStats {
            first_scheduled: None,
            first_token: None,
            last_token: None,
            num_generation_tokens: 0,
            num_cached_tokens: 0,
            ..finished(FinishReason::Abort, t0)
        });
        // Aborted after one token.
        c.record_finished(&FinishedRequestStats {
            last_token: Some(t0 + Duration::from_millis(300)),
            num_generation_tokens: 1,
            ..finished(FinishReason::Abort, t0)
        });
        let s = c.snapshot();
        assert_eq!(s.finished.abort, 2);
        assert_eq!(s.finished.total(), 2);
        for h in [
            &s.e2e_latency,
            &s.request_prompt_tokens,
            &s.request_generation_tokens,
            &s.request_params_max_tokens,
            &s.request_prefill_kv_computed_tokens,
            &s.request_num_preemptions,
            &s.time_per_output_token,
        ] {
            assert_eq!(h.count, 2);
        }
        assert_eq!(s.time_per_output_token.sum, 0.0);
        assert_eq!(s.queue_time.count, 1);
        assert_eq!(s.prefill_time.count, 1);
        assert_eq!(s.decode_time.count, 1);
        assert_eq!(s.inference_time.count, 1);
    }

    #[test]
    fn every_finish_reason_has_its_own_count() {
        let mut c = StatsCollector::new(64, 256);
        let t0 = Instant::now();
        for r in [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::Abort,
            FinishReason::Error,
            FinishReason::Repetition,
        ] {
            c.record_finished(&finished(r, t0));
        }
        let f = c.snapshot().finished;
        assert_eq!(
            f.by_reason().map(|(_, n)| n),
            [1, 1, 1, 1, 1],
            "{:?}",
            f.by_reason()
        );
    }

    #[test]
    fn iteration_tokens_are_computed_prompt_plus_generated_per_step_with_outputs() {
        let mut c = StatsCollector::new(64, 256);
        // Step 1: two first tokens (prompts 10 with 4 cached, and 6).
        c.record_first_token(0.01, 10, 4);
        c.record_generation_tokens(1);
        c.record_first_token(0.02, 6, 0);
        c.record_generation_tokens(1);
        c.end_step(true);
        // Step 2: nothing came out (a prefill chunk).
        c.end_step(false);
        // Step 3: two decode tokens.
        c.record_inter_token(0.05);
        c.record_generation_tokens(1);
        c.record_inter_token(0.05);
        c.record_generation_tokens(1);
        c.end_step(true);
        let s = c.snapshot();
        assert_eq!(s.iteration_tokens.count, 2);
        // (6 + 6 computed + 2 generated) + 2 generated.
        assert_eq!(s.iteration_tokens.sum, 16.0);
        assert_eq!(s.prompt_tokens, 16);
        assert_eq!(s.prompt_tokens_cached, 4);
        assert_eq!(s.prompt_tokens_computed, 12);
        assert_eq!(s.generation_tokens, 4);
        assert_eq!(s.time_to_first_token.count, 2);
        assert_eq!(s.inter_token_latency.count, 2);
    }

    #[test]
    fn per_request_families_once_per_parent() {
        let mut c = StatsCollector::new(64, 256);
        c.record_request_finished(3, 7);
        let s = c.snapshot();
        assert_eq!((s.request_params_n.count, s.request_params_n.sum), (1, 3.0));
        assert_eq!(s.request_max_num_generation_tokens.sum, 7.0);
    }

    #[test]
    fn waiting_splits_into_deferred_and_the_rest() {
        let mut c = StatsCollector::new(64, 256);
        let s = SchedulerStats {
            num_waiting_reqs: 3,
            num_skipped_waiting_reqs: 2,
            ..SchedulerStats::default()
        };
        c.record_scheduler(&s, 1);
        let st = c.snapshot();
        assert_eq!(st.num_waiting_reqs, 6);
        assert_eq!(st.num_deferred_waiting_reqs, 2);
    }

    #[test]
    fn admission_counters_count_each_reason() {
        let a = AdmissionCounters::default();
        a.reject_queued_reqs();
        a.reject_queued_reqs();
        a.reject_queued_tokens();
        assert_eq!(
            a.snapshot(),
            AdmissionRejections {
                max_num_queued_reqs: 2,
                max_num_queued_tokens: 1
            }
        );
    }
}
