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

use crate::step::{StepShape, StepTimeModel};
use serde::{Deserialize, Serialize};
pub use sluice_arch::ModelShape;
use std::sync::OnceLock;

/// One accelerator, with what the roofline and the KV sizing need.
/// Figures of the built-ins are in `profiles/hardware.json`, each with
/// its source.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// FLOP/s, dense bf16.
    pub peak_flops: f64,
    /// Device memory bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// Device memory the driver reports, bytes (what vLLM multiplies by
    /// `--gpu-memory-utilization`).
    pub memory_bytes: f64,
    /// GPU-to-GPU bandwidth per GPU, both directions together as NVIDIA
    /// quotes it (NVLink, or PCIe without it), bytes/s.
    pub interconnect_bandwidth: f64,
    /// Fraction of `peak_flops` a GEMM reaches.
    pub matmul_efficiency: f64,
    /// Fraction of `hbm_bandwidth` a streaming kernel reaches.
    pub bandwidth_efficiency: f64,
    /// Fraction of the per-direction interconnect bandwidth an all-reduce
    /// reaches.
    pub interconnect_efficiency: f64,
    /// Fixed cost of one all-reduce, seconds.
    pub collective_latency_s: f64,
    /// Fixed cost of every step (scheduling, launches, sampling).
    pub step_overhead_s: f64,
    /// Per-GPU memory besides weights and KV cache (activation peak,
    /// workspaces, CUDA graphs), bytes.
    pub activation_reserve_bytes: f64,
}

/// Unfitted defaults shared by the built-ins (`profiles/hardware.json`'s
/// `defaults`, checked equal by a test).
const MATMUL_EFF: f64 = 0.7;
const BANDWIDTH_EFF: f64 = 0.8;
const INTERCONNECT_EFF: f64 = 0.8;
const NVLINK_LATENCY_S: f64 = 8e-6;
const STEP_OVERHEAD_S: f64 = 0.002;
const ACTIVATION_RESERVE: f64 = 2.0 * GIB;
const GB: f64 = 1e9;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const TFLOPS: f64 = 1e12;

/// The profile file, the source of truth for [`Hardware::builtin`].
pub const HARDWARE_PROFILES_JSON: &str = include_str!("../profiles/hardware.json");

/// One built-in profile of `profiles/hardware.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltinHardware {
    pub name: String,
    pub aliases: Vec<String>,
    pub description: String,
    pub hardware: Hardware,
    /// `(field, source)` for every field, defaults included.
    pub sources: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sourced {
    value: f64,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileEntry {
    name: String,
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    description: String,
    fields: std::collections::BTreeMap<String, Sourced>,
}

#[derive(Deserialize)]
struct ProfilesFile {
    defaults: std::collections::BTreeMap<String, Sourced>,
    profiles: Vec<ProfileEntry>,
}

/// Parses a profiles file of `profiles/hardware.json`'s format. Errors
/// name the profile and field.
pub fn parse_hardware_profiles(text: &str) -> Result<Vec<BuiltinHardware>, String> {
    let file: ProfilesFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(file.profiles.len());
    for p in file.profiles {
        let mut fields = serde_json::Map::new();
        let mut sources = Vec::new();
        for (k, s) in file.defaults.iter().chain(p.fields.iter()) {
            fields.insert(k.clone(), serde_json::json!(s.value));
            sources.retain(|(f, _): &(String, String)| f != k);
            sources.push((k.clone(), s.source.clone()));
        }
        let hardware: Hardware = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|e| format!("profile `{}`: {e}", p.name))?;
        hardware
            .validate()
            .map_err(|e| format!("profile `{}`: {e}", p.name))?;
        out.push(BuiltinHardware {
            name: p.name,
            aliases: p.aliases,
            description: p.description,
            hardware,
            sources,
        });
    }
    Ok(out)
}

impl Hardware {
    const fn datasheet(
        tflops: f64,
        gb_per_s: f64,
        memory_bytes: f64,
        interconnect_gb_per_s: f64,
        collective_latency_s: f64,
    ) -> Hardware {
        Hardware {
            peak_flops: tflops * TFLOPS,
            hbm_bandwidth: gb_per_s * GB,
            memory_bytes,
            interconnect_bandwidth: interconnect_gb_per_s * GB,
            matmul_efficiency: MATMUL_EFF,
            bandwidth_efficiency: BANDWIDTH_EFF,
            interconnect_efficiency: INTERCONNECT_EFF,
            collective_latency_s,
            step_overhead_s: STEP_OVERHEAD_S,
            activation_reserve_bytes: ACTIVATION_RESERVE,
        }
    }

    // Compile-time copies of the profile file's built-ins, for code and
    // tests that want a constant; `consts_match_the_profile_file` keeps
    // them equal to the file, which `builtin` reads.

    /// A100 80GB SXM: 312 TFLOPS bf16, 2,039 GB/s, 81,920 MiB, NVLink
    /// 600 GB/s.
    pub const A100_80GB: Hardware =
        Hardware::datasheet(312.0, 2039.0, 81_920.0 * MIB, 600.0, NVLINK_LATENCY_S);
    /// H100 SXM: 989 TFLOPS bf16, 3.35 TB/s, 81,559 MiB, NVLink 900 GB/s.
    pub const H100_SXM: Hardware =
        Hardware::datasheet(989.0, 3350.0, 81_559.0 * MIB, 900.0, NVLINK_LATENCY_S);
    /// H200 SXM: 989 TFLOPS bf16, 4.8 TB/s, 143,771 MiB, NVLink 900 GB/s.
    pub const H200: Hardware =
        Hardware::datasheet(989.0, 4800.0, 143_771.0 * MIB, 900.0, NVLINK_LATENCY_S);
    /// L40S: 362.05 TFLOPS bf16, 864 GB/s, 46,068 MiB, PCIe Gen4 x16
    /// 64 GB/s.
    pub const L40S: Hardware = Hardware {
        // Written out so that it is the same double the file's 362.05e12
        // parses to (362.05 × 1e12 rounds differently).
        peak_flops: 362.05e12,
        ..Hardware::datasheet(362.0, 864.0, 46_068.0 * MIB, 64.0, 25e-6)
    };
    /// B200 (DGX / HGX, per GPU): 2.25 PFLOPS bf16, 8 TB/s, 180 GB,
    /// NVLink 1.8 TB/s.
    pub const B200: Hardware =
        Hardware::datasheet(2250.0, 8000.0, 180.0 * GB, 1800.0, NVLINK_LATENCY_S);

    /// The built-in profiles of `profiles/hardware.json`, parsed once.
    pub fn builtin_profiles() -> Result<&'static [BuiltinHardware], String> {
        static PARSED: OnceLock<Result<Vec<BuiltinHardware>, String>> = OnceLock::new();
        match PARSED.get_or_init(|| parse_hardware_profiles(HARDWARE_PROFILES_JSON)) {
            Ok(v) => Ok(v),
            Err(e) => Err(format!("profiles/hardware.json: {e}")),
        }
    }

    /// A built-in profile by name or alias, case-insensitive.
    pub fn builtin(name: &str) -> Option<Hardware> {
        Self::builtin_profile(name).map(|p| p.hardware)
    }

    /// A built-in profile, with its sources, by name or alias.
    pub fn builtin_profile(name: &str) -> Option<&'static BuiltinHardware> {
        let name = name.trim();
        Self::builtin_profiles().ok()?.iter().find(|p| {
            p.name.eq_ignore_ascii_case(name)
                || p.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
    }

    /// The built-in profiles' names.
    pub fn builtin_names() -> Vec<&'static str> {
        Self::builtin_profiles()
            .map(|ps| ps.iter().map(|p| p.name.as_str()).collect())
            .unwrap_or_default()
    }

    /// Every figure finite, rates and sizes positive, efficiencies in
    /// (0, 1], costs non-negative. Errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("peak_flops", self.peak_flops),
            ("hbm_bandwidth", self.hbm_bandwidth),
            ("memory_bytes", self.memory_bytes),
            ("interconnect_bandwidth", self.interconnect_bandwidth),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("`{name}`: expected a positive number, found {v}"));
            }
        }
        for (name, v) in [
            ("matmul_efficiency", self.matmul_efficiency),
            ("bandwidth_efficiency", self.bandwidth_efficiency),
            ("interconnect_efficiency", self.interconnect_efficiency),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(format!(
                    "`{name}`: expected a fraction in (0, 1], found {v}"
                ));
            }
        }
        for (name, v) in [
            ("collective_latency_s", self.collective_latency_s),
            ("step_overhead_s", self.step_overhead_s),
            ("activation_reserve_bytes", self.activation_reserve_bytes),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "`{name}`: expected a non-negative number, found {v}"
                ));
            }
        }
        Ok(())
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

    /// One ring all-reduce of `bytes` over `tp` GPUs: each sends and
    /// receives `2(tp−1)/tp × bytes`, at once, at half the quoted
    /// bidirectional bandwidth each way.
    pub fn all_reduce_s(&self, bytes: f64, tp: usize) -> f64 {
        if tp <= 1 {
            return 0.0;
        }
        let tp = tp as f64;
        let per_direction = self.interconnect_bandwidth / 2.0 * self.interconnect_efficiency;
        self.collective_latency_s + 2.0 * (tp - 1.0) / tp * bytes / per_direction
    }
}

/// What can go wrong setting up a roofline or sizing a KV cache.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RooflineError {
    #[error("tensor parallel size must be at least 1")]
    ZeroTensorParallel,
    #[error("the model's {heads} attention heads are not divisible by tensor parallel size {tp}")]
    HeadsNotDivisible { heads: usize, tp: usize },
    #[error(
        "the model's {kv_heads} KV heads and tensor parallel size {tp}: one must divide the other"
    )]
    KvHeadsNotDivisible { kv_heads: usize, tp: usize },
    #[error("--gpu-memory-utilization {0}: expected a fraction in (0, 1]")]
    BadUtilization(f64),
    #[error("block size must be at least 1")]
    ZeroBlockSize,
    #[error("model shape: {0}")]
    BadShape(String),
    #[error(
        "the weights ({weights_gb:.1} GB per GPU) and the {reserve_gb:.1} GB activation reserve do not fit in {memory_gb:.1} GB × {utilization} = {requested_gb:.1} GB"
    )]
    WeightsDoNotFit {
        weights_gb: f64,
        reserve_gb: f64,
        memory_gb: f64,
        utilization: f64,
        requested_gb: f64,
    },
    #[error(
        "{available_gb:.3} GB per GPU is left for the KV cache, less than one block ({block_bytes} bytes: {block_size} tokens × {kv_per_token} bytes per token per GPU)"
    )]
    NoRoomForABlock {
        available_gb: f64,
        block_bytes: u64,
        block_size: usize,
        kv_per_token: usize,
    },
}

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

/// How vLLM's memory profiling divides one GPU, as [`kv_cache_budget`]
/// computes it. Bytes, per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KvBudget {
    /// `⌈memory × gpu_memory_utilization⌉`: vLLM's `requested_memory`.
    pub requested_bytes: f64,
    /// This GPU's share of the weights, `weights ÷ tp`.
    pub weight_bytes_per_gpu: f64,
    /// `activation_reserve_bytes`.
    pub reserve_bytes: f64,
    /// What is left for the KV cache.
    pub available_bytes: f64,
    /// One block: `block_size × kv_bytes_per_token_per_gpu`.
    pub bytes_per_block: u64,
    /// `⌊available ÷ bytes_per_block⌋`.
    pub num_blocks: usize,
}

/// The KV cache vLLM would allocate for `model` on `hardware` at tensor
/// parallelism `tp`.
///
/// vLLM 0.33 (`v1/worker/utils.py::request_memory`,
/// `v1/worker/gpu_worker.py::determine_available_memory`): the engine may
/// use `requested = ⌈total_memory × gpu_memory_utilization⌉` of the GPU
/// (a per-instance budget of the whole device's memory, not a fraction of
/// what is free; default 0.92 in `config/cache.py`). A profile run then
/// measures what the instance consumed since start-up (weights,
/// persistent buffers, non-torch allocations such as NCCL) plus the
/// transient activation peak, and the CUDA-graph estimate; the rest of
/// `requested` is the KV cache, `⌊available ÷ bytes per block⌋` blocks
/// (`v1/core/kv_cache_planning.py`). Each TP worker does this on its own
/// GPU and holds its share of every block, so the block count is a
/// per-GPU quantity. Here the weights are `weight_bytes() ÷ tp` and the
/// rest of the non-KV use is the hardware's `activation_reserve_bytes`.
pub fn kv_cache_budget(
    model: &ModelShape,
    hardware: &Hardware,
    tp: usize,
    gpu_memory_utilization: f64,
    block_size: usize,
) -> Result<KvBudget, RooflineError> {
    model.validate().map_err(RooflineError::BadShape)?;
    check_tensor_parallel(model, tp)?;
    if !(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0) {
        return Err(RooflineError::BadUtilization(gpu_memory_utilization));
    }
    if block_size == 0 {
        return Err(RooflineError::ZeroBlockSize);
    }
    let requested = (hardware.memory_bytes * gpu_memory_utilization).ceil();
    let weights = model.weight_bytes() as f64 / tp as f64;
    let reserve = hardware.activation_reserve_bytes;
    let available = requested - weights - reserve;
    if available <= 0.0 {
        return Err(RooflineError::WeightsDoNotFit {
            weights_gb: weights / GB,
            reserve_gb: reserve / GB,
            memory_gb: hardware.memory_bytes / GB,
            utilization: gpu_memory_utilization,
            requested_gb: requested / GB,
        });
    }
    let kv_per_token = model.kv_bytes_per_token_per_gpu(tp);
    let bytes_per_block = (block_size * kv_per_token) as u64;
    let num_blocks = (available / bytes_per_block as f64).floor() as usize;
    if num_blocks == 0 {
        return Err(RooflineError::NoRoomForABlock {
            available_gb: available / GB,
            block_bytes: bytes_per_block,
            block_size,
            kv_per_token,
        });
    }
    Ok(KvBudget {
        requested_bytes: requested,
        weight_bytes_per_gpu: weights,
        reserve_bytes: reserve,
        available_bytes: available,
        bytes_per_block,
        num_blocks,
    })
}

/// The number of KV blocks vLLM would allocate ([`kv_cache_budget`]).
pub fn num_gpu_blocks(
    model: &ModelShape,
    hardware: &Hardware,
    tp: usize,
    gpu_memory_utilization: f64,
    block_size: usize,
) -> Result<usize, RooflineError> {
    kv_cache_budget(model, hardware, tp, gpu_memory_utilization, block_size).map(|b| b.num_blocks)
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
        let kv_tok = (2 * shard.kv * m.bytes_per_param) as f64;
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

    #[test]
    fn param_counts_match_the_published_sizes() {
        // Llama 3.1 8B: 8.03 B; Mixtral 8x7B: 46.7 B; Qwen2.5-0.5B (tied,
        // biases left out): 0.494 B.
        let b = |m: ModelShape| m.param_count() as f64 / 1e9;
        assert!((b(ModelShape::LLAMA_3_1_8B) - 8.03).abs() < 0.01);
        assert!((b(ModelShape::MIXTRAL_8X7B) - 46.70).abs() < 0.05);
        assert!((b(ModelShape::QWEN2_5_0_5B) - 0.494).abs() < 0.001);
        assert_eq!(
            ModelShape::LLAMA_3_1_8B.weight_bytes(),
            2 * ModelShape::LLAMA_3_1_8B.param_count()
        );
        // 32 layers × K and V × 8 heads × 128 × 2 bytes = 128 KiB.
        assert_eq!(ModelShape::LLAMA_3_1_8B.kv_bytes_per_token(), 131_072);
        assert_eq!(
            ModelShape::LLAMA_3_1_8B.kv_bytes_per_token_per_gpu(4),
            32_768
        );
        // Beyond 8 KV heads they replicate: one per GPU.
        assert_eq!(
            ModelShape::LLAMA_3_1_8B.kv_bytes_per_token_per_gpu(16),
            16_384
        );
    }

    #[test]
    fn builtin_names_take_hf_ids_in_any_case() {
        assert_eq!(
            ModelShape::builtin("Qwen/Qwen2.5-7B-Instruct"),
            Some(ModelShape::QWEN2_5_7B)
        );
        assert_eq!(
            ModelShape::builtin("QWEN2.5-7B"),
            Some(ModelShape::QWEN2_5_7B)
        );
        assert_eq!(
            ModelShape::builtin("mistralai/mixtral-8x7b-instruct-v0.1"),
            Some(ModelShape::MIXTRAL_8X7B)
        );
        assert_eq!(ModelShape::builtin("qwen2.5-7b-base"), None);
        for name in ModelShape::builtin_names() {
            assert!(ModelShape::builtin(name).is_some(), "{name}");
            assert_eq!(
                ModelShape::builtin(name).map(|m| m.validate()),
                Some(Ok(()))
            );
        }
    }

    #[test]
    fn consts_match_the_profile_file() {
        let profiles = Hardware::builtin_profiles().unwrap();
        assert_eq!(profiles.len(), 5);
        for (name, c) in [
            ("A100-80GB", Hardware::A100_80GB),
            ("H100-SXM", Hardware::H100_SXM),
            ("H200", Hardware::H200),
            ("L40S", Hardware::L40S),
            ("B200", Hardware::B200),
        ] {
            let p = Hardware::builtin_profile(name).unwrap();
            assert_eq!(p.hardware, c, "{name}");
            // Every field has a source, and a non-empty one.
            assert_eq!(p.sources.len(), 10, "{name}");
            assert!(p.sources.iter().all(|(_, s)| s.len() > 10), "{name}");
        }
        assert_eq!(Hardware::builtin("h100"), Some(Hardware::H100_SXM));
        assert_eq!(Hardware::builtin("a100"), Some(Hardware::A100_80GB));
        assert_eq!(Hardware::builtin("tpu-v5"), None);
    }

    #[test]
    fn a_bad_profiles_file_names_the_profile_and_field() {
        let text = r#"{"defaults": {}, "profiles": [{"name": "X", "fields": {
            "peak_flops": {"value": 1, "source": "s"}}}]}"#;
        let err = parse_hardware_profiles(text).unwrap_err();
        assert!(
            err.contains("profile `X`") && err.contains("missing field"),
            "{err}"
        );
        let mut fields: Vec<String> = Vec::new();
        for (k, v) in serde_json::to_value(HW).unwrap().as_object().unwrap() {
            let v = if k == "matmul_efficiency" {
                serde_json::json!(1.5)
            } else {
                v.clone()
            };
            fields.push(format!(r#""{k}": {{"value": {v}, "source": "s"}}"#));
        }
        let text = format!(
            r#"{{"defaults": {{}}, "profiles": [{{"name": "Y", "fields": {{{}}}}}]}}"#,
            fields.join(",")
        );
        let err = parse_hardware_profiles(&text).unwrap_err();
        assert!(
            err.contains("profile `Y`") && err.contains("`matmul_efficiency`"),
            "{err}"
        );
    }
}
