//! sluice-core: the scheduler and paged KV cache manager of the sluice
//! serving engine, decision-for-decision equivalent to vLLM's v1 scheduler
//! (vLLM 0.33.0).
//!
//! Pure and deterministic: no I/O, no threads, no tensors. The engine calls
//! `Scheduler::schedule()`, runs the model on the returned
//! `SchedulerOutput` through an [`Executor`] (the trait lives here so model
//! crates implement it without depending on the engine), and hands the
//! sampled tokens back through `Scheduler::update_from_output()`.

pub mod block_hash;
pub mod block_pool;
pub mod config;
pub mod error;
pub mod executor;
pub mod free_queue;
pub mod invariants;
pub mod kv_cache;
pub mod kv_events;
pub mod output;
pub mod policy;
pub mod prefix_cache;
pub mod replay;
pub mod request;
pub mod sampling_params;
mod schedule;
pub mod scheduler;
pub mod stats;
pub mod step_record;
pub mod step_shape;
pub mod trace;
mod trace_groups;
pub mod trace_speculative;
mod update;

pub use block_hash::{BlockHash, BlockHasher, HashAlgo};
pub use config::{SchedulerConfig, SchedulingPolicy};
pub use error::FieldError;
pub use executor::Executor;
pub use output::{
    CachedRequestData, DraftTokenIds, EngineCoreOutput, GrammarBitmask, ModelRunnerOutput,
    NewRequestData, ReqHandle, SampleLogprobs, ScheduledRequest, SchedulerOutput, TokenLogprob,
    PLACEHOLDER_TOKEN_ID,
};
pub use request::{
    BlockId, FinishReason, NewRequest, Request, RequestId, RequestStatus, StopReason, TokenId,
};
pub use sampling_params::SamplingParams;
pub use scheduler::{PauseState, Scheduler};
pub use stats::{PrefixCacheStats, SchedulerStats};
pub use step_record::StepRecord;
pub use step_shape::{RowShape, ShapeTracker, StepShape};
