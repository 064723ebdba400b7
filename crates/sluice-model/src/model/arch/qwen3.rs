//! Qwen3 (`Qwen3ForCausalLM`, llama.cpp's `qwen3`), the dense models.
//!
//! Layer: every q head and every k head RMS-normalised (`q_norm` /
//! `k_norm`, `head_dim` weights, the model's `rms_norm_eps`) after the
//! projection and before RoPE; q/k/v and o biased only when
//! `attention_bias` is set (never in released checkpoints); no MLP bias.
//! head_dim is its own config field (128 in transformers' defaults, in
//! `sluice_arch`'s architecture table), not
//! `hidden_size / num_attention_heads`: Qwen3-0.6B has 16 heads of 128 on a
//! hidden size of 1024. The sliding window only applies when
//! `use_sliding_window` is set.

use super::{Arch, Architecture, ConfigSwitches, LayerPieces};
use crate::config::ModelConfig;
use crate::model::layer_attention::LayerAttention;
use crate::model::wiring::LayerWiring;

pub(super) struct Qwen3;

impl Arch for Qwen3 {
    fn architecture(&self) -> Architecture {
        Architecture::Qwen3
    }

    fn hf_architectures(&self) -> &'static [&'static str] {
        &["Qwen3ForCausalLM"]
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["qwen3"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "qwen3"
    }

    fn pieces(&self, s: ConfigSwitches) -> LayerPieces {
        LayerPieces::qk_norm_layer(s)
    }

    fn hf_sliding_window_in_force(&self, use_sliding_window: Option<bool>) -> bool {
        use_sliding_window.unwrap_or(false)
    }

    fn layer_attention(&self, config: &ModelConfig, layer: usize) -> LayerAttention {
        // transformers' Qwen3Config: the window, when in force, applies
        // from layer `max_window_layers` (default 28) on.
        let first = config.attention.max_window_layers.unwrap_or(28);
        LayerAttention::with_config_window(config, layer, first)
    }

    fn wiring(&self, _hidden_size: usize) -> LayerWiring {
        // Pre-norm, SiLU (SwiGLU), the embedding as read.
        LayerWiring::default()
    }
}
