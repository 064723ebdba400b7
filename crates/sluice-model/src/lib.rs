//! sluice-model: executes `SchedulerOutput`s on Hugging Face decoder models
//! (Qwen2, Llama / Mistral families) on CPU, reading and writing KV through the
//! scheduler's block tables.

pub mod attention;
pub mod builtin;
pub mod config;
pub mod kernels;
pub mod kv_cache;
pub mod memory;
pub mod model;
pub mod runner;
pub mod sampling;
pub mod tokenizer;
pub mod weights;

pub use model::{load_dummy, load_model, DType, LoadFormat, LoadedModel, ModelSpec};
