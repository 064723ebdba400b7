//! A discrete-event serving simulator built on sluice's real scheduler.
//!
//! The scheduler (`sluice_core::Scheduler`, vLLM's decision for decision)
//! runs unmodified; only the GPU is replaced by a step-time model and the
//! wall clock by a virtual one, so a simulated run makes exactly the
//! scheduling decisions `sluice_core::replay` makes on the same requests
//! (the crate's main promise, checked in `tests/sim.rs`, FCFS policy).
//!
//! What exists:
//! - [`step`]: `StepShape` (one `SchedulerOutput` summarised) and the
//!   `StepTimeModel` trait, with a constant model for tests;
//! - [`roofline`]: a roofline step-time model from a `ModelShape` and a
//!   `Hardware` profile (tensor parallelism, mixture of experts), with
//!   built-in shapes, datasheet profiles (`profiles/hardware.json`) and
//!   vLLM's KV-cache sizing;
//! - [`model_config`]: `ModelShape::load` from a built-in name, a Hugging
//!   Face `config.json` or a GGUF file;
//! - [`fit`](mod@fit): a step-time model fitted to a step log ([`steplog`]);
//! - [`table`]: a step-time model interpolated from measured times;
//! - [`profile`]: the `roofline` / `fitted` / `table` profile files and
//!   the step-time model each makes;
//! - [`workload`]: `vllm bench serve --dataset-name random` lengths,
//!   Poisson / gamma arrivals (or a duration), shared-prefix groups, from
//!   a seed; [`lengths`]: uniform, normal, lognormal and empirical length
//!   distributions; [`conversation`]: multi-turn conversations whose
//!   history is each turn's prefix; [`traces`]: JSONL, Azure LLM
//!   inference CSV and `sluice replay` traces as requests;
//! - [`sim`]: the event loop and per-request timelines;
//! - [`metrics`]: `SimReport`, vLLM's serving metrics with
//!   `--save-result` key names.
//!
//! - [`replica`] and [`router`]: engine replicas behind a routing policy
//!   (round-robin, random, least-requests, least-kv, power-of-two,
//!   prefix-aware), and P/D disaggregation in [`sim`];
//! - [`slo`]: goodput under `ttft=MS,tpot=MS` objectives; [`timeline`]:
//!   the per-step CSV.
//!
//! - [`executor`]: `SimulatedExecutor`, sluice-core's `Executor` paced by a
//!   step-time model, for `sluice serve --executor simulated`.
//!
//! The `sluice simulate` command (sluice-cli) and `sluice serve --executor
//! simulated` (this crate's `SimulatedExecutor` under the real engine) are
//! built on these.

pub mod conversation;
pub mod executor;
pub mod fit;
pub mod lengths;
pub mod metrics;
pub mod model_config;
pub mod profile;
pub mod replica;
pub mod roofline;
pub mod router;
pub mod sim;
pub mod slo;
pub mod speculation;
pub mod step;
pub mod steplog;
pub mod table;
pub mod timeline;
pub mod traces;
pub mod workload;

pub use conversation::{ConversationWorkload, ThinkTime};
pub use executor::SimulatedExecutor;
pub use fit::{fit, FitOptions, FitReport, FittedModel};
pub use lengths::LengthDist;
pub use metrics::SimReport;
pub use profile::{MeasuredKvCache, MeasuredOn, MixedPoint, Profile};
pub use roofline::{num_gpu_blocks, Hardware, KvCacheDtype, LayeredShape, ModelShape, Roofline};
pub use router::{ReplicaView, RouteRequest, Router, RouterKind};
pub use sim::{PdConfig, RequestTimeline, SimError, SimRequest, SimResult, Simulator};
pub use slo::{Goodput, Slo};
pub use speculation::SimSpeculation;
pub use step::{ConstantStepTime, RowShape, StepShape, StepTimeModel};
pub use table::{MixedRule, SharedDecode, TableModel};
pub use traces::{load_trace, LoadedTrace, ReplayInfo, TraceFileError};
pub use workload::{RandomWorkload, Rng};
