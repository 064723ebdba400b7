//! What a model *is*, read from its own config: the architecture table
//! ([`family`]), the `config.json` and GGUF metadata readers ([`hf`],
//! [`gguf`], [`ModelShape::load`]) and [`ModelShape`] with the facts
//! derived from it (parameters, bytes per weight, KV bytes per token).
//!
//! Its own crate, below both the model runner (sluice-model) and the
//! simulator (sluice-sim), so that the runner's KV sizing, `sluice
//! simulate` and `serve --executor simulated` read one model the same way:
//! one reader per format, one default per missing key. It depends only on
//! the GGUF container reader; it never touches a weight.

pub mod builtin;
pub mod family;
pub mod gguf;
pub mod hf;
pub mod load;
pub mod shape;

pub use family::{Family, HeadDimDefault, FAMILIES};
pub use hf::{checkpoint_dtype, serving_dtype_bytes};
pub use load::ModelConfigError;
pub use shape::ModelShape;
