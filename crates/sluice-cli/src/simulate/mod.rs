//! `sluice simulate`: serving on simulated hardware, driven by sluice's real
//! scheduler (`sluice-sim`), and `sluice simulate fit`, which fits a
//! step-time profile to a `sluice serve --step-log` file.
//!
//! The command owns the translation from flags to a simulation: the
//! workload (`vllm bench serve`'s flag names where they exist; with
//! `--tokenizer` the random dataset and arrival times are vLLM's own, draw
//! for draw, as `sluice bench` sends them), the model shape and hardware
//! profile, the KV cache size (vLLM's `--gpu-memory-utilization` rule), the
//! cluster (replicas, router, P/D), and the outputs (vLLM's summary, the
//! `--save-result` JSON keys, a step timeline CSV, rate and replica
//! sweeps against an SLO).

use crate::bench;
use crate::exit::{bad_config, exit_code};
use crate::options::{hash_seed_from_env, SchedulerArgs};
use crate::simulated::simulated_kv_blocks;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use sluice_core::SchedulerConfig;
use sluice_sim::conversation::{ConversationWorkload, ThinkTime};
use sluice_sim::lengths::LengthDist;
use sluice_sim::profile::{FittedProfile, Profile, StepRange};
use sluice_sim::roofline::Hardware;
use sluice_sim::router::RouterKind;
use sluice_sim::timeline::TimelineWriter;
use sluice_sim::traces::{load_trace_with, LoadedTrace, TraceOptions};
use sluice_sim::workload::WorkloadError;
use sluice_sim::{
    LayeredShape, PdConfig, RandomWorkload, SimReport, SimRequest, SimResult, Simulator, Slo,
    StepTimeModel,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

mod args;
mod fit;
mod report;
mod run;
mod sweep;

pub use args::SimulateArgs;
use args::*;
use fit::*;
use report::*;
use run::*;
use sweep::*;

pub fn run(args: SimulateArgs) -> ExitCode {
    let result = match args.command {
        Some(SimulateCommand::Fit(fit)) => run_fit(&fit),
        None => run_simulation(&args.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice simulate: {e:#}");
            exit_code(&e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_and_pd_parse_and_refuse_nonsense() {
        assert_eq!(parse_sweep_rate("1:3:1").unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(
            parse_sweep_rate("0.5:1.5:0.5").unwrap(),
            vec![0.5, 1.0, 1.5]
        );
        assert!(parse_sweep_rate("3:1:1").is_err());
        assert!(parse_sweep_rate("1:3").is_err());
        assert!(parse_sweep_rate("1:x:1").is_err());
        assert!(parse_sweep_rate("1:100000:0.001").is_err());
        assert_eq!(parse_pd("1:3").unwrap(), (1, 3));
        assert!(parse_pd("0:3").is_err());
        assert!(parse_pd("13").is_err());
        assert_eq!(parse_range("--sweep-replicas", "1:8").unwrap(), (1, 8));
        assert!(parse_range("--sweep-replicas", "0:8").is_err());
    }
}
