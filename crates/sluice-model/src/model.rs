//! The decoder-only transformer (Qwen2 / Llama): its weights and the
//! forward pass over a flattened, paged batch.
//!
//! Owns the weights, fused at load time: q/k/v into one `qkv_proj` and
//! gate/up into one `gate_up_proj`, so a layer makes four matmul calls. Norm
//! weights and biases are f32; linear weights and the embedding are f32 or
//! bf16 (the bf16 matmul path takes them as they are). Activations are f32.
//!
//! Submodules: `batch` (the flattened step input), `rope`, `ops`
//! (elementwise), `forward` (the pass itself), `loader` (`load_model`,
//! `ModelSpec`).

mod batch;
mod forward;
mod loader;
mod ops;
mod rope;

pub use batch::{ForwardBatch, SeqSlice};
pub use forward::Workspace;
pub use loader::{load_dummy, load_model, DType, LoadFormat, LoadedModel, ModelSpec};
pub use rope::Rope;

use crate::config::ModelConfig;
use crate::weights::{TensorSource, Weight, WeightDType};
use anyhow::{Context, Result};

/// A linear layer `y = x·Wᵀ + b` with `W` row-major `[out × in]`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Vec<f32>>,
    pub in_features: usize,
    pub out_features: usize,
}

impl Linear {
    /// `out[m × out_features] = x[m × in_features]·Wᵀ (+ b)`, the bias
    /// added inside the kernel's store (no second pass over `out`).
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let w = self.weight.as_weight_ref();
        match &self.bias {
            Some(b) => {
                crate::kernels::matmul_bias(x, m, self.in_features, w, b, self.out_features, out)
            }
            None => crate::kernels::matmul(x, m, self.in_features, w, self.out_features, out),
        }
    }
}

/// One transformer block.
#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub input_layernorm: Vec<f32>,
    /// Rows: q heads, then k heads, then v heads.
    pub qkv_proj: Linear,
    pub o_proj: Linear,
    pub post_attention_layernorm: Vec<f32>,
    /// Rows: gate, then up.
    pub gate_up_proj: Linear,
    pub down_proj: Linear,
}

/// A loaded model, shareable across threads (`Arc<Model>`).
pub struct Model {
    pub config: ModelConfig,
    pub dtype: WeightDType,
    /// `[vocab × hidden]`.
    pub embed_tokens: Weight,
    pub layers: Vec<DecoderLayer>,
    pub norm: Vec<f32>,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear>,
    pub rope: Rope,
}

/// A raw pointer that may cross into `parallel_for` closures, for writing
/// disjoint parts of one buffer from several threads. Users promise
/// disjointness at each use.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);

// SAFETY: only used to write disjoint ranges of a buffer that outlives the
// parallel region; see each use.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper rather
    /// than the raw field).
    #[inline]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

fn linear(
    source: &dyn TensorSource,
    parts: &[(String, usize)],
    in_features: usize,
    with_bias: bool,
    dtype: WeightDType,
) -> Result<Linear> {
    let weights: Vec<(String, Vec<usize>)> = parts
        .iter()
        .map(|(p, rows)| (format!("{p}.weight"), vec![*rows, in_features]))
        .collect();
    let weight = source.read_fused(&weights, dtype)?;
    let bias = if with_bias {
        let biases: Vec<(String, Vec<usize>)> = parts
            .iter()
            .map(|(p, rows)| (format!("{p}.bias"), vec![*rows]))
            .collect();
        Some(source.read_fused(&biases, WeightDType::F32)?.into_f32())
    } else {
        None
    };
    Ok(Linear {
        weight,
        bias,
        in_features,
        out_features: parts.iter().map(|(_, r)| r).sum(),
    })
}

impl Model {
    /// Builds the model from `source`, checking every tensor's shape.
    /// Linear weights and the embedding are stored as `dtype`.
    pub fn load(
        config: &ModelConfig,
        source: &dyn TensorSource,
        dtype: WeightDType,
    ) -> Result<Self> {
        config.validate()?;
        let c = config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let q_rows = c.num_attention_heads * hd;
        let kv_rows = c.num_key_value_heads * hd;
        let f32_vec = |name: &str, len: usize| -> Result<Vec<f32>> {
            Ok(source.read(name, &[len], WeightDType::F32)?.into_f32())
        };
        let embed_tokens = source.read("model.embed_tokens.weight", &[c.vocab_size, h], dtype)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn = format!("{p}.self_attn");
            let mlp = format!("{p}.mlp");
            let layer = DecoderLayer {
                input_layernorm: f32_vec(&format!("{p}.input_layernorm.weight"), h)?,
                qkv_proj: linear(
                    source,
                    &[
                        (format!("{attn}.q_proj"), q_rows),
                        (format!("{attn}.k_proj"), kv_rows),
                        (format!("{attn}.v_proj"), kv_rows),
                    ],
                    h,
                    c.qkv_bias,
                    dtype,
                )?,
                o_proj: linear(
                    source,
                    &[(format!("{attn}.o_proj"), h)],
                    q_rows,
                    c.o_bias,
                    dtype,
                )?,
                post_attention_layernorm: f32_vec(
                    &format!("{p}.post_attention_layernorm.weight"),
                    h,
                )?,
                gate_up_proj: linear(
                    source,
                    &[
                        (format!("{mlp}.gate_proj"), c.intermediate_size),
                        (format!("{mlp}.up_proj"), c.intermediate_size),
                    ],
                    h,
                    c.mlp_bias,
                    dtype,
                )?,
                down_proj: linear(
                    source,
                    &[(format!("{mlp}.down_proj"), h)],
                    c.intermediate_size,
                    c.mlp_bias,
                    dtype,
                )?,
            };
            layers.push(layer);
        }
        let norm = f32_vec("model.norm.weight", h)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(
                linear(
                    source,
                    &[("lm_head".to_string(), c.vocab_size)],
                    h,
                    false,
                    dtype,
                )
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
            rope: Rope::new(config),
        })
    }

    /// Bytes of weights held (what a decode step streams from memory).
    pub fn weight_bytes(&self) -> usize {
        let lin =
            |l: &Linear| l.weight.size_in_bytes() + l.bias.as_ref().map_or(0, |b| b.len() * 4);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                lin(&l.qkv_proj)
                    + lin(&l.o_proj)
                    + lin(&l.gate_up_proj)
                    + lin(&l.down_proj)
                    + 4 * (l.input_layernorm.len() + l.post_attention_layernorm.len())
            })
            .sum();
        self.embed_tokens.size_in_bytes()
            + layers
            + 4 * self.norm.len()
            + self.lm_head.as_ref().map_or(0, lin)
    }
}
