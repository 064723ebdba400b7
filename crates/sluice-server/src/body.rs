//! Request bodies are read whole, bounded in size and time, before any
//! handler runs: a client that sends its body slowly (or never) gets 408,
//! one that sends too much gets 413, and neither holds a handler or memory
//! beyond the limits. Handlers then take the body as `Bytes`.
//!
//! Every POST route takes JSON: as vLLM, a POST whose `Content-Type` is not
//! `application/json` is refused with 400 before its body is read.

use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::time::Duration;

/// Limits on one request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// From the end of the headers to the end of the body.
    pub timeout: Duration,
}

/// Middleware: replaces the streaming body with the whole body, or answers
/// 408 / 413 / 400.
pub async fn read_whole_body(
    State(limits): State<BodyLimits>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    if parts.method == axum::http::Method::POST {
        let content_type = parts
            .headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = content_type.split(';').next().unwrap_or("").trim();
        // A POST without a body (`POST /v1/responses/{id}/cancel`) declares
        // no type; one with a body must be JSON.
        let content_length = parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let bodyless = content_type.is_empty()
            && (content_length == Some(0)
                || (content_length.is_none()
                    && !parts
                        .headers
                        .contains_key(axum::http::header::TRANSFER_ENCODING)));
        if !bodyless && !essence.eq_ignore_ascii_case("application/json") {
            return ApiError::bad_request(format!(
                "Unsupported Media Type: only 'application/json' is allowed, got Content-Type \
                 {content_type:?}"
            ))
            .into_response();
        }
    }
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        return too_large(limits.max_bytes).into_response();
    }
    let collect = Limited::new(body, limits.max_bytes).collect();
    let bytes = match tokio::time::timeout(limits.timeout, collect).await {
        Err(_) => {
            return ApiError::request_timeout(format!(
                "the request body did not arrive within {} s (--timeout-body-read)",
                limits.timeout.as_secs_f64()
            ))
            .into_response()
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return too_large(limits.max_bytes).into_response()
        }
        Ok(Err(e)) => {
            return ApiError::bad_request(format!("cannot read the request body: {e}"))
                .into_response()
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn too_large(max: usize) -> ApiError {
    ApiError::too_large(format!(
        "the request body is larger than {max} bytes (--max-request-body-bytes)"
    ))
}
