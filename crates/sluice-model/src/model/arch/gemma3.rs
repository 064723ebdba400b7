//! Gemma 3 (`Gemma3ForCausalLM`, the text model of
//! `Gemma3ForConditionalGeneration`, llama.cpp's `gemma3`).
//!
//! Layer: RMSNorms before and after each block (`input_layernorm` /
//! `post_attention_layernorm` around attention, `pre_feedforward_layernorm`
//! / `post_feedforward_layernorm` around the MLP), per-head RMSNorm of q and
//! k, a GELU-tanh gated MLP, no biases, the embedding multiplied by
//! `sqrt(hidden_size)`, tied head. Every RMSNorm multiplies by `1 + w`:
//! checkpoints store `w`, llama.cpp's converter stores `1 + w`, so the +1
//! is added here only for Hugging Face names ([`Arch::norm_weight_offset`]).
//!
//! Attention alternates: sliding-window layers (`sliding_window` keys, the
//! local RoPE base, 10,000 unless the config says otherwise, unscaled) and
//! full ones (the global `rope_theta` with the config's `rope_scaling`).
//! Which layer is which comes from `layer_types`, else from
//! `sliding_window_pattern` (every N-th layer full; 6 by default, as
//! transformers' `Gemma3TextConfig` and llama.cpp). The softmax scale is
//! `query_pre_attn_scalar^-0.5`; a GGUF file does not store that scalar and
//! llama.cpp uses `head_dim` (`hidden / heads` for the 62-layer 27B), which
//! the GGUF reader below mirrors.

use super::{Arch, Architecture, ConfigSwitches, LayerPieces, TensorId, TensorNaming};
use crate::config::{AttentionConfig, LayerType, ModelConfig, RopeScaling};
use crate::model::layer_attention::{LayerAttention, RopeParams};
use crate::model::wiring::{Activation, LayerWiring, NormPlacement};
use anyhow::{bail, Result};
use sluice_gguf::{Array, Metadata};

pub(super) struct Gemma3;

/// transformers' `Gemma3TextConfig` defaults, which llama.cpp hard-codes
/// for `gemma3` files too.
const DEFAULT_SLIDING_WINDOW_PATTERN: usize = 6;
const DEFAULT_LOCAL_ROPE_BASE: f64 = 10_000.0;

impl Arch for Gemma3 {
    fn architecture(&self) -> Architecture {
        Architecture::Gemma3
    }

    fn hf_architectures(&self) -> &'static [&'static str] {
        &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"]
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["gemma3_text"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "gemma3"
    }

    fn pieces(&self, s: ConfigSwitches) -> LayerPieces {
        LayerPieces::qk_norm_layer(s)
    }

    fn hf_sliding_window_in_force(&self, _use_sliding_window: Option<bool>) -> bool {
        // The window applies to the sliding layers whatever the flag.
        true
    }

    fn hf_text_model_wrappers(&self) -> &'static [&'static str] {
        &["Gemma3ForConditionalGeneration"]
    }

    fn hf_config_defaults(&self) -> serde_json::Value {
        // transformers' Gemma3TextConfig; the multimodal checkpoints'
        // `text_config` gives little more than the sizes that differ.
        serde_json::json!({
            "vocab_size": 262_208,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 131_072,
            "rms_norm_eps": 1e-6,
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,
            "rope_local_base_freq": 10_000.0,
            "bos_token_id": 2,
            "eos_token_id": 1,
        })
    }

    fn tensor_names(&self, id: TensorId, naming: TensorNaming) -> Vec<String> {
        let name = id.standard_name(naming);
        if naming != TensorNaming::HuggingFace {
            return vec![name];
        }
        // Gemma3ForConditionalGeneration: `language_model.model.*` and
        // `language_model.lm_head` as transformers 4 saves it,
        // `model.language_model.*` (head `lm_head`) as transformers 5 does.
        let mut names = vec![name.clone()];
        match name.strip_prefix("model.") {
            Some(rest) => {
                names.push(format!("language_model.model.{rest}"));
                names.push(format!("model.language_model.{rest}"));
            }
            None => names.push(format!("language_model.{name}")),
        }
        names
    }

    fn hf_default_tie_word_embeddings(&self) -> bool {
        // Gemma3TextConfig(tie_word_embeddings=True).
        true
    }

    fn norm_weight_offset(&self, naming: TensorNaming) -> f32 {
        match naming {
            TensorNaming::HuggingFace => 1.0,
            // convert_hf_to_gguf.py's Gemma3Model adds `norm_shift` = 1.
            TensorNaming::Gguf => 0.0,
        }
    }

    fn wiring(&self, hidden_size: usize) -> LayerWiring {
        LayerWiring {
            norms: NormPlacement::PrePost,
            activation: Activation::GeluTanh,
            // transformers' Gemma3TextScaledWordEmbedding: a float32
            // `hidden_size ** 0.5`, correctly rounded as `sqrt` is.
            embedding_scale: Some((hidden_size as f32).sqrt()),
        }
    }

    fn layer_attention(&self, config: &ModelConfig, layer: usize) -> LayerAttention {
        let a = &config.attention;
        let sliding = match &a.layer_types {
            Some(types) => types.get(layer) == Some(&LayerType::SlidingAttention),
            None => {
                let pattern = a
                    .sliding_window_pattern
                    .unwrap_or(DEFAULT_SLIDING_WINDOW_PATTERN);
                pattern != 0 && !(layer + 1).is_multiple_of(pattern)
            }
        };
        let uniform = LayerAttention::uniform(config);
        let scale = match a.query_pre_attn_scalar {
            Some(s) => (1.0 / s.sqrt()) as f32,
            None => uniform.scale,
        };
        let (window, rope) = if sliding {
            let local = a.local_rope.unwrap_or(RopeParams {
                base: DEFAULT_LOCAL_ROPE_BASE,
                scaling: RopeScaling::None,
            });
            (a.sliding_window, local)
        } else {
            (None, RopeParams::of(config))
        };
        LayerAttention {
            window,
            scale,
            rope: Some(rope),
            logit_softcap: a.attn_logit_softcapping.map(|c| c as f32),
        }
    }

    fn gguf_attention(&self, md: &Metadata, config: &ModelConfig) -> Result<AttentionConfig> {
        let key = |k: &str| format!("gemma3.{k}");
        if let Some(cap) = md.opt(&key("final_logit_softcapping"), Metadata::f32)? {
            bail!(
                "{} = {cap}: soft-capping the final logits is not supported",
                key("final_logit_softcapping")
            );
        }
        // llama.cpp (models/gemma3.cpp): no window (or 0) means no sliding
        // layers at all; with one, the per-layer pattern from
        // `attention.sliding_window_pattern` (a bool per layer, or N: every
        // N-th layer full, 0: every layer slides), 6 when absent.
        let sliding_window = md
            .opt(&key("attention.sliding_window"), Metadata::u64)?
            .filter(|&w| w > 0)
            .map(|w| w as usize);
        let layers = config.num_hidden_layers;
        let layer_types = match sliding_window {
            None => vec![LayerType::FullAttention; layers],
            Some(_) => {
                let pattern_key = key("attention.sliding_window_pattern");
                let sliding: Vec<bool> = match md.get(&pattern_key) {
                    Some(v) if v.as_array().is_some() => match md.array(&pattern_key)? {
                        Array::Bool(b) if b.len() == layers => b.clone(),
                        a => bail!(
                            "{pattern_key}: expected {layers} booleans (one per layer), found \
                             {} of {}",
                            a.len(),
                            a.element_type()
                        ),
                    },
                    Some(_) => {
                        let n = md.u32(&pattern_key)? as usize;
                        (0..layers).map(|l| n == 0 || l % n < n - 1).collect()
                    }
                    None => (0..layers)
                        .map(|l| {
                            l % DEFAULT_SLIDING_WINDOW_PATTERN < DEFAULT_SLIDING_WINDOW_PATTERN - 1
                        })
                        .collect(),
                };
                sliding
                    .into_iter()
                    .map(|s| {
                        if s {
                            LayerType::SlidingAttention
                        } else {
                            LayerType::FullAttention
                        }
                    })
                    .collect()
            }
        };
        // llama.cpp: the 27B scales by hidden / heads (its
        // query_pre_attn_scalar), every other size by head_dim; the file
        // says neither.
        let query_pre_attn_scalar = if layers == 62 {
            config.hidden_size / config.num_attention_heads
        } else {
            config.head_dim
        } as f64;
        // The sliding layers' RoPE: `rope.freq_base_swa`, else llama.cpp's
        // 10,000, unscaled.
        let local_base = md
            .opt(&key("rope.freq_base_swa"), Metadata::f32)?
            .map_or(DEFAULT_LOCAL_ROPE_BASE, f64::from);
        Ok(AttentionConfig {
            sliding_window,
            layer_types: Some(layer_types),
            query_pre_attn_scalar: Some(query_pre_attn_scalar),
            local_rope: Some(RopeParams {
                base: local_base,
                scaling: RopeScaling::None,
            }),
            ..Default::default()
        })
    }
}
