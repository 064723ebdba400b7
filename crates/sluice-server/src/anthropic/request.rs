//! An Anthropic Messages body as the chat request it means, as vLLM 0.33
//! converts it: `system` (a string or text blocks) becomes the first
//! message; `tool_use` blocks become the assistant's `tool_calls`,
//! `tool_result` blocks `tool` messages (ahead of the user's text, in
//! block order), `thinking` blocks the assistant's `reasoning`;
//! `stop_sequences` → `stop`, `tools[].input_schema` → function
//! `parameters`, `tool_choice` `auto` / `any` / `tool` / `none` → `auto` /
//! `required` / named / `none` (`auto` when tools come without a choice),
//! `disable_parallel_tool_use` → `parallel_tool_calls: false`,
//! `metadata.user_id` → `user`, `thinking.type` `enabled` / `disabled` →
//! `chat_template_kwargs.enable_thinking` (unless the request sets it).
//!
//! What Anthropic requires and chat does not (`model`, `max_tokens`, each
//! message's `role` and `content`, a block's own fields) is checked here,
//! naming the field; what both have (ranges, stop limits, the template,
//! the tool schemas) is checked by the chat path.

use crate::error::ApiError;
use crate::json::type_error;
use serde_json::{json, Map, Value};

/// Which endpoint the body is for: `count_tokens` takes no `max_tokens`
/// and generates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    CountTokens,
}

/// The Messages body `body` as a Chat Completions body.
pub fn to_chat(
    body: &Map<String, Value>,
    endpoint: Endpoint,
) -> Result<Map<String, Value>, ApiError> {
    let mut chat = Map::new();
    match body.get("model") {
        Some(Value::String(m)) => {
            chat.insert("model".into(), json!(m));
        }
        None | Some(Value::Null) => return Err(required("model")),
        Some(v) => return Err(type_error("model", "a string", v)),
    }
    if endpoint == Endpoint::Messages {
        match body.get("max_tokens") {
            None | Some(Value::Null) => return Err(required("max_tokens")),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => {
                    chat.insert("max_tokens".into(), json!(n));
                }
                _ => {
                    return Err(ApiError::invalid(
                        "max_tokens",
                        format!("max_tokens: must be an integer of at least 1, got {v}"),
                    ))
                }
            },
        }
    }
    let mut messages = Vec::new();
    if let Some(system) = system_text(body.get("system"))? {
        messages.push(json!({"role": "system", "content": system}));
    }
    let raw_messages = match body.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "messages: at least one message is required",
            ))
        }
        None | Some(Value::Null) => return Err(required("messages")),
        Some(v) => return Err(type_error("messages", "an array", v)),
    };
    // Embedded system messages join the top-level system text (vLLM).
    let mut extra_system = String::new();
    for (i, m) in raw_messages.iter().enumerate() {
        convert_message(i, m, &mut messages, &mut extra_system)?;
    }
    if !extra_system.is_empty() {
        match messages.first_mut() {
            Some(first) if first["role"] == "system" => {
                let joined = format!("{}{extra_system}", first["content"].as_str().unwrap_or(""));
                first["content"] = json!(joined);
            }
            _ => messages.insert(0, json!({"role": "system", "content": extra_system})),
        }
    }
    chat.insert("messages".into(), Value::Array(messages));

    if endpoint == Endpoint::Messages {
        if let Some(stop) = body.get("stop_sequences").filter(|v| !v.is_null()) {
            match stop {
                Value::Array(a) => {
                    for (i, s) in a.iter().enumerate() {
                        if !s.is_string() {
                            return Err(type_error(&format!("stop_sequences[{i}]"), "a string", s));
                        }
                    }
                    chat.insert("stop".into(), stop.clone());
                }
                v => return Err(type_error("stop_sequences", "an array of strings", v)),
            }
        }
        for key in ["temperature", "top_p", "top_k"] {
            if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
                chat.insert(key.into(), v.clone());
            }
        }
        if let Some(stream) = crate::json::opt_bool(body.get("stream"), "stream")? {
            chat.insert("stream".into(), json!(stream));
            if stream {
                chat.insert("stream_options".into(), json!({"include_usage": true}));
            }
        }
    }
    if let Some(meta) = body.get("metadata").filter(|v| !v.is_null()) {
        let Value::Object(meta) = meta else {
            return Err(type_error("metadata", "an object", meta));
        };
        match meta.get("user_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(u)) => {
                chat.insert("user".into(), json!(u));
            }
            Some(v) => return Err(type_error("metadata.user_id", "a string", v)),
        }
    }
    let mut kwargs = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => return Err(type_error("chat_template_kwargs", "an object", v)),
    };
    if let Some(thinking) = body.get("thinking").filter(|v| !v.is_null()) {
        let kind = thinking.get("type").and_then(Value::as_str);
        let on = match kind {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::invalid(
                    "thinking.type",
                    "thinking.type: must be \"enabled\" or \"disabled\"",
                ))
            }
        };
        kwargs.entry("enable_thinking").or_insert(json!(on));
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    convert_tools(body, endpoint, &mut chat)?;
    Ok(chat)
}

fn required(field: &str) -> ApiError {
    ApiError::invalid(field, format!("{field}: Field required"))
}

/// `system`: a string, or text blocks joined as vLLM joins them.
fn system_text(system: Option<&Value>) -> Result<Option<String>, ApiError> {
    match system {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok((!s.is_empty()).then(|| s.clone())),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let field = format!("system[{j}]");
                match block_type(b, &field)? {
                    "text" => {
                        let t = string_field(b, &field, "text")?;
                        // Claude Code's per-request attribution line would
                        // defeat prefix caching (vLLM drops it too).
                        if !t.starts_with("x-anthropic-billing-header") {
                            text.push_str(t);
                        }
                    }
                    other => {
                        return Err(ApiError::invalid(
                            format!("{field}.type"),
                            format!("{field}.type: system blocks must be text, got {other:?}"),
                        ))
                    }
                }
            }
            Ok((!text.is_empty()).then_some(text))
        }
        Some(v) => Err(type_error(
            "system",
            "a string or an array of text blocks",
            v,
        )),
    }
}

fn block_type<'a>(b: &'a Value, field: &str) -> Result<&'a str, ApiError> {
    if !b.is_object() {
        return Err(type_error(field, "a content block (an object)", b));
    }
    match b.get("type") {
        Some(Value::String(t)) => Ok(t),
        None | Some(Value::Null) => Err(required(&format!("{field}.type"))),
        Some(v) => Err(type_error(&format!("{field}.type"), "a string", v)),
    }
}

fn string_field<'a>(b: &'a Value, field: &str, key: &str) -> Result<&'a str, ApiError> {
    crate::json::string_member(b, field, key, required)
}

/// One Anthropic message → zero or more chat messages.
fn convert_message(
    i: usize,
    m: &Value,
    out: &mut Vec<Value>,
    extra_system: &mut String,
) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    if !m.is_object() {
        return Err(type_error(&field, "a message (an object)", m));
    }
    let role = match m.get("role") {
        Some(Value::String(r)) if matches!(r.as_str(), "user" | "assistant" | "system") => r,
        Some(Value::String(r)) => {
            return Err(ApiError::invalid(
                format!("{field}.role"),
                format!("{field}.role: must be \"user\" or \"assistant\", got {r:?}"),
            ))
        }
        None | Some(Value::Null) => return Err(required(&format!("{field}.role"))),
        Some(v) => return Err(type_error(&format!("{field}.role"), "a string", v)),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            if role == "system" {
                extra_system.push_str(s);
            } else {
                out.push(json!({"role": role, "content": s}));
            }
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        None | Some(Value::Null) => return Err(required(&format!("{field}.content"))),
        Some(v) => {
            return Err(type_error(
                &format!("{field}.content"),
                "a string or an array of content blocks",
                v,
            ))
        }
    };
    let mut texts: Vec<String> = Vec::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    let mut reasoning = String::new();
    let mut has_reasoning = false;
    for (j, b) in blocks.iter().enumerate() {
        let bf = format!("{field}.content[{j}]");
        match block_type(b, &bf)? {
            "text" => {
                let t = string_field(b, &bf, "text")?;
                if role == "system" {
                    extra_system.push_str(t);
                } else if !t.is_empty() {
                    texts.push(t.to_string());
                }
            }
            "thinking" => {
                reasoning.push_str(string_field(b, &bf, "thinking")?);
                has_reasoning = true;
            }
            // Opaque (safety-filtered) thinking a client echoes back.
            "redacted_thinking" => {}
            "tool_use" => {
                let id = string_field(b, &bf, "id")?;
                let name = string_field(b, &bf, "name")?;
                let input = match b.get("input") {
                    Some(v @ Value::Object(_)) => v,
                    None | Some(Value::Null) => return Err(required(&format!("{bf}.input"))),
                    Some(v) => return Err(type_error(&format!("{bf}.input"), "an object", v)),
                };
                tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": python_dumps(input)},
                }));
            }
            "tool_result" => {
                let text = tool_result_text(b, &bf)?;
                if role == "user" {
                    let id = string_field(b, &bf, "tool_use_id")?;
                    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
                } else {
                    texts.push(format!("Tool result: {text}"));
                }
            }
            t @ ("image" | "document") => {
                return Err(ApiError::invalid(
                    format!("{bf}.type"),
                    format!(
                        "{bf}.type: {t} content is not supported: this server's model reads text"
                    ),
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{bf}.type"),
                    format!(
                        "{bf}.type: unknown content block type {other:?} (text, thinking, \
                         redacted_thinking, tool_use or tool_result)"
                    ),
                ))
            }
        }
    }
    if role == "system" {
        return Ok(());
    }
    let mut msg = Map::new();
    msg.insert("role".into(), json!(role));
    if has_reasoning {
        msg.insert("reasoning".into(), json!(reasoning));
    }
    let has_calls = !tool_calls.is_empty();
    if has_calls {
        msg.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    match texts.len() {
        0 => {}
        1 => {
            msg.insert("content".into(), json!(texts[0]));
        }
        _ => {
            let parts: Vec<Value> = texts
                .iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect();
            msg.insert("content".into(), Value::Array(parts));
        }
    }
    // A user message of tool results alone is its `tool` messages (vLLM).
    if role != "user" || msg.contains_key("content") {
        out.push(Value::Object(msg));
    }
    Ok(())
}

/// A `tool_result`'s `content`: a string, or text blocks joined by lines.
fn tool_result_text(b: &Value, field: &str) -> Result<String, ApiError> {
    match b.get("content") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => {
            let mut parts = Vec::new();
            for (k, item) in items.iter().enumerate() {
                let f = format!("{field}.content[{k}]");
                match block_type(item, &f)? {
                    "text" => parts.push(string_field(item, &f, "text")?.to_string()),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{f}.type"),
                            format!("{f}.type: tool results must be text here, got {other:?}"),
                        ))
                    }
                }
            }
            Ok(parts.join("\n"))
        }
        Some(v) => Err(type_error(
            &format!("{field}.content"),
            "a string or an array of text blocks",
            v,
        )),
    }
}

/// Python's `json.dumps` of a JSON value (vLLM writes `tool_use.input` so
/// into the chat template).
fn python_dumps(v: &Value) -> String {
    let text = serde_json::to_string(v).unwrap_or_default();
    crate::tools::pyjson::loads(&text).map_or(text, |j| crate::tools::pyjson::dumps(&j))
}

/// `tools` and `tool_choice` → their chat forms.
fn convert_tools(
    body: &Map<String, Value>,
    endpoint: Endpoint,
    chat: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(a),
        Some(v) => return Err(type_error("tools", "an array", v)),
    };
    if let Some(tools) = tools {
        let mut out = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            let field = format!("tools[{i}]");
            if !t.is_object() {
                return Err(type_error(&field, "a tool (an object)", t));
            }
            match t.get("type") {
                None | Some(Value::Null) => {}
                Some(Value::String(k)) if k == "custom" => {}
                Some(Value::String(k)) => {
                    return Err(ApiError::invalid(
                        format!("{field}.type"),
                        format!(
                            "{field}.type: {k:?} is one of Anthropic's server tools, which this \
                             server does not run; give client tools (name, description, \
                             input_schema)"
                        ),
                    ))
                }
                Some(v) => return Err(type_error(&format!("{field}.type"), "a string", v)),
            }
            let name = string_field(t, &field, "name")?;
            let schema = match t.get("input_schema") {
                Some(s @ Value::Object(_)) => s,
                None | Some(Value::Null) => return Err(required(&format!("{field}.input_schema"))),
                Some(v) => {
                    return Err(type_error(&format!("{field}.input_schema"), "an object", v))
                }
            };
            let mut function = Map::new();
            function.insert("name".into(), json!(name));
            match t.get("description") {
                None | Some(Value::Null) => {}
                Some(d @ Value::String(_)) => {
                    function.insert("description".into(), d.clone());
                }
                Some(v) => return Err(type_error(&format!("{field}.description"), "a string", v)),
            }
            function.insert("parameters".into(), schema.clone());
            if let Some(strict) = t.get("strict").filter(|v| !v.is_null()) {
                function.insert("strict".into(), strict.clone());
            }
            out.push(json!({"type": "function", "function": function}));
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(c @ Value::Object(o)) => {
            let kind = match o.get("type") {
                Some(Value::String(k)) => k.as_str(),
                None | Some(Value::Null) => return Err(required("tool_choice.type")),
                Some(v) => return Err(type_error("tool_choice.type", "a string", v)),
            };
            let disable = crate::json::opt_bool(
                o.get("disable_parallel_tool_use"),
                "tool_choice.disable_parallel_tool_use",
            )?;
            if let Some(disable) = disable {
                chat.insert("parallel_tool_calls".into(), json!(!disable));
            }
            Some(match kind {
                "auto" => json!("auto"),
                "any" => json!("required"),
                "none" => json!("none"),
                "tool" => {
                    let name = string_field(c, "tool_choice", "name")?;
                    json!({"type": "function", "function": {"name": name}})
                }
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        format!(
                        "tool_choice.type: must be \"auto\", \"any\", \"tool\" or \"none\", got \
                             {other:?}"
                    ),
                    ))
                }
            })
        }
        Some(v) => return Err(type_error("tool_choice", "an object", v)),
    };
    let choice = match endpoint {
        // Counting renders the same prompt whatever the choice (the tools
        // reach the template for every choice), and needs no tool parser.
        Endpoint::CountTokens => tools.map(|_| json!("none")),
        Endpoint::Messages => choice.or_else(|| tools.map(|_| json!("auto"))),
    };
    if let Some(c) = choice {
        chat.insert("tool_choice".into(), c);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Value, ApiError> {
        to_chat(body.as_object().unwrap(), Endpoint::Messages).map(Value::Object)
    }

    #[test]
    fn a_tool_exchange_becomes_calls_and_tool_messages_in_vllms_order() {
        let c = chat(json!({
            "model": "m", "max_tokens": 8,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Paris", "unit": "c"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                        {"type": "text", "text": "21"}, {"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]}
            ],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["\n\n"], "metadata": {"user_id": "u1"}
        }))
        .unwrap();
        assert_eq!(
            c["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "tool_calls": [{"id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}],
                 "content": "Checking."},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "21\nsunny"},
                {"role": "user", "content": "And tomorrow?"}
            ])
        );
        assert_eq!(c["tool_choice"], json!("required"));
        assert_eq!(c["parallel_tool_calls"], json!(false));
        assert_eq!(c["stop"], json!(["\n\n"]));
        assert_eq!(c["user"], json!("u1"));
        assert_eq!(
            c["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn a_user_message_of_tool_results_alone_leaves_only_tool_messages() {
        let c = chat(json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                {"type": "tool_result", "tool_use_id": "b"}]}]}))
        .unwrap();
        assert_eq!(
            c["messages"],
            json!([{"role": "tool", "tool_call_id": "a", "content": "1"},
                   {"role": "tool", "tool_call_id": "b", "content": ""}])
        );
    }

    #[test]
    fn tools_without_a_choice_are_auto_and_thinking_reaches_the_template() {
        let c = chat(json!({"model": "m", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {}}],
            "thinking": {"type": "disabled"}}))
        .unwrap();
        assert_eq!(c["tool_choice"], json!("auto"));
        assert_eq!(c["chat_template_kwargs"], json!({"enable_thinking": false}));
    }

    #[test]
    fn missing_and_wrong_fields_are_named() {
        let cases = [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!({"max_tokens": 1, "messages": []}), "model"),
            (
                json!({"model": "m", "max_tokens": 1, "messages": []}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]}),
                "messages[0].content[0].id",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}),
                "tools[0].input_schema",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}}),
                "tool_choice.name",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "x"}),
                "stop_sequences",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]}),
                "system[0].type",
            ),
        ];
        for (body, field) in cases {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e}");
            assert_eq!(e.status, 400);
        }
    }

    #[test]
    fn count_tokens_needs_no_max_tokens_nor_a_tool_parser() {
        let body = json!({"model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {}}],
            "tool_choice": {"type": "auto"}});
        let c = to_chat(body.as_object().unwrap(), Endpoint::CountTokens).unwrap();
        assert_eq!(c.get("max_tokens"), None);
        assert_eq!(c["tool_choice"], json!("none"));
    }
}
