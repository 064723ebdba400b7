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
//!
//! Layer kinds ([`LayeredShape`]): `layer_types` when present, one of
//! `"full_attention"`, `"sliding_attention"` (a window of `sliding_window`
//! tokens) or `"chunked_attention"` (chunks of `attention_chunk_size`) per
//! layer, as transformers and vLLM read it (Gemma 3, gpt-oss, recent
//! Qwen configs); else the family's rule for `sliding_window`
//! ([`crate::family::SlidingRule`]); for the families whose every layer may
//! slide (Mistral, Qwen2 / Qwen3) a window that covers
//! `max_position_embeddings` keeps every token, full attention, as the
//! model runner reads them; `layer_types` and Gemma's patterns take the
//! window as given, as vLLM's Gemma 3 and gpt-oss models do.

use crate::family::SlidingRule;
use crate::family::{default_head_dim, Family};
use crate::load::ModelConfigError;
use crate::{LayeredShape, ModelShape};
use serde_json::Value;
use sluice_core::kv_cache::AttentionKind;
use sluice_gguf::GgmlType;
use std::path::Path;

impl ModelShape {
    /// The shape of a Hugging Face `config.json`.
    pub fn from_config_json(path: &Path) -> Result<ModelShape, ModelConfigError> {
        LayeredShape::from_config_json(path).map(|l| l.shape)
    }

    /// The shape of `config.json` text; `path` is what errors name.
    pub fn from_config_str(text: &str, path: &Path) -> Result<ModelShape, ModelConfigError> {
        LayeredShape::from_config_str(text, path).map(|l| l.shape)
    }
}

impl LayeredShape {
    /// The shape and layer kinds of a Hugging Face `config.json`.
    pub fn from_config_json(path: &Path) -> Result<LayeredShape, ModelConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        LayeredShape::from_config_str(&text, path)
    }

    /// The shape and layer kinds of `config.json` text; `path` is what
    /// errors name.
    pub fn from_config_str(text: &str, path: &Path) -> Result<LayeredShape, ModelConfigError> {
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
            kv_cache_dtype: crate::KvCacheDtype::Auto,
        };
        shape
            .validate()
            .map_err(|problem| ModelConfigError::Shape {
                path: path.to_path_buf(),
                problem,
            })?;
        let layered = LayeredShape {
            layer_kinds: cfg.layer_kinds(shape.layers)?,
            shape,
        };
        layered
            .validate()
            .map_err(|problem| ModelConfigError::Shape {
                path: path.to_path_buf(),
                problem,
            })?;
        Ok(layered)
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

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelConfigError> {
        match self.root.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.key_error(key, format!("expected true or false, found {v}"))),
        }
    }

    /// `sliding_window`, unless it covers the whole context
    /// (`max_position_embeddings`), where a window keeps every token: the
    /// rule of the families whose every layer may slide (MistralConfig's,
    /// Qwen2Config's), as the runner reads them.
    fn window_below_context(&self) -> Result<Option<usize>, ModelConfigError> {
        let max_len = self.opt_usize("max_position_embeddings")?;
        Ok(self
            .opt_usize("sliding_window")?
            .filter(|&w| max_len.is_none_or(|m| w < m)))
    }

    /// What each of `layers` layers' KV cache keeps.
    fn layer_kinds(&self, layers: usize) -> Result<Vec<AttentionKind>, ModelConfigError> {
        if let Some(types) = self.root.get("layer_types").filter(|v| !v.is_null()) {
            return self.listed_layer_kinds(types, layers);
        }
        let full = vec![AttentionKind::Full; layers];
        let rule = self.family().map_or(SlidingRule::Ignored, |f| f.sliding);
        let window = match rule {
            SlidingRule::AllButEvery(_) => self.opt_usize("sliding_window")?,
            _ => self.window_below_context()?,
        };
        let Some(window) = window else {
            return Ok(full);
        };
        let slide = AttentionKind::SlidingWindow { window };
        Ok(match rule {
            SlidingRule::Ignored => full,
            SlidingRule::EveryLayer => vec![slide; layers],
            SlidingRule::FromMaxWindowLayers => {
                if self.opt_bool("use_sliding_window")? != Some(true) {
                    return Ok(full);
                }
                let first = self.opt_usize("max_window_layers")?.unwrap_or(28);
                (0..layers)
                    .map(|i| {
                        if i >= first {
                            slide
                        } else {
                            AttentionKind::Full
                        }
                    })
                    .collect()
            }
            SlidingRule::AllButEvery(default) => {
                let n = match self.opt_usize("sliding_window_pattern")? {
                    Some(n) => n,
                    None => self
                        .opt_usize("_sliding_window_pattern")?
                        .unwrap_or(default),
                };
                crate::LayerPattern::SlidingExceptEvery {
                    window,
                    full_every: n,
                }
                .kinds(layers)
            }
        })
    }

    /// `layer_types`: one name per layer.
    fn listed_layer_kinds(
        &self,
        types: &Value,
        layers: usize,
    ) -> Result<Vec<AttentionKind>, ModelConfigError> {
        let key = "layer_types";
        let Some(names) = types.as_array() else {
            return Err(self.key_error(key, format!("expected a list, found {types}")));
        };
        if names.len() != layers {
            return Err(self.key_error(
                key,
                format!("{} entries for num_hidden_layers {layers}", names.len()),
            ));
        }
        names
            .iter()
            .map(|name| match name.as_str() {
                Some("full_attention") => Ok(AttentionKind::Full),
                Some("sliding_attention") => match self.opt_usize("sliding_window")? {
                    Some(window) => Ok(AttentionKind::SlidingWindow { window }),
                    None => Err(self.key_error(
                        "sliding_window",
                        "missing, and `layer_types` names sliding layers".into(),
                    )),
                },
                Some("chunked_attention") => Ok(AttentionKind::ChunkedLocal {
                    chunk: self.opt_usize("attention_chunk_size")?.ok_or_else(|| {
                        self.key_error(
                            "attention_chunk_size",
                            "missing, and `layer_types` names chunked layers".into(),
                        )
                    })?,
                }),
                _ => Err(self.key_error(
                    key,
                    format!(
                        "unknown layer type {name}: expected \"full_attention\", \
                         \"sliding_attention\" or \"chunked_attention\""
                    ),
                )),
            })
            .collect()
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

    #[test]
    fn layer_kinds_come_from_layer_types_or_the_familys_pattern() {
        let slide = |window| AttentionKind::SlidingWindow { window };
        // gpt-oss-20b's config.json lists its layers (abridged to 4).
        let text = r#"{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "hidden_size": 2880, "num_hidden_layers": 4, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
            "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
            "max_position_embeddings": 131072, "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
            "full_attention"]}"#;
        let m = LayeredShape::from_config_str(text, Path::new("c.json")).unwrap();
        assert_eq!(
            m.layer_kinds,
            vec![
                slide(128),
                AttentionKind::Full,
                slide(128),
                AttentionKind::Full
            ]
        );
        assert_eq!((m.shape.num_experts, m.shape.experts_per_token), (32, 4));
        // Gemma 3 without `layer_types`: Gemma3TextConfig's pattern of 6,
        // or the config's `sliding_window_pattern` / `_sliding_window_pattern`.
        let gemma = r#"{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_size": 640, "num_hidden_layers": 12, "num_attention_heads": 4,
            "num_key_value_heads": 1, "intermediate_size": 2048, "vocab_size": 262144,
            "max_position_embeddings": 32768, "sliding_window": 512}"#;
        let full_layers = |text: &str| -> Vec<usize> {
            let m = LayeredShape::from_config_str(text, Path::new("c.json")).unwrap();
            assert!(m.layer_kinds.iter().all(|k| matches!(
                k,
                AttentionKind::Full | AttentionKind::SlidingWindow { window: 512 }
            )));
            (0..m.shape.layers)
                .filter(|&i| m.layer_kinds[i] == AttentionKind::Full)
                .collect()
        };
        assert_eq!(full_layers(gemma), vec![5, 11]);
        let with = |key: &str| {
            gemma.replace(
                "\"sliding_window\"",
                &format!("\"{key}\": 4, \"sliding_window\""),
            )
        };
        assert_eq!(full_layers(&with("sliding_window_pattern")), vec![3, 7, 11]);
        assert_eq!(
            full_layers(&with("_sliding_window_pattern")),
            vec![3, 7, 11]
        );
        // Mistral: every layer; Qwen2 only with use_sliding_window, from
        // max_window_layers on; a window covering the context is full.
        let dense = |arch: &str, extra: &str| {
            format!(
                r#"{{"architectures": ["{arch}"], "hidden_size": 64, "num_hidden_layers": 3,
                "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
                "max_position_embeddings": 4096, "sliding_window": 1024{extra}}}"#
            )
        };
        let kinds = |text: String| {
            LayeredShape::from_config_str(&text, Path::new("c.json"))
                .unwrap()
                .layer_kinds
        };
        assert_eq!(kinds(dense("MistralForCausalLM", "")), vec![slide(1024); 3]);
        assert_eq!(
            kinds(dense("Qwen2ForCausalLM", "")),
            vec![AttentionKind::Full; 3]
        );
        assert_eq!(
            kinds(dense(
                "Qwen2ForCausalLM",
                r#", "use_sliding_window": true, "max_window_layers": 1"#
            )),
            vec![AttentionKind::Full, slide(1024), slide(1024)]
        );
        assert_eq!(
            kinds(dense("MistralForCausalLM", "").replace("1024", "4096")),
            vec![AttentionKind::Full; 3]
        );
        // A list of the wrong length, or an unknown name, names the key.
        let short = text.replace("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3");
        let e = LayeredShape::from_config_str(&short, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("layer_types"), "{e}");
        let odd = text.replace(r#""full_attention"]"#, r#""linear_attention"]"#);
        let e = LayeredShape::from_config_str(&odd, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("linear_attention"), "{e}");
    }
}
