//! Llama (`LlamaForCausalLM`; also `MistralForCausalLM` without a sliding
//! window, and llama.cpp's `llama` GGUF files such as SmolLM2).
//!
//! Layer: q/k/v and o biased together when `attention_bias` is set (off in
//! every released checkpoint), MLP biases when `mlp_bias` is set, no q/k
//! norm. Mistral's sliding window is always in force when given, so one
//! shorter than the context is refused.

use super::{Arch, Architecture, ConfigSwitches, LayerPieces};
use crate::model::wiring::LayerWiring;

pub(super) struct Llama;

impl Arch for Llama {
    fn architecture(&self) -> Architecture {
        Architecture::Llama
    }

    fn hf_architectures(&self) -> &'static [&'static str] {
        &["LlamaForCausalLM", "MistralForCausalLM"]
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["llama", "mistral"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "llama"
    }

    fn gguf_permutes_qk(&self) -> bool {
        // convert_hf_to_gguf.py's LlamaModel reorders q/k rows for
        // llama.cpp's interleaved rotation.
        true
    }

    fn pieces(&self, s: ConfigSwitches) -> LayerPieces {
        let attention_bias = s.attention_bias.unwrap_or(false);
        LayerPieces {
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            qk_norm: false,
            mlp_bias: s.mlp_bias.unwrap_or(false),
        }
    }

    fn hf_sliding_window_in_force(&self, _use_sliding_window: Option<bool>) -> bool {
        true
    }

    fn wiring(&self, _hidden_size: usize) -> LayerWiring {
        // Pre-norm, SiLU (SwiGLU), the embedding as read.
        LayerWiring::default()
    }
}
