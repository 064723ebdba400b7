//! The `mistral` parser (vLLM's `MistralParser`, note §3.3), both formats:
//! pre-v11 `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` and v11+
//! `[TOOL_CALLS]name[ARGS]{json}` (or `[TOOL_CALLS]name{json}`), one
//! `[TOOL_CALLS]` per call. vLLM picks the format from the tokenizer's
//! vocabulary (`[ARGS]` in it: v11+); `MistralFormat::Auto` picks it from
//! the output instead: after the first `[TOOL_CALLS]`, a `[` or `{` means
//! pre-v11. Ids are Mistral's 9 alphanumerics.
//!
//! Content is the text before the first `[TOOL_CALLS]`; whitespace-only
//! content before calls is dropped (streaming holds whitespace-only content
//! back until something else arrives).
//!
//! Pre-v11, non-streaming: the JSON is the first non-blank segment after a
//! `[TOOL_CALLS]`, read with `raw_decode` (trailing text ignored), else the
//! widest `[{...}]` in it; a dict is one call; list entries that are
//! objects with `name` or `arguments` are calls (a missing or non-string
//! name is `""`, missing or null arguments `"{}"`, string arguments kept,
//! others `json.dumps`-ed); no calls: the JSON text is the content.
//! Streaming: each object is announced once its `name` string closes (or,
//! without one, when it closes), then the raw text of its `arguments`
//! member is streamed (`"{}"` if it has none).
//!
//! v11+, both modes: the name is the segment's text up to `[ARGS]` or `{`
//! (trimmed); the arguments are the raw text of the first JSON value after
//! it (trailing text dropped), the trimmed raw text if it is not JSON, or
//! `"{}"` if empty. A segment with neither `[ARGS]`, `{` nor a name is not
//! a call.
//!
//! `forced()` is for `tool_choice` required / named, where vLLM constrains
//! Mistral to a bare pre-v11 array: without `[TOOL_CALLS]` the whole text
//! is that array.

use super::pyjson::{self, Elem, ObjScan, Stop, J};
use super::{make_mistral_tool_call_id, non_blank, partial_tag_len, Snapshot, StreamDelta};
use super::{Streamer, ToolCall, ToolParser};

const BOT: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

/// Which of Mistral's formats the model writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MistralFormat {
    /// Decide from the output (see the module doc).
    Auto,
    /// `[TOOL_CALLS][{...}]` (tokenizers before v11).
    Legacy,
    /// `[TOOL_CALLS]name[ARGS]{...}`.
    V11,
}

pub struct MistralParser {
    format: MistralFormat,
    forced: bool,
    stream: Streamer,
}

impl MistralParser {
    pub fn new() -> Self {
        Self::with_format(MistralFormat::Auto)
    }

    pub fn with_format(format: MistralFormat) -> Self {
        MistralParser {
            format,
            forced: false,
            stream: Streamer::new(make_mistral_tool_call_id),
        }
    }

    /// For `tool_choice` required / named: a bare JSON array counts as the
    /// calls.
    pub fn forced(mut self) -> Self {
        self.forced = true;
        self
    }

    /// Where the calls start and in which format; None while undecided.
    fn calls_start(&self, text: &str, at_end: bool) -> Option<(usize, MistralFormat)> {
        let mut pos = match text.find(BOT) {
            Some(b) => b + BOT.len(),
            None if self.forced => 0,
            None => return None,
        };
        loop {
            let rest = &text[pos..];
            let trimmed = rest.trim_start();
            pos += rest.len() - trimmed.len();
            if let Some(after) = trimmed.strip_prefix(BOT) {
                pos += trimmed.len() - after.len();
                continue;
            }
            if trimmed.is_empty() || (!at_end && BOT.starts_with(trimmed)) {
                return if at_end {
                    Some((pos, self.resolved(MistralFormat::V11)))
                } else {
                    None
                };
            }
            let legacy = trimmed.starts_with(['[', '{']);
            let guess = if legacy || self.forced {
                MistralFormat::Legacy
            } else {
                MistralFormat::V11
            };
            return Some((pos, self.resolved(guess)));
        }
    }

    fn resolved(&self, guess: MistralFormat) -> MistralFormat {
        match self.format {
            MistralFormat::Auto => guess,
            f => f,
        }
    }

    fn snapshot(&self, text: &str, at_end: bool) -> Snapshot {
        let mut snap = Snapshot::default();
        let bot = text.find(BOT);
        let content = match bot {
            Some(b) => &text[..b],
            None if self.forced => "",
            None => {
                let hold = if at_end {
                    0
                } else {
                    partial_tag_len(text, BOT)
                };
                &text[..text.len() - hold]
            }
        };
        // Whitespace before calls is dropped; until we know, hold it.
        let decided = bot.is_some() || at_end;
        if !content.trim().is_empty() || (decided && bot.is_none()) {
            snap.content = content.to_string();
        }
        let Some((start, format)) = self.calls_start(text, at_end) else {
            return snap;
        };
        match format {
            MistralFormat::V11 => v11_calls(text, start, at_end, &mut snap.calls),
            _ => legacy_stream_calls(text, start, at_end, &mut snap.calls),
        }
        snap
    }
}

impl Default for MistralParser {
    fn default() -> Self {
        Self::new()
    }
}

/// The v11+ calls from `start` (just after a `[TOOL_CALLS]`).
fn v11_calls(text: &str, start: usize, at_end: bool, calls: &mut Vec<(String, String)>) {
    let body = &text[start..];
    let segments: Vec<&str> = body.split(BOT).collect();
    let n = segments.len();
    for (k, seg) in segments.into_iter().enumerate() {
        let closed = at_end || k + 1 < n;
        let seg = if closed {
            seg
        } else {
            let hold = partial_tag_len(seg, BOT).max(partial_tag_len(seg, ARGS));
            &seg[..seg.len() - hold]
        };
        let marker = match (seg.find(ARGS), seg.find('{')) {
            (Some(a), Some(b)) if b < a => Some((b, b)),
            (Some(a), _) => Some((a, a + ARGS.len())),
            (None, Some(b)) => Some((b, b)),
            (None, None) => None,
        };
        let (name, args_text) = match marker {
            Some((name_end, args_start)) => (seg[..name_end].trim(), Some(&seg[args_start..])),
            None if !closed => return,
            None if seg.trim().is_empty() => continue,
            None => (seg.trim(), None),
        };
        let a = args_text.unwrap_or("").trim_start();
        let args = if a.is_empty() {
            if closed {
                "{}"
            } else {
                ""
            }
        } else {
            match pyjson::scan_value(a, 0, closed) {
                Ok(e) => &a[..e],
                Err(Stop::Partial | Stop::Invalid) => a.trim_end(),
            }
        };
        calls.push((name.to_string(), args.to_string()));
    }
}

/// The pre-v11 calls, streaming: the array (or object) at `start`.
fn legacy_stream_calls(text: &str, start: usize, at_end: bool, calls: &mut Vec<(String, String)>) {
    let objects: Vec<ObjScan> = if text[start..].starts_with('[') {
        pyjson::scan_array(text, start, at_end)
            .elems
            .into_iter()
            .filter_map(|e| match e {
                Elem::Obj(o) => Some(o),
                Elem::Other => None,
            })
            .collect()
    } else if text[start..].starts_with('{') {
        vec![pyjson::scan_object(text, start, at_end)]
    } else {
        return;
    };
    for o in objects {
        let closed = o.end.is_some();
        let is_call = o.member("name").is_some() || o.member("arguments").is_some();
        let name = match o.str_member("name") {
            Some(n) => n.to_string(),
            None if closed && is_call => String::new(),
            None if closed => continue,
            None => return,
        };
        let args = match o.member("arguments") {
            Some(m) => match &m.done {
                Some((_, end)) => text[m.start..*end].to_string(),
                None => text[m.start..].to_string(),
            },
            None if closed => "{}".to_string(),
            None => String::new(),
        };
        calls.push((name, args));
        if !closed {
            return;
        }
    }
}

/// vLLM's `_pre_v11_function_calls`.
fn legacy_function_calls(parsed: &J) -> Vec<ToolCall> {
    let items = match parsed {
        J::Obj(_) => std::slice::from_ref(parsed),
        J::Arr(items) => items.as_slice(),
        _ => return Vec::new(),
    };
    items
        .iter()
        .filter(|t| {
            matches!(t, J::Obj(_)) && (t.get("name").is_some() || t.get("arguments").is_some())
        })
        .map(|t| {
            let name = match t.get("name") {
                Some(J::Str(s)) => s.clone(),
                _ => String::new(),
            };
            let args = match t.get("arguments") {
                None | Some(J::Null) => "{}".to_string(),
                Some(J::Str(s)) => s.clone(),
                Some(v) => pyjson::dumps(v),
            };
            ToolCall {
                id: make_mistral_tool_call_id(),
                name,
                arguments: args,
            }
        })
        .collect()
}

/// Python's `re.findall(r"\[{.*}\]", s, re.DOTALL)[0]`: the widest match
/// from the first `[{`.
fn widest_array(s: &str) -> Option<&str> {
    let a = s.find("[{")?;
    let b = s[a..].rfind("}]")?;
    Some(&s[a..a + b + 2])
}

impl MistralParser {
    fn extract_legacy(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let (content, json_text) = match text.find(BOT) {
            Some(_) => {
                let mut parts = text.split(BOT);
                let content = parts.next().unwrap_or("");
                let seg = parts.map(str::trim).find(|s| !s.is_empty()).unwrap_or("");
                (content, seg)
            }
            None if self.forced => ("", text.trim()),
            None => return (non_blank(text), Vec::new()),
        };
        let parsed = match pyjson::raw_decode(json_text, 0) {
            Some((v, _)) => Some(v),
            None => widest_array(json_text).and_then(pyjson::loads),
        };
        let calls = parsed
            .as_ref()
            .map(legacy_function_calls)
            .unwrap_or_default();
        if calls.is_empty() {
            return (non_blank(json_text), Vec::new());
        }
        (non_blank(content), calls)
    }
}

impl ToolParser for MistralParser {
    fn extract(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        match self.calls_start(text, true) {
            None => (non_blank(text), Vec::new()),
            Some((_, MistralFormat::V11)) => {
                let snap = self.snapshot(text, true);
                let calls = snap
                    .calls
                    .into_iter()
                    .map(|(name, arguments)| ToolCall {
                        id: make_mistral_tool_call_id(),
                        name,
                        arguments,
                    })
                    .collect();
                (non_blank(&snap.content), calls)
            }
            Some(_) => self.extract_legacy(text),
        }
    }

    fn push(&mut self, delta: &str) -> StreamDelta {
        self.stream.push_text(delta);
        let snap = self.snapshot(self.stream.text(), false);
        self.stream.emit(snap)
    }

    fn finish(&mut self) -> StreamDelta {
        let snap = self.snapshot(self.stream.text(), true);
        self.stream.emit(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_util::{agrees, stream_every_split};

    fn make() -> Box<dyn ToolParser> {
        Box::new(MistralParser::new())
    }

    #[test]
    fn plain_text_is_content() {
        let p = MistralParser::new();
        assert_eq!(
            p.extract("Bonjour [TOOL"),
            (Some("Bonjour [TOOL".into()), vec![])
        );
        agrees(make, "Bonjour [TOOL");
        agrees(make, "  ");
        agrees(make, " a [b] {c}");
    }

    #[test]
    fn legacy_calls() {
        let t = "Sure. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"q\": \"[{}]\"}}, {\"name\": \"add\", \"arguments\": {\"a\": 1.0, \"b\": [2]}}] trailing";
        let (content, calls) = MistralParser::new().extract(t);
        assert_eq!(content.as_deref(), Some("Sure. "));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, r#"{"city": "Paris", "q": "[{}]"}"#);
        assert_eq!(calls[1].arguments, r#"{"a": 1.0, "b": [2]}"#);
        assert_eq!(calls[0].id.len(), 9);
        agrees(make, t);
        // One object, no array; missing arguments.
        agrees(make, "[TOOL_CALLS]{\"name\": \"ping\"}");
        let (_, calls) = MistralParser::new().extract("[TOOL_CALLS]{\"name\": \"ping\"}");
        assert_eq!(calls[0].arguments, "{}");
        // Forced (required): a bare array.
        let p = || -> Box<dyn ToolParser> { Box::new(MistralParser::new().forced()) };
        agrees(p, " [{\"name\": \"f\", \"arguments\": {\"x\": \"é\"}}]");
    }

    #[test]
    fn v11_calls() {
        let t = "\n[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"s\": \"a}b\"} junk[TOOL_CALLS]now{}[TOOL_CALLS]bare";
        let (content, calls) = MistralParser::new().extract(t);
        assert_eq!(content, None);
        let got: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("get_weather", "{\"city\": \"Paris\", \"s\": \"a}b\"}"),
                ("now", "{}"),
                ("bare", "{}")
            ]
        );
        agrees(make, t);
        // Not JSON: the trimmed raw text.
        let (_, calls) = MistralParser::new().extract("[TOOL_CALLS]f[ARGS] not json ");
        assert_eq!(calls[0].arguments, "not json");
        agrees(make, "[TOOL_CALLS]f[ARGS] not json ");
        agrees(
            make,
            "Text first [TOOL_CALLS]f[ARGS]{\"nested\": {\"u\": \"ü😀\"}}",
        );
    }

    #[test]
    fn malformed_legacy_is_content() {
        let t = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": }]";
        let (content, calls) = MistralParser::new().extract(t);
        assert!(calls.is_empty());
        assert_eq!(
            content.as_deref(),
            Some("[{\"name\": \"f\", \"arguments\": {\"a\": }]")
        );
        stream_every_split(make, t);
        let t = "[TOOL_CALLS] [1, 2]";
        assert_eq!(
            MistralParser::new().extract(t),
            (Some("[1, 2]".into()), vec![])
        );
        stream_every_split(make, t);
    }
}
