//! sluice-model: executes `SchedulerOutput`s on Hugging Face decoder models
//! (Qwen2, Llama / Mistral families) on CPU, reading and writing KV through the
//! scheduler's block tables.

pub mod kernels;
