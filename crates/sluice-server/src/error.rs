//! OpenAI-style error responses: `{"error": {"message", "type", "param",
//! "code"}}` with the HTTP status that goes with them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (503 only).
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: u16,
}

impl ApiError {
    /// 400: a field of the request is invalid.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            retry_after: None,
        }
    }

    /// The same error without a request field named (`param` null).
    pub fn without_param(mut self) -> Self {
        self.param = None;
        self
    }

    /// 400 without a specific field (e.g. malformed JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            retry_after: None,
        }
    }

    pub fn not_found(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: Some(param.to_string()),
            retry_after: None,
        }
    }

    /// 404 for a `model` this server does not serve (vLLM's status and
    /// `NotFoundError` type, so OpenAI clients raise `NotFoundError`).
    pub fn model_not_found(model: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist. Valid aliases: {served}."),
            kind: "NotFoundError",
            param: Some("model".into()),
            retry_after: None,
        }
    }

    /// 503 with `Retry-After`: the engine's waiting queue is full.
    pub fn overloaded(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable",
            param: None,
            retry_after: Some(retry_after),
        }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid or missing API key: send it as `Authorization: Bearer <key>` \
                      or `x-api-key: <key>`."
                .into(),
            kind: "authentication_error",
            param: None,
            retry_after: None,
        }
    }

    /// 405: the route exists, not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("Method {method} is not allowed on {path}."),
            kind: "invalid_request_error",
            param: None,
            retry_after: None,
        }
    }

    /// 408: the request body did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            retry_after: None,
        }
    }

    /// 413: the request body is larger than the server accepts.
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            retry_after: None,
        }
    }

    /// The JSON body alone (for errors inside an SSE stream).
    pub fn body_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        })
        .unwrap_or_else(|_| "{\"error\":{\"message\":\"internal error\"}}".into())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{p}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body_json(),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}
