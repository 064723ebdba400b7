//! A [`ModelShape`] from what a user names: a built-in model, a Hugging
//! Face `config.json` (or a directory holding one), or a GGUF file.
//!
//! Only the shape is read, never a weight: a simulator needs widths and
//! counts, and a GGUF's tensor data is measured (its size is the weight
//! bytes) but not touched.
//!
//! `config.json` keys (transformers' names): `hidden_size`,
//! `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`
//! (default: the attention heads, i.e. no GQA), `head_dim` (default
//! `hidden_size ÷ num_attention_heads`; `null` counts as absent),
//! `intermediate_size`, `vocab_size`, `torch_dtype` (or `dtype`, its newer
//! name; default bfloat16) for the bytes per element,
//! `tie_word_embeddings` (default false), and for a mixture of experts
//! `num_local_experts` (Mixtral) or `num_experts` (Qwen-MoE) with
//! `num_experts_per_tok`, the expert width `moe_intermediate_size` when
//! present. A multimodal config's `text_config` is read when the top
//! level has no `hidden_size`. Shared experts and quantization configs
//! are not modelled.
//!
//! GGUF keys (llama.cpp's names, `{arch}` = `general.architecture`):
//! `{arch}.embedding_length`, `.block_count`, `.attention.head_count`,
//! `.attention.head_count_kv` (default: head count),
//! `.feed_forward_length` (`.expert_feed_forward_length` for experts when
//! present), `.attention.key_length` (default embedding ÷ heads),
//! `.expert_count` / `.expert_used_count` (default 0); the vocabulary from
//! `tokenizer.ggml.tokens`' length, else the `token_embd.weight` tensor's
//! second dimension. Activations and KV cache are taken as 2 bytes (fp16,
//! llama.cpp's and vLLM's default); the weight bytes are the file's tensor
//! data, so a quantized file streams fewer bytes per weight.
//!
//! Errors name the file and the key.

use crate::roofline::ModelShape;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Why a model shape could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ModelConfigError {
    #[error("{spec}: not a built-in model ({builtins}) and no such file or directory")]
    NotFound { spec: String, builtins: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: key `{key}`: {problem}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error("{}: {problem}", path.display())]
    Shape { path: PathBuf, problem: String },
    #[error(transparent)]
    Gguf(#[from] sluice_gguf::GgufError),
}

impl ModelShape {
    /// The shape `spec` names: a built-in (short name or Hugging Face id,
    /// any case) first, then a path: a `config.json` (any JSON file), a
    /// GGUF file, or a directory holding a `config.json` or exactly one
    /// GGUF model.
    pub fn load(spec: &str) -> Result<ModelShape, ModelConfigError> {
        if let Some(shape) = ModelShape::builtin(spec) {
            return Ok(shape);
        }
        let path = Path::new(spec);
        if path.is_dir() {
            let config = path.join("config.json");
            if config.is_file() {
                return ModelShape::from_config_json(&config);
            }
            let gguf = sluice_gguf::resolve_model_path(path)?;
            return ModelShape::from_gguf(&gguf);
        }
        if path.is_file() {
            if sluice_gguf::is_gguf_file(path) {
                return ModelShape::from_gguf(path);
            }
            return ModelShape::from_config_json(path);
        }
        Err(ModelConfigError::NotFound {
            spec: spec.to_string(),
            builtins: ModelShape::builtin_names().join(", "),
        })
    }

    /// The shape of a Hugging Face `config.json`.
    pub fn from_config_json(path: &Path) -> Result<ModelShape, ModelConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        ModelShape::from_config_str(&text, path)
    }

    /// The shape of `config.json` text; `path` is what errors name.
    pub fn from_config_str(text: &str, path: &Path) -> Result<ModelShape, ModelConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|source| ModelConfigError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg = Config { path, root: &root };
        let cfg = match (root.get("hidden_size"), root.get("text_config")) {
            (None, Some(text @ Value::Object(_))) => Config { path, root: text },
            _ => cfg,
        };
        let hidden = cfg.usize("hidden_size")?;
        let heads = cfg.usize("num_attention_heads")?;
        let kv_heads = cfg.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = match cfg.opt_usize("head_dim")? {
            Some(d) => d,
            None => hidden / heads,
        };
        let num_experts = match cfg.opt_usize("num_local_experts")? {
            Some(e) => e,
            None => cfg.opt_usize("num_experts")?.unwrap_or(0),
        };
        let experts_per_token = if num_experts > 0 {
            cfg.usize("num_experts_per_tok")?
        } else {
            0
        };
        let intermediate = match (num_experts > 0, cfg.opt_usize("moe_intermediate_size")?) {
            (true, Some(w)) => w,
            _ => cfg.usize("intermediate_size")?,
        };
        let dtype_key = if cfg.root.get("torch_dtype").is_some() {
            "torch_dtype"
        } else {
            "dtype"
        };
        let bytes_per_param = match cfg.root.get(dtype_key) {
            None | Some(Value::Null) => 2,
            Some(Value::String(s)) => dtype_bytes(s)
                .ok_or_else(|| cfg.key_error(dtype_key, format!("unknown dtype \"{s}\"")))?,
            Some(other) => {
                return Err(cfg.key_error(dtype_key, format!("expected a string, found {other}")))
            }
        };
        let tie_word_embeddings = match cfg.root.get("tie_word_embeddings") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(cfg.key_error(
                    "tie_word_embeddings",
                    format!("expected true or false, found {other}"),
                ))
            }
        };
        let shape = ModelShape {
            hidden,
            layers: cfg.usize("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab: cfg.usize("vocab_size")?,
            bytes_per_param,
            num_experts,
            experts_per_token,
            tie_word_embeddings,
            stored_weight_bytes: None,
        };
        shape
            .validate()
            .map_err(|problem| ModelConfigError::Shape {
                path: path.to_path_buf(),
                problem,
            })?;
        Ok(shape)
    }

    /// The shape of a GGUF file (the first part, for a split set); its
    /// weight bytes are the tensor data of all parts.
    pub fn from_gguf(path: &Path) -> Result<ModelShape, ModelConfigError> {
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
        let kv_heads = opt("attention.head_count_kv")?.unwrap_or(heads);
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
        let vocab = match md.opt("tokenizer.ggml.tokens", sluice_gguf::Metadata::str_array)? {
            Some(tokens) => tokens.len(),
            None => match file.tensor("token_embd.weight") {
                Some(t) if t.dims().len() == 2 => t.dims()[1] as usize,
                _ => {
                    return Err(ModelConfigError::Shape {
                        path: path.to_path_buf(),
                        problem: "no vocabulary size: neither `tokenizer.ggml.tokens` nor a 2-D \
                                  `token_embd.weight` tensor"
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
        };
        shape
            .validate()
            .map_err(|problem| ModelConfigError::Shape {
                path: path.to_path_buf(),
                problem,
            })?;
        Ok(shape)
    }
}

/// Bytes per element of a `torch_dtype` string.
fn dtype_bytes(dtype: &str) -> Option<usize> {
    let d = dtype.trim_start_matches("torch.").to_ascii_lowercase();
    Some(match d.as_str() {
        "float32" | "fp32" | "float" => 4,
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => 2,
        s if s.starts_with("float8") || s.starts_with("fp8") => 1,
        _ => return None,
    })
}

struct Config<'a> {
    path: &'a Path,
    root: &'a Value,
}

impl Config<'_> {
    fn key_error(&self, key: &str, problem: String) -> ModelConfigError {
        ModelConfigError::Key {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            problem,
        }
    }

    /// A positive integer, absent (or `null`) as `None`.
    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelConfigError> {
        match self.root.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n as usize)),
                _ => Err(self.key_error(key, format!("expected a positive integer, found {v}"))),
            },
        }
    }

    fn usize(&self, key: &str) -> Result<usize, ModelConfigError> {
        self.opt_usize(key)?
            .ok_or_else(|| self.key_error(key, "missing".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_map_to_bytes() {
        assert_eq!(dtype_bytes("bfloat16"), Some(2));
        assert_eq!(dtype_bytes("torch.float32"), Some(4));
        assert_eq!(dtype_bytes("float8_e4m3fn"), Some(1));
        assert_eq!(dtype_bytes("int4"), None);
    }

    #[test]
    fn a_multimodal_config_reads_its_text_config() {
        let text = r#"{"architectures": ["X"], "text_config": {"hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 1000}}"#;
        let m = ModelShape::from_config_str(text, Path::new("c.json")).unwrap();
        assert_eq!((m.hidden, m.kv_heads, m.head_dim), (64, 4, 16));
    }
}
