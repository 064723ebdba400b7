//! The small endpoints: models, health, readiness, version, tokenize,
//! detokenize, metrics, and the dev endpoint `reset_prefix_cache`.

use crate::error::ApiError;
use crate::http_metrics::HttpMetrics;
use crate::protocol::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.inner.model_name.clone(),
            object: "model",
            created: state.inner.started,
            owned_by: "sluice",
            root: state.inner.model_name.clone(),
            parent: None,
            max_model_len: state.inner.max_model_len,
        }],
    })
}

/// Alive: the engine thread runs.
pub async fn health(State(state): State<AppState>) -> Response {
    if state.engine().is_alive() {
        StatusCode::OK.into_response()
    } else {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the engine has stopped".into(),
            kind: "service_unavailable",
            param: None,
            retry_after: None,
        }
        .into_response()
    }
}

/// Ready: the model is loaded and the engine accepts requests.
pub async fn ready(State(state): State<AppState>) -> Response {
    let e = state.engine();
    if e.is_alive() && e.is_accepting() {
        Json(serde_json::json!({"status": "ready", "model": state.inner.model_name}))
            .into_response()
    } else {
        ApiError::overloaded("the engine is not accepting requests", 5).into_response()
    }
}

pub async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION")}))
}

pub async fn tokenize(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let req: TokenizeRequest = crate::json::parse(&body)?;
    state.check_model(req.model.as_deref())?;
    let tok = state.engine().tokenizer();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => tok
            .encode(p, req.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e}")))?,
        (None, Some(m)) => {
            let messages = crate::chat::template_messages(m)?;
            tok.encode_chat(&messages, req.add_generation_prompt.unwrap_or(true))
                .map_err(|e| {
                    ApiError::invalid("messages", format!("cannot apply the chat template: {e}"))
                })?
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of prompt or messages",
            ))
        }
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.inner.max_model_len,
        tokens,
    }))
}

pub async fn detokenize(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let req: DetokenizeRequest = crate::json::parse(&body)?;
    state.check_model(req.model.as_deref())?;
    let tok = state.engine().tokenizer();
    // The same vocabulary check as prompts get.
    state
        .engine()
        .check_token_ids("tokens", &req.tokens)
        .map_err(|e| ApiError::invalid(e.field, e.to_string()))?;
    let prompt = tok
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid("tokens", format!("cannot detokenize: {e}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// The Prometheus exposition; the HTTP families come from the extension
/// the metrics middleware puts on every request.
pub async fn metrics(
    State(state): State<AppState>,
    http: Option<Extension<HttpMetrics>>,
) -> Response {
    let engine = state.engine();
    let text = crate::metrics::render(
        &engine.stats(),
        &engine.config().scheduler,
        &state.inner.model_name,
        http.as_ref().map(|Extension(h)| h),
    );
    // prometheus_client 0.26's CONTENT_TYPE_LATEST, what vLLM answers.
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `POST /reset_prefix_cache` (vLLM's dev endpoint):
/// `?reset_running_requests=true` preempts the running requests first;
/// `?reset_external=true` is accepted and has nothing to reset (sluice has
/// no KV connector). Answers `{"success": bool}`, `false` while blocks are
/// still held (the caller may retry), as vLLM.
pub async fn reset_prefix_cache(
    State(state): State<AppState>,
    query: axum::extract::RawQuery,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut reset_running_requests = false;
    for pair in query.0.as_deref().unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "reset_running_requests" => {
                reset_running_requests = parse_query_bool("reset_running_requests", value)?;
            }
            "reset_external" => {
                parse_query_bool("reset_external", value)?;
            }
            // FastAPI ignores query parameters it does not declare.
            _ => {}
        }
    }
    let success = state
        .engine()
        .reset_prefix_cache(reset_running_requests)
        .await
        .map_err(crate::submit::engine_error)?;
    Ok(Json(serde_json::json!({ "success": success })))
}

/// A query boolean as FastAPI (pydantic) reads one; else a 400 naming it.
fn parse_query_bool(key: &'static str, value: &str) -> Result<bool, ApiError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Ok(false),
        _ => Err(ApiError::invalid(
            key,
            format!("{key} must be a boolean, got {value:?}"),
        )),
    }
}
