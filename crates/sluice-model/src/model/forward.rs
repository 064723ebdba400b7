//! The forward pass over one flattened batch.
//!
//! Embeddings (times the wiring's embedding scale, if any); then per layer,
//! with the pieces of `layers.rs`: RMSNorm → the attention block
//! (fused q/k/v (+bias) → per-head q/k RMSNorm where the architecture has
//! it → RoPE on q and k → write K/V into the paged cache at the slot mapping
//! → paged attention with the layer's scale and soft-cap → o_proj) →
//! (post-norm, where the wiring has one) → residual; RMSNorm → the MLP block
//! (fused gate/up → SwiGLU or GeGLU → down) → (post-norm) → residual; a
//! post-norm-only wiring skips the norms before the blocks. RoPE uses the
//! layer's own table (cos/sin computed once per step for each distinct
//! RoPE of the model), or none. Then the final norm only on the rows
//! that need logits, and the head only on those.
//!
//! Promises: every buffer lives in a `Workspace` that grows to the largest
//! step seen and is reused, so a warm step allocates nothing. A token's
//! result depends only on its own request (rows never mix outside
//! attention, and attention reads only the request's own blocks), which is
//! what makes batched, chunked and prefix-cached runs agree with a single
//! request's.

use super::layers::{AttentionBuffers, AttentionStep};
use super::ops::{add_assign, rms_norm};
use super::{ForwardBatch, Model};
use crate::attention::{AttentionShape, WorkItem};
use crate::kv_cache::KvCache;
use anyhow::{bail, Result};

/// MLP rows processed per matmul call: bounds the gate/up buffer for long
/// prefills (8192 tokens × 2·4864 floats would be 318 MB) while keeping each
/// call large enough for the kernel to run at full speed.
const MLP_CHUNK: usize = 256;

/// Reusable activation buffers of the forward pass.
#[derive(Default)]
pub struct Workspace {
    hidden: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    /// Per RoPE table, the step's cos and sin rows.
    rope: Vec<(Vec<f32>, Vec<f32>)>,
    items: Vec<WorkItem>,
    selected: Vec<f32>,
    /// Final-normed hidden states of `ForwardBatch::logits_rows`.
    final_hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl Workspace {
    /// The final-normed hidden rows the last [`Model::forward_hidden`] left
    /// (its `logits_rows`, in order; the buffer may be longer).
    pub fn final_hidden(&self) -> &[f32] {
        &self.final_hidden
    }
}

/// Resizes without shrinking; the contents are overwritten by the caller.
fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

impl Model {
    /// Runs `batch` and returns the logits of its `logits_rows`
    /// (`[rows × vocab]`). Allocates a fresh workspace; the runner uses
    /// [`Model::forward_hidden`] and [`Model::compute_logits`] with its own.
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<Vec<f32>> {
        let mut ws = Workspace::default();
        let n = batch.logits_rows.len();
        self.forward_hidden(batch, kv, &mut ws)?;
        let Workspace {
            final_hidden,
            logits,
            ..
        } = &mut ws;
        self.compute_logits(&final_hidden[..n * self.config.hidden_size], n, logits);
        Ok(std::mem::take(logits))
    }

    /// Logits for `n` final-normed hidden rows, into `out` (resized to
    /// `n × vocab`).
    pub fn compute_logits(&self, hidden: &[f32], n: usize, out: &mut Vec<f32>) {
        let vocab = self.config.vocab_size;
        let out = sized(out, n * vocab);
        match &self.lm_head {
            Some(head) => head.forward(hidden, n, out),
            None => crate::kernels::matmul(
                hidden,
                n,
                self.config.hidden_size,
                self.embed_tokens.as_weight_ref(),
                vocab,
                out,
            ),
        }
    }

    /// Checks what a caller controls: token ids inside the vocabulary, block
    /// ids inside the cache, and a cache shaped for this model.
    fn check_batch(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<()> {
        let c = &self.config;
        if kv.num_kv_heads() != c.num_key_value_heads || kv.head_dim() != c.head_dim {
            bail!(
                "KV cache has {} heads × {} dims, the model needs {} × {}",
                kv.num_kv_heads(),
                kv.head_dim(),
                c.num_key_value_heads,
                c.head_dim
            );
        }
        if let Some(&t) = batch
            .input_ids
            .iter()
            .find(|&&t| t as usize >= c.vocab_size)
        {
            bail!(
                "token id {t} is outside the vocabulary (size {})",
                c.vocab_size
            );
        }
        if batch.num_groups() != kv.group_specs().len() {
            bail!(
                "the batch has block tables for {} KV cache groups, the cache has {}",
                batch.num_groups(),
                kv.group_specs().len()
            );
        }
        if let Some(&b) = batch
            .block_tables
            .iter()
            .flatten()
            .find(|&&b| b as usize >= kv.num_blocks())
        {
            bail!(
                "block id {b} is outside the KV cache ({} blocks)",
                kv.num_blocks()
            );
        }
        if let Some(&r) = batch.logits_rows.iter().find(|&&r| r >= batch.num_tokens()) {
            bail!(
                "logits row {r} is outside the batch ({} tokens)",
                batch.num_tokens()
            );
        }
        Ok(())
    }

    /// Runs the decoder stack over `batch` (writing its K/V into `kv`) and
    /// leaves the final-normed hidden states of `batch.logits_rows` in the
    /// returned slice (`[rows × hidden]`).
    pub fn forward_hidden<'w>(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        self.check_batch(batch, kv)?;
        let c = &self.config;
        let t = batch.num_tokens();
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (nh, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let qkv_width = c.qkv_size();
        let q_width = nh * hd;
        let inter = c.intermediate_size;
        let eps = c.rms_norm_eps as f32;
        let shape = AttentionShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: kv.block_size(),
            // Each layer's own (`LayerAttention`) replace these two.
            scale: 1.0 / (hd as f32).sqrt(),
            logit_softcap: None,
            kind: sluice_core::kv_cache::AttentionKind::Full,
        };
        let wiring = self.wiring;

        let Workspace {
            hidden,
            normed,
            qkv,
            attn,
            proj,
            gate_up,
            act,
            rope,
            items,
            selected,
            final_hidden,
            ..
        } = ws;
        let hidden = sized(hidden, t * h);
        for (row, &id) in hidden.chunks_exact_mut(h).zip(&batch.input_ids) {
            self.embed_tokens.row_to_f32(id as usize, h, row);
        }
        if let Some(scale) = wiring.embedding_scale {
            for x in hidden.iter_mut() {
                *x *= scale;
            }
        }
        if rope.len() < self.ropes.len() {
            rope.resize_with(self.ropes.len(), Default::default);
        }
        for (table, (cos, sin)) in self.ropes.iter().zip(rope.iter_mut()) {
            table.cos_sin(&batch.positions, cos, sin);
        }
        let normed = sized(normed, t * h);
        let qkv = sized(qkv, t * qkv_width);
        let attn = sized(attn, t * q_width);
        let proj = sized(proj, t * h);
        let chunk = t.min(MLP_CHUNK);
        let gate_up = sized(gate_up, chunk * 2 * inter);
        let act = sized(act, chunk * inter);
        let step = AttentionStep {
            batch,
            shape,
            rope,
            eps,
        };

        for (l, layer) in self.layers.iter().enumerate() {
            match &layer.input_layernorm {
                Some(w) => rms_norm(hidden, w, eps, normed),
                None => normed.copy_from_slice(hidden),
            }
            let buffers = AttentionBuffers {
                qkv: &mut *qkv,
                attn: &mut *attn,
                items: &mut *items,
            };
            layer.attention.forward(
                &step,
                l,
                &layer.shape,
                layer.rope_table,
                kv,
                normed,
                buffers,
                proj,
            );
            match &layer.attention_output_norm {
                // `normed` was attention's input and is free again.
                Some(w) => {
                    rms_norm(proj, w, eps, normed);
                    add_assign(hidden, normed, h);
                }
                None => add_assign(hidden, proj, h),
            }

            match &layer.post_attention_layernorm {
                Some(w) => rms_norm(hidden, w, eps, normed),
                None => normed.copy_from_slice(hidden),
            }
            let mut start = 0;
            while start < t {
                let m = (t - start).min(MLP_CHUNK);
                let rows = start * h..(start + m) * h;
                let out = &mut proj[rows.clone()];
                layer.mlp.forward(
                    wiring.activation,
                    &normed[rows.clone()],
                    m,
                    &mut gate_up[..m * 2 * inter],
                    &mut act[..m * inter],
                    out,
                );
                let out: &[f32] = match &layer.mlp_output_norm {
                    // These rows of `normed` were the MLP's input.
                    Some(w) => {
                        rms_norm(out, w, eps, &mut normed[rows.clone()]);
                        &normed[rows.clone()]
                    }
                    None => out,
                };
                add_assign(&mut hidden[rows], out, h);
                start += m;
            }
        }

        let n = batch.logits_rows.len();
        let selected = sized(selected, n * h);
        for (dst, &r) in selected.chunks_exact_mut(h).zip(&batch.logits_rows) {
            dst.copy_from_slice(&hidden[r * h..(r + 1) * h]);
        }
        let final_hidden = sized(final_hidden, n * h);
        rms_norm(selected, &self.norm, eps, final_hidden);
        Ok(final_hidden)
    }
}
