//! The shared pieces every architecture's decoder is built from: the
//! attention block (fused q/k/v, optional per-head q/k RMSNorm, RoPE, paged
//! attention, o_proj), the gated MLP block (fused gate/up, SiLU or GELU-tanh,
//! down), and the loader that reads them by [`TensorId`] through the architecture's names.
//!
//! Which pieces a layer has is [`LayerPieces`], decided by the architecture
//! (`model/arch/`); this file is the only place a piece is implemented, so
//! an architecture adds no forward-pass code unless it needs a new piece.
//!
//! Promises: loading checks every tensor's shape (errors name the tensor);
//! q/k/v and gate/up are fused into one matrix whenever their formats agree
//! (see `linear.rs`). The forward functions write only into the buffers
//! they are given, so a warm step allocates nothing, and treat every row
//! (token) independently outside paged attention.

use super::arch::{Arch, LayerPieces, Role, TensorId, TensorNaming};
use super::layer_attention::LayerAttention;
use super::linear::{Linear, LinearPart, LinearWeight};
use super::ops::{gelu_tanh_mul, rms_norm_heads_in_place, silu_mul};
use super::wiring::{Activation, LayerWiring, NormPlacement};
use super::{ForwardBatch, Rope};
use crate::attention::{paged_attention, AttentionShape, Queries, WorkItem};
use crate::config::ModelConfig;
use crate::kernels::QuantFormat;
use crate::kv_cache::KvCache;
use crate::weights::{TensorSource, Weight};
use anyhow::Result;

/// Per-head RMSNorm weights of q and k (`head_dim` each), shared by every
/// head.
#[derive(Clone, Debug)]
pub struct QkNorm {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
}

/// The attention block of one layer.
#[derive(Clone, Debug)]
pub struct Attention {
    /// Rows: q heads, then k heads, then v heads.
    pub qkv_proj: Linear,
    pub o_proj: Linear,
    pub qk_norm: Option<QkNorm>,
}

/// The gated MLP block of one layer (SwiGLU or GeGLU: `LayerWiring`).
#[derive(Clone, Debug)]
pub struct Mlp {
    /// Rows: gate, then up.
    pub gate_up_proj: Linear,
    pub down_proj: Linear,
}

/// One transformer block: attention, then the MLP, each added to the
/// residual stream, with the norms where the model's [`LayerWiring`] puts
/// them.
#[derive(Clone, Debug)]
pub struct DecoderLayer {
    /// The norm before attention (none in a post-norm-only wiring).
    pub input_layernorm: Option<Vec<f32>>,
    pub attention: Attention,
    /// The norm of the attention output before the residual (post-norm
    /// wirings only).
    pub attention_output_norm: Option<Vec<f32>>,
    /// The norm before the MLP (transformers' `post_attention_layernorm`
    /// in a pre-norm layer, `pre_feedforward_layernorm` in a pre- and
    /// post-norm one, none in a post-norm-only one).
    pub post_attention_layernorm: Option<Vec<f32>>,
    pub mlp: Mlp,
    /// The norm of the MLP output before the residual (post-norm wirings
    /// only).
    pub mlp_output_norm: Option<Vec<f32>>,
    /// How this layer attends (window, scale, RoPE, soft-cap).
    pub shape: LayerAttention,
    /// Its RoPE's table in `Model::ropes` (`None`: no rotation).
    pub rope_table: Option<usize>,
}

/// Reads tensors by role, spelled by the architecture in the source's
/// naming.
pub(crate) struct Loader<'a> {
    pub source: &'a dyn TensorSource,
    pub arch: &'static dyn Arch,
    pub naming: TensorNaming,
    /// What linear weights and the embedding are asked for in.
    pub dtype: QuantFormat,
}

impl Loader<'_> {
    /// The name of `id` in the source: the first of the architecture's
    /// spellings it holds (the first, for errors, when it holds none).
    pub fn name(&self, id: TensorId) -> String {
        let names = self.arch.tensor_names(id, self.naming);
        let found = names.iter().position(|n| self.source.contains(n));
        names
            .into_iter()
            .nth(found.unwrap_or(0))
            .unwrap_or_default()
    }

    /// A norm weight (always f32), offset as the architecture's norms
    /// need in this naming ([`Arch::norm_weight_offset`]).
    pub fn vector(&self, id: TensorId, len: usize) -> Result<Vec<f32>> {
        let name = self.name(id);
        let mut v = self
            .source
            .read(&name, &[len], QuantFormat::F32)?
            .into_f32();
        self.source.release(&name);
        let offset = self.arch.norm_weight_offset(self.naming);
        if offset != 0.0 {
            v.iter_mut().for_each(|w| *w += offset);
        }
        Ok(v)
    }

    /// Lets the source drop the pages of tensors `names` once `weight`
    /// holds its own copy of them.
    fn done_with<'n>(&self, names: impl IntoIterator<Item = &'n String>, weight: &Weight) {
        if !weight.borrows_mapping() {
            for name in names {
                self.source.release(name);
            }
        }
    }

    /// A matrix in the format the source hands it out in; integer formats
    /// repacked for the kernels (`Weight::pack`: the same results, several
    /// times faster than reading ggml's layout on every call).
    pub fn matrix(&self, id: TensorId, shape: &[usize]) -> Result<Weight> {
        let name = self.name(id);
        let dtype = self.source.format_of(&name, self.dtype)?;
        let (rows, cols) = (shape[0], shape.iter().skip(1).product());
        let weight = self.source.read(&name, shape, dtype)?.pack(rows, cols);
        self.done_with([&name], &weight);
        Ok(weight)
    }

    /// A linear layer over `parts` (`(weight id, rows)`, stacked in order)
    /// with `in_features` columns: one fused matrix if every part comes in
    /// the same format, else one matrix per part.
    pub fn linear(
        &self,
        parts: &[(TensorId, usize)],
        in_features: usize,
        with_bias: bool,
    ) -> Result<Linear> {
        let named: Vec<(String, Vec<usize>)> = parts
            .iter()
            .map(|&(id, rows)| (self.name(id), vec![rows, in_features]))
            .collect();
        let formats = named
            .iter()
            .map(|(name, _)| self.source.format_of(name, self.dtype))
            .collect::<Result<Vec<_>>>()?;
        let shared = match formats.split_first() {
            Some((first, rest)) if rest.iter().all(|f| f == first) => Some(*first),
            _ => None,
        };
        let weight = if let Some(format) = shared {
            let rows = named.iter().map(|(_, s)| s[0]).sum();
            let weight = self
                .source
                .read_fused(&named, format)?
                .pack(rows, in_features);
            self.done_with(named.iter().map(|(name, _)| name), &weight);
            LinearWeight::Fused(weight)
        } else {
            let mut v = Vec::with_capacity(parts.len());
            for ((name, shape), format) in named.iter().zip(formats) {
                let weight = self
                    .source
                    .read(name, shape, format)?
                    .pack(shape[0], in_features);
                self.done_with([name], &weight);
                v.push(LinearPart {
                    weight,
                    out_features: shape[0],
                });
            }
            LinearWeight::Parts(v)
        };
        let bias = if with_bias {
            let biases: Vec<(String, Vec<usize>)> = parts
                .iter()
                .map(|&(id, rows)| (self.name(id.bias()), vec![rows]))
                .collect();
            let bias = self.source.read_fused(&biases, QuantFormat::F32)?;
            self.done_with(biases.iter().map(|(name, _)| name), &bias);
            Some(bias.into_f32())
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
}

impl DecoderLayer {
    /// Layer `i` of a model of `c`'s shape, with the pieces `c` names, the
    /// norms `wiring` places, the attention `shape` and its RoPE table.
    pub(crate) fn load(
        ld: &Loader<'_>,
        c: &ModelConfig,
        i: usize,
        wiring: &LayerWiring,
        shape: LayerAttention,
        rope_table: Option<usize>,
    ) -> Result<Self> {
        let p: LayerPieces = c.pieces();
        let (h, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let q_rows = c.num_attention_heads * hd;
        let kv_rows = c.num_key_value_heads * hd;
        let id = |role| TensorId::layer(i, role);
        let qk_norm = if p.qk_norm {
            Some(QkNorm {
                q: ld.vector(id(Role::QNorm), hd)?,
                k: ld.vector(id(Role::KNorm), hd)?,
            })
        } else {
            None
        };
        let norm = |role| ld.vector(id(role), h).map(Some);
        // (before attention, after it, before the MLP, after it)
        let (pre_attn, attention_output_norm, pre_mlp, mlp_output_norm) = match wiring.norms {
            NormPlacement::Pre => (
                norm(Role::InputNorm)?,
                None,
                norm(Role::PostAttentionNorm)?,
                None,
            ),
            NormPlacement::PrePost => (
                norm(Role::InputNorm)?,
                norm(Role::AttentionOutputNorm)?,
                norm(Role::PreFeedforwardNorm)?,
                norm(Role::PostFeedforwardNorm)?,
            ),
            NormPlacement::Post => (
                None,
                norm(Role::AttentionOutputNorm)?,
                None,
                norm(Role::PostFeedforwardNorm)?,
            ),
        };
        Ok(DecoderLayer {
            input_layernorm: pre_attn,
            attention: Attention {
                qkv_proj: ld.linear(
                    &[
                        (id(Role::QProj), q_rows),
                        (id(Role::KProj), kv_rows),
                        (id(Role::VProj), kv_rows),
                    ],
                    h,
                    p.qkv_bias,
                )?,
                o_proj: ld.linear(&[(id(Role::OProj), h)], q_rows, p.o_bias)?,
                qk_norm,
            },
            attention_output_norm,
            post_attention_layernorm: pre_mlp,
            mlp: Mlp {
                gate_up_proj: ld.linear(
                    &[(id(Role::GateProj), inter), (id(Role::UpProj), inter)],
                    h,
                    p.mlp_bias,
                )?,
                down_proj: ld.linear(&[(id(Role::DownProj), h)], inter, p.mlp_bias)?,
            },
            mlp_output_norm,
            shape,
            rope_table,
        })
    }

    /// Bytes of weights held.
    pub fn size_in_bytes(&self) -> usize {
        let a = &self.attention;
        let layer_norms = [
            &self.input_layernorm,
            &self.attention_output_norm,
            &self.post_attention_layernorm,
            &self.mlp_output_norm,
        ];
        let norms = layer_norms
            .iter()
            .map(|n| n.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
            + a.qk_norm.as_ref().map_or(0, |n| n.q.len() + n.k.len());
        a.qkv_proj.size_in_bytes()
            + a.o_proj.size_in_bytes()
            + self.mlp.gate_up_proj.size_in_bytes()
            + self.mlp.down_proj.size_in_bytes()
            + 4 * norms
    }
}

/// What the attention block needs to know about the step, the same for
/// every layer (the layer's own scale and soft-cap come from its
/// [`LayerAttention`]).
pub(super) struct AttentionStep<'a> {
    pub batch: &'a ForwardBatch,
    /// The geometry; its scale and soft-cap are replaced per layer.
    pub shape: AttentionShape,
    /// Per RoPE table of the model (`Model::ropes`), the cos and sin of
    /// every token: `head_dim / 2` values each (`Rope::cos_sin`).
    pub rope: &'a [(Vec<f32>, Vec<f32>)],
    pub eps: f32,
}

/// The attention block's buffers.
pub(super) struct AttentionBuffers<'a> {
    /// `[tokens × qkv width]`.
    pub qkv: &'a mut [f32],
    /// `[tokens × q width]`.
    pub attn: &'a mut [f32],
    pub items: &'a mut Vec<WorkItem>,
}

impl Attention {
    /// `out[t × hidden]` = the block's output for the normed input `x`
    /// (`[t × hidden]`), writing the step's K/V into layer `layer` of `kv`,
    /// attending as `layer_shape` says.
    // The step, the layer (index and shape), the cache, input, scratch and
    // output are each a different borrow; bundling them would only move the
    // list into a struct built once per call.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        step: &AttentionStep<'_>,
        layer: usize,
        layer_shape: &LayerAttention,
        rope_table: Option<usize>,
        kv: &mut KvCache,
        x: &[f32],
        buf: AttentionBuffers<'_>,
        out: &mut [f32],
    ) {
        let s = &AttentionShape {
            scale: layer_shape.scale,
            logit_softcap: layer_shape.logit_softcap,
            kind: layer_shape.kind(),
            ..step.shape
        };
        // The layer's KV cache group: its slots and block tables.
        let group = kv.group_of(layer);
        let (hd, nh, nkv) = (s.head_dim, s.num_heads, s.num_kv_heads);
        let t = step.batch.num_tokens();
        let q_width = nh * hd;
        let qkv_width = (nh + 2 * nkv) * hd;
        let half = hd / 2;
        let AttentionBuffers { qkv, attn, items } = buf;
        self.qkv_proj.forward(x, t, qkv);
        for (i, row) in qkv.chunks_exact_mut(qkv_width).enumerate() {
            if let Some(n) = &self.qk_norm {
                // Each head on its own, before RoPE (Qwen3).
                let (q, rest) = row.split_at_mut(q_width);
                rms_norm_heads_in_place(q, &n.q, step.eps);
                rms_norm_heads_in_place(&mut rest[..nkv * hd], &n.k, step.eps);
            }
            if let Some(table) = rope_table {
                let (cos, sin) = &step.rope[table];
                let (cs, sn) = (
                    &cos[i * half..(i + 1) * half],
                    &sin[i * half..(i + 1) * half],
                );
                // q heads and k heads are adjacent in the fused row.
                Rope::apply(&mut row[..(nh + nkv) * hd], hd, cs, sn);
            }
        }
        kv.write(
            layer,
            &step.batch.slot_mapping[group],
            qkv,
            qkv_width,
            q_width,
            q_width + nkv * hd,
        );
        paged_attention(
            s,
            Queries {
                data: qkv,
                row_stride: qkv_width,
            },
            kv.layer(layer),
            &step.batch.seqs,
            &step.batch.block_tables[group],
            attn,
            items,
        );
        self.o_proj.forward(attn, t, out);
    }
}

impl Mlp {
    /// `out[m × hidden]` = the block's output for the normed input `x`
    /// (`[m × hidden]`), through `gate_up` (`[m × 2·inter]`) and `act`
    /// (`[m × inter]`), gated by `activation`.
    pub(super) fn forward(
        &self,
        activation: Activation,
        x: &[f32],
        m: usize,
        gate_up: &mut [f32],
        act: &mut [f32],
        out: &mut [f32],
    ) {
        let inter = self.down_proj.in_features;
        self.gate_up_proj.forward(x, m, gate_up);
        match activation {
            Activation::Silu => silu_mul(gate_up, inter, act),
            Activation::GeluTanh => gelu_tanh_mul(gate_up, inter, act),
        }
        self.down_proj.forward(act, m, out);
    }
}
