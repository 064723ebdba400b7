//! `sluice bench`: a load generator for any OpenAI-compatible server
//! (sluice's own, vLLM, ...) that measures as `vllm bench serve` (vLLM
//! 0.33.0) does, so that its figures and vLLM's agree on the same server
//! and settings, plus sluice's load-test extras: deliberate hang-ups, 503
//! counts, a KV-drain (leak) check, and the server's resident memory.
//!
//! This module runs the benchmark: resolve the model and tokenizer, build
//! the dataset, send every request at its arrival time under the
//! concurrency limit, then compute, print and save. One concept per
//! submodule:
//!
//! | module | owns |
//! |---|---|
//! | `args` | the flags and their validation |
//! | `rng` | NumPy's PCG64 / MT19937 streams, bit for bit |
//! | `dataset` | the `random` dataset and the tokenizer view it needs |
//! | `arrivals` | send times (Poisson / gamma / all at once) |
//! | `sse` | incremental server-sent-events parsing |
//! | `request` | one request: payload, stream, TTFT / ITL / latency |
//! | `metrics` | the figures from the per-request outputs |
//! | `report` | the summary table and the result JSON |
//! | `server` | model list, prompt alignment, /metrics drain, server RSS |

mod args;
pub(crate) mod arrivals;
pub(crate) mod dataset;
mod metrics;
mod report;
mod request;
mod rng;
mod server;
mod sse;

pub use args::BenchArgs;

use crate::exit::{bad_config, config_error};
use anyhow::{Context, Result};
use args::Config;
use dataset::{BenchTokenizer, RandomParams};
use request::{Outcome, RequestConfig, RequestInput, RequestOutput};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn run(args: BenchArgs) -> ExitCode {
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    // Two workers: enough to keep up with the streams, and the machine's
    // other cores stay with the server under test.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench(cfg)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sluice bench: {e:#}");
            crate::exit::exit_code(&e)
        }
    }
}

/// Where the prompts' lengths come from.
enum Lengths {
    /// A tokenizer here, the server's (or one like it).
    Local,
    /// No local tokenizer: the built-in one drafts, the server's
    /// `/tokenize` measures.
    Server,
}

/// The tokenizer the prompts are built with: `--tokenizer` (`given`, opened
/// already), else the model
/// id when it is a local model path (vLLM loads the model id's
/// tokenizer), else the built-in byte-level one drafting prompts that the
/// server's `/tokenize` then measures.
fn load_tokenizer(
    given: Option<BenchTokenizer>,
    model_id: &str,
) -> Result<(BenchTokenizer, Lengths)> {
    if let Some(tok) = given {
        return Ok((tok, Lengths::Local));
    }
    let path = Path::new(model_id);
    if sluice_model::gguf::is_gguf_model(path) {
        return Ok((BenchTokenizer::from_gguf(path)?, Lengths::Local));
    }
    if path.join("tokenizer.json").is_file() {
        return Ok((BenchTokenizer::from_dir(path)?, Lengths::Local));
    }
    eprintln!(
        "sluice bench: no --tokenizer, and the model id {model_id:?} is not a local model path: \
         prompts are drafted with the built-in byte-level tokenizer and measured in the \
         server's tokens through its /tokenize"
    );
    Ok((BenchTokenizer::builtin()?, Lengths::Server))
}

/// `--tokenizer SPEC`: a GGUF file (or a directory holding one), a
/// tokenizer directory (or its tokenizer.json), else a hub id. A path that
/// does not exist or holds no tokenizer is a flag error (exit status 2); a
/// failed download is not.
fn open_tokenizer(spec: &str) -> Result<BenchTokenizer> {
    let flag = || format!("--tokenizer {spec}");
    let expanded = crate::hub::expand_home(spec);
    let path = expanded.as_path();
    if path.exists() {
        let tok = if sluice_model::gguf::is_gguf_model(path) {
            BenchTokenizer::from_gguf(path)
        } else if path.is_dir() && path.join("tokenizer.json").is_file() {
            BenchTokenizer::from_dir(path)
        } else if path.is_dir() {
            Err(anyhow::anyhow!(
                "the directory has no tokenizer.json and no .gguf file"
            ))
        } else if path.file_name().is_some_and(|n| n == "tokenizer.json") {
            BenchTokenizer::from_dir(path.parent().unwrap_or(Path::new(".")))
        } else {
            Err(anyhow::anyhow!(
                "neither a GGUF file nor a tokenizer directory (tokenizer.json)"
            ))
        };
        return tok.with_context(flag).map_err(config_error);
    }
    if crate::hub::looks_like_path(spec, |p| p.exists()) {
        return Err(bad_config(format!(
            "--tokenizer: {}",
            crate::hub::missing_path(path)
        )));
    }
    match crate::hub::resolve_tokenizer(spec, None) {
        Some(dir) => BenchTokenizer::from_dir(&dir?).with_context(flag),
        None => Err(bad_config(format!(
            "--tokenizer: {}, and {spec:?} is not a Hugging Face id (ORG/NAME)",
            crate::hub::missing_path(path)
        ))),
    }
}

async fn bench(cfg: Config) -> Result<bool> {
    let origin = Instant::now();
    let client = reqwest::Client::builder()
        // vLLM's aiohttp session: 6 hours per request, at most
        // --max-concurrency connections.
        .timeout(Duration::from_secs(6 * 3600))
        .pool_max_idle_per_host(cfg.max_concurrency.unwrap_or(usize::MAX))
        .tcp_nodelay(true)
        .build()
        .context("cannot build the HTTP client")?;

    // A --tokenizer that cannot be opened is refused before the server is
    // asked anything.
    let given = cfg.tokenizer.as_deref().map(open_tokenizer).transpose()?;
    let (model_name, model_id) = match &cfg.model {
        Some(m) => (cfg.served_model_name.clone(), m.clone()),
        None => {
            eprintln!("Model not specified, fetching first model from server...");
            let (name, root) = server::first_model(&client, &cfg.base_url).await?;
            eprintln!("First model name: {name}, first model id: {root}");
            (Some(name), root)
        }
    };
    let (tokenizer, lengths) = load_tokenizer(given, &model_id)?;

    let params = RandomParams {
        num_requests: cfg.num_prompts,
        input_len: cfg.input_len,
        output_len: cfg.output_len,
        prefix_len: cfg.prefix_len,
        range_ratio: cfg.range_ratio,
        seed: cfg.seed,
        request_id_prefix: cfg.request_id_prefix.clone(),
    };
    let samples = dataset::sample_random(&tokenizer, &params).map_err(config_error)?;
    let samples = match lengths {
        Lengths::Local => server::align_prompts(&client, &cfg.base_url, &model_id, samples).await,
        Lengths::Server => {
            server::fit_to_server(&client, &cfg.base_url, &model_id, samples, cfg.disable_tqdm)
                .await
        }
    };
    let requested = report::Requested::new(&params, tokenizer.num_special_tokens_to_add())?;

    let server_pid = match &cfg.server_pid {
        Some(spec) => Some(server::resolve_pid(spec, server::url_port(&cfg.base_url))?),
        None => None,
    };
    let rss_kib_before = server_pid.and_then(server::rss_kib);

    let req_cfg = Arc::new(RequestConfig {
        backend: cfg.backend,
        api_url: cfg.api_url.clone(),
        model: model_name.unwrap_or_else(|| model_id.clone()),
        logprobs: cfg.logprobs,
        ignore_eos: cfg.ignore_eos,
        extra_body: cfg.extra_body.clone(),
        api_key: std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.is_empty()),
    });
    let inputs: Vec<RequestInput> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| RequestInput {
            prompt: s.prompt.clone(),
            prompt_len: s.prompt_len,
            output_len: s.expected_output_len,
            request_id: s.request_id.clone(),
            // A deterministic, evenly spread choice of the hang-ups.
            hang_up: (i as f64 * 0.618_033_988_75).fract() < cfg.disconnect_fraction,
        })
        .collect();

    let semaphore = cfg
        .max_concurrency
        .map(|c| Arc::new(tokio::sync::Semaphore::new(c)));

    if cfg.num_warmups > 0 {
        warm_up(
            &cfg,
            &client,
            &req_cfg,
            &inputs[0],
            semaphore.as_ref(),
            origin,
        )
        .await?;
    }

    print_traffic(&cfg);

    let (outputs, duration) =
        send_all(&cfg, &client, &req_cfg, inputs, semaphore.as_ref(), origin).await?;

    let mut extras = report::Extras {
        overloaded: outputs
            .iter()
            .filter(|o| o.outcome == Outcome::Overloaded)
            .count(),
        disconnected: outputs
            .iter()
            .filter(|o| o.outcome == Outcome::Disconnected)
            .count(),
        rss_kib_before,
        requested: Some(requested),
        ..Default::default()
    };
    if cfg.check_kv_drain {
        extras.drain =
            Some(server::wait_for_drain(&client, &cfg.base_url, Duration::from_secs(30)).await?);
    }
    extras.rss_kib_after = server_pid.and_then(server::rss_kib);

    let m = metrics::calculate(&outputs, duration, &tokenizer, &cfg.percentiles);
    let failures: Vec<&RequestOutput> = outputs
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Failed | Outcome::Overloaded))
        .collect();
    if !failures.is_empty() {
        eprintln!("Failed requests during benchmark run detected (capping to 10):");
        for (i, o) in failures.iter().take(10).enumerate() {
            eprintln!("Error {i}: {}", o.error);
        }
    }

    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let run = report::Run {
        cfg: &cfg,
        model_id: &model_id,
        tokenizer_id: &tokenizer.id,
        duration,
        outputs: &outputs,
        metrics: &m,
        extras,
        date: report::date_string(unix),
    };
    print!("{}", report::summary(&run));
    let full = report::result_json(&run);
    let summary = report::strip_detailed(full.clone());
    if cfg.save_result {
        save_result(&cfg, &model_id, &run.date, full, &summary)?;
    }
    println!("{}", serde_json::Value::Object(summary));

    let hard_failures = outputs
        .iter()
        .filter(|o| o.outcome == Outcome::Failed)
        .count();
    let drained = run.extras.drain.is_none_or(|(_, ok)| ok);
    if !drained {
        eprintln!("sluice bench: the server did not drain within 30 s (--check-kv-drain)");
    }
    Ok(hard_failures == 0 && drained)
}

type Semaphore = Arc<tokio::sync::Semaphore>;

/// `--num-warmups` copies of the first request, under the same
/// concurrency limit, before the measured run.
async fn warm_up(
    cfg: &Config,
    client: &reqwest::Client,
    req_cfg: &Arc<RequestConfig>,
    first: &RequestInput,
    semaphore: Option<&Semaphore>,
    origin: Instant,
) -> Result<()> {
    eprintln!("Warming up with {} requests...", cfg.num_warmups);
    let warm = RequestInput {
        hang_up: false,
        ..first.clone()
    };
    let tasks: Vec<_> = (0..cfg.num_warmups)
        .map(|_| {
            let (client, req_cfg, warm, sem) = (
                client.clone(),
                req_cfg.clone(),
                warm.clone(),
                semaphore.cloned(),
            );
            tokio::spawn(async move {
                let _permit = match &sem {
                    Some(s) => s.clone().acquire_owned().await.ok(),
                    None => None,
                };
                request::send(&client, &req_cfg, &warm, origin).await
            })
        })
        .collect();
    for t in tasks {
        t.await.context("a warm-up task panicked")?;
    }
    eprintln!("Warmup run completed.");
    Ok(())
}

/// vLLM's lines announcing the measured run's traffic.
fn print_traffic(cfg: &Config) {
    eprintln!("Starting main benchmark run...");
    let distribution = if cfg.burstiness == 1.0 {
        "Poisson process"
    } else {
        "Gamma distribution"
    };
    eprintln!(
        "Traffic request rate: {}",
        report::py_float(cfg.request_rate)
    );
    eprintln!(
        "Burstiness factor: {} ({distribution})",
        report::py_float(cfg.burstiness)
    );
    eprintln!(
        "Maximum request concurrency: {}",
        cfg.max_concurrency
            .map_or("None".to_string(), |c| c.to_string())
    );
}

/// Sends every request at its send time (each waits for a concurrency
/// permit first); returns the outputs in input order and the run's
/// duration in seconds.
async fn send_all(
    cfg: &Config,
    client: &reqwest::Client,
    req_cfg: &Arc<RequestConfig>,
    inputs: Vec<RequestInput>,
    semaphore: Option<&Semaphore>,
    origin: Instant,
) -> Result<(Vec<RequestOutput>, f64)> {
    let send_times = arrivals::send_times(inputs.len(), cfg.request_rate, cfg.burstiness, cfg.seed);
    let bar = progress_bar(inputs.len() as u64, cfg.disable_tqdm);
    let bench_start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(inputs.len());
    for (input, at) in inputs.into_iter().zip(send_times) {
        if at > 0.0 {
            tokio::time::sleep_until(bench_start + Duration::from_secs_f64(at)).await;
        }
        let (client, req_cfg, sem) = (client.clone(), req_cfg.clone(), semaphore.cloned());
        let bar = bar.clone();
        let arrival = origin.elapsed().as_secs_f64();
        tasks.push(tokio::spawn(async move {
            let _permit = match &sem {
                Some(s) => s.clone().acquire_owned().await.ok(),
                None => None,
            };
            let mut out = request::send(&client, &req_cfg, &input, origin).await;
            out.client_queue_time = out.start_time - arrival;
            bar.inc(1);
            out
        }));
    }
    let mut outputs: Vec<RequestOutput> = Vec::with_capacity(tasks.len());
    for t in tasks {
        outputs.push(t.await.context("a request task panicked")?);
    }
    let duration = bench_start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok((outputs, duration))
}

/// vLLM's tqdm bar of finished requests, on stderr: drawn only when
/// stderr is a terminal and `--disable-tqdm` is not given (a hidden bar
/// otherwise, so a log gets no control characters).
pub(crate) fn progress_bar(len: u64, disabled: bool) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if disabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{percent:>3}%|{wide_bar}| {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}]",
    ) {
        bar.set_style(style);
    }
    bar
}

/// `--save-result`: the full JSON with `--save-detailed`, else the summary
/// one, under `--result-dir`.
fn save_result(
    cfg: &Config,
    model_id: &str,
    date: &str,
    full: serde_json::Map<String, serde_json::Value>,
    summary: &serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let path = report::result_path(cfg, model_id, date);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--result-dir: cannot create {}", dir.display()))?;
    }
    let saved = if cfg.save_detailed {
        full
    } else {
        summary.clone()
    };
    let text = serde_json::to_string(&saved).context("cannot serialize the result")?;
    std::fs::write(&path, text)
        .with_context(|| format!("cannot write the result file {}", path.display()))?;
    eprintln!("Saved the result to {}", path.display());
    Ok(())
}
