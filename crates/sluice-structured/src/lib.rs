//! Structured outputs: turns a request's constraint (a JSON schema, any JSON
//! object, a regex, a choice of strings, a Lark grammar) into the set of
//! tokens the model may sample at each step.
//!
//! Owns the bridge to llguidance: the model's vocabulary as a token trie
//! ([`StructuredVocab`]), compiling constraints on a small thread pool with a
//! bounded cache ([`GrammarCompiler`]), and a per-sequence matcher
//! ([`GrammarMatcher`]) that writes allowed-token bitmasks and follows the
//! sampled tokens.
//!
//! Promises:
//! - a bitmask allows exactly the tokens whose bytes keep the output a prefix
//!   of some string of the constraint's language; the stop ids exactly where
//!   the output is complete; only the stop ids once nothing else can follow;
//! - compile errors are short messages meant for the client (a 400), never a
//!   panic, never llguidance's verbose state dump;
//! - nothing here panics on a user's constraint or on the tokens a sampler
//!   feeds back: a rejected token makes the matcher report `is_error()`.

mod compiler;
mod json_format;
mod matcher;
mod vocab;

pub use compiler::{CompiledGrammar, GrammarCompiler, PendingGrammar};
pub use json_format::{close_objects, JsonFormat, Whitespace};
pub use matcher::GrammarMatcher;
pub use vocab::StructuredVocab;

/// One structured-output constraint of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// JSON matching a JSON schema.
    Json {
        schema: serde_json::Value,
        format: JsonFormat,
    },
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject { format: JsonFormat },
    /// The whole output matches this regex (Rust regex syntax as
    /// llguidance/derivre accepts).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar, as llguidance accepts.
    Grammar(String),
}

impl Constraint {
    /// `"json"`, `"json_object"`, `"regex"`, `"choice"` or `"grammar"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::Json { .. } => "json",
            Constraint::JsonObject { .. } => "json_object",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Grammar(_) => "grammar",
        }
    }

    /// Canonical text identifying the constraint: a JSON array of the kind
    /// and its parts, so no two constraints share one. The schema is
    /// serialized as given: its key order is kept (the workspace's
    /// serde_json preserves order) because property order decides the order
    /// the output's keys come in.
    pub fn cache_key(&self) -> String {
        use serde_json::json;
        let v = match self {
            Constraint::Json { schema, format } => {
                json!(["json", format.cache_key(), schema])
            }
            Constraint::JsonObject { format } => json!(["json_object", format.cache_key()]),
            Constraint::Regex(rx) => json!(["regex", rx]),
            Constraint::Choice(choices) => json!(["choice", choices]),
            Constraint::Grammar(lark) => json!(["grammar", lark]),
        };
        v.to_string()
    }
}

/// A constraint that does not compile; the message is for the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct CompileError {
    pub message: String,
}

impl CompileError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        CompileError {
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_and_cache_keys_are_distinct() {
        let all = [
            Constraint::Json {
                schema: json!({"type": "string"}),
                format: JsonFormat::default(),
            },
            Constraint::Json {
                schema: json!({"type": "string"}),
                format: JsonFormat {
                    whitespace: Whitespace::Pattern(" ?".into()),
                    strict: false,
                },
            },
            Constraint::Json {
                schema: json!({"type": "string"}),
                format: JsonFormat {
                    whitespace: Whitespace::Any,
                    strict: false,
                },
            },
            Constraint::Json {
                schema: json!({"type": "string"}),
                format: JsonFormat {
                    whitespace: Whitespace::Compact,
                    strict: false,
                },
            },
            Constraint::Json {
                schema: json!({"type": "string"}),
                format: JsonFormat {
                    whitespace: Whitespace::Bounded,
                    strict: true,
                },
            },
            Constraint::JsonObject {
                format: JsonFormat::default(),
            },
            Constraint::Regex("a|b".into()),
            Constraint::Choice(vec!["a|b".into()]),
            Constraint::Choice(vec!["a".into(), "b".into()]),
            Constraint::Grammar("start: \"a\"".into()),
        ];
        let kinds: Vec<_> = all.iter().map(Constraint::kind).collect();
        assert_eq!(
            kinds,
            [
                "json",
                "json",
                "json",
                "json",
                "json",
                "json_object",
                "regex",
                "choice",
                "choice",
                "grammar"
            ]
        );
        let keys: std::collections::HashSet<_> = all.iter().map(Constraint::cache_key).collect();
        assert_eq!(keys.len(), all.len());
        // Key order is part of the key: it orders the output's properties.
        let a = Constraint::Json {
            schema: json!({"properties": {"x": {}, "y": {}}}),
            format: JsonFormat::default(),
        };
        let b = Constraint::Json {
            schema: json!({"properties": {"y": {}, "x": {}}}),
            format: JsonFormat::default(),
        };
        assert_ne!(a.cache_key(), b.cache_key());
        assert_eq!(a.cache_key(), a.clone().cache_key());
    }
}
