//! The attention shape of one layer: which keys it sees (all earlier ones,
//! or a sliding window), its softmax scale, its rotary embedding (or none)
//! and an optional soft-cap of its logits. Models such as Gemma 2 / 3,
//! gpt-oss and Mistral differ here from layer to layer; the architecture
//! builds one per layer from the config ([`Arch::layer_attention`]) and the
//! forward pass hands each layer's to the attention kernel.
//!
//! Promises: [`LayerAttention::uniform`] is what every layer of the Llama /
//! Qwen families had before shapes were per layer — no window,
//! `1 / sqrt(head_dim)`, the config's RoPE, no soft-cap — computed the same
//! way, so those models give the same bits.
//!
//! [`Arch::layer_attention`]: super::Arch::layer_attention

use crate::config::{ModelConfig, RopeScaling};
use anyhow::{bail, Result};
use sluice_core::kv_cache::AttentionKind;

/// A rotary embedding's parameters (transformers' `rope_parameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// `rope_theta`.
    pub base: f64,
    pub scaling: RopeScaling,
}

impl RopeParams {
    /// The config's own (`rope_theta`, `rope_scaling`).
    pub fn of(config: &ModelConfig) -> Self {
        RopeParams {
            base: config.rope_theta,
            scaling: config.rope_scaling,
        }
    }
}

/// How one layer attends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// `Some(n)`: a query sees only the `n` latest keys, its own included
    /// (`sliding_window`). `None`: every earlier key.
    pub window: Option<usize>,
    /// Multiplies q·k before the softmax: `1 / sqrt(head_dim)`, or
    /// `query_pre_attn_scalar^-0.5` where the architecture configures it.
    pub scale: f32,
    /// The rotation of q and k, or `None` for a layer without positions
    /// (Llama 4's NoPE layers).
    pub rope: Option<RopeParams>,
    /// Scaled logits become `tanh(s / cap) · cap` (Gemma 2's
    /// `attn_logit_softcapping`).
    pub logit_softcap: Option<f32>,
}

impl LayerAttention {
    /// Full causal attention with the config's RoPE and the standard scale.
    pub fn uniform(config: &ModelConfig) -> Self {
        LayerAttention {
            window: None,
            scale: 1.0 / (config.head_dim as f32).sqrt(),
            rope: Some(RopeParams::of(config)),
            logit_softcap: None,
        }
    }

    /// [`uniform`](Self::uniform), with the config's sliding window on
    /// layer `layer` if it is at least `first_windowed` and the window is
    /// shorter than the context (a window that covers every position is
    /// full attention).
    pub fn with_config_window(config: &ModelConfig, layer: usize, first_windowed: usize) -> Self {
        LayerAttention {
            window: config
                .attention
                .sliding_window
                .filter(|&w| w < config.max_position_embeddings && layer >= first_windowed),
            ..Self::uniform(config)
        }
    }

    /// Which keys a query sees, as the KV cache groups name it.
    pub fn kind(&self) -> AttentionKind {
        match self.window {
            Some(window) => AttentionKind::SlidingWindow { window },
            None => AttentionKind::Full,
        }
    }

    /// Whether the forward pass can run this layer of a model of `config`,
    /// with errors naming the config key that asks for what it cannot do.
    pub fn check(&self, config: &ModelConfig, layer: usize) -> Result<()> {
        if self.window == Some(0) {
            bail!("config: layer {layer} has a sliding_window of 0 tokens; it must be at least 1");
        }
        if !(self.scale > 0.0 && self.scale.is_finite()) {
            bail!(
                "config: layer {layer}'s attention scale must be a positive number \
                 (query_pre_attn_scalar), got {}",
                self.scale
            );
        }
        if let Some(cap) = self.logit_softcap {
            if !(cap > 0.0 && cap.is_finite()) {
                bail!(
                    "config: attn_logit_softcapping must be a positive number, got {cap} \
                     (layer {layer})"
                );
            }
        }
        if let Some(rope) = self.rope {
            if !config.head_dim.is_multiple_of(2) {
                bail!(
                    "config: layer {layer} rotates heads of {} dimensions with RoPE, which \
                     needs an even head_dim",
                    config.head_dim
                );
            }
            if !(rope.base > 1.0 && rope.base.is_finite()) {
                bail!(
                    "config: layer {layer}'s RoPE base (rope_theta) must be a number above 1, \
                     got {}",
                    rope.base
                );
            }
        }
        Ok(())
    }
}
