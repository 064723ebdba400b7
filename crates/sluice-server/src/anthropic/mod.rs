//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, served as vLLM 0.33 serves them — the
//! body is read as the chat request it means (`request.rs`), runs through
//! the chat path (template, sampling, structured outputs, tool calls,
//! reasoning) and is answered in Anthropic's shapes (`response.rs`).
//!
//! Every error under `/v1/messages` is Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` with its status,
//! whichever layer refused the request (`error_shape`: the API key check,
//! the body limits, the handler). The API key may come as `x-api-key`
//! (Anthropic's header) or `Authorization: Bearer` (`access.rs`).

pub mod request;
pub(crate) mod response;

use crate::access_log::AccessNote;
use crate::client::ApiKeyClient;
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use request::Endpoint;
use serde_json::{Map, Value};
use sluice_engine::Usage;

/// The route prefix whose errors are Anthropic's.
pub const PREFIX: &str = "/v1/messages";

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The chat path's field names as the Messages request spells them.
fn anthropic_param(param: &str) -> String {
    match param {
        "max_completion_tokens" => "max_tokens".into(),
        "stop" => "stop_sequences".into(),
        "user" => "metadata.user_id".into(),
        p => p.replace(".function.parameters", ".input_schema"),
    }
}

fn renamed(mut e: ApiError) -> ApiError {
    e.param = e.param.as_deref().map(anthropic_param);
    e
}

/// Reads the chat request a Messages body means and prepares it.
async fn prepare(
    state: &crate::AppState,
    body: &Bytes,
    endpoint: Endpoint,
) -> Result<crate::chat::Prepared, ApiError> {
    let raw: Map<String, Value> = crate::json::parse(body)?;
    let chat = request::to_chat(&raw, endpoint)?;
    let chat = Bytes::from(serde_json::to_vec(&Value::Object(chat)).unwrap_or_default());
    crate::chat::prepare(state, &chat).await.map_err(renamed)
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<crate::AppState>,
    headers: HeaderMap,
    api_key: Option<Extension<ApiKeyClient>>,
    access: Option<Extension<AccessNote>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = prepare(&state, &body, Endpoint::Messages).await?;
    let id = state.new_id("msg");
    let prompt_tokens = p.prompt.len();
    let caller = crate::chat::Caller {
        headers: &headers,
        api_key: api_key.as_ref(),
        access: access.as_ref(),
    };
    let events = p.start(&state, &id, &caller).map_err(renamed)?;
    let model = state.inner.model_name.clone();
    if p.req.sampling.stream() {
        let render = response::Stream::new(id, model, prompt_tokens, p.turn.stream());
        return Ok(crate::sse::respond_events(events, render));
    }
    let mut text = String::new();
    let mut finished = None;
    let mut usage = Usage::default();
    let mut events = events;
    while let Some(ev) = events.next().await {
        match ev {
            crate::submit::Event::Output { out, .. } => {
                text.push_str(&out.text);
                if let Some(f) = out.finished {
                    if let Some(err) = &f.error {
                        return Err(crate::submit::finish_error(err));
                    }
                    finished = Some(f);
                }
            }
            crate::submit::Event::Done { usage: u, .. } => crate::submit::add_usage(&mut usage, &u),
        }
    }
    let out = p.turn.complete(text);
    let stop = match &finished {
        Some(f) => {
            let reason = p
                .turn
                .finish_reason(f.reason.as_str(), !out.tool_calls.is_empty());
            response::stop_fields(reason, f)
        }
        None => (Value::Null, Value::Null),
    };
    let message = response::message_json(
        &id,
        &model,
        response::content_blocks(&out),
        stop,
        response::usage_json(&usage),
    );
    Ok(axum::Json(message).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's length as the Messages
/// request would render it (system, messages, tools).
pub async fn count_tokens(
    State(state): State<crate::AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = prepare(&state, &body, Endpoint::CountTokens).await?;
    Ok(axum::Json(serde_json::json!({"input_tokens": p.prompt.len()})).into_response())
}

/// Most bytes of an error body rewritten (errors are a few hundred).
const MAX_ERROR_BODY: usize = 64 << 10;

/// Middleware: under `/v1/messages`, an error response of any layer is
/// rewritten into Anthropic's shape; its status and headers stay (a 401's
/// `WWW-Authenticate`, a 503's `Retry-After`).
pub async fn error_shape(req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with(PREFIX) {
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || !is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let err = &parsed["error"];
    let message = err["message"].as_str().unwrap_or("request failed");
    let message = match err["param"].as_str() {
        Some(p) if !message.starts_with(p) => format!("{p}: {message}"),
        _ => message.to_string(),
    };
    let body = response::error_json(error_type(status), &message).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, axum::body::Body::from(body))
}
