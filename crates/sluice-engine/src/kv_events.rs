//! Where the engine sends the scheduler's KV cache events: a
//! [`KvEventSink`] given to [`crate::Engine::start_with_kv_event_sink`] or
//! [`crate::EngineCore::set_kv_event_sink`].
//!
//! Promise: after each step's `update_from_output`, the events the
//! scheduler queued during it (`Scheduler::take_kv_cache_events`) go to
//! the sink as one batch, stamped with the step's wall-clock time in
//! seconds since the Unix epoch (vLLM's `KVEventBatch(ts=time.time())`);
//! a step with no events publishes nothing. The sink runs on the engine
//! thread, so it must not block (sluice-kv-events' ZMQ publisher only
//! queues). The engine itself knows nothing of sockets or encodings.

use sluice_core::kv_events::KvCacheEvent;
use std::time::{SystemTime, UNIX_EPOCH};

/// Receives one step's KV cache events.
pub trait KvEventSink: Send {
    fn publish(&mut self, ts: f64, events: Vec<KvCacheEvent>);
}

impl<F: FnMut(f64, Vec<KvCacheEvent>) + Send> KvEventSink for F {
    fn publish(&mut self, ts: f64, events: Vec<KvCacheEvent>) {
        self(ts, events)
    }
}

/// Python's `time.time()`. A clock before 1970 reads as 0 rather than
/// failing a step.
pub(crate) fn unix_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
