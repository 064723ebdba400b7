//! Who a request comes from: its client key.
//!
//! A request's client key is, in this order of precedence:
//! 1. the value of the client-id header (`--client-id-header`, by default
//!    `x-gateway-inference-fairness-id`, the header the Gateway API
//!    Inference Extension's flow control sets on the requests it forwards);
//! 2. the body's `user` field (OpenAI's end-user id, on both completions
//!    and chat);
//! 3. the API key that authenticated the request, as `key:` and the first
//!    8 hex digits of its SHA-256, so the key itself never reaches a log.
//!
//! Empty values count as absent. A request with none of the three has no
//! client key. The key travels on the engine request and shows in the
//! request log; nothing is decided by it yet.

use axum::http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

/// The header read by default: the one the Gateway API Inference
/// Extension's flow control uses to tell clients apart.
pub const DEFAULT_CLIENT_ID_HEADER: &str = "x-gateway-inference-fairness-id";

/// The client-id header named on the command line, checked: header names
/// are case-insensitive tokens (RFC 9110), so a space or a colon in it is
/// refused, naming the flag.
pub fn header_name(name: &str) -> anyhow::Result<HeaderName> {
    HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()).map_err(|_| {
        anyhow::anyhow!("--client-id-header: {name:?} is not a valid HTTP header name")
    })
}

/// The client key an authenticating API key stands for: `key:` and the
/// first 8 hex digits of the key's SHA-256. The access middleware attaches
/// it to every request whose key it accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyClient(pub String);

impl ApiKeyClient {
    pub fn of(api_key: &str) -> Self {
        let digest = Sha256::digest(api_key.as_bytes());
        let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        ApiKeyClient(format!("key:{hex}"))
    }
}

/// The request's client key, by the precedence above: the header, then
/// `user`, then the API key.
pub fn client_key(
    headers: &HeaderMap,
    header: &HeaderName,
    user: Option<&str>,
    api_key: Option<&ApiKeyClient>,
) -> Option<String> {
    let from_header = headers
        .get(header)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    from_header
        .or(user.filter(|u| !u.is_empty()))
        .map(str::to_string)
        .or_else(|| api_key.map(|k| k.0.clone()))
}
