//! Who may call what: API keys (`--api-key`, `VLLM_API_KEY`) and CORS
//! (`--allowed-origins`, `--allowed-methods`, `--allowed-headers`).
//!
//! Promises, as vLLM's server:
//! - with keys set, `/v1/*` and the tokenizer endpoints need
//!   `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`)
//!   with one of them, else 401 with an OpenAI error object (Anthropic's
//!   under `/v1/messages`); `/health`, `/ready`, `/metrics`, `/version` stay
//!   open (probes and scrapers carry no key), and so do CORS preflights;
//! - a presented key is compared with every configured key in time that
//!   does not depend on where they differ (SHA-256 digests compared in
//!   constant time, so neither the length nor a prefix leaks);
//! - CORS is off unless an allowed origin is given.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

/// The accepted API keys (none: the API is open).
#[derive(Clone, Default)]
pub struct ApiKeys {
    digests: Arc<Vec<[u8; 32]>>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the keys themselves.
        write!(f, "ApiKeys({} keys)", self.digests.len())
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// Equality whose time does not depend on the position of a difference.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the compiler from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

impl ApiKeys {
    /// Empty keys are ignored (`VLLM_API_KEY=` means no key).
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Self {
        ApiKeys {
            digests: Arc::new(
                keys.iter()
                    .map(AsRef::as_ref)
                    .filter(|k| !k.is_empty())
                    .map(|k| digest(k.as_bytes()))
                    .collect(),
            ),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `presented` is one of the keys. Every key is compared, so
    /// the time does not say which one matched either.
    pub fn accepts(&self, presented: &str) -> bool {
        let d = digest(presented.as_bytes());
        self.digests
            .iter()
            .fold(false, |ok, k| ok | constant_time_eq(&d, k))
    }
}

/// The paths a key protects (vLLM: everything under `/v1`; here also the
/// tokenizer endpoints, which expose the served model as much).
pub fn is_protected(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || matches!(path, "/tokenize" | "/detokenize")
}

/// The bearer token of `Authorization`, if there is one.
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Anthropic's header for the key (its clients send no `Authorization`).
fn x_api_key(req: &Request) -> Option<&str> {
    Some(req.headers().get("x-api-key")?.to_str().ok()?.trim())
}

/// Middleware: refuses protected paths without a valid key.
/// An accepted request carries its key's client label
/// (`client::ApiKeyClient`), the last resort of its client key.
pub async fn require_api_key(
    State(keys): State<ApiKeys>,
    mut req: Request,
    next: Next,
) -> Response {
    if keys.is_empty() || req.method() == Method::OPTIONS || !is_protected(req.uri().path()) {
        return next.run(req).await;
    }
    let client = [bearer(&req), x_api_key(&req)]
        .into_iter()
        .flatten()
        .find(|k| keys.accepts(k))
        .map(crate::client::ApiKeyClient::of);
    if let Some(client) = client {
        req.extensions_mut().insert(client);
        return next.run(req).await;
    }
    let mut resp = ApiError::unauthorized().into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// CORS settings; `*` in a list means any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cors {
    pub allowed_origins: Vec<String>,
    pub allowed_methods: Vec<String>,
    pub allowed_headers: Vec<String>,
}

impl Cors {
    /// The CORS layer, or `None` when no origin is allowed (CORS off).
    /// Errors name the flag and the value that is not a valid origin,
    /// method or header name.
    pub fn layer(&self) -> anyhow::Result<Option<CorsLayer>> {
        if self.allowed_origins.is_empty() {
            return Ok(None);
        }
        let any = |v: &[String]| v.is_empty() || v.iter().any(|s| s == "*");
        let origins = if any(&self.allowed_origins) {
            AllowOrigin::any()
        } else {
            let list = self
                .allowed_origins
                .iter()
                .map(|o| {
                    HeaderValue::from_str(o)
                        .map_err(|_| anyhow::anyhow!("--allowed-origins: {o:?} is not an origin"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            AllowOrigin::list(list)
        };
        let methods = if any(&self.allowed_methods) {
            AllowMethods::any()
        } else {
            let list = self
                .allowed_methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| anyhow::anyhow!("--allowed-methods: {m:?} is not a method"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            AllowMethods::list(list)
        };
        let headers = if any(&self.allowed_headers) {
            AllowHeaders::any()
        } else {
            let list = self
                .allowed_headers
                .iter()
                .map(|h| {
                    header::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                        anyhow::anyhow!("--allowed-headers: {h:?} is not a header name")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            AllowHeaders::list(list)
        };
        Ok(Some(
            CorsLayer::new()
                .allow_origin(origins)
                .allow_methods(methods)
                .allow_headers(headers),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_matched_exactly_and_empty_ones_ignored() {
        let keys = ApiKeys::new(&["alpha", "", "beta"]);
        assert!(!keys.is_empty());
        assert!(keys.accepts("alpha"));
        assert!(keys.accepts("beta"));
        assert!(!keys.accepts("alph"));
        assert!(!keys.accepts("alphaa"));
        assert!(!keys.accepts(""));
        assert!(ApiKeys::new(&[""]).is_empty());
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 keys)");
    }

    #[test]
    fn protected_paths() {
        for p in [
            "/v1/completions",
            "/v1/models",
            "/v1",
            "/tokenize",
            "/detokenize",
        ] {
            assert!(is_protected(p), "{p}");
        }
        for p in ["/health", "/ready", "/metrics", "/version", "/v10", "/"] {
            assert!(!is_protected(p), "{p}");
        }
    }

    #[test]
    fn cors_is_off_without_origins_and_bad_values_name_the_flag() {
        assert!(Cors::default().layer().unwrap().is_none());
        let c = Cors {
            allowed_origins: vec!["https://a.example".into()],
            allowed_methods: vec!["get".into(), "POST".into()],
            allowed_headers: vec!["*".into()],
        };
        assert!(c.layer().unwrap().is_some());
        let bad = Cors {
            allowed_origins: vec!["*".into()],
            allowed_methods: vec!["GE T".into()],
            ..Cors::default()
        };
        let e = bad.layer().unwrap_err().to_string();
        assert!(e.starts_with("--allowed-methods"), "{e}");
    }
}
