//! Model shapes from what a user names (a built-in, a `config.json`, a
//! GGUF file): the readers live in `sluice-arch`, shared with the model
//! runner and `serve --executor simulated`; this module keeps the
//! simulator's names for them.

pub use sluice_arch::ModelConfigError;
