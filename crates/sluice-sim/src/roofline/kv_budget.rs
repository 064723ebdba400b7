//! vLLM's KV-cache sizing on a simulated GPU ([`kv_cache_budget`]): the
//! memory an instance may use, less the weights' share and the activation
//! reserve, in whole blocks of the shared pool, a block costing a page of
//! every layer slot of a KV cache group (`sluice_arch::layers`: all layers
//! for a plain decoder, the group size for a hybrid one).

use super::hardware::GB;
use super::{check_tensor_parallel, Hardware, ModelShape, RooflineError};
use serde::Serialize;
use sluice_arch::LayeredShape;
use sluice_core::kv_cache::GroupingPolicy;

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
    /// Layer pages one block id stands for: every layer of a plain
    /// decoder, a hybrid model's KV cache group size.
    pub layer_slots: usize,
    /// One block: `layer_slots` pages of `block_size` tokens, K and V.
    pub bytes_per_block: u64,
    /// `⌊available ÷ bytes_per_block⌋`.
    pub num_blocks: usize,
}

/// The KV cache vLLM would allocate for `model` (every layer full
/// attention) on `hardware` at tensor parallelism `tp`: see
/// [`kv_cache_budget_grouped`].
pub fn kv_cache_budget(
    model: &ModelShape,
    hardware: &Hardware,
    tp: usize,
    gpu_memory_utilization: f64,
    block_size: usize,
) -> Result<KvBudget, RooflineError> {
    kv_cache_budget_grouped(
        &LayeredShape::all_full(*model),
        GroupingPolicy::default(),
        hardware,
        tp,
        gpu_memory_utilization,
        block_size,
    )
}

/// The KV cache vLLM would allocate for `model`, its layers grouped
/// under `policy`, on `hardware` at tensor parallelism `tp`.
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
/// (`v1/core/kv_cache_planning.py::get_kv_cache_config_from_groups`), a
/// block costing the largest group's pages (`_get_kv_cache_bytes_per_block`;
/// every group but a padded one has `group_size` layers, so `group_size`
/// pages). Each TP worker does this on its own
/// GPU and holds its share of every block, so the block count is a
/// per-GPU quantity. Here the weights are `weight_bytes() ÷ tp` and the
/// rest of the non-KV use is the hardware's `activation_reserve_bytes`.
pub fn kv_cache_budget_grouped(
    layered: &LayeredShape,
    policy: GroupingPolicy,
    hardware: &Hardware,
    tp: usize,
    gpu_memory_utilization: f64,
    block_size: usize,
) -> Result<KvBudget, RooflineError> {
    layered.validate().map_err(RooflineError::BadShape)?;
    let model = &layered.shape;
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
    let layer_slots = layered.kv_layer_groups(policy).group_size();
    let bytes_per_block = model.kv_bytes_per_block_per_gpu(layer_slots, block_size, tp);
    let num_blocks = (available / bytes_per_block as f64).floor() as usize;
    if num_blocks == 0 {
        return Err(RooflineError::NoRoomForABlock {
            available_gb: available / GB,
            block_bytes: bytes_per_block,
            block_size,
            kv_per_token: (bytes_per_block / block_size as u64) as usize,
        });
    }
    Ok(KvBudget {
        requested_bytes: requested,
        weight_bytes_per_gpu: weights,
        reserve_bytes: reserve,
        available_bytes: available,
        layer_slots,
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
