//! `sluice serve`: the OpenAI-compatible HTTP server.
//!
//! Besides the model, two ways to study serving: `--step-log PATH` writes
//! one JSON line per engine step (`sluice_core::StepRecord`: its
//! shape and times, for `sluice simulate fit`), and `--executor simulated
//! --profile P` serves with the model replaced by a step-time model (the
//! real server, engine and scheduler; random tokens, no weights loaded).

use crate::exit::{bad_config, config_error, exit_code};
use crate::options::{
    parse_size, prepare_engine, prepare_simulated_engine, ModelArgs, SchedulerArgs,
};
use crate::simulated::Simulation;
use crate::startup;
use anyhow::{Context, Result};
use clap::Args;
use sluice_engine::{RequestLimits, StartOptions, StepLog};
use sluice_kv_events::{KvEventBatch, KvEventsConfig, PublisherError, ZmqEventPublisher};
use sluice_server::access::Cors;
use sluice_server::conn::Timeouts;
use sluice_server::logging::{self, Level};
use sluice_server::{serve, shutdown_signal, ServerConfig, TlsFiles};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// What computes the tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecutorKind {
    /// The model's forward pass (its weights loaded).
    Model,
    /// No weights: each step sleeps the time --profile predicts for it and
    /// returns random tokens.
    Simulated,
}

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    scheduler: SchedulerArgs,
    /// What runs the steps: model (the model's forward pass) or simulated
    /// (the real server, engine and scheduler with the forward pass
    /// replaced by the step time --profile predicts; --model gives only the
    /// config, tokenizer and chat template, its weights are never loaded;
    /// tokens are random ids, never an EOS or stop id, so requests end at
    /// max_tokens; seeded by --model-seed and each request's seed or id).
    /// KV blocks: --num-gpu-blocks-override, else the profile's memory at
    /// 0.92 utilization (vLLM's default) less the bf16 weights (at most 1Mi blocks).
    #[arg(long, value_name = "KIND", default_value = "model")]
    executor: ExecutorKind,
    /// The step-time profile of --executor simulated: a built-in hardware
    /// name (a100-80gb, h100-sxm, h200, l40s, b200: a roofline of the
    /// model on it) or a profile JSON file.
    #[arg(long, value_name = "NAME|FILE.json")]
    profile: Option<String>,
    /// GPUs the simulated model is split over (--executor simulated).
    #[arg(long, value_name = "N", default_value_t = 1)]
    tensor_parallel_size: usize,
    /// Write one JSON line per engine step that scheduled tokens to PATH
    /// (truncated first): the step's rows [new_tokens, context_before,
    /// samples], its token sums, and its wall times (forward_s: the
    /// forward pass; step_s: the whole engine step), as `sluice simulate
    /// fit` reads them. Buffered; flushed every 256 lines, each second
    /// while busy, when idle and at shutdown. Steps that scheduled nothing
    /// are not written (their step numbers are skipped).
    #[arg(long, value_name = "PATH")]
    step_log: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: IpAddr,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model name clients use [default: the model directory's name, or
    /// the built-in model's].
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* and the tokenizer
    /// endpoints (several keys: `--api-key K1 K2` as vLLM, or repeat the
    /// flag; without it, VLLM_API_KEY is read).
    /// /health, /ready, /metrics and /version stay open.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "VLLM_API_KEY",
        hide_env_values = true
    )]
    api_keys: Vec<String>,
    /// Serve HTTPS: the PEM private key (with --ssl-certfile).
    #[arg(long, value_name = "FILE", requires = "ssl_certfile")]
    ssl_keyfile: Option<PathBuf>,
    /// Serve HTTPS: the PEM certificate chain (with --ssl-keyfile).
    #[arg(long, value_name = "FILE", requires = "ssl_keyfile")]
    ssl_certfile: Option<PathBuf>,
    /// CORS: origins allowed to call the API, as a JSON list (vLLM's form,
    /// '["https://a.example"]') or comma-separated; "*" for any. CORS is
    /// off unless this is given.
    #[arg(long, value_name = "LIST", value_parser = parse_list)]
    allowed_origins: Option<Vec<String>>,
    /// CORS: allowed methods (JSON list or comma-separated) [default: any].
    #[arg(long, value_name = "LIST", value_parser = parse_list)]
    allowed_methods: Option<Vec<String>>,
    /// CORS: allowed request headers (JSON list or comma-separated)
    /// [default: any].
    #[arg(long, value_name = "LIST", value_parser = parse_list)]
    allowed_headers: Option<Vec<String>>,
    /// Publish KV cache events over ZeroMQ as vLLM does, for prefix-aware
    /// routers (llm-d): vLLM's KVEventsConfig as JSON, e.g.
    /// '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
    /// "replay_endpoint": "tcp://*:5558", "topic": "kv"}'.
    #[arg(long, value_name = "JSON")]
    kv_events_config: Option<String>,
    /// Close a kept-alive connection idle this long (seconds; uvicorn's
    /// name and vLLM's value).
    #[arg(long, value_name = "SECS", default_value_t = 5.0, value_parser = parse_secs)]
    timeout_keep_alive: f64,
    /// Close a connection whose request headers take longer than this
    /// (seconds, from their first byte; also bounds the TLS handshake).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = parse_secs)]
    timeout_header_read: f64,
    /// Answer 408 when a request body takes longer than this (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 60.0, value_parser = parse_secs)]
    timeout_body_read: f64,
    /// Close a connection whose client has read nothing for this long
    /// while a response waits to be written (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 60.0, value_parser = parse_secs)]
    timeout_write_stall: f64,
    /// Largest request body accepted (413 beyond), e.g. 32MiB.
    #[arg(long, value_name = "SIZE", default_value = "32MiB", value_parser = parse_size)]
    max_request_body_bytes: usize,
    /// Refuse new requests (503 with Retry-After) while this many wait.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_waiting_requests: usize,
    /// Refuse new requests (503 with Retry-After) while the requests not
    /// started yet hold this many prompt + max_tokens tokens [default: 16 ×
    /// the KV cache's capacity in tokens].
    #[arg(long, value_name = "TOKENS")]
    max_waiting_tokens: Option<usize>,
    /// Most sequences (prompts × n) one request may start (400 beyond).
    #[arg(long, value_name = "N", default_value_t = sluice_server::DEFAULT_MAX_SEQUENCES_PER_REQUEST)]
    max_sequences_per_request: usize,
    /// Parse tool calls out of `tool_choice: "auto"` output (vLLM's flag;
    /// needs --tool-call-parser).
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// How the model writes tool calls: hermes (Qwen2.5 / Qwen3:
    /// `<tool_call>{...}</tool_call>`), llama3_json (Llama 3.1+), mistral.
    #[arg(long, value_name = "NAME")]
    tool_call_parser: Option<String>,
    /// Split the model's thinking from its answer: qwen3 (`<think>` ...
    /// `</think>`, thinking unless `chat_template_kwargs.enable_thinking`
    /// is false) or deepseek_r1. The thinking comes back in `reasoning`;
    /// structured outputs hold for the answer.
    #[arg(long, value_name = "NAME")]
    reasoning_parser: Option<String>,
    /// Responses API (`/v1/responses`): most responses kept for `GET` and
    /// `previous_response_id` (the oldest finished one goes first; 0 keeps
    /// none).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    responses_store_max_entries: usize,
    /// Responses API: seconds a finished response stays in the store.
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    responses_store_max_age: u64,
    /// JSON constraints' defaults, as a JSON object: vLLM's
    /// `disable_any_whitespace`, `disable_additional_properties`, `backend`
    /// (auto / guidance), and `whitespace` ("bounded": one space, or up to
    /// two newlines and 20 spaces of indentation, as llama.cpp; "any") or
    /// `whitespace_pattern` (a regex). A request's own fields win.
    #[arg(long, value_name = "JSON")]
    structured_outputs_config: Option<String>,
    /// Most stop strings one request may give (400 beyond). 4 is vLLM's
    /// VLLM_MAX_STOP_STRINGS default and OpenAI's limit.
    #[arg(long, value_name = "N", default_value_t = 4)]
    max_stop_strings: usize,
    /// Longest stop string accepted, in bytes (400 beyond).
    #[arg(long, value_name = "BYTES", default_value_t = RequestLimits::default().max_stop_string_bytes)]
    max_stop_string_bytes: usize,
    /// Most logit_bias entries one request may give (400 beyond).
    #[arg(long, value_name = "N", default_value_t = RequestLimits::default().max_logit_bias)]
    max_logit_bias: usize,
    /// Output a client may leave unread before its request is aborted and
    /// its KV cache freed, e.g. 4MiB.
    #[arg(long, value_name = "SIZE", default_value = "4MiB", value_parser = parse_size)]
    max_stream_buffer_bytes: usize,
    /// On SIGINT/SIGTERM, seconds requests in flight may run before they are
    /// aborted; every connection is closed soon after.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    shutdown_grace_secs: u64,

    /// Serve vLLM's development endpoints (`POST /reset_prefix_cache`).
    /// Off by default, as in vLLM, which mounts them only with
    /// VLLM_SERVER_DEV_MODE=1; that variable turns them on here too, so a
    /// vLLM deployment's environment carries over.
    #[arg(long, env = "VLLM_SERVER_DEV_MODE")]
    enable_dev_endpoints: bool,

    /// Log one line per request on stderr as it arrives: its id, client
    /// key, prompt tokens, max tokens and sampling parameters in brief.
    #[arg(long)]
    enable_log_requests: bool,
    /// The request header whose value is the request's client key (before
    /// the body's `user` field, then a label of the API key). The default
    /// is the header the Gateway API Inference Extension's flow control
    /// sets.
    #[arg(long, value_name = "NAME", default_value = sluice_server::client::DEFAULT_CLIENT_ID_HEADER)]
    client_id_header: String,

    /// Least important log records written: error, warn, info or debug
    /// [default: the level RUST_LOG gives sluice (`debug`, `sluice=debug`),
    /// else info].
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<LogLevel>,
    /// How log records are written on stderr: text (`sluice: ...` lines)
    /// or json (one object per line: ts, level, msg and the record's
    /// fields, for log shippers).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Seconds between stats lines (throughput, running and waiting
    /// requests, KV cache usage, prefix cache hit rate, preemptions;
    /// fractions allowed). A line is written at info only when its
    /// interval or the one before had tokens, else at debug. The variable
    /// is vLLM's.
    #[arg(
        long,
        value_name = "SECS",
        env = "VLLM_LOG_STATS_INTERVAL",
        default_value_t = 10.0,
        value_parser = parse_secs
    )]
    log_stats_interval: f64,
    /// Write no stats lines.
    #[arg(long)]
    disable_log_stats: bool,
    /// Write no access lines (one per HTTP request once its response is
    /// done: status, duration and, for generation, id, client key, tokens,
    /// time to first token, finish reason). --disable-uvicorn-access-log is
    /// vLLM's name for its access log's switch.
    #[arg(long, visible_alias = "disable-uvicorn-access-log")]
    disable_log_requests: bool,
}

/// `--log-level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Sets up the process's log from `--log-level` (else `RUST_LOG`) and
/// `--log-format`, before anything is written.
fn init_logging(args: &ServeArgs) {
    let level = match args.log_level {
        Some(LogLevel::Error) => Level::Error,
        Some(LogLevel::Warn) => Level::Warn,
        Some(LogLevel::Info) => Level::Info,
        Some(LogLevel::Debug) => Level::Debug,
        None => std::env::var("RUST_LOG")
            .ok()
            .and_then(|v| Level::from_rust_log(&v))
            .unwrap_or(Level::Info),
    };
    let format = match args.log_format {
        LogFormat::Text => logging::Format::Text,
        LogFormat::Json => logging::Format::Json,
    };
    logging::init(level, format);
}

/// A JSON list of strings (`'["a", "b"]'`, as vLLM takes these flags) or a
/// comma-separated one.
fn parse_list(s: &str) -> Result<Vec<String>, String> {
    let t = s.trim();
    if t.starts_with('[') {
        return serde_json::from_str::<Vec<String>>(t)
            .map_err(|e| format!("{s:?} is not a JSON list of strings: {e}"));
    }
    Ok(t.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect())
}

/// Seconds, fractions allowed, more than 0.
fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds > 0")),
    }
}

/// Starts vLLM's ZMQ publisher (data parallel rank 0) and the sink that
/// feeds it from the engine thread. The sink owns the publisher: when the
/// engine stops, dropping it flushes what is queued and closes the sockets.
fn kv_event_sink(config: &KvEventsConfig) -> Result<Box<dyn sluice_engine::KvEventSink>> {
    let publisher = ZmqEventPublisher::start(config, 0).map_err(|e| match e {
        PublisherError::Config(_) => bad_config(format!("--kv-events-config: {e}")),
        _ => anyhow::anyhow!("--kv-events-config: cannot start the KV events publisher: {e}"),
    })?;
    logging::info(&format!(
        "publishing KV cache events on {}{}",
        publisher.endpoint(),
        publisher
            .replay_endpoint()
            .map(|r| format!(" (replay on {r})"))
            .unwrap_or_default()
    ));
    Ok(Box::new(move |ts, events| {
        // Never blocks: a full queue drops the batch and counts it.
        publisher.publish(KvEventBatch {
            ts,
            events,
            data_parallel_rank: None,
        });
    }))
}

pub fn run(args: ServeArgs) -> ExitCode {
    init_logging(&args);
    match serve_blocking(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::log_as("sluice serve", Level::Error, &format!("{e:#}"), &[]);
            exit_code(&e)
        }
    }
}

/// The simulation `--executor` / `--profile` / `--tensor-parallel-size`
/// ask for (`None`: the model runs), or the flag that is wrong.
fn simulation(args: &ServeArgs) -> Result<Option<Simulation>> {
    if args.tensor_parallel_size == 0 {
        return Err(bad_config("--tensor-parallel-size: must be at least 1"));
    }
    match (args.executor, &args.profile) {
        (ExecutorKind::Simulated, Some(profile)) => Ok(Some(Simulation {
            profile: profile.clone(),
            tensor_parallel_size: args.tensor_parallel_size,
        })),
        (ExecutorKind::Simulated, None) => Err(bad_config(
            "--executor simulated needs --profile (a built-in hardware name such as h100-sxm, \
             or a profile JSON file)",
        )),
        (ExecutorKind::Model, Some(_)) => {
            Err(bad_config("--profile applies to --executor simulated only"))
        }
        (ExecutorKind::Model, None) if args.tensor_parallel_size != 1 => Err(bad_config(
            "--tensor-parallel-size: the model executor runs on one device; only \
             --executor simulated simulates more",
        )),
        (ExecutorKind::Model, None) => Ok(None),
    }
}

/// The non-empty API keys of `--api-key` / `VLLM_API_KEY`.
fn api_keys(args: &ServeArgs) -> Vec<String> {
    args.api_keys
        .iter()
        .filter(|k| !k.is_empty())
        .cloned()
        .collect()
}

/// The HTTP server's settings from the flags, once the listener is bound.
fn server_config(
    args: &ServeArgs,
    local: SocketAddr,
    model_name: String,
    max_model_len: usize,
    cors: Cors,
    tls: Option<TlsFiles>,
) -> Result<ServerConfig> {
    let secs = Duration::from_secs_f64;
    let mut config = ServerConfig::new(local, model_name, max_model_len);
    config.client_id_header =
        sluice_server::client::header_name(&args.client_id_header).map_err(config_error)?;
    config.log_requests = args.enable_log_requests;
    config.access_log = !args.disable_log_requests;
    config.log_stats_interval = (!args.disable_log_stats).then(|| secs(args.log_stats_interval));
    config.shutdown_grace = Duration::from_secs(args.shutdown_grace_secs);
    config.dev_endpoints = args.enable_dev_endpoints;
    config.timeouts = Timeouts {
        keep_alive: secs(args.timeout_keep_alive),
        header_read: secs(args.timeout_header_read),
        body_read: secs(args.timeout_body_read),
        write_stall: secs(args.timeout_write_stall),
    };
    config.max_request_body_bytes = args.max_request_body_bytes;
    config.max_sequences_per_request = args.max_sequences_per_request;
    config.auto_tool_parser = match (&args.tool_call_parser, args.enable_auto_tool_choice) {
        (Some(name), true) => Some(
            name.parse::<sluice_server::tools::ToolParserKind>()
                .map_err(|e| bad_config(format!("--tool-call-parser: {e}")))?,
        ),
        (None, true) => {
            return Err(bad_config(
                "--enable-auto-tool-choice requires --tool-call-parser",
            ))
        }
        (Some(name), false) => {
            // Checked even when unused, so a typo is found at start.
            name.parse::<sluice_server::tools::ToolParserKind>()
                .map_err(|e| bad_config(format!("--tool-call-parser: {e}")))?;
            None
        }
        (None, false) => None,
    };
    if let Some(name) = &args.reasoning_parser {
        config.reasoning_parser = Some(
            name.parse()
                .map_err(|e| bad_config(format!("--reasoning-parser: {e}")))?,
        );
    }
    if args.responses_store_max_age == 0 && args.responses_store_max_entries > 0 {
        return Err(bad_config(
            "--responses-store-max-age: must be at least 1 second (to keep no responses, set \
             --responses-store-max-entries 0)"
                .to_string(),
        ));
    }
    config.responses_store = sluice_server::responses::store::StoreLimits {
        max_entries: args.responses_store_max_entries,
        max_age: std::time::Duration::from_secs(args.responses_store_max_age),
    };
    if let Some(text) = &args.structured_outputs_config {
        config.json_format = sluice_server::structured::parse_structured_outputs_config(text)
            .map_err(|e| bad_config(format!("--structured-outputs-config: {e}")))?;
    }
    config.api_keys = api_keys(args);
    config.cors = cors;
    config.tls = tls;
    Ok(config)
}

fn serve_blocking(args: ServeArgs) -> Result<()> {
    // Checked before the model loads: a typo should not cost a load.
    sluice_server::client::header_name(&args.client_id_header).map_err(config_error)?;
    let kv_events = args
        .kv_events_config
        .as_deref()
        .map(KvEventsConfig::from_json)
        .transpose()
        .map_err(|e| bad_config(format!("--kv-events-config: {e}")))?;
    let sim = simulation(&args)?;
    let step_log = match &args.step_log {
        Some(path) => {
            let log = StepLog::create(path).map_err(|e| bad_config(format!("--step-log: {e}")))?;
            logging::info(&format!(
                "writing one line per engine step to {}",
                path.display()
            ));
            Some(log)
        }
        None => None,
    };
    let mut prepared = match &sim {
        Some(sim) => prepare_simulated_engine(&args.model, &args.scheduler, sim)?,
        None => prepare_engine(&args.model, &args.scheduler)?,
    };
    let config = &mut prepared.config;
    if let Some(kv) = &kv_events {
        config.scheduler.enable_kv_cache_events = kv.enable_kv_cache_events;
    }
    config.max_waiting_requests = Some(args.max_waiting_requests);
    // The pool the executor was built with: the scheduler config still
    // holds its default until the engine takes the executor's count.
    let kv_tokens = prepared
        .executor
        .num_kv_blocks()
        .saturating_mul(config.scheduler.block_size);
    config.limits = RequestLimits {
        max_stop_strings: args.max_stop_strings,
        max_stop_string_bytes: args.max_stop_string_bytes,
        max_logit_bias: args.max_logit_bias,
        // A backlog many times what the cache holds at once only makes
        // every client behind it wait; refuse early instead.
        max_waiting_tokens: Some(
            args.max_waiting_tokens
                .unwrap_or_else(|| kv_tokens.saturating_mul(16).max(1)),
        ),
        max_stream_buffer_bytes: args.max_stream_buffer_bytes,
    };
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| prepared.model_name.clone());
    let max_model_len = prepared.config.scheduler.max_model_len;
    let tls = match (&args.ssl_certfile, &args.ssl_keyfile) {
        (Some(cert_file), Some(key_file)) => Some(TlsFiles {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
        }),
        _ => None,
    };
    if let Some(files) = &tls {
        // Fail before the model loads into the engine thread.
        sluice_server::tls::acceptor(files).map_err(config_error)?;
    }
    let cors = Cors {
        allowed_origins: args.allowed_origins.clone().unwrap_or_default(),
        allowed_methods: args.allowed_methods.clone().unwrap_or_default(),
        allowed_headers: args.allowed_headers.clone().unwrap_or_default(),
    };
    cors.layer().map_err(config_error)?;
    let sink = match kv_events.filter(KvEventsConfig::publishes) {
        Some(kv) => Some(kv_event_sink(&kv)?),
        None => None,
    };
    let info = prepared.info.clone();
    let engine = prepared.start_with_options(StartOptions {
        kv_event_sink: sink,
        step_log,
    })?;
    let sched = &engine.config().scheduler;
    startup::log_summary(
        &model_name,
        &info,
        &startup::KvFigures {
            num_blocks: sched.num_gpu_blocks,
            block_size: sched.block_size,
            max_model_len: sched.max_model_len,
            max_num_seqs: sched.max_num_seqs,
            max_num_batched_tokens: sched.max_num_batched_tokens,
        },
    );
    // The HTTP side only parses, validates and forwards: two worker threads
    // are plenty, and the model's kernel threads keep the cores.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let addr = SocketAddr::new(args.host, args.port);
        // Signal handlers first: a SIGTERM any time after the listening
        // line below drains the server instead of killing it.
        let stop = shutdown_signal();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--host/--port: cannot listen on {addr}"))?;
        let local = listener.local_addr().unwrap_or(addr);
        if api_keys(&args).is_empty() && !local.ip().is_loopback() {
            logging::warn(&format!(
                "listening on {} without an API key: anyone who can reach this address can use \
                 the model (set --api-key or VLLM_API_KEY, or --host 127.0.0.1)",
                local.ip()
            ));
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        logging::log(
            Level::Info,
            &format!(
                "serving {model_name:?} on {scheme}://{local} (max_model_len {max_model_len}, \
                 pid {})",
                std::process::id()
            ),
            &[
                ("event", "listening".into()),
                ("address", format!("{scheme}://{local}").into()),
                ("pid", std::process::id().into()),
            ],
        );
        let config = server_config(&args, local, model_name, max_model_len, cors, tls)?;
        let grace = args.shutdown_grace_secs;
        let result = serve(engine, config, listener, async move {
            stop.await;
            logging::info(&format!(
                "shutting down (requests in flight get {grace} s, then every connection closes)"
            ));
        })
        .await;
        logging::info("stopped");
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_json_or_comma_separated() {
        assert_eq!(parse_list(r#"["*"]"#).unwrap(), vec!["*"]);
        assert_eq!(
            parse_list("https://a.example, https://b.example").unwrap(),
            vec!["https://a.example", "https://b.example"]
        );
        assert!(parse_list("[1]").is_err());
        assert_eq!(parse_secs("0.5"), Ok(0.5));
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("inf").is_err());
    }
}
