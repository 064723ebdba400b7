//! sluice-engine: the serving engine between callers (the HTTP server,
//! `sluice generate`) and the model.
//!
//! ```text
//! caller ── Engine::generate ──► command channel ──► engine thread (EngineCore)
//!                                                     schedule → execute → update
//! caller ◄── RequestStream ◄── per-request channel ◄── detokenize, stop strings
//! ```
//!
//! - [`Engine`]: a cloneable, non-blocking handle: `generate` (validates and
//!   returns a [`RequestStream`]), `abort`, `stats`, `shutdown`.
//! - [`EngineCore`]: the synchronous step loop, run on a dedicated OS thread
//!   by `Engine::start`, or driven step by step.
//! - [`Executor`]: what computes tokens (the trait is sluice-core's, so the
//!   engine depends on no model crate); [`ScriptedExecutor`] is a
//!   deterministic fake model for tests, sluice-sim's `SimulatedExecutor`
//!   paces random tokens by a step-time model (`serve --executor
//!   simulated`), and
//!   sluice-model's `ModelExecutor` wraps its `ModelRunner`.
//! - [`StepLog`]: one JSON line per engine step (`serve --step-log`).
//!
//! Typical use from an async server:
//!
//! ```no_run
//! # async fn demo(engine: sluice_engine::Engine) -> Result<(), sluice_engine::EngineError> {
//! use sluice_engine::{GenerateRequest, SamplingParams};
//! let prompt = engine.tokenizer().encode("Hello", true).unwrap_or_default();
//! let mut stream = engine.generate(GenerateRequest::new(prompt, SamplingParams::greedy(16)))?;
//! while let Some(out) = stream.next().await {
//!     print!("{}", out.text);
//!     if let Some(f) = out.finished {
//!         println!("\n[{}]", f.reason.as_str());
//!     }
//! }
//! println!("{:?}", stream.usage());
//! # Ok(()) }
//! ```

pub mod core;
pub mod detokenizer;
pub mod engine;
pub mod error;
pub mod executor;
pub mod kv_events;
pub mod limits;
pub mod output;
pub mod request;
pub mod stats;
pub mod step_log;
pub mod stop;
pub mod stream;

pub use crate::core::EngineCore;
pub use engine::{Engine, EngineConfig, ShutdownMode, StartOptions};
pub use error::EngineError;
pub use executor::{Executor, ScriptedExecutor, SeqView};
pub use kv_events::KvEventSink;
pub use limits::RequestLimits;
pub use request::{Finished, GenerateRequest, RequestOutput, StopReason, Usage};
pub use sluice_core::{
    FieldError, FinishReason, SampleLogprobs, SamplingParams, SchedulerConfig, SchedulingPolicy,
    TokenId, TokenLogprob,
};
pub use sluice_tokenizer::{ChatMessage, ChatTemplateError, Tokenizer};
pub use stats::{EngineStats, FinishCounts, Histogram};
pub use step_log::StepLog;
pub use stream::RequestStream;
