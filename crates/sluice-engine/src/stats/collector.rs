//! `StatsCollector`: the engine thread's recorder. It turns step and
//! request events into `EngineStats` under vLLM's observation rules (see
//! the `stats` module docs for which completions count where) and
//! publishes copies of it.

use super::histogram::{
    request_tokens_buckets, Histogram, INTER_TOKEN_LATENCY_BUCKETS, ITERATION_TOKENS_BUCKETS,
    REQUEST_LATENCY_BUCKETS, REQUEST_NUM_PREEMPTIONS_BUCKETS, REQUEST_PARAMS_N_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
};
use super::snapshot::EngineStats;
use sluice_core::{FinishReason, SchedulerStats};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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

    /// One request's drafts verified in a step: `drafted` of them, the
    /// first `accepted` taken (vLLM's `SpecDecodingStats.observe_draft`).
    /// The per-position counts grow to the longest run once, then
    /// allocate no more.
    pub fn record_spec_decode(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let st = &mut self.stats;
        let accepted = accepted.min(drafted);
        st.spec_decode_num_drafts += 1;
        st.spec_decode_num_draft_tokens += drafted as u64;
        st.spec_decode_num_accepted_tokens += accepted as u64;
        let per_pos = &mut st.spec_decode_accepted_per_pos;
        if per_pos.len() < drafted {
            per_pos.resize(drafted, 0);
        }
        for n in &mut per_pos[..accepted] {
            *n += 1;
        }
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
}
