//! What a model *is*, read from its own config: the architecture table
//! ([`family`]), the `config.json` and GGUF metadata readers ([`hf`],
//! [`gguf`], [`ModelShape::load`]) and [`ModelShape`] with the facts
//! derived from it (parameters, bytes per weight, KV bytes per token), and
//! [`LayeredShape`]: the shape with what each layer's KV cache keeps, which
//! decides a hybrid model's KV cache groups and the blocks a budget holds.
//!
//! Its own crate, below both the model runner (sluice-model) and the
//! simulator (sluice-sim), so that the runner's KV sizing, `sluice
//! simulate` and `serve --executor simulated` read one model the same way:
//! one reader per format, one default per missing key. It depends only on
//! the GGUF container reader and sluice-core's KV cache group rule (so a
//! shape's groups are the scheduler's); it never touches a weight.

pub mod builtin;
pub mod family;
pub mod gguf;
pub mod hf;
pub mod kv_dtype;
pub mod layers;
pub mod load;
pub mod shape;

pub use family::{Family, HeadDimDefault, SlidingRule, FAMILIES};
pub use hf::{checkpoint_dtype, serving_dtype_bytes};
pub use kv_dtype::KvCacheDtype;
pub use layers::{LayerPattern, LayeredShape};
pub use load::ModelConfigError;
pub use shape::ModelShape;
