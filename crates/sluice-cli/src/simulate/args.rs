//! The flags of `sluice simulate` and `sluice simulate fit`, and the
//! parsers of their range values (`--sweep-rate A:B:STEP`,
//! `--sweep-replicas A:B`, `--pd P:D`).

use super::*;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimulateArgs {
    #[command(subcommand)]
    pub(super) command: Option<SimulateCommand>,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub(super) enum SimulateCommand {
    /// Fit a step-time profile to a `sluice serve --step-log` file (least
    /// squares; prints its error on held-out steps).
    Fit(FitArgs),
}

#[derive(Args, Debug)]
pub(super) struct FitArgs {
    /// The step logs (one JSON line per engine step); several are fitted as
    /// one, so a profile can cover the shapes of several workloads.
    #[arg(required = true, num_args = 1.., value_name = "STEP_LOG")]
    pub(super) step_log: Vec<PathBuf>,
    /// Where to write the profile JSON (for --hardware / --profile).
    #[arg(short, long, value_name = "PROFILE.json")]
    pub(super) output: PathBuf,
    /// A name recorded in the profile (e.g. "smollm2-135m-q4_1 on 2 cores").
    #[arg(long)]
    pub(super) name: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct RunArgs {
    /// The model whose shape is simulated: a built-in name (Qwen2.5-7B,
    /// Llama-3.1-8B, Mixtral-8x7B, ...), a Hugging Face config.json or model
    /// directory, or a GGUF file. Only the shape is read.
    #[arg(
        long,
        value_name = "NAME|config.json|DIR|FILE.gguf",
        default_value = "Qwen2.5-7B"
    )]
    pub(super) model: String,
    /// A built-in hardware profile (A100-80GB, H100-SXM, H200, L40S, B200)
    /// or a profile JSON (roofline, fitted by `simulate fit`, or table).
    #[arg(
        long,
        alias = "profile",
        value_name = "NAME|PROFILE.json",
        default_value = "H100-SXM"
    )]
    pub(super) hardware: String,
    /// GPUs per replica (tensor parallelism).
    #[arg(long, alias = "tp", value_name = "N", default_value_t = 1)]
    pub(super) tensor_parallel_size: usize,
    /// The fraction of each GPU's memory the engine may use (vLLM's
    /// meaning: weights, activations and KV cache together).
    #[arg(long, value_name = "F", default_value_t = 0.92)]
    pub(super) gpu_memory_utilization: f64,
    /// The KV cache's element type, vLLM's flag: auto (the model's
    /// dtype), bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2; also float32
    /// and q8_0 (34 bytes per 32 elements). It sizes the KV pool and the
    /// bytes attention reads.
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    pub(super) kv_cache_dtype: sluice_sim::KvCacheDtype,
    #[command(flatten)]
    pub(super) sched: SchedulerArgs,

    /// random (synthetic), trace (--dataset-path: JSONL, Azure CSV or a
    /// `sluice replay` trace) or multi-turn (conversations).
    #[arg(long, default_value = "random", value_parser = ["random", "trace", "multi-turn"])]
    pub(super) dataset_name: String,
    /// The trace file with --dataset-name trace.
    #[arg(long, value_name = "FILE")]
    pub(super) dataset_path: Option<PathBuf>,
    /// A Hugging Face tokenizer directory or a GGUF file (its vocabulary):
    /// --dataset-name random then draws vLLM's own prompts and arrival
    /// times (NumPy's streams), the requests `sluice bench` / `vllm bench
    /// serve` send with this seed.
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub(super) tokenizer: Option<PathBuf>,
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub(super) random_input_len: usize,
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub(super) random_output_len: usize,
    /// Lengths uniform in [len·(1−r), len·(1+r)].
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    pub(super) random_range_ratio: f64,
    /// Shared leading tokens of every prompt (of each group's prompts
    /// with --num-prefix-groups).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(super) random_prefix_len: usize,
    /// Distinct shared prefixes (system prompts); each request picks one.
    #[arg(
        long,
        alias = "prefix-repetition-num-prefixes",
        value_name = "N",
        default_value_t = 1
    )]
    pub(super) num_prefix_groups: usize,
    /// Input lengths instead of the uniform rule: uniform:LEN[,RATIO],
    /// normal:MEAN,STD, lognormal:MEAN,STD or empirical:PATH.
    #[arg(long, value_name = "DIST")]
    pub(super) input_len_dist: Option<LengthDist>,
    /// Output lengths, as --input-len-dist.
    #[arg(long, value_name = "DIST")]
    pub(super) output_len_dist: Option<LengthDist>,
    /// Requests (conversations with multi-turn).
    #[arg(long, alias = "num-requests", value_name = "N", default_value_t = 1000)]
    pub(super) num_prompts: usize,
    /// Send for this many seconds at --request-rate instead of
    /// --num-prompts requests.
    #[arg(long, value_name = "S")]
    pub(super) duration: Option<f64>,
    /// Requests per second (conversations per second with multi-turn):
    /// inf sends all at once; otherwise Poisson (gamma with --burstiness).
    #[arg(long, value_name = "RPS", default_value_t = f64::INFINITY)]
    pub(super) request_rate: f64,
    #[arg(long, value_name = "B", default_value_t = 1.0)]
    pub(super) burstiness: f64,
    /// Most requests in flight from the client.
    #[arg(long, alias = "concurrency", value_name = "N")]
    pub(super) max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Speculative decoding, as `serve --speculative-config` (vLLM's JSON),
    /// with `"rejection_sample_method": "synthetic"` and
    /// `synthetic_acceptance_length` (mean tokens per verification) or
    /// `synthetic_acceptance_rates` saying how often drafts are accepted;
    /// verifications cost what the step-time model says of their rows.
    #[arg(long, value_name = "JSON", value_parser = crate::options::parse_speculative_config)]
    pub(super) speculative_config: Option<sluice_model::SpeculativeConfig>,
    /// Turns per conversation (multi-turn): a number or a distribution.
    #[arg(long, value_name = "N|DIST", default_value = "uniform:4,0.5")]
    pub(super) num_turns: LengthDist,
    /// Mean think time between turns, seconds (exponential).
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    pub(super) think_time: f64,

    /// Identical replicas behind --router.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(super) replicas: usize,
    /// round-robin, random, least-requests, least-kv, power-of-two or
    /// prefix-aware.
    #[arg(long, value_name = "POLICY", default_value = "round-robin")]
    pub(super) router: RouterKind,
    /// Prefill/decode disaggregation: P prefill and D decode replicas
    /// (instead of --replicas).
    #[arg(long, value_name = "P:D", conflicts_with = "replicas")]
    pub(super) pd: Option<String>,
    /// KV transfer bandwidth between P and D replicas, GB/s [default: the
    /// hardware's interconnect bandwidth].
    #[arg(long, value_name = "GB/S")]
    pub(super) kv_link_bandwidth: Option<f64>,

    /// Print the result as JSON (`vllm bench serve --save-result` keys).
    #[arg(long)]
    pub(super) json: bool,
    /// Also print each replica's figures.
    #[arg(long)]
    pub(super) per_replica: bool,
    /// Write one CSV row per engine step.
    #[arg(long, value_name = "FILE.csv")]
    pub(super) timeline: Option<PathBuf>,
    /// Service-level objectives, milliseconds: ttft=MS,tpot=MS[,e2el=MS]
    /// [,attainment=F]; reports goodput.
    #[arg(long, value_name = "SLO")]
    pub(super) slo: Option<Slo>,
    /// Run every rate of A:B:STEP (requests per second) and report the
    /// largest that meets --slo.
    #[arg(long, value_name = "A:B:STEP", conflicts_with = "sweep_replicas")]
    pub(super) sweep_rate: Option<String>,
    /// Run with A..=B replicas and report the fewest that meet --slo.
    #[arg(long, value_name = "A:B")]
    pub(super) sweep_replicas: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub(super) no_progress: bool,
}

/// A range `A:B:STEP` of rates.
pub(super) fn parse_sweep_rate(s: &str) -> Result<Vec<f64>> {
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

pub(super) fn parse_range(flag: &str, s: &str) -> Result<(usize, usize)> {
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

pub(super) fn parse_pd(s: &str) -> Result<(usize, usize)> {
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
