//! How a JSON constraint is written and read: the whitespace allowed
//! between JSON tokens and OpenAI's strict reading of object schemas.
//!
//! Owns the translation of a [`JsonFormat`] into the schema llguidance
//! compiles (its `x-guidance` options) and [`close_objects`], the strict
//! rewrite. Promises: the default whitespace is bounded as llama.cpp bounds
//! it; a client's own `x-guidance` whitespace options win over the default
//! but not over a whitespace the request names; closing objects never
//! touches values (`enum`, `const`, `default`, `examples`) or property
//! names, only schemas.

use crate::CompileError;
use serde_json::{json, Map, Value};

/// What may stand between two JSON tokens (after `{`, around `:` and `,`,
/// before `}`): at most one such run each time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Whitespace {
    /// One space, or one or two newlines and at most 20 spaces or tabs of
    /// indentation: llama.cpp's JSON-schema grammar rule. Room for compact
    /// and pretty-printed JSON, none for the runs of newlines a small
    /// model, once it starts them, repeats until its token budget ends.
    #[default]
    Bounded,
    /// Any run of spaces, tabs and newlines (llguidance's flexible
    /// whitespace, vLLM's guidance default).
    Any,
    /// None at all: `{"a":1,"b":2}` (vLLM's `disable_any_whitespace`).
    Compact,
    /// A run matching this regex (vLLM's `whitespace_pattern`).
    Pattern(String),
}

impl Whitespace {
    /// llama.cpp's rule as a regex (its empty alternative is the skip being
    /// optional).
    pub const BOUNDED_REGEX: &'static str = r"( |\n{1,2}[ \t]{0,20})";
}

/// How a JSON constraint is read and written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct JsonFormat {
    pub whitespace: Whitespace,
    /// OpenAI's strict semantics (and vLLM's
    /// `disable_additional_properties`): an object schema that says nothing
    /// of `additionalProperties` allows no keys beyond its `properties`,
    /// where JSON Schema alone would allow any.
    pub strict: bool,
}

impl JsonFormat {
    /// Whitespace matching `regex` between tokens, not strict.
    pub fn pattern(regex: impl Into<String>) -> Self {
        JsonFormat {
            whitespace: Whitespace::Pattern(regex.into()),
            strict: false,
        }
    }

    /// The format as part of a constraint's cache key.
    pub(crate) fn cache_key(&self) -> Value {
        let ws = match &self.whitespace {
            Whitespace::Bounded => json!("bounded"),
            Whitespace::Any => json!("any"),
            Whitespace::Compact => json!("compact"),
            Whitespace::Pattern(p) => json!(["pattern", p]),
        };
        json!([ws, self.strict])
    }

    /// The schema llguidance compiles: closed where strict, with the
    /// whitespace as `x-guidance` options (merged into any the client
    /// wrote).
    pub(crate) fn apply(&self, schema: Value) -> Result<Value, CompileError> {
        // `false` matches nothing: llguidance says so itself.
        if schema == Value::Bool(false) {
            return Ok(schema);
        }
        let mut schema = if self.strict {
            close_objects(schema)
        } else {
            schema
        };
        // `true` is the schema of any value; `{}` says the same and has
        // room for the options.
        if schema == Value::Bool(true) {
            schema = json!({});
        }
        let Value::Object(map) = &mut schema else {
            return Err(CompileError::new(
                "a JSON schema must be an object or a boolean",
            ));
        };
        let options = map.entry("x-guidance").or_insert_with(|| json!({}));
        let Value::Object(options) = options else {
            return Err(CompileError::new("x-guidance must be an object"));
        };
        match &self.whitespace {
            Whitespace::Bounded => {
                if !options.contains_key("whitespace_pattern")
                    && !options.contains_key("whitespace_flexible")
                {
                    options.insert(
                        "whitespace_pattern".into(),
                        json!(Whitespace::BOUNDED_REGEX),
                    );
                }
            }
            Whitespace::Any => {
                options.remove("whitespace_pattern");
                options.insert("whitespace_flexible".into(), json!(true));
            }
            Whitespace::Compact => {
                options.remove("whitespace_pattern");
                options.insert("whitespace_flexible".into(), json!(false));
            }
            Whitespace::Pattern(p) => {
                options.insert("whitespace_pattern".into(), json!(p));
            }
        }
        Ok(schema)
    }
}

/// Keywords whose value is one subschema.
const SCHEMA_KEYWORDS: &[&str] = &[
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
];
/// Keywords whose value maps names to subschemas.
const SCHEMA_MAP_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
/// Keywords whose value is a list of subschemas (`allOf` is handled apart).
const SCHEMA_LIST_KEYWORDS: &[&str] = &["anyOf", "oneOf", "prefixItems", "items"];

/// The schema as OpenAI's strict mode reads it: every object schema (`type`
/// `"object"`, or with `properties`) that says nothing of
/// `additionalProperties` or `unevaluatedProperties` gets
/// `additionalProperties: false`, at every depth. The branches of an
/// `allOf` are left open (each names only part of the properties an
/// instance has, so closing them one by one would refuse every instance);
/// their subschemas are still walked.
pub fn close_objects(schema: Value) -> Value {
    let mut schema = schema;
    close(&mut schema, true);
    schema
}

fn close(node: &mut Value, closable: bool) {
    let Value::Object(map) = node else {
        return;
    };
    if closable
        && is_object_schema(map)
        && !map.contains_key("additionalProperties")
        && !map.contains_key("unevaluatedProperties")
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if key == "allOf" {
            if let Value::Array(list) = value {
                for v in list {
                    close_branch(v);
                }
            }
        } else if SCHEMA_LIST_KEYWORDS.contains(&key) && value.is_array() {
            if let Value::Array(list) = value {
                for v in list {
                    close(v, true);
                }
            }
        } else if SCHEMA_MAP_KEYWORDS.contains(&key) {
            if let Value::Object(m) = value {
                for v in m.values_mut() {
                    close(v, true);
                }
            }
        } else if SCHEMA_KEYWORDS.contains(&key) {
            close(value, true);
        }
    }
}

/// An `allOf` branch: open itself, its subschemas closed as usual.
fn close_branch(node: &mut Value) {
    close(node, false);
}

fn is_object_schema(map: &Map<String, Value>) -> bool {
    let typed = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => false,
    };
    typed || map.contains_key("properties")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_every_object_schema_but_not_values_or_names() {
        let got = close_objects(json!({
            "type": "object",
            "properties": {
                "properties": {"type": "object", "properties": {"x": {}}},
                "open": {"type": "object", "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"y": {}}}},
                "tuple": {"prefixItems": [{"type": "object"}]},
                "either": {"anyOf": [{"type": ["object", "null"]}, {"type": "string"}]},
                "const": {"const": {"type": "object"}, "default": {"properties": {}}},
                "parts": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {"type": "object"}}}]}
            },
            "$defs": {"d": {"type": "object"}}
        }));
        let p = &got["properties"];
        assert_eq!(got["additionalProperties"], false);
        // A property named "properties" is a name, its schema is closed.
        assert_eq!(p["properties"]["additionalProperties"], false);
        assert!(p["properties"]["properties"]
            .get("additionalProperties")
            .is_none());
        assert_eq!(p["open"]["additionalProperties"], true);
        assert_eq!(p["list"]["items"]["additionalProperties"], false);
        assert_eq!(p["tuple"]["prefixItems"][0]["additionalProperties"], false);
        assert_eq!(p["either"]["anyOf"][0]["additionalProperties"], false);
        assert!(p["either"]["anyOf"][1]
            .get("additionalProperties")
            .is_none());
        assert_eq!(
            p["const"],
            json!({"const": {"type": "object"}, "default": {"properties": {}}})
        );
        assert!(p["parts"]["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(
            p["parts"]["allOf"][1]["properties"]["b"]["additionalProperties"],
            false
        );
        assert_eq!(got["$defs"]["d"]["additionalProperties"], false);
    }

    #[test]
    fn whitespace_goes_into_x_guidance() {
        let f = |whitespace| JsonFormat {
            whitespace,
            strict: false,
        };
        let s = f(Whitespace::Pattern(" ?".into()))
            .apply(json!({"type": "object"}))
            .unwrap();
        assert_eq!(s["x-guidance"]["whitespace_pattern"], " ?");
        let s = f(Whitespace::Pattern(String::new()))
            .apply(json!(true))
            .unwrap();
        assert_eq!(s["x-guidance"]["whitespace_pattern"], "");
        let s = f(Whitespace::Bounded).apply(json!({})).unwrap();
        assert_eq!(
            s["x-guidance"]["whitespace_pattern"],
            Whitespace::BOUNDED_REGEX
        );
        // The client's own options win over the default, not over a
        // pattern the request names.
        let mine = json!({"x-guidance": {"whitespace_flexible": false}});
        let s = f(Whitespace::Bounded).apply(mine.clone()).unwrap();
        assert_eq!(s, mine);
        let s = f(Whitespace::Pattern(" ".into())).apply(mine).unwrap();
        assert_eq!(s["x-guidance"]["whitespace_pattern"], " ");
        let s = f(Whitespace::Compact).apply(json!({})).unwrap();
        assert_eq!(s["x-guidance"], json!({"whitespace_flexible": false}));
        assert_eq!(
            f(Whitespace::Bounded).apply(json!(false)).unwrap(),
            json!(false)
        );
        assert!(f(Whitespace::Bounded).apply(json!(3)).is_err());
        assert!(f(Whitespace::Bounded)
            .apply(json!({"x-guidance": 1}))
            .is_err());
    }
}
