//! A Responses API body as the chat request it means, as vLLM 0.33 builds
//! its chat messages: `instructions` → a system message (not carried to
//! follow-ups, as OpenAI's); the previous response's conversation; then
//! `input` — a string (one user message) or items: messages (`role` user,
//! system, developer → system, assistant; `content` a string or
//! `input_text` / `output_text` parts), `function_call` items (consecutive
//! ones are one assistant turn's `tool_calls`), `function_call_output`
//! items (`tool` messages), `reasoning` items (the next assistant turn's
//! `reasoning`). `max_output_tokens` → `max_tokens`; flat function `tools`
//! → chat's nested ones; `tool_choice` `{"type": "function", "name"}` →
//! chat's; `text.format` → `response_format`.
//!
//! Fields chat has too are checked by the chat path, named as this API
//! names them (`mod.rs` renames them back).

use crate::error::ApiError;
use crate::json::type_error;
use serde_json::{json, Map, Value};

/// The chat body, and the messages this request adds to the conversation
/// (what a follow-up's `previous_response_id` continues from, with the
/// output).
pub struct Translated {
    pub chat: Map<String, Value>,
    pub added: Vec<Value>,
}

fn required(field: &str) -> ApiError {
    ApiError::invalid(field, format!("{field}: the field is required"))
}

fn string_field<'a>(v: &'a Value, field: &str, key: &str) -> Result<&'a str, ApiError> {
    crate::json::string_member(v, field, key, required)
}

/// `body` (after `previous_response_id`'s `history`) as a chat body.
pub fn to_chat(body: &Map<String, Value>, history: Vec<Value>) -> Result<Translated, ApiError> {
    let mut chat = Map::new();
    if let Some(m) = body.get("model").filter(|v| !v.is_null()) {
        chat.insert("model".into(), m.clone());
    }
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(v) => return Err(type_error("instructions", "a string", v)),
    }
    messages.extend(history);
    let added = match body.get("input") {
        None | Some(Value::Null) => return Err(required("input")),
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => input_items(items)?,
        Some(v) => {
            return Err(type_error(
                "input",
                "a string or an array of input items",
                v,
            ))
        }
    };
    messages.extend(added.iter().cloned());
    if messages.is_empty() {
        return Err(ApiError::invalid("input", "input: no messages to answer"));
    }
    chat.insert("messages".into(), Value::Array(messages));

    if let Some(m) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), m.clone());
    }
    // Sampling fields both APIs have (and vLLM's extensions to them).
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "stop",
        "user",
        "parallel_tool_calls",
        "priority",
        "chat_template_kwargs",
        "include_reasoning",
    ] {
        if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(stream) = crate::json::opt_bool(body.get("stream"), "stream")? {
        chat.insert("stream".into(), json!(stream));
    }
    if let Some(format) = text_format(body)? {
        chat.insert("response_format".into(), format);
    }
    convert_tools(body, &mut chat)?;
    Ok(Translated { chat, added })
}

/// `input` items → chat messages.
fn input_items(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    // Reasoning handed back with the turn it preceded.
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        if !item.is_object() {
            return Err(type_error(&field, "an input item (an object)", item));
        }
        let kind = match item.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(v) => return Err(type_error(&format!("{field}.type"), "a string", v)),
        };
        match kind {
            "message" => {
                let mut m = message(item, &field)?;
                if m["role"] == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning"] = json!(r);
                    }
                }
                out.push(m);
            }
            "function_call" => {
                let call_id = string_field(item, &field, "call_id")?;
                let name = string_field(item, &field, "name")?;
                let arguments = string_field(item, &field, "arguments")?;
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                });
                // Calls in a row are one assistant turn (parallel calls).
                match out.last_mut() {
                    Some(last)
                        if last["role"] == "assistant" && last.get("tool_calls").is_some() =>
                    {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => {
                        let mut m =
                            json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        if let Some(r) = reasoning.take() {
                            m["reasoning"] = json!(r);
                        }
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                let call_id = string_field(item, &field, "call_id")?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts_text(parts, &format!("{field}.output"))?,
                    None | Some(Value::Null) => return Err(required(&format!("{field}.output"))),
                    Some(v) => {
                        return Err(type_error(
                            &format!("{field}.output"),
                            "a string or an array of text parts",
                            v,
                        ))
                    }
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(Value::Array(parts)) = item.get(key) {
                        for p in parts {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                text.push_str(t);
                            }
                        }
                    }
                    if !text.is_empty() {
                        break;
                    }
                }
                reasoning = Some(text);
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{field}.type"),
                    format!(
                        "{field}.type: input items of type {other:?} are not supported (message, \
                         function_call, function_call_output or reasoning)"
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A message item → a chat message.
fn message(item: &Value, field: &str) -> Result<Value, ApiError> {
    let role = match item.get("role") {
        Some(Value::String(r)) => match r.as_str() {
            "user" | "system" | "assistant" => r.clone(),
            // Chat templates know `system`; OpenAI's developer role is it.
            "developer" => "system".to_string(),
            other => {
                return Err(ApiError::invalid(
                    format!("{field}.role"),
                    format!(
                        "{field}.role: must be \"user\", \"assistant\", \"system\" or \
                         \"developer\", got {other:?}"
                    ),
                ))
            }
        },
        None | Some(Value::Null) => return Err(required(&format!("{field}.role"))),
        Some(v) => return Err(type_error(&format!("{field}.role"), "a string", v)),
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts_text(parts, &format!("{field}.content"))?,
        None | Some(Value::Null) => return Err(required(&format!("{field}.content"))),
        Some(v) => {
            return Err(type_error(
                &format!("{field}.content"),
                "a string or an array of content parts",
                v,
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// Text parts (`input_text`, `output_text`, `text`) joined; anything else
/// is refused naming the part.
fn parts_text(parts: &[Value], field: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let pf = format!("{field}[{j}]");
        let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "input_text" | "output_text" | "text" => text.push_str(string_field(p, &pf, "text")?),
            "refusal" => text.push_str(string_field(p, &pf, "refusal")?),
            other => {
                return Err(ApiError::invalid(
                    format!("{pf}.type"),
                    format!(
                        "{pf}.type: content parts of type {other:?} are not supported: this \
                         server's model reads text (input_text)"
                    ),
                ))
            }
        }
    }
    Ok(text)
}

/// `text.format` → chat's `response_format`.
fn text_format(body: &Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let Some(text) = body.get("text").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Value::Object(text) = text else {
        return Err(type_error("text", "an object", text));
    };
    let Some(format) = text.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = match format.get("type") {
        Some(Value::String(k)) => k.as_str(),
        None | Some(Value::Null) => return Err(required("text.format.type")),
        Some(v) => return Err(type_error("text.format.type", "a string", v)),
    };
    Ok(match kind {
        "text" => None,
        "json_object" => Some(json!({"type": "json_object"})),
        "json_schema" => {
            let schema = match format.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                None | Some(Value::Null) => return Err(required("text.format.schema")),
                Some(v) => return Err(type_error("text.format.schema", "an object", v)),
            };
            let mut js = Map::new();
            js.insert(
                "name".into(),
                format.get("name").cloned().unwrap_or(json!("response")),
            );
            js.insert("schema".into(), schema);
            if let Some(s) = format.get("strict").filter(|v| !v.is_null()) {
                js.insert("strict".into(), s.clone());
            }
            Some(json!({"type": "json_schema", "json_schema": js}))
        }
        other => {
            return Err(ApiError::invalid(
                "text.format.type",
                format!(
                    "text.format.type: must be \"text\", \"json_object\" or \"json_schema\", got \
                     {other:?}"
                ),
            ))
        }
    })
}

/// Flat function tools and `tool_choice` → chat's.
fn convert_tools(body: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut out = Vec::with_capacity(tools.len());
            for (i, t) in tools.iter().enumerate() {
                let field = format!("tools[{i}]");
                if !t.is_object() {
                    return Err(type_error(&field, "a tool (an object)", t));
                }
                match t.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    Some(other) => {
                        return Err(ApiError::invalid(
                            format!("{field}.type"),
                            format!(
                                "{field}.type: {other:?} tools are OpenAI's hosted tools, which \
                                 this server does not run; give function tools"
                            ),
                        ))
                    }
                    None => return Err(required(&format!("{field}.type"))),
                }
                let name = string_field(t, &field, "name")?;
                let mut f = Map::new();
                f.insert("name".into(), json!(name));
                for key in ["description", "parameters", "strict"] {
                    if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                        f.insert(key.into(), v.clone());
                    }
                }
                out.push(json!({"type": "function", "function": f}));
            }
            chat.insert("tools".into(), Value::Array(out));
        }
        Some(v) => return Err(type_error("tools", "an array", v)),
    }
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(c @ Value::String(_)) => {
            chat.insert("tool_choice".into(), c.clone());
        }
        Some(c @ Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = string_field(c, "tool_choice", "name")?;
                chat.insert(
                    "tool_choice".into(),
                    json!({"type": "function", "function": {"name": name}}),
                );
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice: must be \"auto\", \"required\", \"none\" or {\"type\": \
                     \"function\", \"name\": ...}",
                ))
            }
        },
        Some(v) => return Err(type_error("tool_choice", "a string or an object", v)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Translated, ApiError> {
        to_chat(body.as_object().unwrap(), Vec::new())
    }

    #[test]
    fn items_become_the_chat_messages_vllm_builds() {
        let t = chat(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use metric units."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                             {"type": "input_text", "text": "Paris?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Look it up."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                 "arguments": "{\"city\": \"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "get_time",
                 "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
                {"type": "function_call_output", "call_id": "call_2", "output": "noon"}
            ],
            "max_output_tokens": 64,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"},
                       "strict": true}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"},
                                "strict": true}}
        }))
        .unwrap();
        assert_eq!(
            t.chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "system", "content": "Use metric units."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "reasoning": "Look it up.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "get_time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "noon"}
            ])
        );
        // Instructions are not part of what a follow-up continues from.
        assert_eq!(t.added.len(), 5);
        assert_eq!(t.chat["max_tokens"], 64);
        assert_eq!(
            t.chat["tools"],
            json!([{"type": "function", "function": {"name": "get_weather",
                    "parameters": {"type": "object"}, "strict": true}}])
        );
        assert_eq!(
            t.chat["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        assert_eq!(
            t.chat["response_format"],
            json!({"type": "json_schema",
                   "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}})
        );
    }

    #[test]
    fn a_follow_up_continues_the_history() {
        let history = vec![
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello!"}),
        ];
        let body = json!({"input": "And you?", "instructions": "Be kind."});
        let t = to_chat(body.as_object().unwrap(), history).unwrap();
        let roles: Vec<&str> = t.chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(
            t.added,
            vec![json!({"role": "user", "content": "And you?"})]
        );
    }

    #[test]
    fn wrong_items_are_named() {
        let cases = [
            (json!({}), "input"),
            (json!({"input": 5}), "input"),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (json!({"input": [{"role": "user"}]}), "input[0].content"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0].type",
            ),
            (
                json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
                "input[0].call_id",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c"}]}),
                "input[0].output",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "input[0].type",
            ),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": "x", "tools": [{"type": "function"}]}),
                "tools[0].name",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "xml"}}}),
                "text.format.type",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
                "text.format.schema",
            ),
            (
                json!({"input": "x", "tool_choice": {"type": "file_search"}}),
                "tool_choice",
            ),
        ];
        for (body, field) in cases {
            let e = chat(body.clone()).err().unwrap();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e}");
        }
    }
}
