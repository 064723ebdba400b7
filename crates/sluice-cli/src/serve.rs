//! `sluice serve`: the OpenAI-compatible HTTP server.

use crate::options::{prepare_engine, ModelArgs, SchedulerArgs};
use anyhow::{Context, Result};
use clap::Args;
use sluice_server::{serve, shutdown_signal, ServerConfig};
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    scheduler: SchedulerArgs,
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
    /// Refuse new requests (503 with Retry-After) while this many wait.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_waiting_requests: usize,
    /// On SIGINT/SIGTERM, seconds requests in flight may run before they are
    /// aborted.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    shutdown_grace_secs: u64,
}

pub fn run(args: ServeArgs) -> ExitCode {
    match serve_blocking(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice serve: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve_blocking(args: ServeArgs) -> Result<()> {
    let mut prepared = prepare_engine(&args.model, &args.scheduler)?;
    prepared.config.max_waiting_requests = Some(args.max_waiting_requests);
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| prepared.model_name.clone());
    let max_model_len = prepared.config.scheduler.max_model_len;
    let engine = prepared.start()?;
    // The HTTP side only parses, validates and forwards: two worker threads
    // are plenty, and the model's kernel threads keep the cores.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let addr = SocketAddr::new(args.host, args.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--host/--port: cannot listen on {addr}"))?;
        let local = listener.local_addr().unwrap_or(addr);
        eprintln!(
            "sluice: serving {model_name:?} on http://{local} (max_model_len {max_model_len})"
        );
        let config = ServerConfig {
            addr: local,
            model_name,
            max_model_len,
            shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
        };
        let result = serve(engine, config, listener, async {
            shutdown_signal().await;
            eprintln!("sluice: shutting down (finishing requests in flight)");
        })
        .await;
        eprintln!("sluice: stopped");
        result
    })
}
