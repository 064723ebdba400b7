//! The architecture seam: what each decoder family provides, one file per
//! family (`llama.rs`, `qwen2.rs`, `qwen3.rs`, `gemma3.rs`), and the tensor names every
//! weight source resolves.
//!
//! An architecture is an [`Arch`]: the names it answers to (Hugging Face
//! `architectures` / `model_type`, GGUF `general.architecture`), how it reads
//! its config (which [`LayerPieces`] a layer is built from: q/k/v and o
//! biases, per-head q/k RMSNorm, MLP biases; the sliding-window rule; the
//! default head_dim), how its layer is wired ([`Arch::wiring`]: norm
//! placement, activation, embedding scale), each layer's attention shape
//! ([`Arch::layer_attention`]: window, scale, RoPE, soft-cap) and how its
//! tensors are named. The pieces themselves —
//! embedding, RMSNorm, the attention block, the MLP block, the head — are
//! shared (`model/layers.rs`, `model/linear.rs`), so an architecture file
//! holds only what differs.
//!
//! Tensors are asked for by role ([`TensorId`]: layer, role, weight or
//! bias), not by string: each source says which naming it speaks
//! ([`TensorNaming`], through `TensorSource::naming`) and the architecture
//! spells the id in it ([`Arch::tensor_name`]; the standard spelling of both
//! namings is [`TensorId::standard_name`]). A safetensors checkpoint speaks
//! Hugging Face names; a GGUF file speaks llama.cpp's, so a GGUF source plugs
//! in without the model code knowing.
//!
//! Adding an architecture: a file here implementing [`Arch`], a variant of
//! [`Architecture`], and its line in [`Architecture::def`] and
//! [`Architecture::ALL`]. If its layer needs a piece the shared decoder does
//! not have yet, that piece goes into `model/layers.rs` behind a new
//! [`LayerPieces`] switch, not into the architecture file.

mod gemma3;
mod llama;
mod qwen2;
mod qwen3;

use super::layer_attention::LayerAttention;
use super::wiring::LayerWiring;
use crate::config::{AttentionConfig, ModelConfig};
use anyhow::Result;
use sluice_gguf::Metadata;
use std::fmt;

/// The decoder families this runner implements. `ModelConfig::architecture`
/// holds one; [`Architecture::def`] gives its [`Arch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// `Qwen2ForCausalLM`: biased q/k/v projections.
    Qwen2,
    /// `LlamaForCausalLM` (and `MistralForCausalLM` without a sliding window).
    Llama,
    /// `Qwen3ForCausalLM`: per-head RMSNorm of q and k, head_dim from the
    /// config, no q/k/v bias.
    Qwen3,
    /// `Gemma3ForCausalLM`: pre- and post-norms, GELU-tanh, alternating
    /// sliding-window and full layers.
    Gemma3,
}

impl Architecture {
    /// Every architecture, in the order error messages list them.
    pub const ALL: [Architecture; 4] = [Self::Qwen2, Self::Qwen3, Self::Llama, Self::Gemma3];

    /// The architecture's definition.
    pub fn def(self) -> &'static dyn Arch {
        match self {
            Self::Qwen2 => &qwen2::Qwen2,
            Self::Llama => &llama::Llama,
            Self::Qwen3 => &qwen3::Qwen3,
            Self::Gemma3 => &gemma3::Gemma3,
        }
    }

    /// The architecture of a `config.json`: the first entry of
    /// `architectures` that names one, or else (only when `architectures` is
    /// absent or empty) its `model_type`.
    pub fn from_hf(architectures: &[String], model_type: Option<&str>) -> Option<Self> {
        let by_name = architectures.iter().find_map(|n| {
            Self::ALL
                .into_iter()
                .find(|a| a.def().hf_architectures().contains(&n.as_str()))
        });
        by_name.or_else(|| {
            let t = model_type.filter(|_| architectures.is_empty())?;
            Self::ALL
                .into_iter()
                .find(|a| a.def().hf_model_types().contains(&t))
        })
    }

    /// The architecture of a GGUF file's `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.def().gguf_architecture() == name)
    }

    /// Every Hugging Face class name accepted, for error messages.
    pub fn supported_hf_names() -> Vec<&'static str> {
        Self::ALL
            .iter()
            .flat_map(|a| a.def().hf_architectures().iter().copied())
            .collect()
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.def().hf_architectures()[0])
    }
}

/// What one decoder layer is built from, beyond what every layer has
/// (pre-attention RMSNorm, q/k/v/o projections, RoPE, paged attention,
/// post-attention RMSNorm, a SwiGLU MLP). The architecture decides them from
/// its config; `ModelConfig` carries them (`qkv_bias`, `o_bias`, `qk_norm`,
/// `mlp_bias`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerPieces {
    /// Biases on q, k and v.
    pub qkv_bias: bool,
    /// A bias on o_proj.
    pub o_bias: bool,
    /// RMSNorm of every q head and every k head (weights of `head_dim`)
    /// after the projection, before RoPE.
    pub qk_norm: bool,
    /// Biases on gate, up and down.
    pub mlp_bias: bool,
}

impl LayerPieces {
    /// Qwen3's layer (Gemma 3's too): q/k norms, attention biases only
    /// where `attention_bias` says, none in the MLP.
    pub(super) fn qk_norm_layer(s: ConfigSwitches) -> Self {
        let attention_bias = s.attention_bias.unwrap_or(false);
        LayerPieces {
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            qk_norm: true,
            mlp_bias: false,
        }
    }
}

/// The switches of a config that decide a layer's pieces, whatever format
/// the config came from (`config.json` fields, or what a GGUF loader knows;
/// `None` when the config does not say).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigSwitches {
    /// `attention_bias`.
    pub attention_bias: Option<bool>,
    /// `mlp_bias`.
    pub mlp_bias: Option<bool>,
}

/// One decoder family. Implementations are unit structs in this module's
/// files; see the module docs for what goes where.
pub trait Arch: Send + Sync {
    /// The enum value this definition belongs to.
    fn architecture(&self) -> Architecture;

    /// Class names in `config.json`'s `architectures` (the first is the
    /// canonical one, used in messages).
    fn hf_architectures(&self) -> &'static [&'static str];

    /// `model_type` values recognised when `architectures` is absent.
    fn hf_model_types(&self) -> &'static [&'static str];

    /// GGUF `general.architecture` (also the prefix of its `{arch}.*`
    /// metadata keys).
    fn gguf_architecture(&self) -> &'static str;

    /// Whether llama.cpp's converter stores this architecture's q and k
    /// rows permuted for interleaved RoPE (true for `llama`), so a GGUF
    /// loader must un-permute them to get the Hugging Face layout this
    /// model computes with.
    fn gguf_permutes_qk(&self) -> bool {
        false
    }

    /// The layer's pieces, from the config's switches.
    fn pieces(&self, switches: ConfigSwitches) -> LayerPieces;

    /// Whether `config.json`'s `sliding_window` is in force, given its
    /// `use_sliding_window` (a window in force reaches the layers'
    /// attention shapes, which the forward pass checks at load).
    fn hf_sliding_window_in_force(&self, use_sliding_window: Option<bool>) -> bool;

    /// head_dim when `config.json` gives none (the transformers config
    /// class's default), from the architecture table every reader of a
    /// config shares (`sluice_arch::family`), so the runner and the
    /// simulator agree; `None` when the family divides and that does not.
    fn hf_default_head_dim(&self, hidden_size: usize, num_attention_heads: usize) -> Option<usize> {
        let family = sluice_arch::Family::by_hf_name(self.hf_architectures()[0]);
        sluice_arch::family::default_head_dim(family, hidden_size, num_attention_heads)
    }

    /// How the layer of a model `hidden_size` wide is wired (norm
    /// placement, activation, embedding scale). Every architecture states
    /// its own.
    fn wiring(&self, hidden_size: usize) -> LayerWiring;

    /// Multimodal class names in `architectures` whose checkpoints nest
    /// this architecture's config under `text_config` (and its tensors under
    /// a language-model prefix: [`Arch::tensor_names`]); sluice runs the
    /// text model.
    fn hf_text_model_wrappers(&self) -> &'static [&'static str] {
        &[]
    }

    /// The transformers config class's defaults for fields a `config.json`
    /// may omit, as a JSON object (`null` when none are needed: the Llama
    /// and Qwen configs in the wild spell their shape out).
    fn hf_config_defaults(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Where the checkpoint may keep tensor `id` in `naming`, the likeliest
    /// first; the loader takes the first the source holds. One spelling
    /// ([`Arch::tensor_name`]) unless the architecture's checkpoints come
    /// in several layouts.
    fn tensor_names(&self, id: TensorId, naming: TensorNaming) -> Vec<String> {
        vec![self.tensor_name(id, naming)]
    }

    /// `tie_word_embeddings` when `config.json` does not say (the
    /// transformers config class's default).
    fn hf_default_tie_word_embeddings(&self) -> bool {
        false
    }

    /// What a norm weight read in `naming` is offset by before use: Gemma's
    /// RMSNorms multiply by `1 + w` and its checkpoints store `w`, where
    /// llama.cpp's converter has already added the 1.
    fn norm_weight_offset(&self, _naming: TensorNaming) -> f32 {
        0.0
    }

    /// The attention settings of a GGUF file (`md`) whose shape is
    /// `config`, from its `{arch}.*` keys and llama.cpp's rules for what the
    /// file does not say. None by default: llama.cpp's `llama`, `qwen2`
    /// and `qwen3` attend fully on every layer.
    fn gguf_attention(&self, _md: &Metadata, _config: &ModelConfig) -> Result<AttentionConfig> {
        Ok(AttentionConfig::default())
    }

    /// Layer `layer`'s attention shape. The default is the same RoPE'd
    /// attention on every layer, windowed where the config's
    /// `sliding_window` is in force ([`LayerAttention::with_config_window`]);
    /// an architecture that alternates windows, scales or RoPE bases
    /// between layers overrides this.
    fn layer_attention(&self, config: &ModelConfig, layer: usize) -> LayerAttention {
        LayerAttention::with_config_window(config, layer, 0)
    }

    /// The name of tensor `id` in `naming`. Every family here uses the
    /// standard names; one that does not overrides this.
    fn tensor_name(&self, id: TensorId, naming: TensorNaming) -> String {
        id.standard_name(naming)
    }
}

/// Which spelling of tensor names a weight source speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TensorNaming {
    /// `model.layers.3.self_attn.q_proj.weight` (safetensors checkpoints,
    /// dummy weights).
    #[default]
    HuggingFace,
    /// `blk.3.attn_q.weight` (llama.cpp's GGUF files).
    Gguf,
}

/// What a tensor is, independent of how a file names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `[vocab × hidden]`.
    Embedding,
    /// The final RMSNorm.
    FinalNorm,
    /// `[vocab × hidden]`, absent when tied to the embedding.
    LmHead,
    InputNorm,
    QProj,
    KProj,
    VProj,
    OProj,
    /// Per-head RMSNorm of q (`[head_dim]`).
    QNorm,
    /// Per-head RMSNorm of k (`[head_dim]`).
    KNorm,
    /// The norm before the MLP in a pre-norm layer (transformers'
    /// `post_attention_layernorm`: it follows the attention residual).
    PostAttentionNorm,
    /// The norm of the attention block's output, before the residual, in
    /// a pre- and post-norm layer (Gemma's `post_attention_layernorm`).
    AttentionOutputNorm,
    /// The norm before the MLP in a pre- and post-norm layer.
    PreFeedforwardNorm,
    /// The norm of the MLP's output, before the residual.
    PostFeedforwardNorm,
    GateProj,
    UpProj,
    DownProj,
}

/// A linear layer's weight or its bias (norms have only a weight).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    Weight,
    Bias,
}

/// One tensor of the model: a role, in a layer or model-wide, weight or
/// bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId {
    /// `None` for the model-wide roles (embedding, final norm, head).
    pub layer: Option<usize>,
    pub role: Role,
    pub param: Param,
}

impl TensorId {
    /// A model-wide tensor's weight.
    pub fn model(role: Role) -> Self {
        TensorId {
            layer: None,
            role,
            param: Param::Weight,
        }
    }

    /// Layer `layer`'s tensor's weight.
    pub fn layer(layer: usize, role: Role) -> Self {
        TensorId {
            layer: Some(layer),
            role,
            param: Param::Weight,
        }
    }

    /// The same tensor's bias.
    pub fn bias(self) -> Self {
        TensorId {
            param: Param::Bias,
            ..self
        }
    }

    /// The name transformers' checkpoints and llama.cpp's converter give
    /// this tensor in the Llama / Qwen2 / Qwen3 families.
    pub fn standard_name(&self, naming: TensorNaming) -> String {
        let param = match self.param {
            Param::Weight => "weight",
            Param::Bias => "bias",
        };
        let (hf, gguf) = match self.role {
            Role::Embedding => ("model.embed_tokens", "token_embd"),
            Role::FinalNorm => ("model.norm", "output_norm"),
            Role::LmHead => ("lm_head", "output"),
            Role::InputNorm => ("input_layernorm", "attn_norm"),
            Role::QProj => ("self_attn.q_proj", "attn_q"),
            Role::KProj => ("self_attn.k_proj", "attn_k"),
            Role::VProj => ("self_attn.v_proj", "attn_v"),
            Role::OProj => ("self_attn.o_proj", "attn_output"),
            Role::QNorm => ("self_attn.q_norm", "attn_q_norm"),
            Role::KNorm => ("self_attn.k_norm", "attn_k_norm"),
            Role::PostAttentionNorm => ("post_attention_layernorm", "ffn_norm"),
            Role::AttentionOutputNorm => ("post_attention_layernorm", "post_attention_norm"),
            Role::PreFeedforwardNorm => ("pre_feedforward_layernorm", "ffn_norm"),
            Role::PostFeedforwardNorm => ("post_feedforward_layernorm", "post_ffw_norm"),
            Role::GateProj => ("mlp.gate_proj", "ffn_gate"),
            Role::UpProj => ("mlp.up_proj", "ffn_up"),
            Role::DownProj => ("mlp.down_proj", "ffn_down"),
        };
        match (naming, self.layer) {
            (TensorNaming::HuggingFace, None) => format!("{hf}.{param}"),
            (TensorNaming::HuggingFace, Some(l)) => format!("model.layers.{l}.{hf}.{param}"),
            (TensorNaming::Gguf, None) => format!("{gguf}.{param}"),
            (TensorNaming::Gguf, Some(l)) => format!("blk.{l}.{gguf}.{param}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_both_namings() {
        let q = TensorId::layer(3, Role::QProj);
        assert_eq!(
            q.standard_name(TensorNaming::HuggingFace),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            q.bias().standard_name(TensorNaming::Gguf),
            "blk.3.attn_q.bias"
        );
        let e = TensorId::model(Role::Embedding);
        assert_eq!(
            e.standard_name(TensorNaming::HuggingFace),
            "model.embed_tokens.weight"
        );
        assert_eq!(e.standard_name(TensorNaming::Gguf), "token_embd.weight");
        assert_eq!(
            TensorId::layer(0, Role::KNorm).standard_name(TensorNaming::Gguf),
            "blk.0.attn_k_norm.weight"
        );
    }

    #[test]
    fn lookup_by_every_name() {
        for a in Architecture::ALL {
            let d = a.def();
            assert_eq!(d.architecture(), a);
            assert_eq!(Architecture::from_gguf(d.gguf_architecture()), Some(a));
            for n in d.hf_architectures() {
                assert_eq!(Architecture::from_hf(&[n.to_string()], None), Some(a));
            }
            for t in d.hf_model_types() {
                assert_eq!(Architecture::from_hf(&[], Some(t)), Some(a));
            }
        }
        // model_type is only a fallback when `architectures` says nothing.
        let unknown = ["FalconForCausalLM".to_string()];
        assert_eq!(Architecture::from_hf(&unknown, Some("qwen2")), None);
        assert_eq!(Architecture::from_gguf("falcon"), None);
    }
}
