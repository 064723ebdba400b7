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
use crate::options::{hash_seed_from_env, simulated_kv_blocks, SchedulerArgs};
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
    ModelShape, PdConfig, RandomWorkload, SimReport, SimRequest, SimResult, Simulator, Slo,
    StepTimeModel,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimulateArgs {
    #[command(subcommand)]
    command: Option<SimulateCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum SimulateCommand {
    /// Fit a step-time profile to a `sluice serve --step-log` file (least
    /// squares; prints its error on held-out steps).
    Fit(FitArgs),
}

#[derive(Args, Debug)]
struct FitArgs {
    /// The step log (one JSON line per engine step).
    step_log: PathBuf,
    /// Where to write the profile JSON (for --hardware / --profile).
    #[arg(short, long, value_name = "PROFILE.json")]
    output: PathBuf,
    /// A name recorded in the profile (e.g. "smollm2-135m-q4_1 on 2 cores").
    #[arg(long)]
    name: Option<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The model whose shape is simulated: a built-in name (Qwen2.5-7B,
    /// Llama-3.1-8B, Mixtral-8x7B, ...), a Hugging Face config.json or model
    /// directory, or a GGUF file. Only the shape is read.
    #[arg(
        long,
        value_name = "NAME|config.json|DIR|FILE.gguf",
        default_value = "Qwen2.5-7B"
    )]
    model: String,
    /// A built-in hardware profile (A100-80GB, H100-SXM, H200, L40S, B200)
    /// or a profile JSON (roofline, fitted by `simulate fit`, or table).
    #[arg(
        long,
        alias = "profile",
        value_name = "NAME|PROFILE.json",
        default_value = "H100-SXM"
    )]
    hardware: String,
    /// GPUs per replica (tensor parallelism).
    #[arg(long, alias = "tp", value_name = "N", default_value_t = 1)]
    tensor_parallel_size: usize,
    /// The fraction of each GPU's memory the engine may use (vLLM's
    /// meaning: weights, activations and KV cache together).
    #[arg(long, value_name = "F", default_value_t = 0.92)]
    gpu_memory_utilization: f64,
    #[command(flatten)]
    sched: SchedulerArgs,

    /// random (synthetic), trace (--dataset-path: JSONL, Azure CSV or a
    /// `sluice replay` trace) or multi-turn (conversations).
    #[arg(long, default_value = "random", value_parser = ["random", "trace", "multi-turn"])]
    dataset_name: String,
    /// The trace file with --dataset-name trace.
    #[arg(long, value_name = "FILE")]
    dataset_path: Option<PathBuf>,
    /// A Hugging Face tokenizer directory: --dataset-name random then
    /// draws vLLM's own prompts and arrival times (NumPy's streams), the
    /// requests `sluice bench` / `vllm bench serve` send with this seed.
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<PathBuf>,
    #[arg(long, value_name = "N", default_value_t = 1024)]
    random_input_len: usize,
    #[arg(long, value_name = "N", default_value_t = 128)]
    random_output_len: usize,
    /// Lengths uniform in [len·(1−r), len·(1+r)].
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    random_range_ratio: f64,
    /// Shared leading tokens of every prompt (of each group's prompts
    /// with --num-prefix-groups).
    #[arg(long, value_name = "N", default_value_t = 0)]
    random_prefix_len: usize,
    /// Distinct shared prefixes (system prompts); each request picks one.
    #[arg(
        long,
        alias = "prefix-repetition-num-prefixes",
        value_name = "N",
        default_value_t = 1
    )]
    num_prefix_groups: usize,
    /// Input lengths instead of the uniform rule: uniform:LEN[,RATIO],
    /// normal:MEAN,STD, lognormal:MEAN,STD or empirical:PATH.
    #[arg(long, value_name = "DIST")]
    input_len_dist: Option<LengthDist>,
    /// Output lengths, as --input-len-dist.
    #[arg(long, value_name = "DIST")]
    output_len_dist: Option<LengthDist>,
    /// Requests (conversations with multi-turn).
    #[arg(long, alias = "num-requests", value_name = "N", default_value_t = 1000)]
    num_prompts: usize,
    /// Send for this many seconds at --request-rate instead of
    /// --num-prompts requests.
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Requests per second (conversations per second with multi-turn):
    /// inf sends all at once; otherwise Poisson (gamma with --burstiness).
    #[arg(long, value_name = "RPS", default_value_t = f64::INFINITY)]
    request_rate: f64,
    #[arg(long, value_name = "B", default_value_t = 1.0)]
    burstiness: f64,
    /// Most requests in flight from the client.
    #[arg(long, alias = "concurrency", value_name = "N")]
    max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Turns per conversation (multi-turn): a number or a distribution.
    #[arg(long, value_name = "N|DIST", default_value = "uniform:4,0.5")]
    num_turns: LengthDist,
    /// Mean think time between turns, seconds (exponential).
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    think_time: f64,

    /// Identical replicas behind --router.
    #[arg(long, value_name = "N", default_value_t = 1)]
    replicas: usize,
    /// round-robin, random, least-requests, least-kv, power-of-two or
    /// prefix-aware.
    #[arg(long, value_name = "POLICY", default_value = "round-robin")]
    router: RouterKind,
    /// Prefill/decode disaggregation: P prefill and D decode replicas
    /// (instead of --replicas).
    #[arg(long, value_name = "P:D", conflicts_with = "replicas")]
    pd: Option<String>,
    /// KV transfer bandwidth between P and D replicas, GB/s [default: the
    /// hardware's interconnect bandwidth].
    #[arg(long, value_name = "GB/S")]
    kv_link_bandwidth: Option<f64>,

    /// Print the result as JSON (`vllm bench serve --save-result` keys).
    #[arg(long)]
    json: bool,
    /// Also print each replica's figures.
    #[arg(long)]
    per_replica: bool,
    /// Write one CSV row per engine step.
    #[arg(long, value_name = "FILE.csv")]
    timeline: Option<PathBuf>,
    /// Service-level objectives, milliseconds: ttft=MS,tpot=MS[,e2el=MS]
    /// [,attainment=F]; reports goodput.
    #[arg(long, value_name = "SLO")]
    slo: Option<Slo>,
    /// Run every rate of A:B:STEP (requests per second) and report the
    /// largest that meets --slo.
    #[arg(long, value_name = "A:B:STEP", conflicts_with = "sweep_replicas")]
    sweep_rate: Option<String>,
    /// Run with A..=B replicas and report the fewest that meet --slo.
    #[arg(long, value_name = "A:B")]
    sweep_replicas: Option<String>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

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

fn run_fit(args: &FitArgs) -> Result<()> {
    let file = args.step_log.display().to_string();
    let records =
        sluice_sim::fit::read_step_log(&args.step_log).map_err(|e| bad_config(e.to_string()))?;
    let report = sluice_sim::fit(&records, &sluice_sim::FitOptions::default())
        .map_err(|e| bad_config(format!("{file}: {e}")))?;
    let mut fitted = FittedProfile::from_report(&report, file.clone());
    fitted.name = args.name.clone();
    fitted.fitted_range = StepRange::of(&records);
    Profile::Fitted(fitted)
        .save(&args.output)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "fitted {} steps of {file} ({} held out, {} skipped)",
        report.train_steps, report.held_out_steps, report.skipped_steps
    );
    for c in &report.candidates {
        println!(
            "  {:<24} validation MAPE {:>6.2}%",
            format!("{:?}", c.segmentation),
            c.validation_mape_pct
        );
    }
    println!(
        "chosen: {:?}, {} piece(s)",
        report.model.segmentation,
        report.model.pieces.len()
    );
    println!(
        "held-out error: MAPE {:.2}%, median {:.2}%, p90 {:.2}%{}",
        report.held_out_mape_pct,
        report.held_out_median_ape_pct,
        report.held_out_p90_ape_pct,
        report
            .held_out_r2
            .map_or(String::new(), |r2| format!(", R² {r2:.4}"))
    );
    println!("wrote {}", args.output.display());
    Ok(())
}

/// A range `A:B:STEP` of rates.
fn parse_sweep_rate(s: &str) -> Result<Vec<f64>> {
    let parts: Vec<&str> = s.split(':').collect();
    let num = |p: &str| -> Result<f64> {
        p.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| bad_config(format!("--sweep-rate: {p:?} is not a positive number")))
    };
    let [a, b, step] = parts[..] else {
        return Err(bad_config(format!(
            "--sweep-rate: {s:?} is not A:B:STEP (e.g. 1:20:1)"
        )));
    };
    let (a, b, step) = (num(a)?, num(b)?, num(step)?);
    if b < a {
        return Err(bad_config(format!("--sweep-rate: {b} is below {a}")));
    }
    let n = ((b - a) / step + 1e-9).floor() as usize + 1;
    if n > 1000 {
        return Err(bad_config(format!(
            "--sweep-rate: {n} rates is too many (at most 1000)"
        )));
    }
    Ok((0..n).map(|i| a + step * i as f64).collect())
}

fn parse_range(flag: &str, s: &str) -> Result<(usize, usize)> {
    let bad = || bad_config(format!("{flag}: {s:?} is not A:B (e.g. 1:8)"));
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let a: usize = a.trim().parse().map_err(|_| bad())?;
    let b: usize = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || b < a || b > 4096 {
        return Err(bad_config(format!(
            "{flag}: {s:?} must be 1 ≤ A ≤ B ≤ 4096"
        )));
    }
    Ok((a, b))
}

fn parse_pd(s: &str) -> Result<(usize, usize)> {
    let bad = || bad_config(format!("--pd: {s:?} is not P:D (e.g. 1:3)"));
    let (p, d) = s.split_once(':').ok_or_else(bad)?;
    let p: usize = p.trim().parse().map_err(|_| bad())?;
    let d: usize = d.trim().parse().map_err(|_| bad())?;
    if p == 0 || d == 0 {
        return Err(bad_config(format!(
            "--pd: {s:?} needs at least one prefill and one decode replica"
        )));
    }
    Ok((p, d))
}

/// Everything fixed for a run except the request rate and replica count.
struct Setup {
    shape: ModelShape,
    model: Box<dyn StepTimeModel + Send + Sync>,
    hardware: Option<Hardware>,
    config: SchedulerConfig,
    kv_note: String,
    /// A fitted profile's range: runs say how many steps went beyond it.
    fitted_range: Option<StepRange>,
    /// `--dataset-name trace`'s file, read once.
    trace: Option<LoadedTrace>,
}

/// Token ids of synthetic prompts are drawn below this.
const SYNTHETIC_VOCAB: u32 = 32_000;

fn setup(args: &RunArgs) -> Result<Setup> {
    let shape = ModelShape::load(&args.model).map_err(|e| bad_config(format!("--model: {e}")))?;
    if args.tensor_parallel_size == 0 {
        return Err(bad_config("--tensor-parallel-size: must be at least 1"));
    }
    let profile =
        Profile::load(&args.hardware).map_err(|e| bad_config(format!("--hardware: {e}")))?;
    let model = profile
        .step_model(Some(&shape), args.tensor_parallel_size)
        .map_err(|e| bad_config(format!("--hardware {}: {e}", args.hardware)))?;
    let hardware = profile.hardware().copied();
    let fitted_range = match &profile {
        Profile::Fitted(f) => f.fitted_range,
        _ => None,
    };
    let s = &args.sched;
    if s.block_size == 0 {
        return Err(bad_config("--block-size: must be at least 1"));
    }
    let (num_gpu_blocks, kv_note) = match s.num_gpu_blocks_override {
        Some(n) => (n, format!("{n} KV blocks (--num-gpu-blocks-override)")),
        None => simulated_kv_blocks(
            &profile,
            &shape,
            args.tensor_parallel_size,
            args.gpu_memory_utilization,
            s.block_size,
        )?,
    };
    let enable_chunked_prefill = !s.no_enable_chunked_prefill;
    let max_model_len = s.max_model_len.unwrap_or(32_768);
    let config = SchedulerConfig {
        max_num_seqs: s.max_num_seqs,
        max_num_batched_tokens: s
            .max_num_batched_tokens
            .unwrap_or(if enable_chunked_prefill {
                8192
            } else {
                max_model_len.max(8192)
            }),
        max_model_len,
        block_size: s.block_size,
        num_gpu_blocks,
        enable_prefix_caching: !s.no_enable_prefix_caching,
        enable_chunked_prefill,
        long_prefill_token_threshold: s.long_prefill_token_threshold,
        policy: s.scheduling_policy,
        prefix_caching_hash_algo: s.prefix_caching_hash_algo,
        hash_seed: hash_seed_from_env().map_err(bad_config)?,
        ..SchedulerConfig::default()
    };
    // A `sluice replay` trace was recorded under its own scheduler config:
    // its decisions are that config's, so it replaces the flags'.
    let trace = load_trace_dataset(args)?;
    let replay = trace
        .as_ref()
        .and_then(|t| t.replay.as_ref())
        .map(|r| r.config.clone());
    let (config, kv_note) = match replay {
        Some(replay) => {
            eprintln!(
                "sluice simulate: the replay trace sets the scheduler config ({} KV blocks of \
                 {} tokens, {} batched tokens); the scheduler flags are not used",
                replay.num_gpu_blocks, replay.block_size, replay.max_num_batched_tokens
            );
            let note = format!(
                "{} KV blocks (the replay trace's config)",
                replay.num_gpu_blocks
            );
            (replay, note)
        }
        None => (config, kv_note),
    };
    sluice_core::Scheduler::new(config.clone()).map_err(|e| bad_config(e.to_string()))?;
    Ok(Setup {
        shape,
        model,
        hardware,
        config,
        kv_note,
        fitted_range,
        trace,
    })
}

/// The trace file of `--dataset-name trace`, read once for every run.
fn load_trace_dataset(args: &RunArgs) -> Result<Option<LoadedTrace>> {
    if args.dataset_name != "trace" {
        return Ok(None);
    }
    let path = args
        .dataset_path
        .as_ref()
        .ok_or_else(|| bad_config("--dataset-path: --dataset-name trace needs a trace file"))?;
    let opts = TraceOptions {
        seed: args.seed,
        vocab: SYNTHETIC_VOCAB,
        max_requests: None,
    };
    let loaded = load_trace_with(path, &opts).map_err(|e| bad_config(e.to_string()))?;
    if let Some(replay) = &loaded.replay {
        if !replay.aborts.is_empty() {
            eprintln!(
                "sluice simulate: the trace aborts {} request(s); aborts are not simulated, \
                 those requests run to their output length",
                replay.aborts.len()
            );
        }
    }
    Ok(Some(loaded))
}

/// The requests of one run at `rate` requests (or conversations) per second.
fn workload(args: &RunArgs, setup: &Setup, rate: f64) -> Result<Vec<SimRequest>> {
    let config = &setup.config;
    let vocab = SYNTHETIC_VOCAB;
    match args.dataset_name.as_str() {
        "trace" => match &setup.trace {
            Some(trace) => Ok(trace.requests.clone()),
            None => Err(bad_config(
                "--dataset-path: --dataset-name trace needs a trace file",
            )),
        },
        "multi-turn" => {
            let w = ConversationWorkload {
                num_conversations: args.num_prompts,
                duration_s: args.duration,
                conversation_rate: rate,
                burstiness: args.burstiness,
                turns: args.num_turns.clone(),
                first_message: args.input_len_dist.clone().unwrap_or(LengthDist::Uniform {
                    len: args.random_input_len,
                    range_ratio: args.random_range_ratio,
                }),
                later_message: args.input_len_dist.clone().unwrap_or(LengthDist::Uniform {
                    len: args.random_input_len,
                    range_ratio: args.random_range_ratio,
                }),
                output: args.output_len_dist.clone().unwrap_or(LengthDist::Uniform {
                    len: args.random_output_len,
                    range_ratio: args.random_range_ratio,
                }),
                think_time: ThinkTime::Exponential {
                    mean: args.think_time,
                },
                system_prompt_len: args.random_prefix_len,
                num_system_prompts: args.num_prefix_groups,
                max_model_len: config.max_model_len,
                seed: args.seed,
                vocab,
            };
            w.generate().map_err(workload_error)
        }
        _ => match &args.tokenizer {
            Some(dir) => vllm_random_workload(args, dir, rate),
            None => RandomWorkload {
                num_prompts: args.num_prompts,
                input_len: args.random_input_len,
                output_len: args.random_output_len,
                range_ratio: args.random_range_ratio,
                prefix_len: args.random_prefix_len,
                num_prefix_groups: args.num_prefix_groups,
                request_rate: rate,
                burstiness: args.burstiness,
                seed: args.seed,
                vocab,
                input_dist: args.input_len_dist.clone(),
                output_dist: args.output_len_dist.clone(),
                duration_s: args.duration,
                ..RandomWorkload::default()
            }
            .generate()
            .map_err(workload_error),
        },
    }
}

/// A workload the generator refused, under the flag that set the field.
fn workload_error(e: WorkloadError) -> anyhow::Error {
    let flag = |field: &str| match field {
        "request_rate" | "conversation_rate" => "--request-rate",
        "burstiness" => "--burstiness",
        "duration_s" => "--duration",
        "range_ratio" => "--random-range-ratio",
        "num_prefix_groups" | "num_system_prompts" => "--num-prefix-groups",
        "input_len" | "input lengths" | "first message lengths" | "later message lengths" => {
            "--random-input-len / --input-len-dist"
        }
        "output_len" | "output lengths" | "output" => "--random-output-len / --output-len-dist",
        "think_time" => "--think-time",
        "turns" => "--num-turns",
        _ => "",
    };
    let (field, message) = match &e {
        WorkloadError::Invalid(field, what) => (*field, format!("must be {what}")),
        WorkloadError::Length { field, source } => (*field, source.to_string()),
        WorkloadError::TooMany { .. } => ("", e.to_string()),
    };
    match flag(field) {
        "" => bad_config(e.to_string()),
        f => bad_config(format!("{f}: {message}")),
    }
}

/// `vllm bench serve --dataset-name random`'s requests and send times,
/// exactly (the same code `sluice bench` sends them with).
fn vllm_random_workload(
    args: &RunArgs,
    dir: &std::path::Path,
    rate: f64,
) -> Result<Vec<SimRequest>> {
    if args.input_len_dist.is_some() || args.output_len_dist.is_some() || args.duration.is_some() {
        return Err(bad_config(
            "--tokenizer draws vLLM's own random dataset: it takes --random-* lengths and \
             --num-prompts, not --input-len-dist / --output-len-dist / --duration",
        ));
    }
    if args.num_prefix_groups != 1 {
        return Err(bad_config(
            "--num-prefix-groups: vLLM's random dataset has one shared prefix; drop \
             --tokenizer to simulate several",
        ));
    }
    let seed = u32::try_from(args.seed)
        .map_err(|_| bad_config("--seed: with --tokenizer it must fit in 32 bits (NumPy's)"))?;
    let tok = bench::dataset::BenchTokenizer::from_dir(dir)
        .with_context(|| format!("--tokenizer {}", dir.display()))
        .map_err(crate::exit::config_error)?;
    let params = bench::dataset::RandomParams {
        num_requests: args.num_prompts,
        input_len: args.random_input_len,
        output_len: args.random_output_len,
        prefix_len: args.random_prefix_len,
        range_ratio: (args.random_range_ratio, args.random_range_ratio),
        seed,
        request_id_prefix: String::new(),
    };
    let samples =
        bench::dataset::sample_random(&tok, &params).map_err(crate::exit::config_error)?;
    let times = bench::arrivals::send_times(samples.len(), rate, args.burstiness, seed);
    samples
        .iter()
        .zip(times)
        .enumerate()
        .map(|(i, (s, t))| {
            let mut ids = tok.encode(&s.prompt)?;
            // The server adds the special tokens the count includes (BOS).
            while ids.len() < s.prompt_len {
                ids.insert(0, 0);
            }
            ids.truncate(s.prompt_len.max(1));
            Ok(SimRequest::new(
                format!("{i}"),
                t,
                ids,
                s.expected_output_len.max(1),
            ))
        })
        .collect()
}

fn simulate(
    args: &RunArgs,
    setup: &Setup,
    requests: &[SimRequest],
    replicas: usize,
    progress: Option<&indicatif::ProgressBar>,
) -> Result<SimResult> {
    let router = args.router;
    let seed = args.seed;
    let factory = move || router.build(seed);
    if args.max_concurrency == Some(0) {
        return Err(bad_config("--max-concurrency: must be at least 1"));
    }
    let mut sim = Simulator::new(setup.config.clone(), &*setup.model)
        .with_max_concurrency(args.max_concurrency);
    if let Some(pd) = &args.pd {
        let (p, d) = parse_pd(pd)?;
        let link = match (args.kv_link_bandwidth, &setup.hardware) {
            (Some(gbs), _) if gbs > 0.0 && gbs.is_finite() => gbs * 1e9,
            (Some(gbs), _) => {
                return Err(bad_config(format!(
                    "--kv-link-bandwidth: {gbs} must be a positive number of GB/s"
                )))
            }
            (None, Some(hw)) => hw.interconnect_bandwidth,
            (None, None) => {
                return Err(bad_config(
                    "--kv-link-bandwidth: the profile has no interconnect bandwidth; give one",
                ))
            }
        };
        sim = sim.with_pd(
            PdConfig {
                prefill: p,
                decode: d,
                kv_bytes_per_token: setup.shape.kv_bytes_per_token() as f64,
                link_bandwidth: link,
                transfer_latency_s: setup
                    .hardware
                    .as_ref()
                    .map_or(0.0, |h| h.collective_latency_s),
            },
            Box::new(factory),
        );
    } else if replicas > 1 {
        sim = sim.with_replicas(replicas, Box::new(factory));
    }
    if let Some(bar) = progress {
        let bar = bar.clone();
        sim = sim.with_progress(Box::new(move |done| bar.set_position(done as u64)));
    }
    sim.run(requests).map_err(|e| bad_config(e.to_string()))
}

fn progress_bar(args: &RunArgs, total: usize) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if args.no_progress || !std::io::stderr().is_terminal() || total < 10_000 {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {pos}/{len} requests ({eta} left)",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

/// One run's report as JSON: vLLM's `--save-result` keys, sluice's extras,
/// goodput under the SLO, per-replica figures.
fn report_json(args: &RunArgs, result: &SimResult, slo: Option<&Slo>, rate: f64) -> Value {
    let report = SimReport::from_result(result);
    let mut m: Map<String, Value> = match report.to_json() {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    m.insert("request_rate".into(), json_rate(rate));
    m.insert("burstiness".into(), json!(args.burstiness));
    m.insert("max_concurrency".into(), json!(args.max_concurrency));
    m.insert("num_prompts".into(), json!(result.requests.len()));
    m.insert("replicas".into(), json!(result.replicas.len()));
    if let Some(slo) = slo {
        let g = slo.goodput_of(result);
        m.insert("request_goodput".into(), json!(g.request_goodput));
        m.insert("slo".into(), json!(slo.to_string()));
        m.insert("slo_attainment".into(), json!(g.attainment()));
        m.insert("meets_slo".into(), json!(slo.meets(&g)));
    }
    if args.per_replica || result.replicas.len() > 1 {
        let per: Vec<Value> = (0..result.replicas.len())
            .map(|k| {
                let mut v = SimReport::for_replica(result, k).to_json();
                if let Value::Object(o) = &mut v {
                    o.insert("replica".into(), json!(k));
                    o.insert("role".into(), json!(replica_role(result, k)));
                }
                v
            })
            .collect();
        m.insert("per_replica".into(), Value::Array(per));
    }
    Value::Object(m)
}

/// What replica `k` does: prefill or decode under P/D, else both.
fn replica_role(result: &SimResult, k: usize) -> &'static str {
    if k < result.num_prefill_replicas {
        "prefill"
    } else if result.num_prefill_replicas > 0 {
        "decode"
    } else {
        "both"
    }
}

fn json_rate(rate: f64) -> Value {
    if rate.is_finite() {
        json!(rate)
    } else {
        json!("inf")
    }
}

/// vLLM's summary block, with the simulator's extras.
fn print_summary(args: &RunArgs, setup: &Setup, result: &SimResult, slo: Option<&Slo>) {
    let r = SimReport::from_result(result);
    let line = |k: &str, v: String| println!("{k:<40}{v:>12}");
    println!("{:=^52}", " Simulated Serving Benchmark Result ");
    line("Successful requests:", r.completed.to_string());
    if let Some(c) = args.max_concurrency {
        line("Maximum request concurrency:", c.to_string());
    }
    line("Benchmark duration (s):", format!("{:.2}", r.duration_s));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line(
        "Request throughput (req/s):",
        format!("{:.2}", r.request_throughput),
    );
    if let Some(slo) = slo {
        let g = slo.goodput_of(result);
        line(
            "Request goodput (req/s):",
            format!("{:.2}", g.request_goodput),
        );
        line("SLO attainment:", format!("{:.1}%", 100.0 * g.attainment()));
    }
    line(
        "Output token throughput (tok/s):",
        format!("{:.2}", r.output_throughput),
    );
    line(
        "Total Token throughput (tok/s):",
        format!("{:.2}", r.total_token_throughput),
    );
    for (title, name, s) in [
        ("Time to First Token", "TTFT", &r.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", &r.tpot),
        ("Inter-token Latency", "ITL", &r.itl),
        ("End-to-end Latency", "E2EL", &r.e2el),
    ] {
        println!("{:-^52}", title);
        line(&format!("Mean {name} (ms):"), format!("{:.2}", s.mean_ms));
        line(
            &format!("Median {name} (ms):"),
            format!("{:.2}", s.median_ms),
        );
        line(&format!("P90 {name} (ms):"), format!("{:.2}", s.p90_ms));
        line(&format!("P99 {name} (ms):"), format!("{:.2}", s.p99_ms));
    }
    println!("{:-^52}", "Engine");
    line("Preemptions:", r.num_preemptions.to_string());
    line(
        "Prefix cache hit rate:",
        format!("{:.1}%", 100.0 * r.prefix_cache_hit_rate),
    );
    line(
        "KV cache usage mean / peak:",
        format!(
            "{:.1}% / {:.1}%",
            100.0 * r.mean_kv_cache_usage,
            100.0 * r.peak_kv_cache_usage
        ),
    );
    line(
        "Batch size mean / peak:",
        format!("{:.1} / {}", r.mean_batch_size, r.peak_batch_size),
    );
    line("Simulated steps:", r.num_steps.to_string());
    println!("{}", "=".repeat(52));
    println!("({})", setup.kv_note);
    if args.per_replica || result.replicas.len() > 1 {
        println!(
            "{:>7} {:>8} {:>9} {:>10} {:>10} {:>9} {:>8} {:>8}",
            "replica",
            "role",
            "requests",
            "TTFT p50",
            "TPOT p50",
            "out tok/s",
            "KV peak",
            "preempt"
        );
        for k in 0..result.replicas.len() {
            let p = SimReport::for_replica(result, k);
            let role = replica_role(result, k);
            println!(
                "{:>7} {:>8} {:>9} {:>10.2} {:>10.2} {:>9.1} {:>7.1}% {:>8}",
                k,
                role,
                p.completed,
                p.ttft.median_ms,
                p.tpot.median_ms,
                p.output_throughput,
                100.0 * p.peak_kv_cache_usage,
                p.num_preemptions
            );
        }
    }
}

/// Says how many steps were larger than any the fitted profile saw.
fn warn_beyond_fit(setup: &Setup, result: &SimResult) {
    let Some(range) = setup.fitted_range else {
        return;
    };
    let beyond = result
        .steps
        .iter()
        .filter(|s| range.exceeded_by(s.num_tokens, s.num_reqs))
        .count();
    if beyond > 0 {
        eprintln!(
            "sluice simulate: {beyond} of {} steps ({:.1}%) were larger than any the profile was \
             fitted on (at most {} tokens, {} requests a step): their times are extrapolated",
            result.steps.len(),
            100.0 * beyond as f64 / result.steps.len().max(1) as f64,
            range.max_tokens,
            range.max_rows
        );
    }
}

fn write_timeline(path: &PathBuf, result: &SimResult) -> Result<()> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("--timeline: creating {}", path.display()))
        .map_err(crate::exit::config_error)?;
    let mut w = TimelineWriter::new(std::io::BufWriter::new(file))
        .with_context(|| format!("writing {}", path.display()))?;
    // Steps are listed as they started, which is time order.
    for s in &result.steps {
        w.write_step(s)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    w.finish()
        .and_then(|mut b| std::io::Write::flush(&mut b))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn run_simulation(args: &RunArgs) -> Result<()> {
    let setup = setup(args)?;
    if args.replicas == 0 {
        return Err(bad_config("--replicas: must be at least 1"));
    }
    if args.request_rate.is_nan() || args.request_rate <= 0.0 {
        return Err(bad_config("--request-rate: must be positive (or inf)"));
    }
    if let Some(sweep) = &args.sweep_rate {
        let rates = parse_sweep_rate(sweep)?;
        return sweep_rates(args, &setup, &rates);
    }
    if let Some(range) = &args.sweep_replicas {
        let (a, b) = parse_range("--sweep-replicas", range)?;
        if args.pd.is_some() {
            return Err(bad_config("--sweep-replicas: not with --pd"));
        }
        return sweep_replicas(args, &setup, a, b);
    }
    let requests = workload(args, &setup, args.request_rate)?;
    let bar = progress_bar(args, requests.len());
    let t0 = Instant::now();
    let result = simulate(args, &setup, &requests, args.replicas, bar.as_ref())?;
    let wall = t0.elapsed().as_secs_f64();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    warn_beyond_fit(&setup, &result);
    if let Some(path) = &args.timeline {
        write_timeline(path, &result)?;
    }
    if args.json {
        let mut v = report_json(args, &result, args.slo.as_ref(), args.request_rate);
        if let Value::Object(m) = &mut v {
            m.insert("simulation_wall_s".into(), json!(wall));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_summary(args, &setup, &result, args.slo.as_ref());
        eprintln!(
            "simulated {} steps of {} replica(s) in {:.2} s ({:.0} steps/s)",
            result.steps.len(),
            result.replicas.len(),
            wall,
            result.steps.len() as f64 / wall.max(1e-9)
        );
    }
    Ok(())
}

/// One row of a sweep.
fn sweep_row(args: &RunArgs, result: &SimResult, rate: f64, replicas: usize) -> (Value, bool) {
    let r = SimReport::from_result(result);
    let (goodput, attainment, meets) = match &args.slo {
        Some(slo) => {
            let g = slo.goodput_of(result);
            (g.request_goodput, g.attainment(), slo.meets(&g))
        }
        None => (r.request_throughput, 1.0, true),
    };
    let v = json!({
        "request_rate": json_rate(rate),
        "replicas": replicas,
        "request_throughput": r.request_throughput,
        "output_throughput": r.output_throughput,
        "median_ttft_ms": r.ttft.median_ms,
        "p99_ttft_ms": r.ttft.p99_ms,
        "median_tpot_ms": r.tpot.median_ms,
        "p99_tpot_ms": r.tpot.p99_ms,
        "request_goodput": goodput,
        "slo_attainment": attainment,
        "meets_slo": meets,
        "num_preemptions": r.num_preemptions,
    });
    (v, meets)
}

fn print_sweep_header(first: &str) {
    println!(
        "{first:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>7}",
        "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "goodput", "meets"
    );
}

fn print_sweep_row(first: String, v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    println!(
        "{first:>8} {:>9.2} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.2} {:>7}",
        f("request_throughput"),
        f("output_throughput"),
        f("median_ttft_ms"),
        f("p99_ttft_ms"),
        f("median_tpot_ms"),
        f("p99_tpot_ms"),
        f("request_goodput"),
        if v["meets_slo"].as_bool().unwrap_or(false) {
            "yes"
        } else {
            "no"
        }
    );
}

fn sweep_rates(args: &RunArgs, setup: &Setup, rates: &[f64]) -> Result<()> {
    let mut rows = Vec::new();
    let mut best: Option<f64> = None;
    if !args.json {
        print_sweep_header("rate");
    }
    for &rate in rates {
        let requests = workload(args, setup, rate)?;
        let result = simulate(args, setup, &requests, args.replicas, None)?;
        warn_beyond_fit(setup, &result);
        let (row, meets) = sweep_row(args, &result, rate, result.replicas.len());
        if !args.json {
            print_sweep_row(format!("{rate}"), &row);
        }
        if meets {
            best = Some(rate);
        }
        rows.push(row);
    }
    finish_sweep(
        args,
        rows,
        "max_request_rate_meeting_slo",
        best.map(|b| json!(b)),
    )
}

fn sweep_replicas(args: &RunArgs, setup: &Setup, lo: usize, hi: usize) -> Result<()> {
    let requests = workload(args, setup, args.request_rate)?;
    let mut rows = Vec::new();
    let mut fewest: Option<usize> = None;
    if !args.json {
        print_sweep_header("replicas");
    }
    for n in lo..=hi {
        let result = simulate(args, setup, &requests, n, None)?;
        warn_beyond_fit(setup, &result);
        let (row, meets) = sweep_row(args, &result, args.request_rate, n);
        if !args.json {
            print_sweep_row(format!("{n}"), &row);
        }
        rows.push(row);
        if meets {
            fewest = Some(n);
            break;
        }
    }
    finish_sweep(
        args,
        rows,
        "min_replicas_meeting_slo",
        fewest.map(|n| json!(n)),
    )
}

fn finish_sweep(args: &RunArgs, rows: Vec<Value>, key: &str, answer: Option<Value>) -> Result<()> {
    if args.json {
        let v =
            json!({ "rows": rows, key: answer, "slo": args.slo.as_ref().map(|s| s.to_string()) });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match (&args.slo, answer) {
        (None, _) => println!("(give --slo ttft=MS,tpot=MS to find the {key})"),
        (Some(slo), Some(a)) => println!("{key}: {a} (SLO {slo})"),
        (Some(slo), None) => println!("{key}: none in the range meets the SLO {slo}"),
    }
    Ok(())
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
