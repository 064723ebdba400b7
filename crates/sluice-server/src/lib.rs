//! sluice-server: the OpenAI-compatible HTTP API over a sluice engine.
//!
//! Handlers never block: they validate the request, hand it to the engine
//! (`Engine::generate`, which only sends on a channel) and await its stream.
//! The engine thread owns the scheduler and the model; a client that goes
//! away drops its stream, which aborts its requests.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, `GET /health`, `GET /ready`, `GET /version`,
//! `POST /tokenize`, `POST /detokenize`, `GET /metrics`.

pub mod chat;
pub mod completions;
pub mod error;
pub mod json;
pub mod logprobs;
pub mod metrics;
pub mod misc;
pub mod params;
pub mod protocol;
pub mod sse;
pub mod state;
pub mod submit;

use axum::routing::{get, post};
use axum::Router;
use sluice_engine::{Engine, ShutdownMode};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

pub use state::AppState;

/// The HTTP application for `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(misc::models))
        .route("/health", get(misc::health))
        .route("/ready", get(misc::ready))
        .route("/version", get(misc::version))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/metrics", get(misc::metrics))
        .fallback(|| async { error::ApiError::not_found("path", "no such route") })
        .with_state(state)
}

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
}

/// Serves until `shutdown` resolves, then stops accepting connections and
/// requests, lets requests in flight finish for up to `shutdown_grace`,
/// aborts the rest, and stops the engine.
pub async fn serve(
    engine: Engine,
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(
        engine.clone(),
        config.model_name.clone(),
        config.max_model_len,
    );
    let app = router(state);
    let drain_engine = engine.clone();
    let grace = config.shutdown_grace;
    let signal = async move {
        shutdown.await;
        // New requests get 503 from here on; streams in flight keep going,
        // so their connections (which axum now waits for) can finish.
        tokio::spawn(async move {
            let drain = drain_engine.shutdown(ShutdownMode::Drain);
            if tokio::time::timeout(grace, drain).await.is_err() {
                drain_engine.shutdown(ShutdownMode::Abort).await;
            }
        });
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(signal)
        .await?;
    engine.shutdown(ShutdownMode::Abort).await;
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
