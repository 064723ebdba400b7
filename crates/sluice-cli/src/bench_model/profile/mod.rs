//! `bench-model --profile PATH`: a table profile (`sluice_sim::TableModel`)
//! measured on a designed grid of step shapes with the real scheduler and
//! model runner, for `sluice simulate --hardware PATH` and `serve
//! --executor simulated --profile PATH`.
//!
//! The grid covers what the engine's limits allow: prefill chunks of 1 to
//! `--max-num-batched-tokens` tokens on 0 to ¾ of `--profile-max-model-len`
//! cached tokens; decode batches of 1 to `max(--concurrency)` rows at mean
//! contexts from 2 to the longest a request can have; and a few mixed steps.
//! Every point is `--repeats` steps of exactly that shape, each timed as the
//! engine times a step (schedule + forward + update); the table keeps their
//! median and their spread (slowest − fastest).
//!
//! `grid` chooses the points from the engine's limits; `measure` measures
//! them; this module writes the profile and describes the machine it was
//! measured on.

mod grid;
mod measure;

use super::{Bench, BenchModelArgs};
use crate::exit::config_error;
use anyhow::{Context, Result};
use grid::{Grid, GridLimits};
use measure::ms_list;
use sluice_core::kv_cache::GroupingPolicy;
use sluice_model::kv_cache::{KvCacheConfig, KvDtype};
use sluice_sim::profile::TableProfile;
use sluice_sim::{MeasuredKvCache, MeasuredOn, MixedRule, Profile};
use std::path::Path;

/// Prints the reference step's times and warns when they differ by more
/// than 15 %: the machine changed speed during the measurement, and the
/// grid holds points of both speeds.
fn report_speed_probe(probes: &[f64]) {
    eprintln!(
        "  reference step (1 decode row) before, between and after the parts: {} ms",
        ms_list(probes)
    );
    let lo = probes.iter().copied().fold(f64::MAX, f64::min);
    let hi = probes.iter().copied().fold(0.0, f64::max);
    if hi > lo * 1.15 {
        sluice_server::logging::warn(&format!(
            "bench-model --profile: the reference step took {:.2} to {:.2} ms ({:+.0} %) during \
             the measurement: the machine's speed varied, and the grid's points saw different \
             speeds; measure on a quieter machine, or with more --repeats, or compare two \
             profiles",
            lo * 1e3,
            hi * 1e3,
            (hi / lo - 1.0) * 100.0
        ));
    }
}

/// The CPU's model name (from `/proc/cpuinfo` where there is one) and the
/// instruction sets the kernels can use.
fn cpu_description() -> String {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{name} ({})", sluice_model::kernels::cpu_features())
}

/// Measures the grid `args` asks for and writes the table profile to
/// `path`; prints the grid, its cost and the mixed-step check on stderr.
pub(super) fn write(
    b: &mut Bench,
    args: &BenchModelArgs,
    path: &Path,
    model: &str,
    kv_dtype: KvDtype,
) -> Result<()> {
    let limits = GridLimits {
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_batch: args.concurrency.iter().copied().max().unwrap_or(1),
        max_model_len: args.profile_max_model_len,
        block_size: args.block_size,
        repeats: args.repeats,
    };
    let grid = Grid::new(&limits).map_err(config_error)?;
    let grouping = GroupingPolicy {
        hybrid: !args.disable_hybrid_kv_cache_manager,
        ..GroupingPolicy::default()
    };
    let serve_kv = KvCacheConfig::new(args.block_size, 0)
        .with_grouping(grouping)
        .with_dtype(kv_dtype)
        .with_memory_budget(&b.loaded.config, args.kv_cache_memory)
        .context("--kv-cache-memory")
        .map_err(config_error)?;
    eprintln!(
        "profiling {model}: prefill chunks {:?} x contexts {:?}, decode batches {:?} x prompts \
         {:?}, {} repeats each (times in ms)",
        grid.chunks, grid.contexts, grid.batches, grid.prompts, args.repeats
    );
    let m = b.measure_grid(&grid, args.repeats)?;
    for (q, p) in m.mixed.iter().zip(&m.mixed_predicted) {
        eprintln!(
            "  mixed {:>3} rows + {:>4} tokens: {:.2} ms measured, {:.2} predicted",
            q.batch_size,
            q.chunk_tokens,
            q.time_s * 1e3,
            p * 1e3
        );
    }
    let worst = m
        .mixed
        .iter()
        .zip(&m.mixed_predicted)
        .fold(0.0f64, |w, (q, p)| w.max(((p - q.time_s) / q.time_s).abs()));
    let rule = match m.table.mixed_rule {
        MixedRule::Additive => "additive",
        MixedRule::Merged => "merged",
    };
    let description = format!(
        "measured by sluice bench-model --profile in {:.0} s; mixed steps priced by the {rule} \
         rule, off by at most {:.1} % on the {} measured",
        m.cost_s,
        100.0 * worst,
        m.mixed.len()
    );
    let profile = Profile::Table(TableProfile {
        name: Some(format!("{model}, {} threads", args.threads)),
        description: Some(description.clone()),
        tensor_parallel: None,
        memory_bytes: None,
        kv_cache: Some(MeasuredKvCache {
            num_blocks: serve_kv.num_blocks,
            block_size: args.block_size,
        }),
        measured_on: Some(MeasuredOn {
            model: model.to_string(),
            cpu: cpu_description(),
            threads: args.threads,
            repeats: args.repeats,
            cost_s: m.cost_s,
            speed_probe_s: m.speed_probe_s.clone(),
        }),
        mixed_measured: Some(m.mixed),
        table: m.table,
    });
    profile
        .save(path)
        .with_context(|| format!("--profile {}", path.display()))
        .map_err(config_error)?;
    eprintln!("{description}");
    report_speed_probe(&m.speed_probe_s);
    eprintln!(
        "wrote {} (KV cache: {} blocks of {} tokens, as --kv-cache-memory {} gives)",
        path.display(),
        serve_kv.num_blocks,
        args.block_size,
        args.kv_cache_memory
    );
    Ok(())
}
