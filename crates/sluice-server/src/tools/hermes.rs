//! The `hermes` parser (Hermes 2 Pro, Qwen2.5, Qwen3 ...): calls are
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
//! (vLLM's `Hermes2ProToolParser`, note §3.1).
//!
//! Non-streaming: the content is the text before the first `<tool_call>`;
//! text after or between blocks is dropped; an unclosed last block counts;
//! any block that is not a JSON object with a string `name` and an
//! `arguments` member gives no calls and the whole text as content.
//! Arguments are `json.dumps(arguments, ensure_ascii=False)`.
//!
//! Streaming: content up to the first `<tool_call>` (a suffix that may be
//! the start of the tag is held back). A call is announced once its body
//! matches `"name"\s*:\s*"([^"]+)"`; later calls wait for it. Arguments are
//! the raw text after the first `"arguments"\s*:\s*`, always holding back
//! trailing whitespace and one trailing `}` (it may be the outer object's)
//! until the block closes, when they are dropped for good. A block that
//! turns out malformed has already been streamed as a call (as in vLLM).

use super::pyjson::{self, J};
use super::{make_tool_call_id, non_blank, partial_tag_len, Snapshot, StreamDelta, Streamer};
use super::{ToolCall, ToolParser};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub struct HermesParser {
    stream: Streamer,
}

impl HermesParser {
    pub fn new() -> Self {
        HermesParser {
            stream: Streamer::new(make_tool_call_id),
        }
    }
}

impl Default for HermesParser {
    fn default() -> Self {
        Self::new()
    }
}

/// The regex `"name"\s*:\s*"([^"]+)"`: the first match's name.
fn match_name(body: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(k) = body[from..].find("\"name\"") {
        let at = from + k;
        from = at + 1;
        let rest = body[at + 6..].trim_start();
        let Some(rest) = rest.strip_prefix(':') else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('"') else {
            continue;
        };
        if let Some(q) = rest.find('"') {
            if q > 0 {
                return Some(&rest[..q]);
            }
        }
    }
    None
}

/// The text after the first match of `"arguments"\s*:\s*`.
fn after_arguments(body: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(k) = body[from..].find("\"arguments\"") {
        let at = from + k;
        from = at + 1;
        if let Some(rest) = body[at + 11..].trim_start().strip_prefix(':') {
            return Some(rest.trim_start());
        }
    }
    None
}

/// Raw arguments without the outer object's `}` and trailing whitespace.
fn trim_args(args: &str) -> &str {
    let t = args.trim_end();
    t.strip_suffix('}').unwrap_or(t).trim_end()
}

fn snapshot(text: &str, at_end: bool) -> Snapshot {
    let mut snap = Snapshot::default();
    let Some(first) = text.find(START) else {
        let hold = if at_end {
            0
        } else {
            partial_tag_len(text, START)
        };
        snap.content = text[..text.len() - hold].to_string();
        return snap;
    };
    snap.content = text[..first].to_string();
    let mut pos = first;
    while let Some(k) = text[pos..].find(START) {
        let body_start = pos + k + START.len();
        let (body, next) = match text[body_start..].find(END) {
            Some(e) => (
                &text[body_start..body_start + e],
                body_start + e + END.len(),
            ),
            None => {
                let hold = if at_end {
                    0
                } else {
                    partial_tag_len(text, END)
                };
                let body_end = (text.len() - hold).max(body_start);
                (&text[body_start..body_end], text.len())
            }
        };
        let Some(name) = match_name(body) else {
            break;
        };
        let args = after_arguments(body).map(trim_args).unwrap_or("");
        snap.calls.push((name.to_string(), args.to_string()));
        pos = next;
    }
    snap
}

/// One block as vLLM reads it: `json.loads`, `obj["name"]`,
/// `json.dumps(obj["arguments"])`.
fn block_call(body: &str) -> Option<ToolCall> {
    let obj = pyjson::loads(body)?;
    let J::Str(name) = obj.get("name")? else {
        return None;
    };
    let args = obj.get("arguments")?;
    Some(ToolCall::new(name.clone(), pyjson::dumps(args)))
}

impl ToolParser for HermesParser {
    fn extract(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let Some(first) = text.find(START) else {
            return (non_blank(text), Vec::new());
        };
        let mut calls = Vec::new();
        let mut pos = first;
        while let Some(k) = text[pos..].find(START) {
            let body_start = pos + k + START.len();
            let (body, next) = match text[body_start..].find(END) {
                Some(e) => (
                    &text[body_start..body_start + e],
                    body_start + e + END.len(),
                ),
                None => (&text[body_start..], text.len()),
            };
            match block_call(body) {
                Some(c) => calls.push(c),
                None => return (non_blank(text), Vec::new()),
            }
            pos = next;
        }
        (non_blank(&text[..first]), calls)
    }

    fn push(&mut self, delta: &str) -> StreamDelta {
        self.stream.feed(delta, snapshot)
    }

    fn finish(&mut self) -> StreamDelta {
        self.stream.finish_with(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_util::{agrees, stream_every_split};

    fn make() -> Box<dyn ToolParser> {
        Box::new(HermesParser::new())
    }

    #[test]
    fn plain_text_is_content() {
        let p = HermesParser::new();
        assert_eq!(
            p.extract("Hello <b>there</b>"),
            (Some("Hello <b>there</b>".into()), vec![])
        );
        assert_eq!(p.extract("  \n"), (None, vec![]));
        agrees(make, "Hello <b>there</b> <tool");
        agrees(make, "a < b");
    }

    #[test]
    fn text_then_calls() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = HermesParser::new().extract(text);
        assert_eq!(content.as_deref(), Some("Let me check.\n"));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city": "Paris", "unit": "c"}"#);
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("get_time", "{}")
        );
        assert!(calls[0].id.starts_with("chatcmpl-tool-"));
        agrees(make, text);
        // Streamed arguments are the model's raw text.
        let (_, streamed) = stream_every_split(make, text);
        assert_eq!(streamed[0].1, r#"{"city": "Paris", "unit": "c"}"#);
    }

    #[test]
    fn tricky_arguments() {
        let text = "<tool_call>{\"name\":\"f\",\"arguments\":{\"code\":\"if (a) { b(\\\"}\\\"); }\",\"nested\":{\"x\":[1,{\"y\":null}]},\"emoji\":\"héllo 😀 \\u00e9\"}}</tool_call>";
        let (content, calls) = HermesParser::new().extract(text);
        assert_eq!(content, None);
        assert_eq!(
            calls[0].arguments,
            "{\"code\": \"if (a) { b(\\\"}\\\"); }\", \"nested\": {\"x\": [1, {\"y\": null}]}, \"emoji\": \"héllo 😀 é\"}"
        );
        agrees(make, text);
        // Unclosed last block counts.
        agrees(
            make,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"}\"}}",
        );
    }

    #[test]
    fn malformed_calls_are_content() {
        let p = HermesParser::new();
        for text in [
            "x <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>nope</tool_call>",
        ] {
            assert_eq!(p.extract(text), (Some(text.to_string()), vec![]), "{text}");
            // Streaming never fails, and does not depend on the split.
            stream_every_split(make, text);
        }
    }

    #[test]
    fn stream_shapes() {
        let mut p = HermesParser::new();
        assert_eq!(p.push("Hi <tool").content.as_deref(), Some("Hi "));
        assert!(p.push("_call>{\"name\": \"f").is_empty());
        let d = p.push("\", \"arguments\": {\"a\": 1}");
        assert_eq!(d.content, None);
        assert_eq!(d.tool_calls.len(), 1);
        assert_eq!(d.tool_calls[0].function.name.as_deref(), Some("f"));
        assert_eq!(
            d.tool_calls[0].function.arguments.as_deref(),
            Some("{\"a\": 1")
        );
        let d = p.push("}</tool_call>");
        assert_eq!(d.tool_calls[0].function.arguments.as_deref(), Some("}"));
        assert!(p.finish().is_empty());
    }
}
