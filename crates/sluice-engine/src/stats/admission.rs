//! Admission rejections: requests `Engine::generate` refused at a queue
//! limit. They are counted on the callers' threads, where the refusals
//! happen, and copied into each `EngineStats` read.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

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

#[cfg(test)]
mod tests {
    use super::*;

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
