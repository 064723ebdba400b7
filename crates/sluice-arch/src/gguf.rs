//! The shape of a GGUF file (llama.cpp's key names, `{arch}` =
//! `general.architecture`).
//!
//! Keys: `{arch}.embedding_length`, `.block_count`,
//! `.attention.head_count`, `.attention.head_count_kv` (default: head
//! count; a per-layer array must agree across layers),
//! `.feed_forward_length` (`.expert_feed_forward_length` for experts when
//! present), `.attention.key_length` (default embedding ÷ heads, llama.cpp's
//! rule), `.expert_count` / `.expert_used_count` (default 0); the
//! vocabulary is the `token_embd.weight` tensor's rows (what the LM head
//! computes), else `tokenizer.ggml.tokens`' length. Activations and KV
//! cache are taken as 2 bytes (fp16, llama.cpp's and vLLM's default); the
//! weight bytes are the file's tensor data (all parts of a split set), so a
//! quantized file streams fewer bytes per weight.
//!
//! Layer kinds ([`LayeredShape`]): with a positive
//! `{arch}.attention.sliding_window`, the layers of a family that
//! alternates windows slide as `{arch}.attention.sliding_window_pattern`
//! says (a bool per layer, or N: every N-th layer full, 0: none), else as
//! llama.cpp's default `swa_pattern` (Gemma 2 every 2nd layer full, Gemma 3
//! every 6th, layer `il` full when `(il + 1) % n == 0`; gpt-oss every
//! 2nd); any other file is full attention.

use crate::family::{Family, SlidingRule};
use crate::load::ModelConfigError;
use crate::{LayeredShape, ModelShape};
use sluice_core::kv_cache::AttentionKind;
use std::path::Path;

impl ModelShape {
    /// The shape of a GGUF file (the first part, for a split set); its
    /// weight bytes are the tensor data of all parts.
    pub fn from_gguf(path: &Path) -> Result<ModelShape, ModelConfigError> {
        LayeredShape::from_gguf(path).map(|l| l.shape)
    }
}

impl LayeredShape {
    /// The shape and layer kinds of a GGUF file (the first part, for a
    /// split set).
    pub fn from_gguf(path: &Path) -> Result<LayeredShape, ModelConfigError> {
        let file = sluice_gguf::GgufFile::open(path)?;
        let md = file.metadata();
        let arch = md.architecture()?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| -> Result<usize, ModelConfigError> { Ok(md.u64(&key(k))? as usize) };
        let opt = |k: &str| -> Result<Option<usize>, ModelConfigError> {
            Ok(md
                .opt(&key(k), sluice_gguf::Metadata::u64)?
                .map(|v| v as usize))
        };
        let hidden = get("embedding_length")?;
        let layers = get("block_count")?;
        let heads = get("attention.head_count")?;
        let kv_key = key("attention.head_count_kv");
        let kv_heads = match md.get(&kv_key) {
            None => heads,
            Some(v) if v.as_array().is_some() => {
                let counts = md.u32_array(&kv_key)?;
                match counts.first() {
                    Some(&first) if counts.iter().all(|&c| c == first) => first as usize,
                    _ => {
                        return Err(ModelConfigError::Key {
                            path: path.to_path_buf(),
                            key: kv_key,
                            problem: format!(
                                "KV heads per layer {counts:?}: one count for every layer is \
                                 needed"
                            ),
                        })
                    }
                }
            }
            Some(_) => get("attention.head_count_kv")?,
        };
        let head_dim = match opt("attention.key_length")? {
            Some(d) => d,
            None => hidden / heads.max(1),
        };
        let num_experts = opt("expert_count")?.unwrap_or(0);
        let experts_per_token = opt("expert_used_count")?.unwrap_or(0);
        let intermediate = match (num_experts > 0, opt("expert_feed_forward_length")?) {
            (true, Some(w)) => w,
            _ => get("feed_forward_length")?,
        };
        let embedding_rows = match file.tensor("token_embd.weight") {
            Some(t) if t.dims().len() == 2 => Some(t.dims()[1] as usize),
            _ => None,
        };
        let vocab = match embedding_rows {
            Some(rows) => rows,
            None => match md.opt("tokenizer.ggml.tokens", sluice_gguf::Metadata::str_array)? {
                Some(tokens) => tokens.len(),
                None => {
                    return Err(ModelConfigError::Shape {
                        path: path.to_path_buf(),
                        problem: "no vocabulary size: neither a 2-D `token_embd.weight` tensor \
                                  nor `tokenizer.ggml.tokens`"
                            .into(),
                    })
                }
            },
        };
        let stored: u64 = file.tensors().iter().map(|t| t.n_bytes() as u64).sum();
        let shape = ModelShape {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            bytes_per_param: 2,
            num_experts,
            experts_per_token,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            stored_weight_bytes: Some(stored),
            kv_cache_dtype: crate::KvCacheDtype::Auto,
        };
        let layer_kinds = match (
            Family::from_gguf(&arch).map(|f| f.sliding),
            opt("attention.sliding_window")?.filter(|&w| w > 0),
        ) {
            (Some(SlidingRule::AllButEvery(default)), Some(window)) => {
                let slide = AttentionKind::SlidingWindow { window };
                sliding_layers(
                    md,
                    &key("attention.sliding_window_pattern"),
                    layers,
                    default,
                )
                .map_err(|problem| ModelConfigError::Key {
                    path: path.to_path_buf(),
                    key: key("attention.sliding_window_pattern"),
                    problem,
                })?
                .into_iter()
                .map(|s| if s { slide } else { AttentionKind::Full })
                .collect()
            }
            _ => vec![AttentionKind::Full; layers],
        };
        let layered = LayeredShape { shape, layer_kinds };
        layered
            .validate()
            .map_err(|problem| ModelConfigError::Shape {
                path: path.to_path_buf(),
                problem,
            })?;
        Ok(layered)
    }
}

/// Which of `layers` layers slide, from `key` (llama.cpp's
/// `attention.sliding_window_pattern`: a bool per layer, or `N`, every
/// `N`-th layer full, 0 none), else every `default`-th layer full.
fn sliding_layers(
    md: &sluice_gguf::Metadata,
    key: &str,
    layers: usize,
    default: usize,
) -> Result<Vec<bool>, String> {
    let every = |n: usize| (0..layers).map(|l| n == 0 || (l + 1) % n != 0).collect();
    match md.get(key) {
        None => Ok(every(default)),
        Some(v) if v.as_array().is_some() => match md.array(key).map_err(|e| e.to_string())? {
            sluice_gguf::Array::Bool(b) if b.len() == layers => Ok(b.clone()),
            a => Err(format!(
                "expected {layers} booleans (one per layer), found {} of {}",
                a.len(),
                a.element_type()
            )),
        },
        Some(_) => Ok(every(md.u32(key).map_err(|e| e.to_string())? as usize)),
    }
}
