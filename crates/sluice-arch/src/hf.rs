//! The shape of a Hugging Face `config.json` (transformers' key names).
//!
//! Keys: `hidden_size`, `num_hidden_layers`, `num_attention_heads`,
//! `num_key_value_heads` (default: the attention heads, i.e. no GQA),
//! `head_dim` (absent or `null`: the family's default, [`crate::family`]:
//! `hidden_size ÷ num_attention_heads` for most, 128 for Qwen3, 256 for
//! Gemma), `intermediate_size`, `vocab_size`, `torch_dtype` (or `dtype`,
//! its newer name) for the bytes per element as vLLM serves it under
//! `--dtype auto` (float32 checkpoints run in bf16, so 2 bytes, as do
//! bf16 / fp16 and an absent dtype; fp8: 1), `tie_word_embeddings`
//! (default false), and for a mixture of experts `num_local_experts`
//! (Mixtral) or `num_experts` (Qwen-MoE) with `num_experts_per_tok`, the
//! expert width `moe_intermediate_size` when present. A multimodal
//! config's `text_config` is read when the top level has no
//! `hidden_size`. Shared experts and quantization configs are not
//! modelled.

use crate::family::{default_head_dim, Family};
use crate::load::ModelConfigError;
use crate::ModelShape;
use serde_json::Value;
use sluice_gguf::GgmlType;
use std::path::Path;

impl ModelShape {
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
            None => default_head_dim(cfg.family(), hidden, heads).ok_or_else(|| {
                cfg.key_error(
                    "head_dim",
                    format!(
                        "absent, and hidden_size ({hidden}) is not a multiple of \
                             num_attention_heads ({heads})"
                    ),
                )
            })?,
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
            Some(Value::String(s)) => serving_dtype_bytes(s)
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
}

/// Bytes per weight, activation and KV element of a checkpoint whose
/// `torch_dtype` is `dtype`, as vLLM serves it with `--dtype auto`: a
/// float32 checkpoint is downcast to bf16 (vLLM's `_resolve_auto_dtype`),
/// fp8 stays one byte.
pub fn serving_dtype_bytes(dtype: &str) -> Option<usize> {
    let d = dtype.trim_start_matches("torch.").to_ascii_lowercase();
    Some(match d.as_str() {
        "float32" | "fp32" | "float" | "bfloat16" | "bf16" | "float16" | "fp16" | "half" => 2,
        s if s.starts_with("float8") || s.starts_with("fp8") => 1,
        _ => return None,
    })
}

/// The storage type a `torch_dtype` / `dtype` string names, among the float
/// types a safetensors checkpoint holds (F32, F16, BF16); `None` for any
/// other.
pub fn checkpoint_dtype(dtype: &str) -> Option<GgmlType> {
    match dtype {
        "float32" => Some(GgmlType::F32),
        "bfloat16" => Some(GgmlType::BF16),
        "float16" => Some(GgmlType::F16),
        _ => None,
    }
}

struct Config<'a> {
    path: &'a Path,
    root: &'a Value,
}

impl Config<'_> {
    /// The family the config names (`architectures`, else `model_type`).
    fn family(&self) -> Option<&'static Family> {
        let names: Vec<String> = match self.root.get("architectures") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        let model_type = self.root.get("model_type").and_then(Value::as_str);
        Family::from_hf(&names, model_type)
    }

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
        assert_eq!(serving_dtype_bytes("bfloat16"), Some(2));
        // vLLM's `--dtype auto` runs a float32 checkpoint in bf16.
        assert_eq!(serving_dtype_bytes("torch.float32"), Some(2));
        assert_eq!(serving_dtype_bytes("float8_e4m3fn"), Some(1));
        assert_eq!(serving_dtype_bytes("int4"), None);
        assert_eq!(checkpoint_dtype("float32"), Some(GgmlType::F32));
        assert_eq!(checkpoint_dtype("float16"), Some(GgmlType::F16));
        assert_eq!(checkpoint_dtype("int4"), None);
    }

    #[test]
    fn a_multimodal_config_reads_its_text_config() {
        let text = r#"{"architectures": ["X"], "text_config": {"hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 1000}}"#;
        let m = ModelShape::from_config_str(text, Path::new("c.json")).unwrap();
        assert_eq!((m.hidden, m.kv_heads, m.head_dim), (64, 4, 16));
    }

    #[test]
    fn an_absent_head_dim_is_the_config_classs_default() {
        // hidden 64 over 4 heads: 16 where the class divides; transformers'
        // Qwen3Config and Gemma*Config defaults otherwise.
        let config = |arch: &str, model_type: &str| {
            format!(
                r#"{{"architectures": ["{arch}"], "model_type": "{model_type}",
                "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 128, "vocab_size": 1000}}"#
            )
        };
        for (arch, model_type, want) in [
            ("LlamaForCausalLM", "llama", 16),
            ("MistralForCausalLM", "mistral", 16),
            ("Qwen2ForCausalLM", "qwen2", 16),
            ("Qwen3ForCausalLM", "qwen3", 128),
            ("GemmaForCausalLM", "gemma", 256),
            ("Gemma2ForCausalLM", "gemma2", 256),
            ("Gemma3ForCausalLM", "gemma3_text", 256),
            ("SomethingNewForCausalLM", "new", 16),
        ] {
            let m = ModelShape::from_config_str(&config(arch, model_type), Path::new("c.json"))
                .unwrap();
            assert_eq!(m.head_dim, want, "{arch}");
        }
        // `model_type` decides when `architectures` is absent.
        let text = config("X", "qwen3").replace(r#""architectures": ["X"], "#, "");
        let m = ModelShape::from_config_str(&text, Path::new("c.json")).unwrap();
        assert_eq!(m.head_dim, 128);
        // A width that does not divide, without head_dim, names the key.
        let odd = config("LlamaForCausalLM", "llama")
            .replace("\"hidden_size\": 64", "\"hidden_size\": 66");
        let e = ModelShape::from_config_str(&odd, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("head_dim"), "{e}");
    }
}
