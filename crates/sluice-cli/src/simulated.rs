//! `serve --executor simulated`: what a simulated executor runs on (the
//! profile, the model's shape, the KV pool sized as vLLM sizes it) and the
//! executor itself. `sluice simulate` sizes its pool here too, so the two
//! commands give one model the same blocks.

use crate::exit::bad_config;
use crate::options::SchedulerArgs;
use anyhow::Result;
use sluice_core::kv_cache::GroupingPolicy;
use sluice_engine::TokenId;
use sluice_model::config::ModelConfig;
use sluice_server::logging;
use sluice_sim::{LayeredShape, SimulatedExecutor, StepTimeModel};

/// What `serve --executor simulated` runs on.
#[derive(Clone, Debug)]
pub struct Simulation {
    /// `--profile`: a built-in hardware name or a profile JSON file.
    pub profile: String,
    /// `--tensor-parallel-size`: GPUs the simulated model is split over.
    pub tensor_parallel_size: usize,
}

/// The fraction of the profile's memory the simulated KV cache and weights
/// may use (vLLM 0.33's `--gpu-memory-utilization` default, `config/cache.py`).
const SIMULATED_GPU_MEMORY_UTILIZATION: f64 = 0.92;

/// Most KV blocks a simulated cache gets from a profile's memory (16 Mi
/// tokens at block size 16: more than a real deployment of a small model
/// holds, and the scheduler's per-block bookkeeping stays in the tens of
/// MiB). `--num-gpu-blocks-override` is not capped.
pub const MAX_SIMULATED_KV_BLOCKS: usize = 1 << 20;

/// The step-time model `--profile SPEC` gives `shape` on `tp` GPUs: a
/// built-in hardware name (the roofline on it) or a profile JSON (roofline,
/// fitted by `sluice simulate fit`, or table).
pub fn load_profile(
    spec: &str,
    shape: &sluice_sim::ModelShape,
    tensor_parallel_size: usize,
) -> Result<(sluice_sim::Profile, Box<dyn StepTimeModel + Send + Sync>)> {
    let profile = sluice_sim::Profile::load(spec)
        .map_err(|e| bad_config(format!("--profile {spec}: {e}")))?;
    let model = profile
        .step_model(Some(shape), tensor_parallel_size)
        .map_err(|e| bad_config(format!("--profile {spec}: {e}")))?;
    Ok((profile, model))
}

/// The shape a simulated server sizes and times: read from the model's
/// own files by the reader `sluice simulate` uses (`ModelShape::load`: a
/// directory's `config.json`, a GGUF file's metadata and stored bytes), so
/// both size one model alike; a built-in config (no files) gives its own.
pub fn simulated_shape(
    resolved: Option<&crate::hub::ResolvedModel>,
    config: &ModelConfig,
) -> Result<LayeredShape> {
    match resolved {
        Some(r) => {
            LayeredShape::from_path(&r.path).map_err(|e| bad_config(format!("--model: {e}")))
        }
        None => Ok(LayeredShape {
            shape: config.shape(),
            layer_kinds: sluice_model::model::DecoderPlan::of(config).attention_kinds(),
        }),
    }
}

/// KV blocks of a simulated cache, as vLLM sizes them
/// (`sluice_sim::roofline::kv_cache_budget_grouped`: the GPU's memory at
/// `gpu_memory_utilization`, less the weights' share and the profile's
/// activation reserve, in blocks of the shared pool, one block a page of
/// each layer slot of a KV cache group grouped under `grouping`), at most
/// `MAX_SIMULATED_KV_BLOCKS`. A fitted or table profile without a
/// hardware section has no memory to size from: `--num-gpu-blocks-override`
/// must say; a table measured by `bench-model --profile` gives the cache
/// its runner had. Returns the blocks and a line saying how they were sized.
pub fn simulated_kv_blocks(
    profile: &sluice_sim::Profile,
    shape: &LayeredShape,
    grouping: GroupingPolicy,
    tp: usize,
    gpu_memory_utilization: f64,
    block_size: usize,
) -> Result<(usize, String)> {
    if let Some(kv) = profile.measured_kv_cache() {
        // A measured table knows the cache its runner had.
        let blocks = kv.blocks_of(block_size);
        return Ok((
            blocks,
            format!(
                "{blocks} KV blocks of {block_size} tokens (the measured runner's cache: {} \
                 blocks of {})",
                kv.num_blocks, kv.block_size
            ),
        ));
    }
    let hardware = match (profile.hardware(), profile.memory_bytes()) {
        (Some(hw), _) => *hw,
        // Memory without a hardware section: no activation reserve known.
        (None, Some(memory)) => sluice_sim::Hardware {
            memory_bytes: memory,
            activation_reserve_bytes: 0.0,
            ..sluice_sim::Hardware::H100_SXM
        },
        (None, None) => {
            return Err(bad_config(format!(
                "--num-gpu-blocks-override: the {} profile records no memory size, so the \
                 KV cache size must be given",
                profile.kind()
            )))
        }
    };
    let b = sluice_sim::roofline::kv_cache_budget_grouped(
        shape,
        grouping,
        &hardware,
        tp,
        gpu_memory_utilization,
        block_size,
    )
    .map_err(|e| bad_config(format!("--gpu-memory-utilization: {e}")))?;
    let blocks = b.num_blocks.min(MAX_SIMULATED_KV_BLOCKS);
    let groups = shape.kv_layer_groups(grouping);
    let per_block = if groups.is_hybrid() {
        format!(
            ", a block {} layer pages ({} KV cache groups of {} layers)",
            b.layer_slots,
            groups.specs.len(),
            b.layer_slots
        )
    } else {
        String::new()
    };
    Ok((
        blocks,
        format!(
            "{blocks} KV blocks: {:.1} GB per GPU × {gpu_memory_utilization} − {:.1} GB of \
             weights − {:.1} GB reserve{per_block}",
            hardware.memory_bytes / 1e9,
            b.weight_bytes_per_gpu / 1e9,
            b.reserve_bytes / 1e9
        ),
    ))
}

/// `serve --executor simulated`'s executor: no weights, steps timed by
/// `sim`'s profile, a KV pool sized from `shape` (or the override).
pub fn simulated_executor(
    sim: &Simulation,
    shape: &LayeredShape,
    sched: &SchedulerArgs,
    vocab: usize,
    seed: u64,
    eos_ids: Vec<TokenId>,
) -> Result<SimulatedExecutor> {
    let tp = sim.tensor_parallel_size;
    let (profile, step_model) = load_profile(&sim.profile, &shape.shape, tp)?;
    let grouping = sched.grouping();
    let blocks = match sched.num_gpu_blocks_override {
        Some(n) => n,
        None => {
            simulated_kv_blocks(
                &profile,
                shape,
                grouping,
                tp,
                SIMULATED_GPU_MEMORY_UTILIZATION,
                sched.block_size,
            )?
            .0
        }
    };
    logging::info(&format!(
        "simulated executor: no weights loaded; steps take the time --profile {} predicts \
         (tensor parallel {tp}), {blocks} KV blocks",
        sim.profile
    ));
    Ok(
        SimulatedExecutor::new(step_model, blocks, sched.block_size, vocab, seed)
            .with_excluded_tokens(eos_ids)
            .with_kv_cache_groups(shape.kv_layer_groups(grouping).specs)
            .with_outside_range_warning(Box::new(logging::warn)),
    )
}

/// Why a simulated engine refuses a speculative config without
/// synthetic acceptance.
pub const NEEDS_SYNTHETIC: &str = "--speculative-config: the simulated executor has no model \
     to verify drafts: give \"rejection_sample_method\": \"synthetic\" with \
     synthetic_acceptance_length (mean tokens per verification) or synthetic_acceptance_rates";

/// The simulator's speculative decoding from `--speculative-config`: k by
/// batch size, and the synthetic acceptance rates (required).
pub fn sim_speculation(
    spec: &sluice_model::SpeculativeConfig,
    max_num_seqs: usize,
    max_model_len: usize,
) -> Result<sluice_sim::SimSpeculation> {
    let rates = spec
        .synthetic_acceptance_rates
        .as_ref()
        .ok_or_else(|| crate::exit::bad_config(NEEDS_SYNTHETIC))?;
    Ok(sluice_sim::SimSpeculation::new(
        spec.k_by_batch_size(max_num_seqs),
        rates,
        max_model_len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_kv_blocks_come_from_the_profiles_memory() {
        let (config, _) = sluice_model::builtin::config("qwen2.5-0.5b").unwrap();
        let shape = config.shape();
        assert_eq!(shape, sluice_sim::ModelShape::QWEN2_5_0_5B);
        let h100 = sluice_sim::Profile::load("h100-sxm").unwrap();
        let hw = *h100.hardware().unwrap();
        let layered = LayeredShape::all_full(shape);
        let on = GroupingPolicy::default();
        let (blocks, why) = simulated_kv_blocks(&h100, &layered, on, 1, 0.5, 16).unwrap();
        // K and V × 24 layers × 2 KV heads × 64 × 2 bytes, per token.
        let per_block = (2 * 24 * 2 * 64 * 2 * 16) as f64;
        let usable = (hw.memory_bytes * 0.5).ceil()
            - shape.weight_bytes() as f64
            - hw.activation_reserve_bytes;
        let want = ((usable / per_block) as usize).min(MAX_SIMULATED_KV_BLOCKS);
        assert_eq!(blocks, want, "{why}");
        // A table profile without memory needs the override.
        let table = sluice_sim::Profile::from_json_str(
            r#"{"kind": "table", "table": {
                "prefill": {"chunk_tokens": [256, 1024], "context": [0, 4096],
                            "time_s": [[0.020, 0.030], [0.060, 0.080]]},
                "decode": {"batch_size": [1, 16], "mean_context": [512, 4096],
                           "time_s": [[0.010, 0.012], [0.013, 0.018]]},
                "step_overhead_s": 0.004}}"#,
            "t.json",
        )
        .unwrap();
        let e = simulated_kv_blocks(&table, &layered, on, 1, 0.92, 16).unwrap_err();
        assert!(
            format!("{e:#}").contains("--num-gpu-blocks-override"),
            "{e:#}"
        );
    }
}
