//! Counters the scheduler exposes for metrics and logs.

use serde::Serialize;

/// Prefix-cache lookups counted at admission (vLLM's `PrefixCacheStats`).
/// Lookups by requests that were preempted before go to the `preempted_*`
/// counters so the hit rate of fresh traffic stays readable.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
    pub preempted_requests: u64,
    pub preempted_queries: u64,
    pub preempted_hits: u64,
    /// The cache was reset since the last report.
    pub reset: bool,
}

/// A snapshot of the scheduler (vLLM's `SchedulerStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SchedulerStats {
    pub num_running_reqs: usize,
    pub num_waiting_reqs: usize,
    /// Waiting requests a scan skipped (blocked, e.g. on a grammar).
    pub num_skipped_waiting_reqs: usize,
    pub kv_cache_usage: f64,
    pub num_free_blocks: usize,
    /// Preemptions since the scheduler started.
    pub num_preemptions_total: u64,
    /// Steps that scheduled at least one token.
    pub num_executed_steps: u64,
    /// Taken (and reset) by `Scheduler::make_stats`.
    pub prefix_cache_stats: PrefixCacheStats,
}
