//! [`ModelShape`]: the widths and counts of a decoder-only transformer
//! (gated MLP, GQA; dense or mixture-of-experts) and the facts derived
//! from them — parameters, bytes per weight, KV-cache bytes per token,
//! the per-GPU shares under tensor parallelism.
//!
//! Promises: a shape that passed [`ModelShape::validate`] has no zero
//! width and a top-k within its experts, so the derived facts never
//! divide by zero. Every consumer (the model runner's KV sizing, the
//! simulator's roofline, `serve --executor simulated`) computes these
//! facts here, so two readers of one model cannot disagree on them.

use crate::kv_dtype::KvCacheDtype;
use serde::{Deserialize, Serialize};

/// The shape of a decoder-only transformer (gated MLP, GQA), dense or
/// mixture-of-experts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The MLP's intermediate width; for a mixture of experts, one
    /// expert's.
    pub intermediate: usize,
    pub vocab: usize,
    /// Bytes of one activation and one KV-cache element, and of one weight
    /// unless `stored_weight_bytes` says otherwise: 2 for bf16 / fp16.
    pub bytes_per_param: usize,
    /// Routed experts per MoE layer; 0 for a dense model.
    #[serde(default)]
    pub num_experts: usize,
    /// Experts each token is routed to (top-k); 0 for a dense model.
    #[serde(default)]
    pub experts_per_token: usize,
    /// The LM head shares the embedding's weights (`tie_word_embeddings`).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The weights' size as stored, when a file says it (a GGUF's tensor
    /// data, quantized or not); the weight bytes the roofline streams are
    /// scaled to it.
    #[serde(default)]
    pub stored_weight_bytes: Option<u64>,
    /// The KV cache's element type (`--kv-cache-dtype`); `auto` stores
    /// `bytes_per_param` per element, as vLLM does.
    #[serde(default, skip_serializing_if = "KvCacheDtype::is_auto")]
    pub kv_cache_dtype: KvCacheDtype,
}

impl ModelShape {
    /// Whether the MLP is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.num_experts > 0 && self.experts_per_token > 0
    }

    /// Parameters of one (routed) expert or of the dense MLP: gate, up and
    /// down projections.
    fn mlp_params(&self) -> u64 {
        3 * (self.hidden as u64) * (self.intermediate as u64)
    }

    /// Every parameter: attention and MLP (all experts, the router) of
    /// each layer, the two RMSNorms per layer and the final one, the
    /// embedding and (untied) LM head. Biases (Qwen2's QKV bias) are left
    /// out: under 0.01 % of any built-in.
    pub fn param_count(&self) -> u64 {
        let (h, q, kv) = (
            self.hidden as u64,
            (self.heads * self.head_dim) as u64,
            (self.kv_heads * self.head_dim) as u64,
        );
        let attention = h * (q + 2 * kv) + q * h;
        let mlp = if self.is_moe() {
            self.num_experts as u64 * self.mlp_params() + h * self.num_experts as u64
        } else {
            self.mlp_params()
        };
        let per_layer = attention + mlp + 2 * h;
        let embeddings = if self.tie_word_embeddings { 1 } else { 2 } * self.vocab as u64 * h;
        self.layers as u64 * per_layer + embeddings + h
    }

    /// Bytes of all the weights: the stored size when known, else
    /// `param_count() × bytes_per_param`.
    pub fn weight_bytes(&self) -> u64 {
        self.stored_weight_bytes
            .unwrap_or(self.param_count() * self.bytes_per_param as u64)
    }

    /// Bytes one weight takes on average: `bytes_per_param`, or the stored
    /// size spread over the parameters (a quantized GGUF's 0.5-1 byte).
    pub fn weight_bytes_per_param(&self) -> f64 {
        match self.stored_weight_bytes {
            Some(b) if self.param_count() > 0 => b as f64 / self.param_count() as f64,
            _ => self.bytes_per_param as f64,
        }
    }

    /// KV cache elements of one token across all layers, K and V (the
    /// runner multiplies by its own element size); `None` on overflow.
    pub fn kv_elements_per_token(&self) -> Option<usize> {
        [self.layers, self.kv_heads, self.head_dim]
            .into_iter()
            .try_fold(2usize, usize::checked_mul)
    }

    /// KV cache bytes of one token in one layer (K and V, all KV heads).
    pub fn kv_bytes_per_token_per_layer(&self) -> usize {
        2 * self.kv_heads * self.kv_row_bytes()
    }

    /// Bytes of one KV head's K (or V) row of one token in the cache's
    /// element type.
    pub fn kv_row_bytes(&self) -> usize {
        self.kv_cache_dtype
            .row_bytes(self.head_dim, self.bytes_per_param)
    }

    /// This shape with its KV cache stored as `dtype`.
    pub fn with_kv_cache_dtype(self, dtype: KvCacheDtype) -> Self {
        ModelShape {
            kv_cache_dtype: dtype,
            ..self
        }
    }

    /// KV cache bytes of one token across all layers, K and V.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers * self.kv_bytes_per_token_per_layer()
    }

    /// KV heads one GPU holds at tensor parallelism `tp`: its share, or
    /// one (replicated) when `tp` exceeds them, as vLLM shards them.
    pub fn kv_heads_per_gpu(&self, tp: usize) -> usize {
        (self.kv_heads / tp.max(1)).max(1)
    }

    /// KV cache bytes of one token across all layers on one GPU at
    /// tensor parallelism `tp`.
    pub fn kv_bytes_per_token_per_gpu(&self, tp: usize) -> usize {
        self.layers * self.kv_page_bytes_per_token_per_gpu(tp)
    }

    /// KV cache bytes of one token in one layer on one GPU at `tp`.
    fn kv_page_bytes_per_token_per_gpu(&self, tp: usize) -> usize {
        2 * self.kv_heads_per_gpu(tp) * self.kv_row_bytes()
    }

    /// Bytes of one KV pool block on one GPU at `tp` when a block id
    /// stands for `layer_slots` layers' pages of `block_size` tokens (vLLM's
    /// page: `block_size × 2 × kv_heads × head_dim × dtype bytes`; every
    /// layer of a plain decoder, or a hybrid model's group size, see
    /// `crate::layers`).
    pub fn kv_bytes_per_block_per_gpu(
        &self,
        layer_slots: usize,
        block_size: usize,
        tp: usize,
    ) -> u64 {
        layer_slots as u64 * block_size as u64 * self.kv_page_bytes_per_token_per_gpu(tp) as u64
    }

    /// The experts a step of `tokens` tokens touches in expectation, each
    /// token picking `experts_per_token` of `num_experts` uniformly:
    /// `E·(1 − (1 − k/E)^T)`. Monotone in `tokens`, at most `E`; 0 for a
    /// dense model.
    pub fn expected_experts_touched(&self, tokens: usize) -> f64 {
        if !self.is_moe() {
            return 0.0;
        }
        let e = self.num_experts as f64;
        let k = (self.experts_per_token as f64).min(e);
        let untouched = (1.0 - k / e).powf(tokens as f64);
        (e * (1.0 - untouched)).clamp(0.0, e)
    }

    /// The MoE weight bytes one GPU reads in one layer for a step of
    /// `tokens` tokens: the experts touched × one expert's share at `tp`.
    pub fn moe_weight_bytes_read(&self, tokens: usize, tp: usize) -> f64 {
        let expert = 3.0
            * self.hidden as f64
            * self.intermediate.div_ceil(tp.max(1)) as f64
            * self.weight_bytes_per_param();
        self.expected_experts_touched(tokens) * expert
    }

    /// The shape's sizes are usable: no zero width, top-k within the
    /// experts. Errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate", self.intermediate),
            ("vocab", self.vocab),
            ("bytes_per_param", self.bytes_per_param),
        ] {
            if v == 0 {
                return Err(format!("`{name}` is 0"));
            }
        }
        if (self.num_experts == 0) != (self.experts_per_token == 0) {
            return Err(format!(
                "`num_experts` {} and `experts_per_token` {}: both 0 (dense) or both positive",
                self.num_experts, self.experts_per_token
            ));
        }
        if self.experts_per_token > self.num_experts {
            return Err(format!(
                "`experts_per_token` {} exceeds `num_experts` {}",
                self.experts_per_token, self.num_experts
            ));
        }
        Ok(())
    }
}
