//! Request bodies: parsed by hand (not axum's `Json` extractor) so that a
//! malformed body gets an OpenAI-style 400 naming the field at fault.

use crate::error::ApiError;
use serde::de::DeserializeOwned;

/// What a field must look like, for the fields whose type is a choice of
/// shapes (serde only says "did not match any variant").
fn shape_hint(path: &str) -> Option<&'static str> {
    let last = path.rsplit('.').next().unwrap_or(path);
    let last = last.split('[').next().unwrap_or(last);
    Some(match last {
        "prompt" => "must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        "stop" => "must be a string or a list of strings",
        "content" => "must be a string or a list of content parts",
        _ => return None,
    })
}

/// Parses `body` as `T`; the error names the JSON path that failed, in the
/// message and in `param`. Bytes after the JSON value are an error.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("malformed JSON body: {inner}"))
        } else if path == "." || path.is_empty() {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            let why = match shape_hint(&path) {
                Some(hint) if inner.to_string().contains("did not match any variant") => {
                    hint.to_string()
                }
                _ => inner.to_string(),
            };
            ApiError::invalid(path.clone(), format!("{path}: {why}"))
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
        assert!(e.message.contains("list of token ids"), "{}", e.message);
    }

    #[test]
    fn names_the_field() {
        let e =
            parse::<CompletionRequest>(br#"{"prompt": "x", "max_tokens": "many"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = parse::<CompletionRequest>(br#"{"prompt": "x""#).unwrap_err();
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
        assert_eq!(e.status.as_u16(), 400);
    }
}
