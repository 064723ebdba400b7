//! Request bodies: parsed by hand (not axum's `Json` extractor) so that a
//! malformed body gets an OpenAI-style 400 naming the field at fault, in
//! the API's words: `temperature: expected a number, got the string "hot"`,
//! the field's JSON path (`messages[0].content`) in the message and in
//! `param`. Only a body that is not JSON at all (a syntax error, or one cut
//! short) is reported with the line and column where parsing stopped;
//! serde's own wording (`invalid type: string "hot", expected f64`) never
//! reaches the client.

use crate::error::ApiError;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

/// What a field must look like, for the fields whose type is a choice of
/// shapes (serde only says "did not match any variant").
fn shape_hint(path: &str) -> Option<&'static str> {
    let last = path.rsplit('.').next().unwrap_or(path);
    let last = last.split('[').next().unwrap_or(last);
    Some(match last {
        "prompt" => {
            "a string, an array of strings, an array of token ids or an array of arrays of \
             token ids"
        }
        "stop" => "a string or an array of strings",
        "content" => "a string or an array of content parts",
        _ => return None,
    })
}

/// A JSON value as the error messages name it: `the string "hot"`, `the
/// number 1.5`, `true`, `null`, `an array`, `an object`. Long strings are
/// cut (the client has them already).
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => {
            const MAX: usize = 40;
            if s.chars().count() > MAX {
                let head: String = s.chars().take(MAX).collect();
                format!("the string {:?}", format!("{head}..."))
            } else {
                format!("the string {s:?}")
            }
        }
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// 400 for a field of the wrong JSON type: `{path}: expected {expected},
/// got {what v is}`, `param` set to `path`.
pub fn type_error(path: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        path,
        format!("{path}: expected {expected}, got {}", describe(got)),
    )
}

/// An optional boolean: `None` when absent or null, a 400 naming `path`
/// when it is not a boolean.
pub fn opt_bool(v: Option<&Value>, path: &str) -> Result<Option<bool>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(type_error(path, "a boolean", other)),
    }
}

/// The string member `key` of `v` (at `path.key`): a 400 naming it when it
/// is not a string, and `missing(path.key)` when it is absent or null (each
/// API words that in its own way).
pub fn string_member<'a>(
    v: &'a Value,
    path: &str,
    key: &str,
    missing: fn(&str) -> ApiError,
) -> Result<&'a str, ApiError> {
    match v.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(missing(&format!("{path}.{key}"))),
        Some(other) => Err(type_error(&format!("{path}.{key}"), "a string", other)),
    }
}

/// serde's name of an expected type, in JSON's words.
fn json_type_name(expected: &str) -> String {
    match expected {
        "f64" | "f32" => "a number".to_string(),
        "i64" | "i32" | "i16" | "i8" | "isize" | "i128" => "an integer".to_string(),
        "u8" => "an integer in [0, 255]".to_string(),
        "u16" => "an integer in [0, 65535]".to_string(),
        "u32" => "an integer in [0, 4294967295]".to_string(),
        "u64" | "usize" | "u128" => "a non-negative integer".to_string(),
        "a boolean" => "a boolean".to_string(),
        "a string" | "a borrowed string" | "a character" | "a char" => "a string".to_string(),
        "a sequence" | "a tuple" => "an array".to_string(),
        "a map" => "an object".to_string(),
        other if other.starts_with("struct ") => "an object".to_string(),
        other => other.replace('`', "'"),
    }
}

/// The value at `path` in `root`, if the path leads anywhere.
fn value_at<'a>(root: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut v = root;
    for seg in path.iter() {
        v = match seg {
            Segment::Seq { index } => v.get(*index)?,
            Segment::Map { key } => v.get(key.as_str())?,
            Segment::Enum { .. } => v,
            Segment::Unknown => return None,
        };
    }
    Some(v)
}

/// serde_json's message without its ` at line L column C` suffix.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// The client's words for a body that is JSON but has a field of the
/// wrong type or value at `path` (`root` is the body, when it parses as
/// JSON).
fn data_error(path: &Path, inner: &serde_json::Error, root: Option<&Value>) -> ApiError {
    let shown = path.to_string();
    let at_root = shown == "." || shown.is_empty();
    let name = if at_root { "the request body" } else { &shown };
    let message = without_position(inner);
    let got = root.and_then(|r| value_at(r, path));
    let wrong = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    let why = if let Some((_, expected)) = wrong.and_then(|m| m.rsplit_once(", expected ")) {
        let expected = json_type_name(expected);
        match got {
            Some(v) => format!("expected {expected}, got {}", describe(v)),
            None => format!("expected {expected}"),
        }
    } else if message.contains("did not match any variant") {
        let expected = shape_hint(&shown).unwrap_or("another shape");
        match got {
            Some(v) => format!("expected {expected}, got {}", describe(v)),
            None => format!("expected {expected}"),
        }
    } else if let Some(field) = message.strip_prefix("missing field ") {
        format!("the field {} is required", field.replace('`', "'"))
    } else {
        message.replace('`', "'")
    };
    let text = format!("{name}: {why}");
    if at_root {
        ApiError::bad_request(text)
    } else {
        ApiError::invalid(shown, text)
    }
}

/// Parses `body` as `T`; the error names the JSON path that failed, in the
/// message and in `param`. Bytes after the JSON value are an error.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().clone();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("malformed JSON body: {inner}"))
        } else {
            // The body is JSON (serde got past its syntax): read it again
            // as a value to say what the faulty field holds.
            let root = serde_json::from_slice::<Value>(body).ok();
            // serde's derived structs also read arrays, field by field: a
            // request body is an object.
            if let Some(v @ Value::Array(_)) = &root {
                return type_error("the request body", "an object", v).without_param();
            }
            data_error(&path, &inner, root.as_ref())
        }
    })?;
    de.end().map_err(|e| {
        ApiError::bad_request(format!("malformed JSON body: {e} after the JSON value"))
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::CompletionRequest;

    #[test]
    fn trailing_bytes_are_an_error() {
        let e = parse::<CompletionRequest>(br#"{"prompt": "x"} {"x": 1}"#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("trailing"), "{}", e.message);
        assert!(parse::<CompletionRequest>(b"{\"prompt\": \"x\"}\n  ").is_ok());
    }

    #[test]
    fn shape_errors_say_what_the_field_must_be() {
        let e = parse::<CompletionRequest>(br#"{"prompt": {"a": 1}}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(e.message.contains("array of token ids"), "{}", e.message);
    }

    #[test]
    fn names_the_field() {
        let e =
            parse::<CompletionRequest>(br#"{"prompt": "x", "max_tokens": "many"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(
            e.message,
            r#"max_tokens: expected an integer, got the string "many""#
        );
        let e = parse::<CompletionRequest>(br#"{"prompt": "x""#).unwrap_err();
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
        assert_eq!(e.status.as_u16(), 400);
    }

    #[test]
    fn the_body_itself_of_the_wrong_type() {
        let e = parse::<CompletionRequest>(b"[1, 2]").unwrap_err();
        assert_eq!(e.param, None);
        assert_eq!(
            e.message,
            "the request body: expected an object, got an array"
        );
    }

    #[test]
    fn values_are_described_as_json() {
        assert_eq!(describe(&serde_json::json!(null)), "null");
        assert_eq!(describe(&serde_json::json!(-2)), "the number -2");
        assert_eq!(describe(&serde_json::json!("a\"b")), r#"the string "a\"b""#);
        let long = "x".repeat(100);
        assert_eq!(
            describe(&serde_json::json!(long)),
            format!("the string \"{}...\"", "x".repeat(40))
        );
    }
}
