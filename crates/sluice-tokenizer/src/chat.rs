//! Chat templates: the model's Jinja template rendered as `transformers`'
//! `apply_chat_template(tokenize=False)` renders it (trim_blocks,
//! lstrip_blocks, `raise_exception`, `tojson` with Python's separators,
//! `strftime_now`, Python string methods), the ChatML template of the
//! built-in model and the fallback for models without one.

use super::*;

/// Name of the template inside the tokenizer's Jinja environment.
pub(super) const TEMPLATE_NAME: &str = "chat";
/// ChatML, the format the built-in model's special tokens were named after.
pub(super) const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// For models without a chat template: `role: content` lines, the BOS first
/// when the model has one (the rendered prompt is encoded without special
/// tokens, so nobody else adds it).
pub const FALLBACK_CHAT_TEMPLATE: &str = "{{- bos_token if bos_token else '' -}}\
{%- for message in messages -%}\
{{- message['role'] + ': ' + message['content'] + '\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}";

/// One chat message in the OpenAI / Hugging Face shape. Templates see any
/// serializable message; this is the common case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat template that failed to render: a syntax error in the model's
/// template, or the template's own `raise_exception(...)` refusing the
/// messages (e.g. roles that do not alternate). The message is meant for the
/// client: the server answers 400 with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplateError {
    pub message: String,
}

impl fmt::Display for ChatTemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chat template: {}", self.message)
    }
}

impl std::error::Error for ChatTemplateError {}

impl Tokenizer {
    /// The model's own chat template, `None` when it has none (then
    /// `apply_chat_template` uses `FALLBACK_CHAT_TEMPLATE`).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders `messages` (anything serializable to a list of message
    /// objects, usually `ChatMessage`s or OpenAI JSON messages) with the chat
    /// template. `bos_token`, `eos_token`, `pad_token`, `unk_token`,
    /// `messages` and `add_generation_prompt` are in scope.
    pub fn apply_chat_template<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }

    /// `apply_chat_template` with the `tools` variable: the request's tools
    /// as a list of `{"type": "function", "function": {...}}` objects, or
    /// `None`, which the template sees as `none` (transformers passes
    /// `tools=None`; templates test `tools is not none`, which an undefined
    /// variable would pass).
    pub fn apply_chat_template_with_tools<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&JsonValue>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.apply_chat_template_with_kwargs(messages, tools, add_generation_prompt, None)
    }

    /// `apply_chat_template_with_tools` with extra template variables (a
    /// request's `chat_template_kwargs`, e.g. `{"enable_thinking": false}`
    /// for Qwen3's template), as transformers passes them. They cannot
    /// replace `messages`, `tools`, `add_generation_prompt` or the special
    /// tokens, which win.
    pub fn apply_chat_template_with_kwargs<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&JsonValue>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, JsonValue>>,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError {
                message: e.to_string(),
            })?;
        let ctx = minijinja::context! {
            messages => JinjaValue::from_serialize(messages),
            tools => JinjaValue::from_serialize(tools),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref().unwrap_or(""),
            eos_token => self.eos_token.as_deref().unwrap_or(""),
            pad_token => self.pad_token.as_deref().unwrap_or(""),
            unk_token => self.unk_token.as_deref().unwrap_or(""),
            ..JinjaValue::from_serialize(kwargs)
        };
        template.render(ctx).map_err(|e| ChatTemplateError {
            message: render_error_message(&e),
        })
    }

    /// `apply_chat_template`, then `encode(.., add_special_tokens = false)`:
    /// the template already wrote any BOS.
    pub fn encode_chat<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, add_generation_prompt)?;
        self.encode(&text, false)
    }
}

/// The template's message without minijinja's source listing; a
/// `raise_exception` message comes through as the template wrote it.
pub(super) fn render_error_message(e: &minijinja::Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => e.to_string(),
    }
}

/// A Jinja environment configured as `transformers` renders chat templates.
pub(super) fn template_env(source: String) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    // transformers: jinja2 ImmutableSandboxedEnvironment(trim_blocks=True,
    // lstrip_blocks=True).
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, _> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE_NAME, source)?;
    Ok(env)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`:
/// separators `", "` and `": "` (`","` at line ends when indenting), no HTML
/// escaping (minijinja's own `tojson` escapes `<`, `>`, `&`, `'`).
pub(super) fn tojson(value: JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    // Serialized straight from the Jinja value: a detour through
    // serde_json::Value would sort the keys.
    let json = &value;
    let mut out = Vec::new();
    let res = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            json.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            json.serialize(&mut ser)
        }
    };
    res.map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(JinjaValue::from_safe_string(text))
}

/// serde_json's compact output with Python's default separators.
pub(super) struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `strftime_now(format)` (Llama 3 templates print today's date): the UTC
/// date with `%d %m %Y %y %b %B %H %M %S %%`.
pub(super) fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

pub(super) fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (y, m, d, tod) = utc(unix_secs);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The UTC calendar date and time of day (seconds) of a Unix time.
fn utc(unix_secs: u64) -> (i64, u32, u32, u64) {
    let t = i64::try_from(unix_secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let tod = u64::from(t.hour()) * 3600 + u64::from(t.minute()) * 60 + u64::from(t.second());
    (
        i64::from(t.year()),
        u32::from(u8::from(t.month())),
        u32::from(t.day()),
        tod,
    )
}
