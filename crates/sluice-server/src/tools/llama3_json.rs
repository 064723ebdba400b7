//! The `llama3_json` parser (Llama 3.1/3.2/3.3 JSON tool calls): calls are
//! JSON objects `{"name": ..., "arguments"|"parameters": {...}}`, several
//! separated by `; `, optionally after `<|python_tag|>` (vLLM's
//! `Llama3JsonToolParser`, note §3.2).
//!
//! Non-streaming: without `<|python_tag|>` and without `{` the text is
//! content. Otherwise every `{` after the end of the last parsed object
//! must start a JSON object with a `name` string and `arguments` (or
//! `parameters`); any failure gives no calls and the whole text as content.
//! With calls the content is None (text around them is dropped).
//! Arguments are `json.dumps(..., ensure_ascii=False)`.
//!
//! Streaming: text that starts with neither `<|python_tag|>` nor `{` is
//! content, all of it, and no call is ever parsed from it (as vLLM; the
//! non-streaming parse may still find calls in such text). Otherwise each
//! top-level object is announced once its `name` string is complete, and
//! its arguments are streamed as the raw text of the first `arguments` (or,
//! if that key has not appeared, `parameters`) member. vLLM streams a
//! `json.dumps` re-rendering instead; the raw text is equal as JSON.

use super::pyjson::{self, J};
use super::{make_tool_call_id, non_blank, Snapshot, StreamDelta, Streamer};
use super::{ToolCall, ToolParser};

const BOT: &str = "<|python_tag|>";

pub struct Llama3JsonParser {
    stream: Streamer,
}

impl Llama3JsonParser {
    pub fn new() -> Self {
        Llama3JsonParser {
            stream: Streamer::new(make_tool_call_id),
        }
    }
}

impl Default for Llama3JsonParser {
    fn default() -> Self {
        Self::new()
    }
}

fn snapshot(text: &str, at_end: bool) -> Snapshot {
    let mut snap = Snapshot::default();
    if text.is_empty() || (!at_end && BOT.starts_with(text) && text != BOT) {
        // Undecided: this may be the start of `<|python_tag|>`.
        return snap;
    }
    let start = if text.starts_with(BOT) {
        BOT.len()
    } else if text.starts_with('{') {
        0
    } else {
        snap.content = text.to_string();
        return snap;
    };
    let mut pos = start;
    while let Some(k) = text[pos..].find('{') {
        let at = pos + k;
        let obj = pyjson::scan_object(text, at, at_end);
        let Some(name) = obj.str_member("name") else {
            break;
        };
        let member = obj.member("arguments").or_else(|| obj.member("parameters"));
        let args = match member {
            Some(m) => match &m.done {
                Some((_, end)) => &text[m.start..*end],
                // Unfinished (or broken): the value's text so far. Text
                // only grows, so this extends what was sent before.
                None => &text[m.start..],
            },
            None => "",
        };
        snap.calls.push((name.to_string(), args.to_string()));
        match obj.end {
            Some(e) => pos = e,
            None => break,
        }
    }
    snap
}

fn object_call(obj: &J) -> Option<ToolCall> {
    let J::Str(name) = obj.get("name")? else {
        return None;
    };
    let args = obj.get("arguments").or_else(|| obj.get("parameters"))?;
    Some(ToolCall::new(name.clone(), pyjson::dumps(args)))
}

impl ToolParser for Llama3JsonParser {
    fn extract(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        if !text.contains(BOT) && !text.contains('{') {
            return (non_blank(text), Vec::new());
        }
        let mut calls = Vec::new();
        let mut pos = 0;
        while let Some(k) = text[pos..].find('{') {
            let at = pos + k;
            let Some((obj, end)) = pyjson::raw_decode(text, at) else {
                return (non_blank(text), Vec::new());
            };
            match object_call(&obj) {
                Some(c) => calls.push(c),
                None => return (non_blank(text), Vec::new()),
            }
            pos = end;
        }
        if calls.is_empty() {
            return (non_blank(text), Vec::new());
        }
        (None, calls)
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
        Box::new(Llama3JsonParser::new())
    }

    #[test]
    fn plain_text_is_content() {
        let p = Llama3JsonParser::new();
        assert_eq!(
            p.extract("The answer is 4."),
            (Some("The answer is 4.".into()), vec![])
        );
        agrees(make, "The answer is 4.");
        agrees(make, "<|python");
        // A stray brace in prose: non-streaming gives the text back.
        let t = "Use {braces} wisely";
        assert_eq!(p.extract(t), (Some(t.into()), vec![]));
        agrees(make, t);
    }

    #[test]
    fn one_and_several_calls() {
        let t = r#"{"name": "get_weather", "parameters": {"city": "San Francisco", "days": 3}}"#;
        let (content, calls) = Llama3JsonParser::new().extract(t);
        assert_eq!(content, None);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            r#"{"city": "San Francisco", "days": 3}"#
        );
        agrees(make, t);
        let t = "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"q\": \"{x}; \\\"y\\\"\"}}; {\"name\":\"b\",\"arguments\":{\"n\":[1,2,{\"deep\":\"ü\"}]}}";
        let (content, calls) = Llama3JsonParser::new().extract(t);
        assert_eq!(content, None);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"n": [1, 2, {"deep": "ü"}]}"#);
        agrees(make, t);
        let (_, streamed) = stream_every_split(make, t);
        assert_eq!(streamed[1].1, r#"{"n":[1,2,{"deep":"ü"}]}"#);
    }

    #[test]
    fn malformed_calls_are_content() {
        let p = Llama3JsonParser::new();
        for t in [
            r#"{"name": "f", "arguments": {"a": 1}"#,
            r#"{"arguments": {}}"#,
            r#"{"name": "f"}"#,
            r#"{"name": "f", "arguments": {}}; {"oops"}"#,
            "<|python_tag|>",
        ] {
            assert_eq!(p.extract(t), (Some(t.to_string()), vec![]), "{t}");
            stream_every_split(make, t);
        }
    }
}
