//! A roofline step-time model: each piece of a step costs the larger of
//! its compute time and its memory time, on one GPU of a
//! tensor-parallel group.
//!
//! Per step with `T` scheduled tokens and `S` sampling rows, on each of
//! `tp` GPUs (Megatron-style sharding, as vLLM's `ColumnParallelLinear` /
//! `RowParallelLinear` do it: query heads, KV heads and the MLP's
//! intermediate width split `tp` ways; KV heads are replicated when `tp`
//! exceeds them, one per GPU):
//! - each linear layer (QKV, O, gate+up, down, per transformer layer):
//!   `max(2·T·params ÷ (peak·matmul_eff), (params·w + T·(in+out)·a) ÷
//!   (bandwidth·bandwidth_eff))` with this GPU's share of the params, `w`
//!   bytes per weight and `a` bytes per activation;
//! - a mixture-of-experts MLP (`num_experts > 0`): a router GEMM, then the
//!   gate+up and down GEMMs of the `experts_per_token` experts each token
//!   picks: FLOPs for `T·k` expert rows, weights read for the experts the
//!   step touches at all, in expectation `E·(1 − (1 − k/E)^T)` under
//!   uniform routing ([`ModelShape::expected_experts_touched`]);
//! - attention, per layer: `max(flops ÷ (peak·eff), kv_bytes ÷ (bw·eff))`
//!   where a row with context `c` computing `n` tokens reads `c` tokens of
//!   KV, writes `n`, and does `4·heads·head_dim·(n·c + n(n+1)/2)` FLOPs
//!   (the causal triangle of a prefill chunk; one row of it for decode);
//! - the LM head only for the `S` rows that sample (none when `S = 0`),
//!   its vocabulary split `tp` ways;
//! - at `tp > 1`, the all-reduces of the hidden state: two per layer
//!   (after attention's O projection and after the MLP's down
//!   projection) and one after the vocabulary-parallel embedding, each of
//!   `T·hidden·a` bytes, costing a ring's `2(tp−1)/tp × bytes ÷
//!   (interconnect per direction · eff)` plus `collective_latency_s`; the
//!   gather of the sampled rows' logits is left out (`S·vocab` floats, a
//!   fraction of one decode all-reduce);
//! - plus `step_overhead_s` (scheduling, launch, sampling).
//!
//! It promises monotonicity and the right orders of magnitude, not
//! calibrated times: the efficiencies, latencies and overhead are
//! unfitted defaults (`profiles/hardware.json` says where each figure
//! comes from). The fitted and table models (`fit`, `table`) are the
//! calibrated ones.
//!
//! It also sizes the KV cache as vLLM does ([`kv_cache_budget`]).

mod error;
mod hardware;
mod kv_budget;

use crate::step::{StepShape, StepTimeModel};
pub use error::RooflineError;
pub use hardware::{parse_hardware_profiles, BuiltinHardware, Hardware, HARDWARE_PROFILES_JSON};
pub use kv_budget::{kv_cache_budget, kv_cache_budget_grouped, num_gpu_blocks, KvBudget};
use serde::{Deserialize, Serialize};
pub use sluice_arch::{KvCacheDtype, LayeredShape, ModelShape};

/// Checks `tp` against the model as vLLM's config verification does:
/// attention heads divisible by it, KV heads divisible by it or it by
/// them.
pub fn check_tensor_parallel(model: &ModelShape, tp: usize) -> Result<(), RooflineError> {
    if tp == 0 {
        return Err(RooflineError::ZeroTensorParallel);
    }
    if !model.heads.is_multiple_of(tp) {
        return Err(RooflineError::HeadsNotDivisible {
            heads: model.heads,
            tp,
        });
    }
    if !model.kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(model.kv_heads.max(1)) {
        return Err(RooflineError::KvHeadsNotDivisible {
            kv_heads: model.kv_heads,
            tp,
        });
    }
    Ok(())
}

/// The roofline model of one model on `tensor_parallel` GPUs of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    pub model: ModelShape,
    pub hardware: Hardware,
    #[serde(default = "one")]
    pub tensor_parallel: usize,
}

fn one() -> usize {
    1
}

/// One GPU's share of the model's widths.
struct Shard {
    q: usize,
    kv: usize,
    inter: usize,
    vocab: usize,
    heads: usize,
}

impl Roofline {
    /// On one GPU.
    pub fn new(model: ModelShape, hardware: Hardware) -> Roofline {
        Roofline {
            model,
            hardware,
            tensor_parallel: 1,
        }
    }

    /// On `tp` GPUs, checked as vLLM checks it
    /// ([`check_tensor_parallel`]).
    pub fn with_tensor_parallel(
        model: ModelShape,
        hardware: Hardware,
        tp: usize,
    ) -> Result<Roofline, RooflineError> {
        model.validate().map_err(RooflineError::BadShape)?;
        check_tensor_parallel(&model, tp)?;
        Ok(Roofline {
            model,
            hardware,
            tensor_parallel: tp,
        })
    }

    fn tp(&self) -> usize {
        self.tensor_parallel.max(1)
    }

    fn shard(&self) -> Shard {
        let (m, tp) = (&self.model, self.tp());
        let heads = m.heads.div_ceil(tp);
        Shard {
            q: heads * m.head_dim,
            kv: m.kv_heads_per_gpu(tp) * m.head_dim,
            inter: m.intermediate.div_ceil(tp),
            vocab: m.vocab.div_ceil(tp),
            heads,
        }
    }

    /// One dense linear layer of `inp × out` weights over `rows` tokens.
    fn linear_s(&self, inp: usize, out: usize, rows: usize) -> f64 {
        let (inp, out, rows) = (inp as f64, out as f64, rows as f64);
        let w = self.model.weight_bytes_per_param();
        let a = self.model.bytes_per_param as f64;
        let flops = 2.0 * rows * inp * out;
        let bytes = inp * out * w + rows * (inp + out) * a;
        self.hardware.roof(flops, bytes)
    }

    /// One expert GEMM (`inp × out` per expert) for `tokens` tokens, each
    /// routed to top-k experts: FLOPs for every routed row, weights for
    /// the experts touched.
    fn expert_linear_s(&self, inp: usize, out: usize, tokens: usize) -> f64 {
        let m = &self.model;
        let (inp, out) = (inp as f64, out as f64);
        let rows = (tokens * m.experts_per_token) as f64;
        let w = m.weight_bytes_per_param();
        let a = m.bytes_per_param as f64;
        let flops = 2.0 * rows * inp * out;
        let bytes = m.expected_experts_touched(tokens) * inp * out * w + rows * (inp + out) * a;
        self.hardware.roof(flops, bytes)
    }

    /// Attention of one layer over the whole step, this GPU's heads.
    fn attention_s(&self, step: &StepShape, shard: &Shard) -> f64 {
        let m = &self.model;
        // K and V of this GPU's heads, in the cache's element type.
        let kv_tok = (2 * (shard.kv / m.head_dim) * m.kv_row_bytes()) as f64;
        let per_pair = 4.0 * (shard.heads * m.head_dim) as f64;
        let (mut flops, mut bytes) = (0.0, 0.0);
        for r in &step.rows {
            let (n, c) = (r.new_tokens as f64, r.context_before as f64);
            flops += per_pair * (n * c + n * (n + 1.0) / 2.0);
            bytes += (c + n) * kv_tok;
        }
        self.hardware.roof(flops, bytes)
    }

    /// The step's all-reduces (two per layer and the embedding's), zero
    /// at `tp = 1`.
    pub fn collective_s(&self, step: &StepShape) -> f64 {
        let tp = self.tp();
        let t = step.total_tokens();
        if tp == 1 || t == 0 {
            return 0.0;
        }
        let bytes = (t * self.model.hidden * self.model.bytes_per_param) as f64;
        let count = 2 * self.model.layers + 1;
        count as f64 * self.hardware.all_reduce_s(bytes, tp)
    }
}

impl StepTimeModel for Roofline {
    fn step_time(&self, step: &StepShape) -> f64 {
        let t = step.total_tokens();
        if t == 0 {
            // An empty step still pays the engine's fixed cost.
            return self.hardware.step_overhead_s;
        }
        let m = &self.model;
        let sh = self.shard();
        let attention_linears =
            self.linear_s(m.hidden, sh.q + 2 * sh.kv, t) + self.linear_s(sh.q, m.hidden, t);
        let mlp = if m.is_moe() {
            // The router is replicated on every GPU.
            self.linear_s(m.hidden, m.num_experts, t)
                + self.expert_linear_s(m.hidden, 2 * sh.inter, t)
                + self.expert_linear_s(sh.inter, m.hidden, t)
        } else {
            self.linear_s(m.hidden, 2 * sh.inter, t) + self.linear_s(sh.inter, m.hidden, t)
        };
        let block = attention_linears + mlp + self.attention_s(step, &sh);
        let s = step.num_sampling_rows();
        let lm_head = if s > 0 {
            self.linear_s(m.hidden, sh.vocab, s)
        } else {
            0.0
        };
        m.layers as f64 * block + lm_head + self.collective_s(step) + self.hardware.step_overhead_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::RowShape;

    const TINY: ModelShape = ModelShape {
        hidden: 4,
        layers: 1,
        heads: 2,
        kv_heads: 1,
        head_dim: 2,
        intermediate: 8,
        vocab: 10,
        bytes_per_param: 2,
        num_experts: 0,
        experts_per_token: 0,
        tie_word_embeddings: false,
        stored_weight_bytes: None,
        kv_cache_dtype: sluice_arch::KvCacheDtype::Auto,
    };
    const HW: Hardware = Hardware {
        peak_flops: 1000.0,
        hbm_bandwidth: 100.0,
        memory_bytes: 1e9,
        interconnect_bandwidth: 200.0,
        matmul_efficiency: 0.5,
        bandwidth_efficiency: 1.0,
        interconnect_efficiency: 1.0,
        collective_latency_s: 0.5,
        step_overhead_s: 0.25,
        activation_reserve_bytes: 0.0,
    };

    fn decode_row(context: usize) -> RowShape {
        RowShape {
            new_tokens: 1,
            context_before: context,
            samples: true,
            shared_context: 0,
        }
    }

    #[test]
    fn one_decode_row_by_hand() {
        // One row: 1 new token on 3 tokens of context, sampling.
        let step = StepShape {
            rows: vec![decode_row(3)],
        };
        // Linears (in, out): qkv (4, 4+2·2=8), o (4, 4), gate_up (4, 16),
        // down (8, 4). Effective compute 500 FLOP/s, memory 100 B/s.
        // qkv: flops 2·1·32 = 64 → 0.128 s; bytes (32 + 12)·2 = 88 → 0.88.
        // o:   flops 32 → 0.064; bytes (16 + 8)·2 = 48 → 0.48.
        // g_u: flops 128 → 0.256; bytes (64 + 20)·2 = 168 → 1.68.
        // down: flops 64 → 0.128; bytes (32 + 12)·2 = 88 → 0.88.
        // Attention: pairs 1·3 + 1 = 4, flops 4·4·4 = 64 → 0.128; KV per
        // token 2·1·2·2 = 8 B, bytes (3 + 1)·8 = 32 → 0.32.
        // LM head (4, 10), 1 row: flops 80 → 0.16; bytes (40 + 14)·2 =
        // 108 → 1.08. Overhead 0.25.
        let want = 0.88 + 0.48 + 1.68 + 0.88 + 0.32 + 1.08 + 0.25;
        let got = Roofline::new(TINY, HW).step_time(&step);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn a_compute_bound_prefill_by_hand() {
        // 100 new tokens, no context, not sampling: the LM head is skipped.
        let step = StepShape {
            rows: vec![RowShape {
                new_tokens: 100,
                context_before: 0,
                samples: false,
                shared_context: 0,
            }],
        };
        // qkv: flops 2·100·32 = 6400 → 12.8; bytes (32 + 1200)·2 → 24.64.
        // o: flops 3200 → 6.4; bytes (16 + 800)·2 = 1632 → 16.32.
        // g_u: flops 12800 → 25.6; bytes (64 + 2000)·2 = 4128 → 41.28.
        // down: flops 6400 → 12.8; bytes (32 + 1200)·2 → 24.64.
        // Attention: pairs 5050, flops 16·5050 = 80800 → 161.6; bytes
        // 100·8 = 800 → 8.
        let want = 24.64 + 16.32 + 41.28 + 24.64 + 161.6 + 0.25;
        let got = Roofline::new(TINY, HW).step_time(&step);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }

    #[test]
    fn tensor_parallel_two_by_hand() {
        // TINY at tp = 2: one query head, the one KV head replicated,
        // intermediate 4, vocab 5; one decode row on 3 tokens.
        let step = StepShape {
            rows: vec![decode_row(3)],
        };
        // qkv (4, 2+2·2=6): flops 48 → 0.096; bytes (24 + 10)·2 = 68 → 0.68.
        // o (2, 4): flops 16; bytes (8 + 6)·2 = 28 → 0.28.
        // g_u (4, 8): flops 64 → 0.128; bytes (32 + 12)·2 = 88 → 0.88.
        // down (4, 4): bytes (16 + 8)·2 = 48 → 0.48.
        // Attention: 1 head, flops 4·2·4 = 32 → 0.064; KV 8 B/token (the
        // replicated head), bytes 32 → 0.32.
        // LM head (4, 5): bytes (20 + 9)·2 = 58 → 0.58.
        // All-reduces: 2·1 + 1 = 3 of 1·4·2 = 8 bytes: 0.5 latency +
        // 2·(1/2)·8 ÷ (200/2) = 0.08, so 3·0.58 = 1.74. Overhead 0.25.
        let want = 0.68 + 0.28 + 0.88 + 0.48 + 0.32 + 0.58 + 1.74 + 0.25;
        let r = Roofline::with_tensor_parallel(TINY, HW, 2).unwrap();
        let got = r.step_time(&step);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        assert!((r.collective_s(&step) - 1.74).abs() < 1e-12);
        assert_eq!(Roofline::new(TINY, HW).collective_s(&step), 0.0);
    }

    #[test]
    fn tensor_parallel_is_checked_as_vllm_does() {
        let qwen7b = ModelShape::QWEN2_5_7B; // 28 heads, 4 KV heads
        let h = Hardware::H100_SXM;
        assert!(Roofline::with_tensor_parallel(qwen7b, h, 4).is_ok());
        assert_eq!(
            Roofline::with_tensor_parallel(qwen7b, h, 8),
            Err(RooflineError::HeadsNotDivisible { heads: 28, tp: 8 })
        );
        assert_eq!(
            Roofline::with_tensor_parallel(qwen7b, h, 0),
            Err(RooflineError::ZeroTensorParallel)
        );
        // 70B: 64 heads, 8 KV heads; tp 16 replicates KV heads (16 % 8 = 0).
        assert!(check_tensor_parallel(&ModelShape::LLAMA_3_1_70B, 16).is_ok());
        let odd = ModelShape {
            heads: 12,
            kv_heads: 4,
            ..TINY
        };
        assert_eq!(
            check_tensor_parallel(&odd, 6),
            Err(RooflineError::KvHeadsNotDivisible { kv_heads: 4, tp: 6 })
        );
    }
}
