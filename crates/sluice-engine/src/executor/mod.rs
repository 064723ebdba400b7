//! The seam between the engine loop and whatever computes tokens.
//!
//! The [`Executor`] trait itself lives in `sluice_core::executor` (beside
//! the `SchedulerOutput` / `ModelRunnerOutput` it exchanges), so that model
//! crates implement it without depending on the engine, and the engine
//! depends on no model crate; it is re-exported here.
//!
//! Implementations: `ScriptedExecutor` (here: a deterministic fake model
//! for tests and tools), sluice-sim's `SimulatedExecutor` (random tokens at
//! the pace of a step-time model, `serve --executor simulated`) and
//! sluice-model's `ModelExecutor` (its `ModelRunner`, the real forward
//! pass).

pub mod scripted;

pub use scripted::{ScriptedExecutor, SeqView};
pub use sluice_core::executor::Executor;
