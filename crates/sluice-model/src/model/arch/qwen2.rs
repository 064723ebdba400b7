//! Qwen2 (`Qwen2ForCausalLM`, llama.cpp's `qwen2`): Qwen2 and Qwen2.5.
//!
//! Layer: q/k/v always biased, o_proj and the MLP never (transformers
//! hard-codes both, whatever the config says), no q/k norm. The sliding
//! window only applies when `use_sliding_window` is set.

use super::{Arch, Architecture, ConfigSwitches, LayerPieces};
use crate::config::ModelConfig;
use crate::model::layer_attention::LayerAttention;
use crate::model::wiring::LayerWiring;

pub(super) struct Qwen2;

impl Arch for Qwen2 {
    fn architecture(&self) -> Architecture {
        Architecture::Qwen2
    }

    fn hf_architectures(&self) -> &'static [&'static str] {
        &["Qwen2ForCausalLM"]
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["qwen2"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "qwen2"
    }

    fn pieces(&self, _: ConfigSwitches) -> LayerPieces {
        LayerPieces {
            qkv_bias: true,
            o_bias: false,
            qk_norm: false,
            mlp_bias: false,
        }
    }

    fn hf_sliding_window_in_force(&self, use_sliding_window: Option<bool>) -> bool {
        use_sliding_window.unwrap_or(false)
    }

    fn layer_attention(&self, config: &ModelConfig, layer: usize) -> LayerAttention {
        // transformers' Qwen2Config: the window, when in force, applies
        // from layer `max_window_layers` (default 28) on.
        let first = config.attention.max_window_layers.unwrap_or(28);
        LayerAttention::with_config_window(config, layer, first)
    }

    fn wiring(&self, _hidden_size: usize) -> LayerWiring {
        // Pre-norm, SiLU (SwiGLU), the embedding as read.
        LayerWiring::default()
    }
}
