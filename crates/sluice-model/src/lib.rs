//! sluice-model: executes `SchedulerOutput`s on Hugging Face decoder models
//! (Qwen2, Qwen3, Llama / Mistral families; one file per architecture in
//! `model/arch/`) on CPU, reading and writing KV through the scheduler's
//! block tables. `ModelExecutor` is the engine's `Executor` over the
//! runner; the runner's forward pass is a `ForwardBackend` (the CPU model
//! here), so other devices plug in under the same runner.

pub mod attention;
pub mod builtin;
pub mod config;
pub mod drafter;
pub mod executor;
pub mod gguf;
pub mod kernels;
pub mod kv_cache;
pub mod memory;
pub mod model;
pub mod perplexity;
pub mod runner;
pub mod sampling;
pub mod weights;

/// The tokenizer lives in its own crate (the engine needs it without the CPU
/// model runner); re-exported so `sluice_model::tokenizer::Tokenizer` keeps
/// working.
pub use sluice_tokenizer as tokenizer;

pub use drafter::{
    DraftModelDrafter, DraftRequest, Drafter, NgramDrafter, SpeculativeConfig, SpeculativeMethod,
    SuffixDrafter, SuffixParams,
};
pub use executor::{KvCacheSize, ModelExecutor, Speculation};
pub use model::{
    load_dummy, load_dummy_as, load_model, DType, LoadFormat, LoadedModel, ModelSpec, WeightSource,
};
