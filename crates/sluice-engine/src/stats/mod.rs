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
//!
//! The parts: `histogram` (the `Histogram` type and vLLM's bucket sets),
//! `snapshot` (`EngineStats`, what readers see), `collector`
//! (`StatsCollector`, what the engine thread records into), `admission`
//! (the refusals counted on the callers' threads). Everything is
//! re-exported here, so each type's path is `stats::...`.

mod admission;
mod collector;
mod histogram;
mod snapshot;

pub use admission::{AdmissionCounters, AdmissionRejections};
pub use collector::{FinishedRequestStats, StatsCollector};
pub use histogram::{
    request_tokens_buckets, Histogram, INTER_TOKEN_LATENCY_BUCKETS, ITERATION_TOKENS_BUCKETS,
    MAX_BUCKETS, REQUEST_LATENCY_BUCKETS, REQUEST_NUM_PREEMPTIONS_BUCKETS,
    REQUEST_PARAMS_N_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS,
};
pub use snapshot::{EngineStats, FinishCounts};
