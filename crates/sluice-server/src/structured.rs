//! Structured-output request fields → one `Constraint`, validated the way
//! vLLM 0.33 validates them, and compiled before the request is accepted
//! so a bad one is a 400 naming its field.
//!
//! The fields, on both endpoints: OpenAI's `response_format` (`text`,
//! `json_object`, `json_schema` with `json_schema.schema`), vLLM's
//! `structured_outputs` object (`json`, `regex`, `choice`, `grammar` —
//! Lark, as llguidance takes it — `json_object`, `whitespace_pattern`), and
//! the older top-level `guided_json`, `guided_regex`, `guided_choice`,
//! `guided_grammar`, `guided_whitespace_pattern` (vLLM 0.33 ignores those
//! with a warning; sluice applies them, as earlier vLLMs did). As in vLLM,
//! `response_format` replaces the same kind in `structured_outputs`, and
//! two kinds at once are refused. Unlike vLLM (which reads whitespace
//! options only from its server config), `whitespace_pattern` applies.

use crate::error::ApiError;
use crate::json::type_error;
use serde_json::{Map, Value};
use sluice_structured::{Constraint, JsonFormat, Whitespace};

/// A request's constraint and the field it came from (for errors).
#[derive(Clone, Debug)]
pub struct Requested {
    pub constraint: Constraint,
    pub field: &'static str,
}

/// The kinds, in vLLM's counting order.
#[derive(Default)]
struct Kinds {
    json: Option<(Value, &'static str)>,
    regex: Option<(String, &'static str)>,
    choice: Option<(Vec<String>, &'static str)>,
    grammar: Option<(String, &'static str)>,
    json_object: Option<&'static str>,
    whitespace_pattern: Option<String>,
    /// vLLM's per-request `disable_any_whitespace` /
    /// `disable_additional_properties` (`structured_outputs` only).
    disable_any_whitespace: Option<bool>,
    disable_additional_properties: Option<bool>,
}

fn string(v: &Value, field: &str) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| type_error(field, "a string", v))
}

fn nonempty(s: String, field: &str, what: &str) -> Result<String, ApiError> {
    if s.trim().is_empty() {
        return Err(ApiError::invalid(
            field,
            format!("{what} cannot be an empty string"),
        ));
    }
    Ok(s)
}

/// A JSON schema given as an object (or `true`), or as a string holding one.
fn schema(v: &Value, field: &str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(true) => Ok(v.clone()),
        Value::String(s) => {
            if s.trim().is_empty() {
                return Err(ApiError::invalid(
                    field,
                    "structured_outputs.json cannot be an empty string",
                ));
            }
            serde_json::from_str::<Value>(s)
                .ok()
                .filter(|v| v.is_object() || v == &Value::Bool(true))
                .ok_or_else(|| ApiError::invalid(field, "Invalid JSON grammar specification."))
        }
        _ => Err(type_error(
            field,
            "a JSON schema (an object, or a string holding one)",
            v,
        )),
    }
}

fn choices(v: &Value, field: &str) -> Result<Vec<String>, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| type_error(field, "an array of strings", v))?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            field,
            "Choice '[]' cannot be an empty list",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, c)| string(c, &format!("{field}[{i}]")))
        .collect()
}

impl Kinds {
    fn count(&self) -> usize {
        [
            self.json.is_some(),
            self.regex.is_some(),
            self.choice.is_some(),
            self.grammar.is_some(),
            self.json_object.is_some(),
        ]
        .iter()
        .filter(|&&b| b)
        .count()
    }

    fn read_object(
        &mut self,
        o: &Map<String, Value>,
        prefix: &'static str,
    ) -> Result<(), ApiError> {
        // Field names for errors: `structured_outputs.json` or `guided_json`.
        let name = |key: &'static str| -> &'static str {
            match (prefix, key) {
                ("structured_outputs", "json") => "structured_outputs.json",
                ("structured_outputs", "regex") => "structured_outputs.regex",
                ("structured_outputs", "choice") => "structured_outputs.choice",
                ("structured_outputs", "grammar") => "structured_outputs.grammar",
                ("structured_outputs", "json_object") => "structured_outputs.json_object",
                ("structured_outputs", "whitespace_pattern") => {
                    "structured_outputs.whitespace_pattern"
                }
                (_, "json") => "guided_json",
                (_, "regex") => "guided_regex",
                (_, "choice") => "guided_choice",
                (_, "grammar") => "guided_grammar",
                _ => "guided_whitespace_pattern",
            }
        };
        let get = |key: &str| o.get(key).filter(|v| !v.is_null());
        if let Some(v) = get("json") {
            let f = name("json");
            self.json = Some((schema(v, f)?, f));
        }
        if let Some(v) = get("regex") {
            let f = name("regex");
            let re = string(v, f)?;
            if re.contains('\0') {
                return Err(ApiError::invalid(
                    f,
                    "structured_outputs.regex must not contain a NUL character ('\\x00')",
                ));
            }
            self.regex = Some((re, f));
        }
        if let Some(v) = get("choice") {
            let f = name("choice");
            self.choice = Some((choices(v, f)?, f));
        }
        if let Some(v) = get("grammar") {
            let f = name("grammar");
            let g = nonempty(string(v, f)?, f, "structured_outputs.grammar")?;
            self.grammar = Some((g, f));
        }
        if let Some(v) = get("json_object") {
            let f = name("json_object");
            if v != &Value::Bool(true) {
                return Err(ApiError::invalid(
                    f,
                    "structured_outputs.json_object must be True if set; omit \
                     structured_outputs to disable structured outputs",
                ));
            }
            self.json_object = Some(f);
        }
        if let Some(v) = get("whitespace_pattern") {
            self.whitespace_pattern = Some(string(v, name("whitespace_pattern"))?);
        }
        if prefix == "structured_outputs" {
            for (key, slot) in [
                ("disable_any_whitespace", &mut self.disable_any_whitespace),
                (
                    "disable_additional_properties",
                    &mut self.disable_additional_properties,
                ),
            ] {
                if let Some(v) = get(key) {
                    let b = v.as_bool().ok_or_else(|| {
                        type_error(&format!("structured_outputs.{key}"), "a boolean", v)
                    })?;
                    *slot = Some(b);
                }
            }
        }
        if get("structural_tag").is_some() {
            return Err(ApiError::invalid(
                "structured_outputs.structural_tag",
                "structural tags are not supported",
            ));
        }
        Ok(())
    }
}

/// `--structured-outputs-config`: a JSON object with vLLM's keys
/// `disable_any_whitespace` and `disable_additional_properties` (booleans),
/// `backend` (`auto` or `guidance`: sluice compiles with llguidance), and
/// sluice's `whitespace` (`bounded`, llama.cpp's rule and the default, or
/// `any`) and `whitespace_pattern` (a regex). Errors name the key.
pub fn parse_structured_outputs_config(text: &str) -> Result<JsonFormat, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(o) = v else {
        return Err("must be a JSON object".into());
    };
    let mut format = JsonFormat::default();
    let flag = |key: &str, v: &Value| {
        v.as_bool()
            .ok_or_else(|| format!("{key}: expected a boolean, got {v}"))
    };
    let (mut compact, mut pattern, mut any) = (false, None, false);
    for (key, v) in &o {
        match key.as_str() {
            "disable_any_whitespace" => compact = flag(key, v)?,
            "disable_additional_properties" => format.strict = flag(key, v)?,
            "backend" => match v.as_str() {
                Some("auto" | "guidance") => {}
                _ => {
                    return Err(format!(
                        "backend: sluice compiles constraints with llguidance (vLLM's \
                         \"guidance\"); expected \"auto\" or \"guidance\", got {v}"
                    ))
                }
            },
            "whitespace" => match v.as_str() {
                Some("bounded") => any = false,
                Some("any") => any = true,
                _ => {
                    return Err(format!(
                        "whitespace: expected \"bounded\" or \"any\", got {v}"
                    ))
                }
            },
            "whitespace_pattern" => {
                pattern = Some(
                    v.as_str()
                        .ok_or_else(|| format!("whitespace_pattern: expected a string, got {v}"))?
                        .to_string(),
                )
            }
            other => {
                return Err(format!(
                    "unknown key {other:?} (known: backend, disable_any_whitespace, \
                     disable_additional_properties, whitespace, whitespace_pattern)"
                ))
            }
        }
    }
    format.whitespace = match (pattern, compact, any) {
        (Some(p), _, _) => Whitespace::Pattern(p),
        (None, true, _) => Whitespace::Compact,
        (None, false, true) => Whitespace::Any,
        (None, false, false) => Whitespace::Bounded,
    };
    Ok(format)
}

/// The constraint a request asks for, if any. `defaults` is the server's
/// JSON format (`--structured-outputs-config`); the request's
/// `whitespace_pattern`, `disable_any_whitespace`,
/// `disable_additional_properties` and `response_format.json_schema.strict`
/// refine it.
pub fn from_body(
    body: &Map<String, Value>,
    defaults: &JsonFormat,
) -> Result<Option<Requested>, ApiError> {
    let mut k = Kinds::default();
    // The older top-level fields first, so the newer ones win a tie of kind.
    let mut legacy = Map::new();
    for (key, field) in [
        ("json", "guided_json"),
        ("regex", "guided_regex"),
        ("choice", "guided_choice"),
        ("grammar", "guided_grammar"),
        ("whitespace_pattern", "guided_whitespace_pattern"),
    ] {
        if let Some(v) = body.get(field) {
            legacy.insert(key.to_string(), v.clone());
        }
    }
    k.read_object(&legacy, "guided")?;
    let mut so = Kinds::default();
    match body.get("structured_outputs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            so.read_object(o, "structured_outputs")?;
            if so.count() == 0 {
                return Err(ApiError::invalid(
                    "structured_outputs",
                    "You must use one kind of structured outputs constraint but none are \
                     specified",
                ));
            }
        }
        Some(v) => return Err(type_error("structured_outputs", "an object", v)),
    }
    if k.count() > 0 && so.count() > 0 {
        return Err(multiple());
    }
    if so.count() > 0 || so.whitespace_pattern.is_some() {
        k = so;
    }
    let mut strict = false;
    // response_format replaces the same kind of structured_outputs.
    match body.get("response_format") {
        None | Some(Value::Null) => {}
        Some(rf) => {
            if !rf.is_object() {
                return Err(type_error("response_format", "an object", rf));
            }
            let ty = match rf.get("type") {
                None | Some(Value::Null) => None,
                Some(Value::String(t)) => Some(t.as_str()),
                Some(t) => return Err(type_error("response_format.type", "a string", t)),
            };
            match ty {
                Some("text") => {}
                Some("json_object") => {
                    k.json = None;
                    k.json_object = Some("response_format");
                }
                Some("json_schema") => {
                    let js = match rf.get("json_schema") {
                        Some(js @ Value::Object(_)) => Some(js),
                        None | Some(Value::Null) => None,
                        Some(js) => {
                            return Err(type_error("response_format.json_schema", "an object", js))
                        }
                    };
                    let Some(js) = js else {
                        return Err(ApiError::invalid(
                            "response_format",
                            "When response_format type is 'json_schema', the 'json_schema' \
                             field must be provided.",
                        ));
                    };
                    let Some(s) = js.get("schema").filter(|v| !v.is_null()) else {
                        return Err(ApiError::invalid(
                            "response_format.json_schema.schema",
                            "response_format.json_schema needs a schema",
                        ));
                    };
                    strict = match js.get("strict") {
                        None | Some(Value::Null) => false,
                        Some(Value::Bool(b)) => *b,
                        Some(v) => {
                            return Err(type_error(
                                "response_format.json_schema.strict",
                                "a boolean",
                                v,
                            ))
                        }
                    };
                    k.json_object = None;
                    k.json = Some((
                        schema(s, "response_format.json_schema.schema")?,
                        "response_format",
                    ));
                }
                Some("structural_tag") => {
                    return Err(ApiError::invalid(
                        "response_format",
                        "structural tags are not supported",
                    ))
                }
                _ => {
                    return Err(ApiError::invalid(
                        "response_format.type",
                        "response_format.type must be one of 'text', 'json_object', \
                         'json_schema'",
                    ))
                }
            }
        }
    }
    if k.count() > 1 {
        return Err(multiple());
    }
    let format = JsonFormat {
        whitespace: match (&k.whitespace_pattern, k.disable_any_whitespace) {
            (Some(p), _) => Whitespace::Pattern(p.clone()),
            (None, Some(true)) => Whitespace::Compact,
            (None, _) => defaults.whitespace.clone(),
        },
        strict: strict || k.disable_additional_properties.unwrap_or(defaults.strict),
    };
    Ok(if let Some((schema, field)) = k.json {
        Some(Requested {
            constraint: Constraint::Json { schema, format },
            field,
        })
    } else if let Some(field) = k.json_object {
        Some(Requested {
            constraint: Constraint::JsonObject { format },
            field,
        })
    } else if let Some((re, field)) = k.regex {
        Some(Requested {
            constraint: Constraint::Regex(re),
            field,
        })
    } else if let Some((c, field)) = k.choice {
        Some(Requested {
            constraint: Constraint::Choice(c),
            field,
        })
    } else {
        k.grammar.map(|(g, field)| Requested {
            constraint: Constraint::Grammar(g),
            field,
        })
    })
}

fn multiple() -> ApiError {
    ApiError::invalid(
        "structured_outputs",
        "You can only use one kind of structured outputs constraint but multiple are specified",
    )
}

/// Compiles the constraint off the async workers; a constraint the engine
/// cannot compile is a 400 naming its field and the reason.
pub async fn check(engine: &sluice_engine::Engine, req: &Requested) -> Result<(), ApiError> {
    let (engine, constraint) = (engine.clone(), req.constraint.clone());
    let result = tokio::task::spawn_blocking(move || engine.compile_constraint(&constraint))
        .await
        .map_err(|e| ApiError::internal(format!("compiling the constraint: {e}")))?;
    result.map_err(|reason| {
        ApiError::invalid(
            req.field,
            format!("Invalid {} constraint: {reason}", req.constraint.kind()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Option<Requested>, ApiError> {
        from_body(v.as_object().unwrap(), &JsonFormat::default())
    }

    fn format(whitespace: Whitespace, strict: bool) -> JsonFormat {
        JsonFormat { whitespace, strict }
    }

    #[test]
    fn server_config_reads_vllms_keys_and_names_bad_ones() {
        let p = parse_structured_outputs_config;
        assert_eq!(p("{}").unwrap(), JsonFormat::default());
        assert_eq!(
            p(r#"{"disable_any_whitespace": true, "disable_additional_properties": true, "backend": "guidance"}"#)
                .unwrap(),
            format(Whitespace::Compact, true)
        );
        assert_eq!(
            p(r#"{"whitespace": "any"}"#).unwrap(),
            format(Whitespace::Any, false)
        );
        assert_eq!(
            p(r#"{"whitespace_pattern": "[ ]?", "whitespace": "any"}"#).unwrap(),
            format(Whitespace::Pattern("[ ]?".into()), false)
        );
        for (bad, needle) in [
            ("[]", "object"),
            ("{", "not JSON"),
            (r#"{"backend": "xgrammar"}"#, "backend"),
            (r#"{"whitespace": "lots"}"#, "whitespace"),
            (
                r#"{"disable_any_whitespace": "yes"}"#,
                "disable_any_whitespace",
            ),
            (r#"{"reasoning": 1}"#, "\"reasoning\""),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn whitespace_and_strictness_follow_the_request_then_the_server() {
        let json_of =
            |v: Value, defaults: &JsonFormat| match from_body(v.as_object().unwrap(), defaults)
                .unwrap()
                .unwrap()
                .constraint
            {
                Constraint::Json { format, .. } | Constraint::JsonObject { format } => format,
                c => panic!("{c:?}"),
            };
        let any = format(Whitespace::Any, true);
        let rf = |strict: Value| {
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": strict}}})
        };
        let dflt = JsonFormat::default();
        assert_eq!(
            json_of(rf(json!(true)), &dflt),
            format(Whitespace::Bounded, true)
        );
        assert_eq!(
            json_of(rf(json!(false)), &dflt),
            format(Whitespace::Bounded, false)
        );
        assert_eq!(json_of(rf(Value::Null), &any), any);
        let so = |extra: Value| {
            let mut o = json!({"json": {"type": "object"}});
            o.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            json!({ "structured_outputs": o })
        };
        assert_eq!(
            json_of(so(json!({"disable_any_whitespace": true})), &any),
            format(Whitespace::Compact, true)
        );
        assert_eq!(
            json_of(so(json!({"disable_additional_properties": false})), &any),
            format(Whitespace::Any, false)
        );
        assert_eq!(
            json_of(
                so(json!({"disable_any_whitespace": true, "whitespace_pattern": " "})),
                &dflt
            ),
            format(Whitespace::Pattern(" ".into()), false)
        );
        let e = parse(so(json!({"disable_any_whitespace": 1}))).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("structured_outputs.disable_any_whitespace")
        );
        let e = parse(rf(json!("yes"))).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("response_format.json_schema.strict")
        );
    }

    #[test]
    fn each_field_gives_its_constraint() {
        let r = parse(json!({"response_format": {"type": "json_object"}}))
            .unwrap()
            .unwrap();
        assert!(matches!(r.constraint, Constraint::JsonObject { .. }));
        let r = parse(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": true}}}))
        .unwrap()
        .unwrap();
        assert_eq!(
            r.constraint,
            Constraint::Json {
                schema: json!({"type": "integer"}),
                format: format(Whitespace::Bounded, true)
            }
        );
        let r = parse(json!({"structured_outputs": {"regex": "a+", "whitespace_pattern": " "}}))
            .unwrap()
            .unwrap();
        assert_eq!(r.constraint, Constraint::Regex("a+".into()));
        assert_eq!(r.field, "structured_outputs.regex");
        let r = parse(json!({"guided_choice": ["a", "b"]}))
            .unwrap()
            .unwrap();
        assert_eq!(
            r.constraint,
            Constraint::Choice(vec!["a".into(), "b".into()])
        );
        let r = parse(
            json!({"structured_outputs": {"json": "{\"type\":\"object\"}",
            "whitespace_pattern": "[ ]?"}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            r.constraint,
            Constraint::Json {
                schema: json!({"type": "object"}),
                format: JsonFormat::pattern("[ ]?")
            }
        );
        assert!(parse(json!({"response_format": {"type": "text"}}))
            .unwrap()
            .is_none());
        assert!(parse(json!({})).unwrap().is_none());
    }

    #[test]
    fn response_format_replaces_the_same_kind() {
        let r = parse(json!({"structured_outputs": {"json": {"type": "string"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}}))
        .unwrap()
        .unwrap();
        assert_eq!(
            r.constraint,
            Constraint::Json {
                schema: json!({"type": "integer"}),
                format: JsonFormat::default()
            }
        );
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        let cases = [
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                "structured_outputs",
                "only use one kind",
            ),
            (
                json!({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}),
                "structured_outputs",
                "only use one kind",
            ),
            (
                json!({"guided_regex": "a", "structured_outputs": {"choice": ["b"]}}),
                "structured_outputs",
                "only use one kind",
            ),
            (
                json!({"structured_outputs": {}}),
                "structured_outputs",
                "none are specified",
            ),
            (
                json!({"structured_outputs": {"choice": []}}),
                "structured_outputs.choice",
                "cannot be an empty list",
            ),
            (
                json!({"structured_outputs": {"grammar": "  "}}),
                "structured_outputs.grammar",
                "empty string",
            ),
            (
                json!({"structured_outputs": {"json_object": false}}),
                "structured_outputs.json_object",
                "must be True",
            ),
            (
                json!({"structured_outputs": {"json": "{not json"}}),
                "structured_outputs.json",
                "Invalid JSON grammar",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
                "'json_schema' field must be provided",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format.type",
                "must be one of",
            ),
            (
                json!({"guided_choice": "a"}),
                "guided_choice",
                "guided_choice: expected an array of strings, got the string \"a\"",
            ),
        ];
        for (body, field, text) in cases {
            let e = parse(body.clone()).unwrap_err();
            let j: Value = serde_json::from_str(&e.body_json()).unwrap();
            let msg = j["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert_eq!(j["error"]["param"], field, "{body}: {j}");
            assert!(msg.contains(text), "{body}: {msg}");
        }
    }
}
