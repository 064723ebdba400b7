//! sluice-server: the OpenAI-compatible HTTP API over a sluice engine.
//!
//! Handlers never block: they validate the request, hand it to the engine
//! (`Engine::generate`, which only sends on a channel) and await its stream.
//! The engine thread owns the scheduler and the model; a client that goes
//! away drops its stream, which aborts its requests.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`,
//! `POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel` (OpenAI's Responses API),
//! `POST /v1/messages`, `POST /v1/messages/count_tokens` (Anthropic's),
//! `GET /v1/models`, `GET /health`, `GET /ready`, `GET /version`,
//! `POST /tokenize`, `POST /detokenize`, `GET /metrics`,
//! `POST /v1/completions/render`, `POST /v1/chat/completions/render`, and
//! `POST /reset_prefix_cache` with `ServerConfig::dev_endpoints`.
//!
//! Layers, outermost first: CORS (`access.rs`, off unless configured),
//! Anthropic's error shape (`anthropic/`, under `/v1/messages`), the
//! API key check (`access.rs`), the HTTP metrics (`http_metrics.rs`), the
//! whole-body read with its size and time limits (`body.rs`), then the
//! handler. They are `Router::layer`s, so they run after routing (the
//! route template, `MatchedPath`, is known to them). Outside them all, the
//! access log (`access_log.rs`, when on). Connections, their timeouts and
//! shutdown are `conn.rs`'s. Logging is `logging.rs`'s; the periodic stats
//! line `stats_log.rs`'s.

pub mod access;
pub mod access_log;
pub mod anthropic;
pub mod body;
pub mod body_end;
pub mod chat;
pub mod client;
pub mod completions;
pub mod conn;
pub mod error;
pub mod http_metrics;
pub mod json;
pub mod logging;
pub mod logprobs;
pub mod metrics;
pub mod misc;
pub mod params;
pub mod protocol;
pub mod reasoning;
pub mod render;
pub mod responses;
pub mod sse;
pub mod state;
pub mod stats_log;
pub mod structured;
pub mod submit;
pub mod tls;
pub mod tools;
pub mod turn;

use access::{ApiKeys, Cors};
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::Router;
use body::BodyLimits;
use conn::{Phase, Timeouts};
use sluice_engine::{Engine, ShutdownMode};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinSet;

pub use state::AppState;
pub use tls::TlsFiles;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// The name clients pass as `model`.
    pub model_name: String,
    pub max_model_len: usize,
    /// On shutdown, how long requests in flight may run before they are
    /// aborted.
    pub shutdown_grace: Duration,
    pub timeouts: Timeouts,
    /// Largest request body accepted (413 beyond).
    pub max_request_body_bytes: usize,
    /// Accepted API keys; empty: no authentication.
    pub api_keys: Vec<String>,
    pub cors: Cors,
    /// Serve HTTPS with these files.
    pub tls: Option<TlsFiles>,
    /// Most sequences (prompts × `n`) one HTTP request may start.
    pub max_sequences_per_request: usize,
    /// `--tool-call-parser` with `--enable-auto-tool-choice`: how
    /// `tool_choice: "auto"` output is parsed for tool calls (`None`: auto
    /// tool choice is refused, as vLLM does without those flags).
    pub auto_tool_parser: Option<tools::ToolParserKind>,
    /// Serve vLLM's development endpoints (`POST /reset_prefix_cache`),
    /// which vLLM mounts only with `VLLM_SERVER_DEV_MODE=1`: they let any
    /// client that reaches the server change its state.
    pub dev_endpoints: bool,
    /// The header whose value is a request's client key
    /// (`--client-id-header`; `client.rs` has the precedence).
    pub client_id_header: axum::http::HeaderName,
    /// `--enable-log-requests`: one line per request on stderr as it
    /// arrives (id, client key, prompt and max tokens, sampling in brief).
    pub log_requests: bool,
    /// One access line per request when its response is done
    /// (`access_log.rs`; the CLI's default is on, as uvicorn's in vLLM).
    pub access_log: bool,
    /// Write the stats line this often (`stats_log.rs`); `None`: never.
    pub log_stats_interval: Option<Duration>,
    /// JSON constraints' whitespace and strictness where a request does
    /// not say (`--structured-outputs-config`).
    pub json_format: sluice_structured::JsonFormat,
    /// `--reasoning-parser`: split thinking from the answer.
    pub reasoning_parser: Option<reasoning::ReasoningParserKind>,
    /// The Responses API's store (`--responses-store-max-entries`,
    /// `--responses-store-max-age`).
    pub responses_store: responses::store::StoreLimits,
}

impl ServerConfig {
    /// The defaults: no key, no CORS, no TLS, vLLM-like timeouts.
    pub fn new(addr: SocketAddr, model_name: impl Into<String>, max_model_len: usize) -> Self {
        ServerConfig {
            addr,
            model_name: model_name.into(),
            max_model_len,
            shutdown_grace: Duration::from_secs(30),
            timeouts: Timeouts::default(),
            max_request_body_bytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
            api_keys: Vec::new(),
            cors: Cors::default(),
            tls: None,
            max_sequences_per_request: DEFAULT_MAX_SEQUENCES_PER_REQUEST,
            auto_tool_parser: None,
            dev_endpoints: false,
            client_id_header: axum::http::HeaderName::from_static(client::DEFAULT_CLIENT_ID_HEADER),
            log_requests: false,
            access_log: false,
            log_stats_interval: None,
            json_format: sluice_structured::JsonFormat::default(),
            reasoning_parser: None,
            responses_store: responses::store::StoreLimits::default(),
        }
    }
}

/// 32 MiB: a prompt of 128k token ids as JSON is about 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 32 << 20;
/// Prompts × `n` per request: `n` alone may be 128, as in vLLM.
pub const DEFAULT_MAX_SEQUENCES_PER_REQUEST: usize = 256;

/// After the grace period, how long aborted streams get to send their last
/// chunk before every connection is closed.
const CLOSE_AFTER_ABORT: Duration = Duration::from_millis(500);

/// The HTTP application for `state`, with its middleware.
pub fn router(state: AppState, config: &ServerConfig) -> anyhow::Result<Router> {
    let body_limits = BodyLimits {
        max_bytes: config.max_request_body_bytes,
        timeout: config.timeouts.body_read,
    };
    let mut app = Router::new();
    if config.dev_endpoints {
        // Not mounted otherwise: a 404, as vLLM without dev mode.
        app = app.route("/reset_prefix_cache", post(misc::reset_prefix_cache));
    }
    let app = app
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/completions/render", post(render::render_completion))
        .route(
            "/v1/chat/completions/render",
            post(render::render_chat_completion),
        )
        .route("/v1/models", get(misc::models))
        .route("/health", get(misc::health))
        .route("/ready", get(misc::ready))
        .route("/version", get(misc::version))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/metrics", get(misc::metrics))
        .fallback(|uri: Uri| async move {
            error::ApiError::not_found("path", format!("no route {}", uri.path()))
        })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            error::ApiError::method_not_allowed(method.as_str(), uri.path())
        })
        .with_state(state)
        // body.rs enforces the size limit itself, with an OpenAI error.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            body_limits,
            body::read_whole_body,
        ))
        // Inside the API key check and CORS, as vLLM's instrumentator sits
        // inside its authentication and CORS middleware: 401s and
        // preflights are not counted, 404s, 405s and 413s are.
        .layer(axum::middleware::from_fn_with_state(
            http_metrics::HttpMetrics::new(),
            http_metrics::track,
        ))
        .layer(axum::middleware::from_fn_with_state(
            ApiKeys::new(&config.api_keys),
            access::require_api_key,
        ))
        // Outside every layer that can refuse: Anthropic's routes answer
        // every error in Anthropic's shape.
        .layer(axum::middleware::from_fn(anthropic::error_shape));
    let app = match config.cors.layer()? {
        Some(cors) => app.layer(cors),
        None => app,
    };
    Ok(if config.access_log {
        app.layer(axum::middleware::from_fn(access_log::track))
    } else {
        app
    })
}

/// Serves until `shutdown` resolves, then stops accepting connections and
/// requests, lets requests in flight finish for up to `shutdown_grace`,
/// aborts the rest, closes every connection (stalled or not) and stops the
/// engine. Returns within about `shutdown_grace` + 1 s of the signal.
pub async fn serve(
    engine: Engine,
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let state = AppState::new(engine.clone(), &config);
    let app = router(state, &config)?;
    let timeouts = config.timeouts;
    let (stop_stats, stats_task) = match config.log_stats_interval {
        Some(every) => {
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(stats_log::run(engine.clone(), every, stopped));
            (Some(stop), Some(task))
        }
        None => (None, None),
    };
    let (phase, phase_rx) = tokio::sync::watch::channel(Phase::Running);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    // Each SSE event is one small write: without this,
                    // Nagle's algorithm holds it for the client's delayed
                    // ACK (~40 ms).
                    let _ = socket.set_nodelay(true);
                    let (app, phase_rx, tls) = (app.clone(), phase_rx.clone(), tls.clone());
                    connections.spawn(async move {
                        match tls {
                            None => conn::serve_connection(socket, app, timeouts, phase_rx).await,
                            Some(tls) => {
                                let handshake = tokio::time::timeout(
                                    timeouts.header_read,
                                    tls.accept(socket),
                                );
                                if let Ok(Ok(stream)) = handshake.await {
                                    conn::serve_connection(stream, app, timeouts, phase_rx).await;
                                }
                            }
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors, usually: back off instead of
                    // spinning; connections closing will free some.
                    logging::warn(&format!("accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = phase.send(Phase::Draining);
    // New requests get 503 from here on; requests in flight keep going for
    // the grace period, then are aborted (their streams end with `abort`).
    let deadline = tokio::time::Instant::now() + config.shutdown_grace;
    if tokio::time::timeout_at(deadline, engine.shutdown(ShutdownMode::Drain))
        .await
        .is_err()
    {
        engine.shutdown(ShutdownMode::Abort).await;
    }
    // Responses still being written get the rest of the grace period (at
    // least a moment, for the last chunk of an aborted stream).
    let flushed = async { while connections.join_next().await.is_some() {} };
    let close_at = deadline.max(tokio::time::Instant::now() + CLOSE_AFTER_ABORT);
    let _ = tokio::time::timeout_at(close_at, flushed).await;
    let _ = phase.send(Phase::Closing);
    // Whatever is left (a client that reads nothing, a half-sent body) is
    // dropped with its socket.
    connections.shutdown().await;
    // The last stats line covers the drain.
    drop(stop_stats);
    if let Some(task) = stats_task {
        let _ = task.await;
    }
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    // Registered now, not when first polled: a SIGTERM that arrives right
    // after the listening line (a supervisor that stops a replica at once)
    // must start the drain, not kill the process.
    #[cfg(unix)]
    let (int, term) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(int) => {},
                _ = wait(term) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
