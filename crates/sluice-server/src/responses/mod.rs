//! OpenAI's Responses API, as vLLM 0.33 serves it: `POST /v1/responses`
//! (awaited, streamed with the typed events, or in the `background`),
//! `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and
//! `POST /v1/responses/{id}/cancel`.
//!
//! A request is read as the chat request it means (`request.rs`: input
//! items, instructions, tools, `text.format`, and the conversation of its
//! `previous_response_id`), runs through the chat path (template,
//! sampling, structured outputs, tool calls, reasoning), and is answered
//! by one builder (`output.rs`). With `store` (the default) the final
//! response and its conversation stay in the bounded store (`store.rs`)
//! for `GET` and for follow-ups; every response is registered there while
//! it runs, so a streamed or background one can be cancelled.

pub(crate) mod output;
pub(crate) mod request;
pub mod store;

use crate::access_log::AccessNote;
use crate::client::ApiKeyClient;
use crate::error::ApiError;
use crate::json::type_error;
use crate::state::{unix_now, AppState};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The chat path's field names as the Responses request spells them.
fn responses_param(param: &str) -> String {
    match param {
        "max_tokens" | "max_completion_tokens" => "max_output_tokens".into(),
        "response_format" => "text.format".into(),
        "messages" => "input".into(),
        p => p.replace(".function.", "."),
    }
}

fn renamed(mut e: ApiError) -> ApiError {
    e.param = e.param.as_deref().map(responses_param);
    e
}

fn flag(raw: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    Ok(crate::json::opt_bool(raw.get(key), key)?.unwrap_or(default))
}

fn not_found(field: &str, id: &str) -> ApiError {
    ApiError::not_found(field, format!("Response with id '{id}' not found."))
}

/// The response object's request-derived fields (everything but
/// `status`, `output`, `usage`).
fn skeleton(
    raw: &Map<String, Value>,
    id: &str,
    model: &str,
    params: &sluice_engine::SamplingParams,
    store: bool,
    background: bool,
) -> Map<String, Value> {
    let get = |k: &str, default: Value| {
        raw.get(k)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let mut r = Map::new();
    r.insert("id".into(), json!(id));
    r.insert("object".into(), json!("response"));
    r.insert("created_at".into(), json!(unix_now()));
    r.insert("model".into(), json!(model));
    r.insert("error".into(), Value::Null);
    r.insert("incomplete_details".into(), Value::Null);
    r.insert("instructions".into(), get("instructions", Value::Null));
    r.insert(
        "max_output_tokens".into(),
        get("max_output_tokens", Value::Null),
    );
    r.insert("metadata".into(), get("metadata", json!({})));
    r.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls", json!(true)),
    );
    r.insert(
        "previous_response_id".into(),
        get("previous_response_id", Value::Null),
    );
    r.insert("reasoning".into(), get("reasoning", Value::Null));
    r.insert("temperature".into(), json!(params.temperature));
    r.insert("top_p".into(), json!(params.top_p));
    r.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    r.insert("tools".into(), get("tools", json!([])));
    r.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    r.insert("truncation".into(), json!("disabled"));
    r.insert("store".into(), json!(store));
    r.insert("background".into(), json!(background));
    r.insert("user".into(), get("user", Value::Null));
    r
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    api_key: Option<Extension<ApiKeyClient>>,
    access: Option<Extension<AccessNote>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let raw: Map<String, Value> = crate::json::parse(&body)?;
    let store = flag(&raw, "store", true)?;
    let background = flag(&raw, "background", false)?;
    let stream = flag(&raw, "stream", false)?;
    if background && !store {
        return Err(ApiError::invalid(
            "background",
            "background: a background response must be stored (store: true) to be retrieved",
        ));
    }
    if background && stream {
        return Err(ApiError::invalid(
            "stream",
            "stream: a background response cannot be streamed here; poll GET /v1/responses/{id}",
        ));
    }
    let responses = state.inner.responses.clone();
    if background && !responses.enabled() {
        return Err(ApiError::invalid(
            "background",
            "background: the response store is off (--responses-store-max-entries 0)",
        ));
    }
    let history = match raw.get("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(prev)) => match responses.get(prev) {
            Some(s) if s.running => {
                return Err(ApiError::invalid(
                    "previous_response_id",
                    format!("previous_response_id: response '{prev}' is still in progress"),
                ))
            }
            Some(s) => s.history,
            None => return Err(not_found("previous_response_id", prev)),
        },
        Some(v) => return Err(type_error("previous_response_id", "a string", v)),
    };
    let translated = request::to_chat(&raw, history.clone())?;
    let chat = Bytes::from(serde_json::to_vec(&Value::Object(translated.chat)).unwrap_or_default());
    let p = crate::chat::prepare(&state, &chat).await.map_err(renamed)?;

    let id = format!(
        "resp_{:016x}{:016x}",
        crate::tools::random_u64(),
        crate::tools::random_u64()
    );
    let model = state.inner.model_name.clone();
    let skeleton = skeleton(&raw, &id, &model, &p.params, store, background);
    let mut conversation = history;
    conversation.extend(translated.added);
    let cancel = responses.start(&id);
    let caller = crate::chat::Caller {
        headers: &headers,
        api_key: api_key.as_ref(),
        access: access.as_ref(),
    };
    let events = p.start(&state, &id, &caller).map_err(|e| {
        responses.delete(&id);
        renamed(e)
    })?;
    // A cancel ends the stream, which aborts the engine request.
    let mut stop = cancel.clone();
    let events = events
        .take_until(async move {
            let _ = stop.wait_for(|c| *c).await;
        })
        .boxed();
    let on_finish: output::OnFinish = {
        let (responses, id) = (responses.clone(), id.clone());
        Box::new(move |response: &Value, assistant: Value| {
            conversation.push(assistant);
            responses.finish(&id, response.clone(), conversation, store);
        })
    };
    let builder = output::Builder::new(
        skeleton,
        p.turn.stream(),
        stream,
        p.prompt.len(),
        cancel,
        on_finish,
    );
    let snapshot = builder.snapshot("in_progress");
    responses.update_running(&id, snapshot.clone());
    if stream {
        return Ok(crate::sse::respond_events(events, builder));
    }
    if background {
        tokio::spawn(output::collect(events, builder));
        return Ok(axum::Json(snapshot).into_response());
    }
    Ok(axum::Json(output::collect(events, builder).await).into_response())
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.inner.responses.get(&id) {
        Some(s) if !s.response.is_null() => Ok(axum::Json(s.response).into_response()),
        _ => Err(not_found("response_id", &id)),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if state.inner.responses.delete(&id) {
        Ok(axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
    } else {
        Err(not_found("response_id", &id))
    }
}

/// How long a cancel waits for the response to record its end.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// `POST /v1/responses/{id}/cancel`: stops a running (streamed or
/// background) response and answers with it, `status: "cancelled"`.
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let responses = &state.inner.responses;
    match responses.cancel(&id) {
        Ok(()) => {}
        Err(store::CancelError::NotFound) => return Err(not_found("response_id", &id)),
        Err(store::CancelError::NotRunning(status)) => {
            return Err(ApiError::invalid(
                "response_id",
                format!("Cannot cancel response '{id}': it is no longer running (status {status})"),
            ))
        }
    }
    let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
    loop {
        match responses.get(&id) {
            Some(s) if !s.running => return Ok(axum::Json(s.response).into_response()),
            // Not stored (store: false): the cancel took, nothing to show.
            None => {
                return Ok(axum::Json(
                    json!({"id": id, "object": "response", "status": "cancelled"}),
                )
                .into_response())
            }
            Some(_) if tokio::time::Instant::now() >= deadline => {
                return Err(ApiError::internal(format!(
                    "response '{id}' was told to stop but has not yet"
                )))
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}
