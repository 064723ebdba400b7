//! sluice's own reader (and a small writer) of GGUF, llama.cpp's model file
//! format, versions 2 and 3.
//!
//! This crate owns the file format and nothing else: it knows how a GGUF
//! file lays out its header, metadata, tensor infos and tensor data, and the
//! GGML type table (block size and bytes per block of every type id), but
//! not what a `llama` or `qwen2` model does with them. It lives apart from
//! the model runner so that anything that only needs a model's shape (a
//! scheduler simulator, a CLI probing a path) can read a GGUF without
//! depending on the kernels.
//!
//! # What it promises
//!
//! - [`GgufFile::open`] memory-maps the file (every part of a split set)
//!   and checks the whole structure before it returns: every metadata value
//!   is parsed, every tensor's type is known, its byte range lies inside the
//!   file, is aligned and overlaps no other tensor. After a successful open,
//!   [`GgufFile::data`] and [`TensorInfo::data`] cannot fail.
//! - Hostile input (truncated, corrupt, crafted) gets a [`GgufError`] that
//!   names the file and the metadata key or tensor at fault, never a panic.
//!   Every count or length read from the file is checked against the bytes
//!   that remain before anything is reserved for it, so the heap used by a
//!   parse is bounded by a small multiple of the file's size (the test
//!   `tests/hostile.rs` measures it with a counting allocator).
//! - Tensor bytes are never copied: [`MappedBytes`] borrows the mapping
//!   through an `Arc`, so a consumer may keep quantized weights in place for
//!   as long as it likes, after the [`GgufFile`] itself is dropped.
//! - [`GgufWriter`] writes files this reader (and llama.cpp) reads, for
//!   fixtures built inside tests.
//!
//! # Layout, for reference
//!
//! All little-endian: magic `GGUF`, `u32` version, `u64` tensor count,
//! `u64` metadata count; the metadata key/value pairs (key: `u64` length +
//! UTF-8 bytes; `u32` value type; the value); the tensor infos (name,
//! `u32` number of dimensions, that many `u64` dimensions with `dims[0]` the
//! row length, `u32` GGML type id, `u64` data offset); padding to
//! `general.alignment` (default 32); the tensor data, each tensor at its
//! offset from the start of that data section.

#![warn(missing_docs)]

mod bytes;
mod error;
mod file;
mod metadata;
mod parse;
mod resolve;
mod types;
mod value;
mod writer;

pub use bytes::MappedBytes;
pub use error::GgufError;
pub use file::{GgufFile, TensorInfo};
pub use metadata::Metadata;
pub use resolve::{is_gguf_file, resolve_model_path, split_part_path, SplitName};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;

/// The metadata key that sets the alignment of tensor data.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// The metadata key naming the model architecture (`llama`, `qwen2`, …).
pub const KEY_ARCHITECTURE: &str = "general.architecture";

/// The 0-based index of this part in a split set (llama.cpp's `gguf-split`).
pub const KEY_SPLIT_NO: &str = "split.no";

/// The number of parts of a split set.
pub const KEY_SPLIT_COUNT: &str = "split.count";

/// The number of tensors in all parts of a split set together.
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// How deeply arrays may nest inside metadata values. llama.cpp refuses
/// nested arrays altogether; the `gguf` Python package writes them, so we
/// read them, but a bound keeps a crafted file from recursing without end.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Result with this crate's error.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
