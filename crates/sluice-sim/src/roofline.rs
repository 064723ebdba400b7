//! A roofline step-time model: each piece of a step costs the larger of
//! its compute time and its memory time.
//!
//! Per step with `T` scheduled tokens and `S` sampling rows:
//! - each linear layer (QKV, O, gate+up, down, per transformer layer):
//!   `max(2·T·params ÷ (peak·matmul_eff), (params + T·(in+out))·bytes ÷
//!   (bandwidth·bandwidth_eff))`;
//! - attention, per layer: `max(flops ÷ (peak·eff), kv_bytes ÷ (bw·eff))`
//!   where a row with context `c` computing `n` tokens reads `c` tokens of
//!   KV, writes `n`, and does `4·heads·head_dim·(n·c + n(n+1)/2)` FLOPs
//!   (the causal triangle of a prefill chunk; one row of it for decode);
//! - the LM head only for the `S` rows that sample (none when `S = 0`);
//! - plus `step_overhead_s` (scheduling, launch, sampling).
//!
//! It promises monotonicity and the right orders of magnitude, not
//! calibrated times: the efficiencies and the overhead are unfitted
//! defaults until the fitted model arrives.

use crate::step::{StepShape, StepTimeModel};
use serde::{Deserialize, Serialize};

/// The shape of a dense decoder-only transformer (gated MLP, GQA).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    /// 2 for bf16 / fp16 weights and KV cache.
    pub bytes_per_param: usize,
}

impl ModelShape {
    /// `Qwen/Qwen2.5-0.5B-Instruct` config.json.
    pub const QWEN2_5_0_5B: ModelShape = ModelShape {
        hidden: 896,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 4864,
        vocab: 151_936,
        bytes_per_param: 2,
    };
    /// `Qwen/Qwen2.5-7B-Instruct` config.json.
    pub const QWEN2_5_7B: ModelShape = ModelShape {
        hidden: 3584,
        layers: 28,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
        intermediate: 18_944,
        vocab: 152_064,
        bytes_per_param: 2,
    };
    /// `Qwen/Qwen2.5-72B-Instruct` config.json.
    pub const QWEN2_5_72B: ModelShape = ModelShape {
        hidden: 8192,
        layers: 80,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 29_568,
        vocab: 152_064,
        bytes_per_param: 2,
    };
    /// `meta-llama/Llama-3.1-8B-Instruct` config.json.
    pub const LLAMA_3_1_8B: ModelShape = ModelShape {
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14_336,
        vocab: 128_256,
        bytes_per_param: 2,
    };
    /// `meta-llama/Llama-3.1-70B-Instruct` config.json.
    pub const LLAMA_3_1_70B: ModelShape = ModelShape {
        hidden: 8192,
        layers: 80,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 28_672,
        vocab: 128_256,
        bytes_per_param: 2,
    };
    /// `Qwen/Qwen3-8B` config.json.
    pub const QWEN3_8B: ModelShape = ModelShape {
        hidden: 4096,
        layers: 36,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 12_288,
        vocab: 151_936,
        bytes_per_param: 2,
    };
    /// `Qwen/Qwen3-32B` config.json (its `head_dim` 128 × 64 heads is
    /// wider than `hidden`, which is why projections use heads·head_dim).
    pub const QWEN3_32B: ModelShape = ModelShape {
        hidden: 5120,
        layers: 64,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 25_600,
        vocab: 151_936,
        bytes_per_param: 2,
    };

    /// The built-in shapes by name (the Hugging Face repo's short name).
    pub fn builtin(name: &str) -> Option<ModelShape> {
        Some(match name.to_ascii_lowercase().as_str() {
            "qwen2.5-0.5b" => Self::QWEN2_5_0_5B,
            "qwen2.5-7b" => Self::QWEN2_5_7B,
            "qwen2.5-72b" => Self::QWEN2_5_72B,
            "llama-3.1-8b" => Self::LLAMA_3_1_8B,
            "llama-3.1-70b" => Self::LLAMA_3_1_70B,
            "qwen3-8b" => Self::QWEN3_8B,
            "qwen3-32b" => Self::QWEN3_32B,
            _ => return None,
        })
    }

    /// (input, output) widths of the four linear layers of one block.
    fn linears(&self) -> [(usize, usize); 4] {
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        [
            (self.hidden, q + 2 * kv),
            (q, self.hidden),
            (self.hidden, 2 * self.intermediate),
            (self.intermediate, self.hidden),
        ]
    }

    /// KV cache bytes of one token in one layer.
    pub fn kv_bytes_per_token_per_layer(&self) -> usize {
        2 * self.kv_heads * self.head_dim * self.bytes_per_param
    }
}

/// One accelerator. Figures are the vendor datasheets' dense (not
/// sparse) bf16 tensor throughput and HBM bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    /// FLOP/s, dense bf16.
    pub peak_flops: f64,
    /// Bytes/s.
    pub hbm_bandwidth: f64,
    pub memory_bytes: f64,
    /// Fraction of `peak_flops` a GEMM reaches.
    pub matmul_efficiency: f64,
    /// Fraction of `hbm_bandwidth` a streaming kernel reaches.
    pub bandwidth_efficiency: f64,
    /// Fixed cost of every step (scheduling, launches, sampling).
    pub step_overhead_s: f64,
}

/// Unfitted defaults shared by the built-ins, typical of what well-tuned
/// kernels reach; the fitted model replaces them.
const MATMUL_EFF: f64 = 0.7;
const BANDWIDTH_EFF: f64 = 0.8;
const STEP_OVERHEAD_S: f64 = 0.002;
const GB: f64 = 1e9;
const TFLOPS: f64 = 1e12;

impl Hardware {
    const fn new(tflops: f64, gb_per_s: f64, memory_gb: f64) -> Hardware {
        Hardware {
            peak_flops: tflops * TFLOPS,
            hbm_bandwidth: gb_per_s * GB,
            memory_bytes: memory_gb * GB,
            matmul_efficiency: MATMUL_EFF,
            bandwidth_efficiency: BANDWIDTH_EFF,
            step_overhead_s: STEP_OVERHEAD_S,
        }
    }

    /// NVIDIA A100 80GB SXM datasheet: 312 TFLOPS bf16 (624 sparse),
    /// 2,039 GB/s HBM2e, 80 GB.
    pub const A100_80GB: Hardware = Hardware::new(312.0, 2039.0, 80.0);
    /// NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 dense (1,979 sparse),
    /// 3.35 TB/s HBM3, 80 GB.
    pub const H100_SXM: Hardware = Hardware::new(989.0, 3350.0, 80.0);
    /// NVIDIA H200 SXM datasheet: 989 TFLOPS bf16 dense (1,979 sparse),
    /// 4.8 TB/s HBM3e, 141 GB.
    pub const H200: Hardware = Hardware::new(989.0, 4800.0, 141.0);
    /// NVIDIA L40S datasheet: 362.05 TFLOPS bf16 dense (733 sparse),
    /// 864 GB/s GDDR6, 48 GB.
    pub const L40S: Hardware = Hardware::new(362.05, 864.0, 48.0);
    /// NVIDIA DGX/HGX B200 datasheet, per GPU: 2.25 PFLOPS bf16 dense
    /// (4.5 sparse), 8 TB/s HBM3e, 180 GB.
    pub const B200: Hardware = Hardware::new(2250.0, 8000.0, 180.0);

    pub fn builtin(name: &str) -> Option<Hardware> {
        Some(match name.to_ascii_lowercase().as_str() {
            "a100-80gb" | "a100" => Self::A100_80GB,
            "h100-sxm" | "h100" => Self::H100_SXM,
            "h200" => Self::H200,
            "l40s" => Self::L40S,
            "b200" => Self::B200,
            _ => return None,
        })
    }

    fn compute_s(&self, flops: f64) -> f64 {
        flops / (self.peak_flops * self.matmul_efficiency)
    }

    fn memory_s(&self, bytes: f64) -> f64 {
        bytes / (self.hbm_bandwidth * self.bandwidth_efficiency)
    }

    fn roof(&self, flops: f64, bytes: f64) -> f64 {
        self.compute_s(flops).max(self.memory_s(bytes))
    }
}

/// The roofline model of one model on one accelerator (no tensor
/// parallelism yet).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    pub model: ModelShape,
    pub hardware: Hardware,
}

impl Roofline {
    pub fn new(model: ModelShape, hardware: Hardware) -> Roofline {
        Roofline { model, hardware }
    }

    /// One linear layer of `inp × out` weights over `rows` tokens.
    fn linear_s(&self, inp: usize, out: usize, rows: usize) -> f64 {
        let (inp, out, rows) = (inp as f64, out as f64, rows as f64);
        let b = self.model.bytes_per_param as f64;
        let flops = 2.0 * rows * inp * out;
        let bytes = (inp * out + rows * (inp + out)) * b;
        self.hardware.roof(flops, bytes)
    }

    /// Attention of one layer over the whole step.
    fn attention_s(&self, step: &StepShape) -> f64 {
        let m = &self.model;
        let kv_tok = m.kv_bytes_per_token_per_layer() as f64;
        let per_pair = 4.0 * (m.heads * m.head_dim) as f64;
        let (mut flops, mut bytes) = (0.0, 0.0);
        for r in &step.rows {
            let (n, c) = (r.new_tokens as f64, r.context_before as f64);
            flops += per_pair * (n * c + n * (n + 1.0) / 2.0);
            bytes += (c + n) * kv_tok;
        }
        self.hardware.roof(flops, bytes)
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
        let block: f64 = m
            .linears()
            .iter()
            .map(|&(i, o)| self.linear_s(i, o, t))
            .sum::<f64>()
            + self.attention_s(step);
        let s = step.num_sampling_rows();
        let lm_head = if s > 0 {
            self.linear_s(m.hidden, m.vocab, s)
        } else {
            0.0
        };
        m.layers as f64 * block + lm_head + self.hardware.step_overhead_s
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
    };
    const HW: Hardware = Hardware {
        peak_flops: 1000.0,
        hbm_bandwidth: 100.0,
        memory_bytes: 1e9,
        matmul_efficiency: 0.5,
        bandwidth_efficiency: 1.0,
        step_overhead_s: 0.25,
    };

    #[test]
    fn one_decode_row_by_hand() {
        // One row: 1 new token on 3 tokens of context, sampling.
        let step = StepShape {
            rows: vec![RowShape {
                new_tokens: 1,
                context_before: 3,
                samples: true,
            }],
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
}
