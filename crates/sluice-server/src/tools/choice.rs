//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request (note
//! §2.1-2.2, 2.4(b), 2.5): validation with vLLM's messages and fields, the
//! tools as chat-template input, the JSON schema that forces `required` or
//! a named function (vLLM's legacy JSON-schema path,
//! `get_json_schema_from_tools`), turning that forced output into calls
//! (non-streaming and streaming), and `finish_reason`.
//!
//! Differences from vLLM: the shape errors of the tools themselves (a tool
//! without `function.name`, a `type` other than `"function"`) are sluice's
//! messages naming the field (vLLM's are pydantic's); schemas are
//! `serde_json::Value`s, so their keys are sorted, not in vLLM's order.

use super::pyjson::{self, Elem, J};
use super::{make_tool_call_id, Snapshot, StreamDelta, Streamer, ToolCall};
use crate::error::ApiError;
use crate::json::type_error;
use serde_json::{json, Map, Value};

/// `tool_choice`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    /// `{"type": "function", "function": {"name": ...}}`.
    Named(String),
    /// An explicit `null` with tools: parsed as auto, but calls are dropped
    /// (note end of §2.6).
    Null,
}

/// One `tools[]` entry (only the fields vLLM passes on).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
    pub defer_loading: Option<bool>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ToolConfig {
    /// None when `tools` is absent or null.
    pub tools: Option<Vec<Tool>>,
    pub choice: ToolChoice,
    /// Only an explicit `false` turns it off.
    pub parallel_tool_calls: bool,
}

const USAGE: &str =
    "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";

/// Python's `str(value)` for the values a JSON body can hold.
fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", py_repr(&Value::String(k.clone())), py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn parse_tool(i: usize, v: &Value) -> Result<Tool, ApiError> {
    let at = |f: &str| format!("tools[{i}]{f}");
    let err = |f: &str, why: &str| ApiError::invalid(at(f), format!("{}: {why}", at(f)));
    let wrong = |f: &str, expected: &str, got: &Value| type_error(&at(f), expected, got);
    let obj = v.as_object().ok_or_else(|| wrong("", "an object", v))?;
    match obj.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(t) => return Err(wrong(".type", "the string \"function\"", t)),
    }
    let f = match obj.get("function") {
        Some(Value::Object(f)) => f,
        Some(g) => return Err(wrong(".function", "an object", g)),
        None => return Err(err(".function", "field required")),
    };
    let name = match f.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(n) => return Err(wrong(".function.name", "a string", n)),
        None => return Err(err(".function.name", "field required")),
    };
    let opt_str = |k: &str| -> Result<Option<String>, ApiError> {
        match f.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(wrong(&format!(".function.{k}"), "a string", v)),
        }
    };
    let opt_bool = |k: &str| -> Result<Option<bool>, ApiError> {
        match f.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(&format!(".function.{k}"), "a boolean", v)),
        }
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p.clone()),
        Some(p) => return Err(wrong(".function.parameters", "an object", p)),
    };
    Ok(Tool {
        name,
        description: opt_str("description")?,
        parameters,
        strict: opt_bool("strict")?,
        defer_loading: opt_bool("defer_loading")?,
    })
}

impl ToolConfig {
    /// Reads and validates the three fields of a chat request body, in
    /// vLLM's order (`check_tool_usage`, then the fields' types).
    pub fn from_request(body: &Map<String, Value>) -> Result<Self, ApiError> {
        let tools_v = body.get("tools").filter(|t| !t.is_null());
        if let Some(Value::Array(a)) = tools_v {
            if a.is_empty() {
                return Err(ApiError::invalid(
                    "tools",
                    "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
                ));
            }
        }
        let tools_truthy = match tools_v {
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Bool(b)) => *b,
            Some(_) => true,
            None => false,
        };
        let choice = match body.get("tool_choice") {
            None if tools_truthy => ToolChoice::Auto,
            None => ToolChoice::None,
            Some(Value::Null) => {
                if tools_v.is_some() {
                    ToolChoice::Null
                } else {
                    ToolChoice::None
                }
            }
            Some(Value::String(s)) if s == "none" => ToolChoice::None,
            Some(tc) => {
                let Some(Value::Array(tools)) = tools_v else {
                    if tools_v.is_none() {
                        return Err(ApiError::invalid(
                            "tool_choice",
                            "When using `tool_choice`, `tools` must be set.",
                        ));
                    }
                    return Err(type_error(
                        "tools",
                        "an array of tools",
                        tools_v.unwrap_or(&Value::Null),
                    ));
                };
                match tc {
                    Value::String(s) if s == "auto" => ToolChoice::Auto,
                    Value::String(s) if s == "required" => ToolChoice::Required,
                    Value::Object(o) => {
                        let function = o.get("function").unwrap_or(&Value::Null);
                        let Value::Object(function) = function else {
                            return Err(ApiError::invalid(
                                "tool_choice.function",
                                format!(
                                    "Invalid value for `function`: `{}` in `tool_choice`! {USAGE}",
                                    py_str(function)
                                ),
                            ));
                        };
                        let Some(name) = function.get("name") else {
                            return Err(ApiError::invalid(
                                "tool_choice.function.name",
                                format!("Expected field `name` in `function` in `tool_choice`! {USAGE}"),
                            ));
                        };
                        let name = match name {
                            Value::String(n) if !n.is_empty() => n.clone(),
                            other => {
                                return Err(ApiError::invalid(
                                    "tool_choice.function.name",
                                    format!(
                                        "Invalid `name` in `function`: `{}` in `tool_choice`! {USAGE}",
                                        py_str(other)
                                    ),
                                ))
                            }
                        };
                        let found = tools.iter().any(|t| {
                            t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str)
                                == Some(name.as_str())
                        });
                        if !found {
                            return Err(ApiError::invalid(
                                "tool_choice",
                                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                            ));
                        }
                        ToolChoice::Named(name)
                    }
                    other => {
                        return Err(ApiError::invalid(
                            "tool_choice",
                            format!(
                                "Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or \"required\" are supported.",
                                py_str(other)
                            ),
                        ))
                    }
                }
            }
        };
        let tools = match tools_v {
            None => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .enumerate()
                    .map(|(i, t)| parse_tool(i, t))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(v) => return Err(type_error("tools", "an array of tools", v)),
        };
        let parallel_tool_calls = match body.get("parallel_tool_calls") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(type_error("parallel_tool_calls", "a boolean", v)),
        };
        Ok(ToolConfig {
            tools,
            choice,
            parallel_tool_calls,
        })
    }

    /// The `tools` chat-template variable: `[{"type": "function",
    /// "function": {"name", "description", "parameters"[, "strict"][,
    /// "defer_loading"]}}]`, None without tools (vLLM passes them even for
    /// `tool_choice: "none"`).
    pub fn template_tools(&self) -> Option<Value> {
        let tools = self.tools.as_ref()?;
        Some(Value::Array(
            tools
                .iter()
                .map(|t| {
                    let mut f = Map::new();
                    f.insert("name".into(), json!(t.name));
                    f.insert("description".into(), json!(t.description));
                    f.insert("parameters".into(), json!(t.parameters));
                    if let Some(s) = t.strict {
                        f.insert("strict".into(), json!(s));
                    }
                    if let Some(d) = t.defer_loading {
                        f.insert("defer_loading".into(), json!(d));
                    }
                    json!({"type": "function", "function": f})
                })
                .collect(),
        ))
    }

    fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.as_ref()?.iter().find(|t| t.name == name)
    }

    /// The JSON schema that constrains the output for `required` or a named
    /// function (None otherwise). Errors: a tool's `$defs` that is not an
    /// object, or one definition name with two schemas (param `tools`).
    pub fn forced_schema(&self) -> Result<Option<Value>, ApiError> {
        let Some(tools) = &self.tools else {
            return Ok(None);
        };
        match &self.choice {
            ToolChoice::Named(name) => Ok(Some(params_or_empty_object(
                self.tool(name)
                    .and_then(Tool::constrained_parameters)
                    .as_ref(),
            ))),
            ToolChoice::Required => {
                let mut defs = Map::new();
                let mut any_of = Vec::new();
                for t in tools {
                    let mut params = t.constrained_parameters();
                    if let Some(Value::Object(p)) = params.as_mut() {
                        match p.remove("$defs") {
                            None => {}
                            Some(Value::Object(d)) => {
                                for (k, v) in d {
                                    if defs.get(&k).is_some_and(|old| *old != v) {
                                        return Err(ApiError::invalid(
                                            "tools",
                                            format!("Tool definition '{k}' has multiple schemas, which is not supported."),
                                        ));
                                    }
                                    defs.insert(k, v);
                                }
                            }
                            Some(other) => {
                                return Err(ApiError::invalid(
                                    "tools",
                                    format!(
                                        "`$defs` in the parameters of tool '{}' must be an object, got {}.",
                                        t.name,
                                        py_type(&other)
                                    ),
                                ))
                            }
                        }
                    }
                    any_of.push(json!({
                        "properties": {
                            "name": {"type": "string", "enum": [t.name]},
                            "parameters": params_or_empty_object(params.as_ref()),
                        },
                        "required": ["name", "parameters"],
                    }));
                }
                let mut schema = json!({
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "object", "anyOf": any_of},
                });
                if !self.parallel_tool_calls {
                    schema["maxItems"] = json!(1);
                }
                if !defs.is_empty() {
                    schema["$defs"] = Value::Object(defs);
                }
                Ok(Some(schema))
            }
            _ => Ok(None),
        }
    }

    /// Whether the response keeps parsed calls (vLLM's `keeps_tool_calls`):
    /// required, named, or auto with a parser enabled
    /// (`--enable-auto-tool-choice --tool-call-parser`) and tools.
    pub fn keeps_tool_calls(&self, auto_tools_enabled: bool) -> bool {
        match self.choice {
            ToolChoice::Required | ToolChoice::Named(_) => true,
            ToolChoice::Auto => {
                auto_tools_enabled && self.tools.as_ref().is_some_and(|t| !t.is_empty())
            }
            ToolChoice::None | ToolChoice::Null => false,
        }
    }

    /// Calls as the response carries them: only the first without
    /// parallel tool calls.
    pub fn limit_calls(&self, mut calls: Vec<ToolCall>) -> Vec<ToolCall> {
        if !self.parallel_tool_calls {
            calls.truncate(1);
        }
        calls
    }

    /// Streaming: without parallel tool calls, deltas of calls after the
    /// first are dropped.
    pub fn limit_delta(&self, delta: &mut StreamDelta) {
        if !self.parallel_tool_calls {
            delta.tool_calls.retain(|d| d.index == 0);
        }
    }

    /// vLLM's `resolve_finish_reason`: `"tool_calls"` when calls were made,
    /// the engine said `"stop"` and the choice is not a named function;
    /// otherwise the engine's reason (`"length"` stays).
    pub fn finish_reason<'a>(&self, engine: &'a str, calls_made: bool) -> &'a str {
        if calls_made && engine == "stop" && !matches!(self.choice, ToolChoice::Named(_)) {
            "tool_calls"
        } else {
            engine
        }
    }
}

fn py_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// vLLM's `_params_or_empty_object`: missing or empty parameters still
/// constrain the arguments to an object.
impl Tool {
    /// The parameters' schema as the output is held to it: with `strict`,
    /// OpenAI's strict reading (no keys beyond an object's `properties`
    /// unless it allows them).
    fn constrained_parameters(&self) -> Option<Value> {
        let p = self.parameters.clone()?;
        Some(if self.strict == Some(true) {
            sluice_structured::close_objects(p)
        } else {
            p
        })
    }
}

fn params_or_empty_object(p: Option<&Value>) -> Value {
    match p {
        Some(Value::Object(m)) if !m.is_empty() => Value::Object(m.clone()),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// The calls in output forced by `required` or a named choice
/// (non-streaming; content is None either way, the response shows `""`).
/// Named: the whole text is that function's arguments (none if blank).
/// Required: the text must be a JSON list of `{"name": str, "parameters":
/// object|null, "description"?: str|null}`; each element's arguments are
/// `json.dumps(parameters, ensure_ascii=False)` (`"null"` without them);
/// anything else gives no calls. Other choices: no calls.
pub fn parse_forced(choice: &ToolChoice, text: &str) -> Vec<ToolCall> {
    match choice {
        ToolChoice::Named(name) => {
            if text.trim().is_empty() {
                Vec::new()
            } else {
                vec![ToolCall::new(name.clone(), text)]
            }
        }
        ToolChoice::Required => parse_required(text).unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn parse_required(text: &str) -> Option<Vec<ToolCall>> {
    let J::Arr(items) = pyjson::loads(text)? else {
        return None;
    };
    items
        .iter()
        .map(|item| {
            let J::Obj(_) = item else { return None };
            let J::Str(name) = item.get("name")? else {
                return None;
            };
            if !matches!(item.get("description"), None | Some(J::Null | J::Str(_))) {
                return None;
            }
            let args = match item.get("parameters") {
                None | Some(J::Null) => "null".to_string(),
                Some(p @ J::Obj(_)) => pyjson::dumps(p),
                Some(_) => return None,
            };
            Some(ToolCall::new(name.clone(), args))
        })
        .collect()
}

/// Streams output forced by `required` or a named choice. Named: the call
/// is announced (id, type, name and the text so far) at the first
/// non-whitespace text, then every fragment is sent as arguments (the
/// arguments are the whole raw text, as non-streaming). Required: a scan of
/// the partial array announces each element once its `name` string is
/// closed and its `parameters` value has started, then streams the raw
/// parameters text; text after `]` is ignored.
pub struct ForcedStream {
    choice: ToolChoice,
    stream: Streamer,
}

impl ForcedStream {
    pub fn new(choice: ToolChoice) -> Self {
        ForcedStream {
            choice,
            stream: Streamer::new(make_tool_call_id),
        }
    }

    fn snapshot(&self, at_end: bool) -> Snapshot {
        let text = self.stream.text();
        let mut snap = Snapshot::default();
        match &self.choice {
            ToolChoice::Named(name) if !text.trim().is_empty() => {
                snap.calls.push((name.clone(), text.to_string()));
            }
            ToolChoice::Required => {
                let start = text.len() - text.trim_start().len();
                if !text[start..].starts_with('[') {
                    return snap;
                }
                for e in pyjson::scan_array(text, start, at_end).elems {
                    let Elem::Obj(o) = e else { continue };
                    let (Some(name), closed) = (o.str_member("name"), o.end.is_some()) else {
                        if o.end.is_some() {
                            continue;
                        }
                        break;
                    };
                    let args = match o.member("parameters") {
                        Some(m) => match &m.done {
                            Some((_, end)) => &text[m.start..*end],
                            None => &text[m.start..],
                        },
                        None if closed => "null",
                        None => break,
                    };
                    snap.calls.push((name.to_string(), args.to_string()));
                    if !closed {
                        break;
                    }
                }
            }
            _ => {}
        }
        snap
    }

    pub fn push(&mut self, delta: &str) -> StreamDelta {
        self.stream.push_text(delta);
        let snap = self.snapshot(false);
        self.stream.emit(snap)
    }

    pub fn finish(&mut self) -> StreamDelta {
        let snap = self.snapshot(true);
        self.stream.emit(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_util::{fold, json_eq};

    fn cfg(body: Value) -> Result<ToolConfig, ApiError> {
        ToolConfig::from_request(body.as_object().unwrap())
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "w",
            "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
                           "$defs": {"City": {"type": "string"}}}}})
    }

    fn err(body: Value) -> (String, Option<String>) {
        let e = cfg(body).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        (e.message, e.param)
    }

    #[test]
    fn validation_messages() {
        assert_eq!(
            err(json!({"tools": []})),
            ("`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.".into(), Some("tools".into()))
        );
        assert_eq!(
            err(json!({"tool_choice": "auto"})),
            (
                "When using `tool_choice`, `tools` must be set.".into(),
                Some("tool_choice".into())
            )
        );
        assert_eq!(
            err(json!({"tools": [weather()], "tool_choice": "any"})),
            ("Invalid value for `tool_choice`: any! Only named tools, \"none\", \"auto\" or \"required\" are supported.".into(), Some("tool_choice".into()))
        );
        assert_eq!(
            err(json!({"tools": [weather()], "tool_choice": {"type": "function"}})).0,
            format!("Invalid value for `function`: `None` in `tool_choice`! {USAGE}")
        );
        assert_eq!(
            err(json!({"tools": [weather()], "tool_choice": {"function": {}}})),
            (
                format!("Expected field `name` in `function` in `tool_choice`! {USAGE}"),
                Some("tool_choice.function.name".into())
            )
        );
        assert_eq!(
            err(json!({"tools": [weather()], "tool_choice": {"function": {"name": ""}}})).0,
            format!("Invalid `name` in `function`: `` in `tool_choice`! {USAGE}")
        );
        assert_eq!(
            err(json!({"tools": [weather()], "tool_choice": {"function": {"name": "nope"}}})),
            (
                "The tool specified in `tool_choice` does not match any of the specified `tools`"
                    .into(),
                Some("tool_choice".into())
            )
        );
        assert_eq!(
            err(json!({"tools": [{"type": "function", "function": {}}]}))
                .1
                .as_deref(),
            Some("tools[0].function.name")
        );
        assert_eq!(
            err(json!({"tools": [weather()], "parallel_tool_calls": 1}))
                .1
                .as_deref(),
            Some("parallel_tool_calls")
        );
        // Not validated: none, null.
        assert_eq!(
            cfg(json!({"tool_choice": "none"})).unwrap().choice,
            ToolChoice::None
        );
        assert_eq!(
            cfg(json!({"tool_choice": null})).unwrap().choice,
            ToolChoice::None
        );
        assert_eq!(
            cfg(json!({"tools": [weather()], "tool_choice": null}))
                .unwrap()
                .choice,
            ToolChoice::Null
        );
        assert_eq!(
            cfg(json!({})).unwrap(),
            ToolConfig {
                tools: None,
                choice: ToolChoice::None,
                parallel_tool_calls: true
            }
        );
    }

    #[test]
    fn defaults_and_template_tools() {
        let c = cfg(json!({"tools": [weather()]})).unwrap();
        assert_eq!(c.choice, ToolChoice::Auto);
        assert!(c.keeps_tool_calls(true) && !c.keeps_tool_calls(false));
        let t = c.template_tools().unwrap();
        assert_eq!(t[0]["type"], "function");
        assert_eq!(t[0]["function"]["name"], "get_weather");
        assert!(t[0]["function"].get("strict").is_none());
        let c = cfg(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})).unwrap();
        assert_eq!(c.choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(
            c.forced_schema().unwrap().unwrap(),
            weather()["function"]["parameters"]
        );
    }

    #[test]
    fn required_schema_is_vllms() {
        let noparams = json!({"type": "function", "function": {"name": "now"}});
        let c = cfg(json!({"tools": [weather(), noparams], "tool_choice": "required", "parallel_tool_calls": false})).unwrap();
        let want = json!({
            "type": "array", "minItems": 1,
            "items": {"type": "object", "anyOf": [
                {"properties": {"name": {"type": "string", "enum": ["get_weather"]},
                                "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}}}},
                 "required": ["name", "parameters"]},
                {"properties": {"name": {"type": "string", "enum": ["now"]},
                                "parameters": {"type": "object", "properties": {}}},
                 "required": ["name", "parameters"]}]},
            "maxItems": 1,
            "$defs": {"City": {"type": "string"}}
        });
        assert_eq!(c.forced_schema().unwrap().unwrap(), want);
        let mut clash = weather();
        clash["function"]["name"] = json!("other");
        clash["function"]["parameters"]["$defs"]["City"] = json!({"type": "integer"});
        let c = cfg(json!({"tools": [weather(), clash], "tool_choice": "required"})).unwrap();
        let e = c.forced_schema().unwrap_err();
        assert_eq!(
            e.message,
            "Tool definition 'City' has multiple schemas, which is not supported."
        );
        let mut bad = weather();
        bad["function"]["parameters"]["$defs"] = json!([1]);
        let c = cfg(json!({"tools": [bad], "tool_choice": "required"})).unwrap();
        assert_eq!(
            c.forced_schema().unwrap_err().message,
            "`$defs` in the parameters of tool 'get_weather' must be an object, got list."
        );
        assert!(cfg(json!({"tools": [weather()]}))
            .unwrap()
            .forced_schema()
            .unwrap()
            .is_none());
    }

    #[test]
    fn strict_tools_allow_no_other_keys() {
        let mut strict = weather();
        strict["function"]["strict"] = json!(true);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let c = cfg(json!({"tools": [strict.clone()], "tool_choice": named})).unwrap();
        let s = c.forced_schema().unwrap().unwrap();
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(
            s["properties"],
            weather()["function"]["parameters"]["properties"]
        );
        let c = cfg(json!({"tools": [strict, weather()], "tool_choice": "required"})).unwrap();
        let s = c.forced_schema().unwrap().unwrap();
        let branches = &s["items"]["anyOf"];
        assert_eq!(
            branches[0]["properties"]["parameters"]["additionalProperties"],
            false
        );
        assert!(branches[1]["properties"]["parameters"]
            .get("additionalProperties")
            .is_none());
    }

    #[test]
    fn forced_outputs() {
        let named = ToolChoice::Named("f".into());
        let calls = parse_forced(&named, " {\"a\":1} ");
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("f", " {\"a\":1} ")
        );
        assert!(parse_forced(&named, " \n").is_empty());
        let text = r#"[{"name": "a", "parameters": {"x": [1,2], "s": "]}"}}, {"name":"b","parameters":{}}]"#;
        let calls = parse_forced(&ToolChoice::Required, text);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, r#"{"x": [1, 2], "s": "]}"}"#);
        assert!(
            parse_forced(&ToolChoice::Required, r#"[{"name": "a", "parameters": 3}]"#).is_empty()
        );
        assert!(parse_forced(&ToolChoice::Required, r#"{"name": "a"}"#).is_empty());
        assert!(parse_forced(&ToolChoice::Required, "[{\"name\": \"a\"").is_empty());
        let c = cfg(
            json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false}),
        )
        .unwrap();
        assert_eq!(c.limit_calls(calls).len(), 1);
    }

    #[test]
    fn forced_streaming_every_split() {
        let cases = [
            (ToolChoice::Named("f".into()), "  {\"a\": \"}\"}"),
            (
                ToolChoice::Required,
                r#" [{"name": "a", "parameters": {"x": [1,2], "s": "]}\"é"}}, {"name":"b","parameters":{}}] junk"#,
            ),
        ];
        for (choice, text) in cases {
            let run = |pieces: &[&str]| {
                let mut s = ForcedStream::new(choice.clone());
                let mut ds: Vec<StreamDelta> = pieces.iter().map(|p| s.push(p)).collect();
                ds.push(s.finish());
                fold(&ds)
            };
            let whole = run(&[text]);
            for (i, _) in text.char_indices().skip(1) {
                assert_eq!(run(&[&text[..i], &text[i..]]), whole, "split at {i}");
            }
            let want = parse_forced(&choice, text.trim_end_matches(" junk"));
            assert_eq!(whole.1.len(), want.len());
            for ((n, a), w) in whole.1.iter().zip(&want) {
                assert_eq!(n, &w.name);
                assert!(json_eq(a, &w.arguments), "{a} vs {}", w.arguments);
            }
        }
        let mut s = ForcedStream::new(ToolChoice::Named("f".into()));
        assert!(s.push(" ").is_empty());
        let d = s.push("{");
        assert_eq!(d.tool_calls[0].function.arguments.as_deref(), Some(" {"));
        assert_eq!(d.tool_calls[0].function.name.as_deref(), Some("f"));
    }

    #[test]
    fn finish_reasons() {
        let auto = cfg(json!({"tools": [weather()]})).unwrap();
        assert_eq!(auto.finish_reason("stop", true), "tool_calls");
        assert_eq!(auto.finish_reason("stop", false), "stop");
        assert_eq!(auto.finish_reason("length", true), "length");
        let named = cfg(
            json!({"tools": [weather()], "tool_choice": {"function": {"name": "get_weather"}}}),
        )
        .unwrap();
        assert_eq!(named.finish_reason("stop", true), "stop");
    }
}
