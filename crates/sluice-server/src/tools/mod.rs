//! Tool calling with vLLM 0.33's semantics:
//! the call and stream-delta types, tool-call ids, the model-output parsers
//! (`hermes`, `llama3_json`, `mistral`), `tool_choice` validation and the
//! JSON schema for `required` / named choices (`choice`), and the
//! preprocessing of messages for chat templates (`messages`).
//!
//! Promises: nothing here panics or errors on model output: text the
//! parsers cannot read as calls comes back as content. Request fields that
//! are wrong are `ApiError`s naming the field, with vLLM's messages.
//!
//! Streaming contract (every parser and the forced-choice streamer): the
//! deltas concatenated over any split of the text into pushes are the same
//! as for one push of the whole text: the same content, the same calls in
//! the same order with the same names, and argument fragments that
//! concatenate to the same text. That text is the model's **raw** argument
//! text (as vLLM streams it). The non-streaming `extract` returns the
//! arguments **re-serialized** as Python's `json.dumps(ensure_ascii=False)`
//! (as vLLM does for hermes, llama3_json, legacy mistral and `required`),
//! so for well-formed calls the streamed arguments and the extracted ones
//! are equal as JSON values, not byte for byte (mistral v11+ and named
//! choices keep the raw text in both modes). Streaming re-scans the text
//! held so far on each push (quadratic in the worst case, as vLLM's
//! parsers are) so that the result cannot depend on where the text splits.

pub mod choice;
pub mod hermes;
pub mod llama3_json;
pub mod messages;
pub mod mistral;
pub(crate) mod pyjson;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// One parsed call, as the non-streaming response's
/// `message.tool_calls[]` (serialized `{"id", "type": "function",
/// "function": {"name", "arguments"}}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON text (a string, as OpenAI sends it).
    pub arguments: String,
}

impl ToolCall {
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: make_tool_call_id(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("ToolCall", 3)?;
        st.serialize_field("id", &self.id)?;
        st.serialize_field("type", "function")?;
        st.serialize_field(
            "function",
            &FunctionDelta {
                name: Some(self.name.clone()),
                arguments: Some(self.arguments.clone()),
            },
        )?;
        st.end()
    }
}

/// `function` of a streamed tool-call delta; absent fields are omitted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One entry of a stream chunk's `delta.tool_calls[]`: the first for a call
/// carries `id`, `type` and `function.name`; later ones only
/// `function.arguments`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

/// What to send for one push: content text and/or tool-call deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamDelta {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl StreamDelta {
    /// Nothing to send (vLLM sends no chunk then, unless logprobs are due).
    pub fn is_empty(&self) -> bool {
        self.content.is_none() && self.tool_calls.is_empty()
    }

    /// Appends `other` (content concatenated, deltas in order).
    pub fn append(&mut self, other: StreamDelta) {
        if let Some(c) = other.content {
            self.content.get_or_insert_with(String::new).push_str(&c);
        }
        self.tool_calls.extend(other.tool_calls);
    }
}

/// A model-output parser for `--tool-call-parser`. One per choice.
pub trait ToolParser: Send {
    /// Non-streaming: the content (None when empty or whitespace, as vLLM)
    /// and the calls. Calls that do not parse give no calls and the whole
    /// text as content (never an error).
    fn extract(&self, text: &str) -> (Option<String>, Vec<ToolCall>);
    /// Streaming: feeds the next text delta and returns what to send now;
    /// see the module doc for what concatenates to what.
    fn push(&mut self, delta: &str) -> StreamDelta;
    /// At the end of generation: whatever is still held back.
    fn finish(&mut self) -> StreamDelta;
}

/// The parsers sluice has, by vLLM's `--tool-call-parser` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolParserKind {
    Hermes,
    Llama3Json,
    Mistral,
}

/// The names `ToolParserKind::from_str` accepts.
pub const SUPPORTED_PARSERS: &[&str] = &["hermes", "llama3_json", "mistral"];

impl std::str::FromStr for ToolParserKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hermes" => Ok(ToolParserKind::Hermes),
            "llama3_json" => Ok(ToolParserKind::Llama3Json),
            "mistral" => Ok(ToolParserKind::Mistral),
            _ => Err(format!(
                "invalid tool call parser: {s} (chose from {{ {} }})",
                SUPPORTED_PARSERS.join(",")
            )),
        }
    }
}

/// A fresh parser of `kind` (mistral detects the pre-v11 / v11+ format
/// from the output; see `mistral::MistralParser::with_format`).
pub fn parser(kind: ToolParserKind) -> Box<dyn ToolParser> {
    match kind {
        ToolParserKind::Hermes => Box::new(hermes::HermesParser::new()),
        ToolParserKind::Llama3Json => Box::new(llama3_json::Llama3JsonParser::new()),
        ToolParserKind::Mistral => Box::new(mistral::MistralParser::new()),
    }
}

/// 64 random bits: the standard library's per-process random SipHash keys
/// over a counter and the clock (no `rand` in the workspace; ids need to be
/// unique, not unpredictable).
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    h.finish()
}

/// `chatcmpl-tool-` and 16 lowercase hex digits (vLLM: the low 64 bits of
/// a uuid4).
pub fn make_tool_call_id() -> String {
    format!("chatcmpl-tool-{:016x}", random_u64())
}

/// Mistral's ids: 9 characters from `[A-Za-z0-9]`.
pub fn make_mistral_tool_call_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x = random_u64();
    (0..9)
        .map(|_| {
            let c = ALPHABET[(x % 62) as usize] as char;
            x /= 62;
            c
        })
        .collect()
}

/// `None` for empty or whitespace-only content, as vLLM's parse layer.
pub(crate) fn non_blank(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.to_string())
}

/// The longest suffix of `text` that is a proper prefix of `tag` (text to
/// hold back in case the tag is arriving). Byte lengths on char
/// boundaries.
pub(crate) fn partial_tag_len(text: &str, tag: &str) -> usize {
    let max = tag.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k) && tag.starts_with(&text[text.len() - k..])
        })
        .unwrap_or(0)
}

/// What a parser reads from the text so far: everything it would have sent
/// by now. Each snapshot's content and arguments extend the previous ones
/// (the parsers hold back what a later character could change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub content: String,
    /// (name, raw argument text so far), announced calls only.
    pub calls: Vec<(String, String)>,
}

/// The streaming half shared by the parsers: holds the text, diffs each
/// snapshot against what was sent.
pub(crate) struct Streamer {
    text: String,
    content_sent: usize,
    args_sent: Vec<usize>,
    new_id: fn() -> String,
}

impl Streamer {
    pub(crate) fn new(new_id: fn() -> String) -> Self {
        Streamer {
            text: String::new(),
            content_sent: 0,
            args_sent: Vec::new(),
            new_id,
        }
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) fn push_text(&mut self, delta: &str) {
        self.text.push_str(delta);
    }

    /// The part of `snap` not sent yet. A snapshot that does not extend
    /// what was sent (it should not happen) sends nothing rather than
    /// something wrong.
    /// A stateless parser's `push`: takes `delta`, re-reads the whole text
    /// with `snapshot` and sends what is new.
    pub(crate) fn feed(
        &mut self,
        delta: &str,
        snapshot: fn(&str, bool) -> Snapshot,
    ) -> StreamDelta {
        self.push_text(delta);
        let snap = snapshot(self.text(), false);
        self.emit(snap)
    }

    /// A stateless parser's `finish`: the final read, holding nothing back.
    pub(crate) fn finish_with(&mut self, snapshot: fn(&str, bool) -> Snapshot) -> StreamDelta {
        let snap = snapshot(self.text(), true);
        self.emit(snap)
    }

    pub(crate) fn emit(&mut self, snap: Snapshot) -> StreamDelta {
        let mut out = StreamDelta::default();
        if snap.content.len() > self.content_sent {
            if let Some(new) = snap.content.get(self.content_sent..) {
                out.content = Some(new.to_string());
                self.content_sent = snap.content.len();
            }
        }
        for (index, (name, args)) in snap.calls.into_iter().enumerate() {
            match self.args_sent.get(index).copied() {
                None => {
                    out.tool_calls.push(ToolCallDelta {
                        index,
                        id: Some((self.new_id)()),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: (!args.is_empty()).then(|| args.clone()),
                        },
                    });
                    self.args_sent.push(args.len());
                }
                Some(sent) if args.len() > sent => {
                    if let Some(new) = args.get(sent..) {
                        out.tool_calls.push(ToolCallDelta {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionDelta {
                                name: None,
                                arguments: Some(new.to_string()),
                            },
                        });
                        self.args_sent[index] = args.len();
                    }
                }
                Some(_) => {}
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Checks shared by the parser tests.
    use super::*;

    /// The streamed result folded: content, then (name, arguments) per call.
    pub fn fold(deltas: &[StreamDelta]) -> (String, Vec<(String, String)>) {
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for d in deltas {
            if let Some(c) = &d.content {
                content.push_str(c);
            }
            for t in &d.tool_calls {
                if t.index == calls.len() {
                    assert!(t.id.is_some() && t.kind == Some("function"), "{t:?}");
                    calls.push((t.function.name.clone().unwrap(), String::new()));
                } else {
                    assert!(t.id.is_none() && t.function.name.is_none(), "{t:?}");
                }
                assert!(t.index < calls.len(), "{t:?}");
                if let Some(a) = &t.function.arguments {
                    calls[t.index].1.push_str(a);
                }
            }
        }
        (content, calls)
    }

    /// Streams `text` in one push, then split at every char boundary (and
    /// char by char); every way gives the same folded result, returned.
    pub fn stream_every_split(
        make: impl Fn() -> Box<dyn ToolParser>,
        text: &str,
    ) -> (String, Vec<(String, String)>) {
        let run = |pieces: &[&str]| {
            let mut p = make();
            let mut ds: Vec<StreamDelta> = pieces.iter().map(|x| p.push(x)).collect();
            ds.push(p.finish());
            fold(&ds)
        };
        let whole = run(&[text]);
        for (i, _) in text.char_indices().skip(1) {
            let got = run(&[&text[..i], &text[i..]]);
            assert_eq!(got, whole, "split at byte {i} of {text:?}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&refs), whole, "char by char: {text:?}");
        whole
    }

    /// JSON equality of two argument texts.
    pub fn json_eq(a: &str, b: &str) -> bool {
        if a == b {
            return true;
        }
        match (
            serde_json::from_str::<serde_json::Value>(a),
            serde_json::from_str::<serde_json::Value>(b),
        ) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }

    /// Streaming agrees with `extract`: content (blank ↔ None), names, and
    /// arguments equal as JSON.
    pub fn agrees(make: impl Fn() -> Box<dyn ToolParser>, text: &str) {
        let (content, calls) = stream_every_split(&make, text);
        let (want_content, want_calls) = make().extract(text);
        assert_eq!(non_blank(&content), want_content, "content of {text:?}");
        assert_eq!(
            calls.len(),
            want_calls.len(),
            "calls of {text:?}: {calls:?}"
        );
        for ((name, args), want) in calls.iter().zip(&want_calls) {
            assert_eq!(name, &want.name, "{text:?}");
            assert!(
                json_eq(args, &want.arguments),
                "{text:?}: streamed {args:?} vs {:?}",
                want.arguments
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_vllm_shapes() {
        let a = make_tool_call_id();
        assert_eq!(a.len(), "chatcmpl-tool-".len() + 16);
        assert!(a.starts_with("chatcmpl-tool-"));
        assert!(a[14..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(a, make_tool_call_id());
        let m = make_mistral_tool_call_id();
        assert_eq!(m.len(), 9);
        assert!(m.bytes().all(|b| b.is_ascii_alphanumeric()));
    }

    #[test]
    fn parser_names() {
        assert_eq!("hermes".parse(), Ok(ToolParserKind::Hermes));
        assert_eq!("llama3_json".parse(), Ok(ToolParserKind::Llama3Json));
        assert_eq!("mistral".parse(), Ok(ToolParserKind::Mistral));
        let e = "pythonic".parse::<ToolParserKind>().unwrap_err();
        assert!(e.contains("hermes,llama3_json,mistral"), "{e}");
    }

    #[test]
    fn serializes_as_openai() {
        let c = ToolCall {
            id: "chatcmpl-tool-0".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"id":"chatcmpl-tool-0","type":"function","function":{"name":"f","arguments":"{}"}}"#
        );
        let d = ToolCallDelta {
            index: 1,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: Some("x".into()),
            },
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"index":1,"function":{"arguments":"x"}}"#
        );
        assert_eq!(partial_tag_len("ab<tool", "<tool_call>"), 5);
        assert_eq!(partial_tag_len("ab<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_tag_len("é", "<x>"), 0);
    }
}
