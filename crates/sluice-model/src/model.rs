//! The decoder-only transformer: its weights and the forward pass over a
//! flattened, paged batch, for every architecture of `arch/`.
//!
//! Owns the weights, fused at load time: q/k/v into one `qkv_proj` and
//! gate/up into one `gate_up_proj` (when their formats agree; see
//! `linear`), so a layer makes four matmul calls. Norm weights and biases
//! are f32; linear weights and the embedding are in the format the weight
//! source hands out (f32 or bf16 today; the bf16 matmul path takes them as
//! they are). Activations are f32.
//!
//! Submodules: `arch` (one file per architecture and the seam they
//! implement: names, config interpretation, which pieces a layer has, its
//! wiring and per-layer attention), `wiring` (norm placement, activation,
//! embedding scale), `layer_attention` (window, scale, RoPE, soft-cap),
//! `layers` (the shared pieces: attention block, MLP block, the loader by
//! tensor role), `linear` (linear layers, fused or made of parts), `batch`
//! (the flattened step input), `rope`, `ops` (elementwise), `forward` (the
//! pass itself), `loader` (`load_model`, `ModelSpec`).

pub mod arch;
mod batch;
mod forward;
mod layer_attention;
mod layers;
mod linear;
mod loader;
mod ops;
mod rope;
mod wiring;

pub use arch::{Arch, Architecture, LayerPieces, Role, TensorId, TensorNaming};
pub use batch::{ForwardBatch, SeqSlice};
pub use forward::Workspace;
pub use layer_attention::{LayerAttention, RopeParams};
pub use layers::{Attention, DecoderLayer, Mlp, QkNorm};
pub use linear::{Linear, LinearPart, LinearWeight};
pub use loader::{
    load_dummy, load_dummy_as, load_model, DType, GgufInfo, LoadFormat, LoadedModel, ModelSpec,
    WeightSource,
};
pub use rope::Rope;
pub use wiring::{Activation, LayerWiring, NormPlacement};

use crate::config::ModelConfig;
use crate::kernels::QuantFormat;
use crate::weights::{TensorSource, Weight};
use anyhow::{bail, Context, Result};
use layers::Loader;

/// A loaded model, shareable across threads (`Arc<Model>`).
pub struct Model {
    pub config: ModelConfig,
    /// What linear weights and the embedding were asked for in. Norm
    /// weights and biases are always f32 (they are tiny and feed f32
    /// arithmetic directly).
    pub dtype: QuantFormat,
    /// `[vocab × hidden]`.
    pub embed_tokens: Weight,
    pub layers: Vec<DecoderLayer>,
    pub norm: Vec<f32>,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
    /// The RoPE tables of the layers: `ropes[0]` is the config's, then one
    /// per other RoPE a layer asks for (`DecoderLayer::rope_table`).
    pub ropes: Vec<Rope>,
    /// How every layer is wired (norms, activation, embedding scale).
    pub wiring: LayerWiring,
}

/// What the decoder stack is made of beyond its tensors: the wiring and
/// each layer's attention shape. [`DecoderPlan::of`] asks the config's
/// architecture; a caller may build one to load the same weights wired
/// otherwise ([`Model::load_planned`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderPlan {
    pub wiring: LayerWiring,
    /// One per layer.
    pub layers: Vec<LayerAttention>,
}

impl DecoderPlan {
    /// The architecture's plan for a model of `config`.
    pub fn of(config: &ModelConfig) -> Self {
        let arch = config.architecture.def();
        DecoderPlan {
            wiring: arch.wiring(config.hidden_size),
            layers: (0..config.num_hidden_layers)
                .map(|i| arch.layer_attention(config, i))
                .collect(),
        }
    }

    /// What each layer's KV cache keeps (its window), in layer order.
    pub fn attention_kinds(&self) -> Vec<sluice_core::kv_cache::AttentionKind> {
        self.layers.iter().map(LayerAttention::kind).collect()
    }

    /// Whether the forward pass can run it for `config` (errors name the
    /// config key).
    pub fn check(&self, config: &ModelConfig) -> Result<()> {
        if self.layers.len() != config.num_hidden_layers {
            bail!(
                "the decoder plan has {} layer shapes for num_hidden_layers {}",
                self.layers.len(),
                config.num_hidden_layers
            );
        }
        if let Some(s) = self.wiring.embedding_scale {
            if !s.is_finite() {
                bail!("the embedding scale must be a finite number, got {s}");
            }
        }
        for (i, layer) in self.layers.iter().enumerate() {
            layer.check(config, i)?;
        }
        Ok(())
    }
}

impl Model {
    /// Builds the model from `source`, checking every tensor's shape. Its
    /// architecture (`config.architecture`) names the tensors in the
    /// source's naming and `config`'s pieces say which a layer has. Linear
    /// weights and the embedding are asked for as `dtype` (the source may
    /// keep a stored format instead: `TensorSource::format_of`).
    pub fn load(
        config: &ModelConfig,
        source: &dyn TensorSource,
        dtype: QuantFormat,
    ) -> Result<Self> {
        Self::load_planned(config, source, dtype, DecoderPlan::of(config))
    }

    /// [`Model::load`] with the wiring and layer shapes of `plan` instead of
    /// the architecture's (checked first: see [`DecoderPlan::check`]).
    pub fn load_planned(
        config: &ModelConfig,
        source: &dyn TensorSource,
        dtype: QuantFormat,
        plan: DecoderPlan,
    ) -> Result<Self> {
        config.validate()?;
        plan.check(config)?;
        let c = config;
        let h = c.hidden_size;
        let ld = Loader {
            source,
            arch: c.architecture.def(),
            naming: source.naming(),
            dtype,
        };
        let embed_tokens = ld.matrix(TensorId::model(Role::Embedding), &[c.vocab_size, h])?;
        // One table per distinct RoPE, the config's first.
        let mut rope_params = vec![RopeParams::of(c)];
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for (i, &shape) in plan.layers.iter().enumerate() {
            let table = shape.rope.map(|r| {
                rope_params.iter().position(|&p| p == r).unwrap_or_else(|| {
                    rope_params.push(r);
                    rope_params.len() - 1
                })
            });
            layers.push(DecoderLayer::load(&ld, c, i, &plan.wiring, shape, table)?);
        }
        let ropes = rope_params
            .iter()
            .map(|&p| Rope::from_params(c.head_dim, p))
            .collect();
        let norm = ld.vector(TensorId::model(Role::FinalNorm), h)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(
                ld.linear(&[(TensorId::model(Role::LmHead), c.vocab_size)], h, false)
                    .context(
                        "the model's head is not tied to its embedding (tie_word_embeddings is false)",
                    )?,
            )
        };
        Ok(Model {
            config: config.clone(),
            dtype,
            embed_tokens,
            layers,
            norm,
            lm_head,
            ropes,
            wiring: plan.wiring,
        })
    }

    /// Bytes of weights held (what a decode step streams from memory).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(DecoderLayer::size_in_bytes).sum();
        self.embed_tokens.size_in_bytes()
            + layers
            + 4 * self.norm.len()
            + self.lm_head.as_ref().map_or(0, Linear::size_in_bytes)
    }
}
