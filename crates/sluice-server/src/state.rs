//! What every handler shares: the engine handle and the served model's
//! identity.

use sluice_engine::Engine;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone)]
pub struct AppState {
    pub inner: Arc<Inner>,
}

pub struct Inner {
    pub engine: Engine,
    /// The name clients pass as `model`.
    pub model_name: String,
    pub max_model_len: usize,
    /// Most sequences (prompts × `n`) one request may start.
    pub max_sequences_per_request: usize,
    /// The parser of `tool_choice: "auto"` output, when enabled.
    pub auto_tool_parser: Option<crate::tools::ToolParserKind>,
    /// Unix time the server started (the model card's `created`).
    pub started: u64,
    /// The header a client key is read from first (`client.rs`).
    pub client_id_header: axum::http::HeaderName,
    /// Log each request as it arrives (`--enable-log-requests`).
    pub log_requests: bool,
    /// JSON constraints' defaults (`ServerConfig::json_format`).
    pub json_format: sluice_structured::JsonFormat,
    /// `--reasoning-parser`, bound to the model's vocabulary.
    pub reasoning: Option<crate::reasoning::ReasoningConfig>,
    /// Stored and running Responses API responses.
    pub responses: Arc<crate::responses::store::Store>,
    next_id: AtomicU64,
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    pub fn new(engine: Engine, config: &crate::ServerConfig) -> Self {
        let reasoning = config
            .reasoning_parser
            .map(|k| crate::reasoning::ReasoningConfig::new(k, engine.tokenizer()));
        if reasoning.as_ref().is_some_and(|r| !r.end_is_one_token) {
            crate::logging::warn(
                "the reasoning parser's </think> is not one token of this model's vocabulary: \
                 thinking ends where its text's tokens appear",
            );
        }
        AppState {
            inner: Arc::new(Inner {
                engine,
                model_name: config.model_name.clone(),
                max_model_len: config.max_model_len,
                max_sequences_per_request: config.max_sequences_per_request,
                auto_tool_parser: config.auto_tool_parser,
                started: unix_now(),
                client_id_header: config.client_id_header.clone(),
                log_requests: config.log_requests,
                json_format: config.json_format.clone(),
                reasoning,
                responses: Arc::new(crate::responses::store::Store::new(config.responses_store)),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// A fresh response id with the given prefix (`cmpl`, `chatcmpl`).
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.inner.started)
    }

    /// Checks the request's `model` against the served one: 404, as vLLM.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), crate::error::ApiError> {
        match model {
            None => Ok(()),
            Some(m) if m == self.inner.model_name => Ok(()),
            Some(m) => Err(crate::error::ApiError::model_not_found(
                m,
                &self.inner.model_name,
            )),
        }
    }
}
