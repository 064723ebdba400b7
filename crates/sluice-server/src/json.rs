//! Request bodies: parsed by hand (not axum's `Json` extractor) so that a
//! malformed body gets an OpenAI-style 400 naming the field at fault.

use crate::error::ApiError;
use serde::de::DeserializeOwned;

/// Parses `body` as `T`; the error names the JSON path that failed.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("malformed JSON body: {inner}"))
        } else if path == "." || path.is_empty() {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::CompletionRequest;

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
