//! Engine statistics for metrics: gauges (running, waiting, KV usage),
//! cumulative counters and per-request histograms, in the units and bucket
//! boundaries of vLLM's Prometheus metrics so the server can export them
//! under vLLM's names unchanged.
//!
//! The engine thread owns a `StatsCollector` and publishes an `EngineStats`
//! snapshot after each step; readers copy the snapshot (`Engine::stats`).

use serde::Serialize;
use sluice_core::{FinishReason, SchedulerStats};
use std::time::Duration;

/// vLLM's `REQUEST_LATENCY_BUCKETS` (e2e and queue time), seconds.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's `TIME_TO_FIRST_TOKEN_BUCKETS`, seconds.
pub const TIME_TO_FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `INTER_TOKEN_LATENCY_BUCKETS`, seconds.
pub const INTER_TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// vLLM's request-token buckets: 1, 2, 5, 10, 20, 50, ... up to
/// `max_model_len`.
pub fn request_tokens_buckets(max_model_len: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            let v = m.saturating_mul(scale);
            if v > max_model_len {
                return out;
            }
            out.push(v as f64);
        }
        scale = scale.saturating_mul(10);
    }
}

/// A Prometheus-style histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Histogram {
    /// Upper bounds, ascending; `+Inf` is implicit.
    pub bounds: Vec<f64>,
    /// Observations per bucket, NOT cumulative: `counts[i]` for
    /// `bounds[i-1] < x <= bounds[i]`, the last entry for `x > bounds[last]`.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, x: f64) {
        let i = self.bounds.partition_point(|&b| b < x);
        self.counts[i] += 1;
        self.sum += x;
        self.count += 1;
    }

    /// Cumulative counts per bound (Prometheus `le` buckets), `+Inf` last.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, &c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }
}

/// Finished requests by reason (vLLM's `vllm:request_success` labels, plus
/// aborts and errors).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FinishCounts {
    pub stop: u64,
    pub length: u64,
    pub abort: u64,
    pub error: u64,
}

/// A snapshot of the engine. Counters are cumulative since start; the
/// histograms count each finished scheduler request (one per completion).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineStats {
    /// `vllm:num_requests_running`.
    pub num_running_reqs: usize,
    /// `vllm:num_requests_waiting` (scheduler requests, so `n` counts `n`
    /// times; includes requests accepted but not yet handed to the
    /// scheduler).
    pub num_waiting_reqs: usize,
    /// `vllm:kv_cache_usage_perc`, in 0..=1.
    pub kv_cache_usage: f64,
    pub num_kv_blocks: usize,
    pub num_free_kv_blocks: usize,
    /// `vllm:prefix_cache_queries`: prompt tokens looked up.
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits`: of those, tokens found in the cache.
    pub prefix_cache_hits: u64,
    /// `vllm:num_preemptions`.
    pub num_preemptions: u64,
    /// `vllm:prompt_tokens`: prompt tokens of requests that started
    /// generating (counted per completion).
    pub prompt_tokens: u64,
    /// `vllm:generation_tokens`.
    pub generation_tokens: u64,
    pub num_steps: u64,
    /// `vllm:request_success{finished_reason}` (stop, length) and aborts /
    /// errors.
    pub finished: FinishCounts,
    /// `vllm:request_queue_time_seconds`: arrival to first scheduled.
    pub queue_time: Histogram,
    /// `vllm:time_to_first_token_seconds`: arrival to first token.
    pub time_to_first_token: Histogram,
    /// `vllm:inter_token_latency_seconds`: between consecutive outputs.
    pub inter_token_latency: Histogram,
    /// `vllm:e2e_request_latency_seconds`: arrival to finish.
    pub e2e_latency: Histogram,
    /// `vllm:request_prompt_tokens`.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`.
    pub request_generation_tokens: Histogram,
}

/// Accumulates stats on the engine thread.
#[derive(Debug)]
pub struct StatsCollector {
    stats: EngineStats,
}

/// One finished scheduler request, for the histograms.
#[derive(Debug)]
pub struct FinishedRequestStats {
    pub reason: FinishReason,
    pub queue_time: Option<Duration>,
    pub e2e_latency: Duration,
    pub num_prompt_tokens: usize,
    pub num_generation_tokens: usize,
}

impl StatsCollector {
    pub fn new(num_kv_blocks: usize, max_model_len: usize) -> Self {
        let tokens = request_tokens_buckets(max_model_len);
        StatsCollector {
            stats: EngineStats {
                num_kv_blocks,
                num_free_kv_blocks: num_kv_blocks.saturating_sub(1),
                queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
                time_to_first_token: Histogram::new(TIME_TO_FIRST_TOKEN_BUCKETS),
                inter_token_latency: Histogram::new(INTER_TOKEN_LATENCY_BUCKETS),
                e2e_latency: Histogram::new(REQUEST_LATENCY_BUCKETS),
                request_prompt_tokens: Histogram::new(&tokens),
                request_generation_tokens: Histogram::new(&tokens),
                ..EngineStats::default()
            },
        }
    }

    /// Takes the scheduler's gauges and adds its per-step counters.
    pub fn record_scheduler(&mut self, s: &SchedulerStats, num_pending: usize) {
        let st = &mut self.stats;
        st.num_running_reqs = s.num_running_reqs;
        st.num_waiting_reqs = s.num_waiting_reqs + s.num_skipped_waiting_reqs + num_pending;
        st.kv_cache_usage = s.kv_cache_usage;
        st.num_free_kv_blocks = s.num_free_blocks;
        st.num_preemptions = s.num_preemptions_total;
        st.prefix_cache_queries += s.prefix_cache_stats.queries;
        st.prefix_cache_hits += s.prefix_cache_stats.hits;
    }

    pub fn record_step(&mut self) {
        self.stats.num_steps += 1;
    }

    pub fn record_first_token(&mut self, ttft: Duration, num_prompt_tokens: usize) {
        self.stats.time_to_first_token.observe(ttft.as_secs_f64());
        self.stats.prompt_tokens += num_prompt_tokens as u64;
    }

    pub fn record_inter_token(&mut self, itl: Duration) {
        self.stats.inter_token_latency.observe(itl.as_secs_f64());
    }

    pub fn record_generation_tokens(&mut self, n: usize) {
        self.stats.generation_tokens += n as u64;
    }

    pub fn record_finished(&mut self, f: FinishedRequestStats) {
        let st = &mut self.stats;
        match f.reason {
            FinishReason::Stop => st.finished.stop += 1,
            FinishReason::Length => st.finished.length += 1,
            FinishReason::Abort => st.finished.abort += 1,
            FinishReason::Error | FinishReason::Repetition => st.finished.error += 1,
        }
        // Like vLLM, latency histograms describe requests the engine
        // finished, not ones their callers abandoned.
        if f.reason == FinishReason::Abort {
            return;
        }
        if let Some(q) = f.queue_time {
            st.queue_time.observe(q.as_secs_f64());
        }
        st.e2e_latency.observe(f.e2e_latency.as_secs_f64());
        st.request_prompt_tokens.observe(f.num_prompt_tokens as f64);
        st.request_generation_tokens
            .observe(f.num_generation_tokens as f64);
    }

    pub fn snapshot(&self) -> EngineStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_le() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for x in [0.5, 1.0, 1.5, 3.0] {
            h.observe(x);
        }
        assert_eq!(h.counts, vec![2, 1, 1]);
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
    }
}
