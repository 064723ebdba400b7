//! sluice-kv-events: publishes the scheduler's KV cache events the way
//! vLLM 0.33 does (`vllm/distributed/kv_events.py`), so that llm-d's
//! inference scheduler (its precise prefix-cache scorer) can subscribe to a
//! sluice replica exactly as to a vLLM one.
//!
//! - [`KvEventsConfig`]: vLLM's `--kv-events-config` (names, defaults).
//! - [`KvEventBatch`]: one step's events and their msgpack encoding,
//!   byte for byte msgspec's.
//! - [`ZmqEventPublisher`]: PUB + replay ROUTER sockets on a background
//!   thread, fed through a bounded queue that never blocks the caller.
//!
//! A crate of its own so the ZeroMQ stack (and the async runtime its
//! sockets need) stays out of sluice-engine, which needs no runtime: the
//! engine takes any event sink, and only the binary that serves wires this
//! one in.

pub mod config;
pub mod encode;
pub mod publisher;

pub use config::{ConfigError, KvEventsConfig, PublisherKind};
pub use encode::KvEventBatch;
pub use publisher::{PublisherError, PublisherStats, ZmqEventPublisher};
pub use sluice_core::kv_events::KvCacheEvent;
