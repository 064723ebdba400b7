//! Reading `tokenizer_config.json`: its special tokens (strings or
//! `AddedToken` objects) and its chat template (a string or a named list).

use super::*;

/// A special token in `tokenizer_config.json`: `null`, a string, or an
/// `AddedToken` object (`{"content": "...", ...}`).
pub(super) fn special_token(config: &JsonValue, key: &str) -> Option<String> {
    match config.get(key)? {
        JsonValue::String(s) => Some(s.clone()),
        JsonValue::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

pub(super) fn read_json(path: &Path) -> Result<Option<JsonValue>> {
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", path.display()))?;
    Ok(Some(value))
}

/// The chat template of `tokenizer_config.json`: a string, or a list of
/// `{name, template}` (the one named `default` is the chat template).
pub(super) fn config_chat_template(config: &JsonValue, path: &Path) -> Result<Option<String>> {
    match config.get("chat_template") {
        None | Some(JsonValue::Null) => Ok(None),
        Some(JsonValue::String(s)) => Ok(Some(s.clone())),
        Some(JsonValue::Array(items)) => {
            let named = |name: &str| {
                items.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == name)
                        .then(|| t.get("template")?.as_str().map(str::to_string))
                        .flatten()
                })
            };
            match named("default") {
                Some(t) => Ok(Some(t)),
                None => bail!(
                    "{}: chat_template is a list without a template named \"default\"",
                    path.display()
                ),
            }
        }
        Some(_) => bail!(
            "{}: chat_template must be a string or a list of {{name, template}}",
            path.display()
        ),
    }
}
