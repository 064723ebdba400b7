//! Chat messages as the template sees them when tools are in play (vLLM's
//! `_postprocess_messages`, note §2.3): assistant `tool_calls` checked and
//! their `function.arguments` JSON strings parsed into objects (invalid,
//! non-object, null or empty: `{}`), `tool_calls: []` removed, `content:
//! null` → `""`, all-text content-part lists joined with `"\n"`; `role`,
//! `name`, `tool_call_id` and other keys pass through.

use crate::error::ApiError;
use serde_json::{Map, Value};

const NOT_FUNCTION: &str = "chat completions only support assistant tool_calls of type 'function'.";

/// The request's `messages` (raw JSON) prepared for
/// `Tokenizer::apply_chat_template_with_tools`.
pub fn prepare(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(crate::json::type_error(
                    &format!("messages[{i}]"),
                    "an object",
                    m,
                ));
            };
            let mut m = m.clone();
            match m.get("content") {
                None | Some(Value::Null) => {
                    m.insert("content".into(), Value::String(String::new()));
                }
                Some(Value::Array(parts)) => {
                    let texts: Option<Vec<&str>> = parts
                        .iter()
                        .map(
                            |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                                (Some("text"), Some(Value::String(t))) => Some(t.as_str()),
                                _ => None,
                            },
                        )
                        .collect();
                    // Any non-text part keeps the list, as vLLM.
                    if let Some(texts) = texts {
                        m.insert("content".into(), Value::String(texts.join("\n")));
                    }
                }
                Some(_) => {}
            }
            if m.get("role").and_then(Value::as_str) == Some("assistant") {
                prepare_tool_calls(&mut m)?;
            }
            Ok(Value::Object(m))
        })
        .collect()
}

fn prepare_tool_calls(m: &mut Map<String, Value>) -> Result<(), ApiError> {
    let calls = match m.get_mut("tool_calls") {
        Some(Value::Array(calls)) if calls.is_empty() => {
            m.remove("tool_calls");
            return Ok(());
        }
        Some(Value::Array(calls)) => calls,
        _ => return Ok(()),
    };
    for call in calls.iter_mut() {
        let Value::Object(call) = call else {
            return Err(ApiError::invalid(
                "tool_calls",
                "assistant tool_calls entries must be objects.",
            ));
        };
        if call.get("type").is_some_and(|t| t != "function") {
            return Err(ApiError::invalid("tool_calls", NOT_FUNCTION));
        }
        let Some(Value::Object(f)) = call.get_mut("function") else {
            return Err(ApiError::invalid("tool_calls", NOT_FUNCTION));
        };
        let args = match f.remove("arguments") {
            Some(Value::Object(o)) => Value::Object(o),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
                Ok(Value::Object(o)) => Value::Object(o),
                _ => Value::Object(Map::new()),
            },
            _ => Value::Object(Map::new()),
        };
        f.insert("arguments".into(), args);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_become_objects() {
        let out = prepare(&[
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                {"id": "c", "function": {"name": "h", "arguments": "[1]"}},
                {"id": "d", "type": "function", "function": {"name": "k"}}]}),
            json!({"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}]}),
            json!({"role": "assistant", "content": "hi", "tool_calls": []}),
        ])
        .unwrap();
        assert_eq!(out[0]["content"], "");
        let args: Vec<&Value> = (0..4)
            .map(|k| &out[0]["tool_calls"][k]["function"]["arguments"])
            .collect();
        assert_eq!(args, [&json!({"x": 1}), &json!({}), &json!({}), &json!({})]);
        assert_eq!(
            out[1],
            json!({"role": "tool", "tool_call_id": "a", "content": "1\n2"})
        );
        assert!(out[2].get("tool_calls").is_none());
    }

    #[test]
    fn bad_tool_calls() {
        let e = prepare(&[json!({"role": "assistant", "tool_calls": [3]})]).unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.param.as_deref()),
            (
                "assistant tool_calls entries must be objects.",
                Some("tool_calls")
            )
        );
        let e = prepare(&[
            json!({"role": "assistant", "tool_calls": [{"type": "custom", "function": {}}]}),
        ])
        .unwrap_err();
        assert_eq!(e.message, NOT_FUNCTION);
    }
}
