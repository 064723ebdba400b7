//! Built-in model configurations, usable with dummy weights and no files.
//!
//! `tiny` is the small Qwen2-shaped model `sluice serve` runs by default with
//! the built-in byte-level tokenizer (ids 0..255 are bytes, 256
//! `<|endoftext|>`, 257 `<|im_start|>`, 258 `<|im_end|>`). `qwen2.5-0.5b` is
//! the real Qwen2.5-0.5B shape, the benchmark model.

use crate::config::{Architecture, GenerationConfig, ModelConfig, RopeScaling};
use anyhow::{bail, Result};
use sluice_gguf::GgmlType;

/// Names accepted by [`config`].
pub const NAMES: &[&str] = &["tiny", "qwen2.5-0.5b"];

/// The model and generation configs of a built-in model.
pub fn config(name: &str) -> Result<(ModelConfig, GenerationConfig)> {
    let config = match name {
        "tiny" => ModelConfig {
            architecture: Architecture::Qwen2,
            hidden_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 32,
            intermediate_size: 256,
            vocab_size: 384,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: false,
            qk_norm: false,
            mlp_bias: false,
            bos_token_id: None,
            eos_token_ids: vec![256, 258],
            checkpoint_dtype: Some(GgmlType::F32),
            attention: Default::default(),
        },
        "qwen2.5-0.5b" => ModelConfig {
            architecture: Architecture::Qwen2,
            hidden_size: 896,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            head_dim: 64,
            intermediate_size: 4864,
            vocab_size: 151936,
            max_position_embeddings: 32768,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: false,
            qk_norm: false,
            mlp_bias: false,
            bos_token_id: None,
            eos_token_ids: vec![151643, 151645],
            checkpoint_dtype: Some(GgmlType::BF16),
            attention: Default::default(),
        },
        other => bail!("unknown built-in model {other:?} (built-in models: {NAMES:?})"),
    };
    config.validate()?;
    let generation = GenerationConfig::from_model_config(&config);
    Ok((config, generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_valid() {
        for name in NAMES {
            config(name).unwrap();
        }
        assert!(config("gpt-5").is_err());
    }

    #[test]
    fn qwen_shape_has_the_anchor_parameter_count() {
        // The shape the README's llama.cpp and transformers figures were
        // measured on: 387 M parameters with a 32,000-token vocabulary.
        let (mut c, _) = config("qwen2.5-0.5b").unwrap();
        c.vocab_size = 32000;
        let p = c.num_parameters();
        assert!((386_000_000..388_000_000).contains(&p), "{p}");
    }
}
