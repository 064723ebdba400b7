//! Why the engine refused a request. Each variant maps to one HTTP status
//! (see the variant docs), so the server never has to parse messages.

use sluice_core::FieldError;
use std::fmt;

/// A request the engine did not accept.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineError {
    /// A field of the request is invalid (HTTP 400, `param` = `field`): an
    /// empty or too long prompt, a token id outside the vocabulary,
    /// `max_tokens` < 1, `min_tokens` > `max_tokens`, a bad sampling value,
    /// too many logprobs, a duplicate request id.
    Invalid(FieldError),
    /// The waiting queue is past `EngineConfig::max_waiting_requests`
    /// (HTTP 503 with `Retry-After`).
    Overloaded { num_waiting: usize, limit: usize },
    /// The requests not started yet already hold
    /// `RequestLimits::max_waiting_tokens` prompt + output tokens (HTTP 503
    /// with `Retry-After`).
    OverloadedTokens { waiting_tokens: usize, limit: usize },
    /// The engine is shutting down and accepts nothing new (HTTP 503).
    ShuttingDown,
    /// The engine thread is gone (it panicked or was shut down) (HTTP 500).
    Dead,
}

impl EngineError {
    /// The offending request field, for `Invalid`.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            EngineError::Invalid(e) => Some(e.field),
            _ => None,
        }
    }
}

impl From<FieldError> for EngineError {
    fn from(e: FieldError) -> Self {
        EngineError::Invalid(e)
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Invalid(e) => write!(f, "{e}"),
            EngineError::Overloaded { num_waiting, limit } => write!(
                f,
                "the server is overloaded: {num_waiting} requests are waiting (limit {limit}); retry later"
            ),
            EngineError::OverloadedTokens {
                waiting_tokens,
                limit,
            } => write!(
                f,
                "the server is overloaded: the waiting requests hold {waiting_tokens} prompt and \
                 output tokens (limit {limit}, --max-waiting-tokens); retry later"
            ),
            EngineError::ShuttingDown => f.write_str("the engine is shutting down"),
            EngineError::Dead => f.write_str("the engine has stopped"),
        }
    }
}

impl std::error::Error for EngineError {}
