//! Reasoning parsers (`--reasoning-parser`): split a choice's text into the
//! model's thinking and its answer, as vLLM 0.33's parsers of the same
//! names do, whole or as it streams.
//!
//! Owns the marker rules of each parser and the streaming splitter, which
//! holds back a tail that may still become a marker (`</thi` until the
//! next piece says whether it is `</think>`), so a marker split across
//! tokens or pieces is still found. Promises: the pieces a stream yields,
//! joined, equal what `split` gives for the whole text, however the text
//! is cut; nothing is lost (a held tail that never became a marker is
//! released at the end).
//!
//! The rules:
//! - `qwen3` (vLLM's Qwen3 parser engine): with thinking on (the default;
//!   `chat_template_kwargs.enable_thinking: false` turns it off) the text
//!   is thinking from the start — the template may already have written
//!   `<think>` into the prompt — until `</think>`; a `<think>` inside is
//!   dropped; a `<tool_call>` ends the thinking too and stays in the answer
//!   (for the tool parser); a later `</think>` is dropped. With thinking off
//!   everything is the answer (a stray `</think>` still dropped).
//! - `deepseek_r1` (vLLM's `BaseThinkingReasoningParser`): thinking from
//!   the start until the first `</think>`, a `<think>` before it dropped;
//!   everything after it is the answer, verbatim.
//!
//! Never closed: all of it is thinking, the answer is empty (the model ran
//! out of tokens while thinking). Empty parts are `None`, except that
//! `deepseek_r1` gives `Some("")` thinking for a text that opens with
//! `</think>`, as vLLM's partition does.

use std::str::FromStr;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL_CALL_START: &str = "<tool_call>";

/// The parsers, by vLLM's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParserKind {
    Qwen3,
    DeepseekR1,
}

impl FromStr for ReasoningParserKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "qwen3" => Ok(ReasoningParserKind::Qwen3),
            "deepseek_r1" => Ok(ReasoningParserKind::DeepseekR1),
            other => Err(format!(
                "unknown reasoning parser {other:?} (known: qwen3, deepseek_r1)"
            )),
        }
    }
}

/// Where the splitter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Thinking,
    Answer,
}

/// A marker found in the text and what it does.
#[derive(Clone, Copy)]
enum Action {
    /// Drop the marker, stay.
    Drop,
    /// Drop the marker, thinking ends.
    End,
    /// Thinking ends; the marker is the answer's first text.
    EndKeep,
}

/// One choice's splitter, fed the text piece by piece.
pub struct ReasoningStream {
    kind: ReasoningParserKind,
    state: State,
    /// Text not yet given out: a tail that may still grow into a marker.
    held: String,
    /// An end marker was seen (`deepseek_r1` then gives `Some("")` for
    /// empty thinking).
    saw_end: bool,
}

/// What one piece of text adds: thinking and answer text (either may be
/// empty).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl ReasoningStream {
    /// `thinking`: whether the request thinks (`enable_thinking`, default
    /// on; only `qwen3` reads it, as in vLLM).
    pub fn new(kind: ReasoningParserKind, thinking: bool) -> Self {
        let state = match kind {
            ReasoningParserKind::Qwen3 if !thinking => State::Answer,
            _ => State::Thinking,
        };
        ReasoningStream {
            kind,
            state,
            held: String::new(),
            saw_end: false,
        }
    }

    /// Whether the thinking is over (what follows is the answer).
    pub fn in_answer(&self) -> bool {
        self.state == State::Answer
    }

    /// The markers that act in the current state.
    fn markers(&self) -> &'static [(&'static str, Action)] {
        match (self.kind, self.state) {
            (ReasoningParserKind::Qwen3, State::Thinking) => &[
                (THINK_START, Action::Drop),
                (THINK_END, Action::End),
                (TOOL_CALL_START, Action::EndKeep),
            ],
            (ReasoningParserKind::Qwen3, State::Answer) => &[(THINK_END, Action::Drop)],
            (ReasoningParserKind::DeepseekR1, State::Thinking) => {
                &[(THINK_START, Action::Drop), (THINK_END, Action::End)]
            }
            (ReasoningParserKind::DeepseekR1, State::Answer) => &[],
        }
    }

    /// Feeds `text`; returns what can be given out now.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            let markers = self.markers();
            // The earliest whole marker in the held text.
            let found = markers
                .iter()
                .filter_map(|&(m, a)| self.held.find(m).map(|i| (i, m, a)))
                .min_by_key(|&(i, _, _)| i);
            match found {
                Some((i, m, action)) => {
                    let before: String = self.held.drain(..i).collect();
                    self.emit(&mut out, &before);
                    self.held.drain(..m.len());
                    match action {
                        Action::Drop => {}
                        Action::End => self.end(),
                        Action::EndKeep => {
                            self.end();
                            out.content.push_str(m);
                        }
                    }
                }
                None => {
                    // Keep back the longest tail that is a proper prefix of
                    // a marker; give out the rest.
                    let keep = markers
                        .iter()
                        .map(|&(m, _)| partial_suffix(&self.held, m))
                        .max()
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    let now: String = self.held.drain(..cut).collect();
                    self.emit(&mut out, &now);
                    return out;
                }
            }
        }
    }

    /// The end of the text: the held tail is plain text after all.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let rest = std::mem::take(&mut self.held);
        self.emit(&mut out, &rest);
        out
    }

    fn end(&mut self) {
        self.state = State::Answer;
        self.saw_end = true;
    }

    fn emit(&self, out: &mut Split, text: &str) {
        match self.state {
            State::Thinking => out.reasoning.push_str(text),
            State::Answer => out.content.push_str(text),
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// `marker` (on a char boundary: markers are ASCII).
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            text.len() >= n && text.is_char_boundary(text.len() - n) && text.ends_with(&marker[..n])
        })
        .unwrap_or(0)
}

/// A whole text split into (thinking, answer), `None` where empty (see the
/// module's rules).
pub fn split(
    kind: ReasoningParserKind,
    thinking: bool,
    text: &str,
) -> (Option<String>, Option<String>) {
    let mut s = ReasoningStream::new(kind, thinking);
    let mut a = s.push(text);
    let b = s.finish();
    a.reasoning.push_str(&b.reasoning);
    a.content.push_str(&b.content);
    let reasoning = if a.reasoning.is_empty() {
        (kind == ReasoningParserKind::DeepseekR1 && s.saw_end).then(String::new)
    } else {
        Some(a.reasoning)
    };
    let content = (!a.content.is_empty()).then_some(a.content);
    (reasoning, content)
}

/// A parser bound to the model's vocabulary: the token ids of its markers,
/// for the engine's structured-output gate and the prompt check.
#[derive(Clone, Debug)]
pub struct ReasoningConfig {
    pub kind: ReasoningParserKind,
    /// `</think>` (one id where the vocabulary has the token, else the
    /// ids the text encodes to).
    end: Vec<u32>,
    start: Vec<u32>,
    /// `qwen3`: the ChatML turn markers, which begin a new turn (thinking
    /// again) when scanning a prompt backwards.
    boundaries: Vec<Vec<u32>>,
    /// Whether `</think>` is one token of the vocabulary (vLLM refuses to
    /// start otherwise; sluice matches its text's tokens).
    pub end_is_one_token: bool,
}

impl ReasoningConfig {
    pub fn new(kind: ReasoningParserKind, tok: &sluice_engine::Tokenizer) -> Self {
        let ids = |marker: &str| match tok.token_to_id(marker) {
            Some(id) => vec![id],
            None => tok.encode(marker, false).unwrap_or_default(),
        };
        let boundaries = match kind {
            ReasoningParserKind::Qwen3 => ["<|im_start|>", "<|im_end|>"]
                .iter()
                .filter_map(|m| tok.token_to_id(m))
                .map(|id| vec![id])
                .collect(),
            ReasoningParserKind::DeepseekR1 => Vec::new(),
        };
        ReasoningConfig {
            kind,
            end: ids(THINK_END),
            start: ids(THINK_START),
            boundaries,
            end_is_one_token: tok.token_to_id(THINK_END).is_some(),
        }
    }

    /// The sequence after which a constraint holds, or `None` when it holds
    /// from the first token: thinking off, or a prompt whose thinking has
    /// already ended (vLLM's `is_reasoning_end` on the prompt: scanning
    /// back, an end marker before any start marker or turn boundary).
    pub fn structured_after(&self, prompt: &[u32], thinking: bool) -> Option<Vec<u32>> {
        if self.kind == ReasoningParserKind::Qwen3 && !thinking {
            return None;
        }
        let last = |seq: &[u32]| -> Option<usize> {
            (!seq.is_empty() && prompt.len() >= seq.len())
                .then(|| {
                    (0..=prompt.len() - seq.len())
                        .rev()
                        .find(|&i| &prompt[i..i + seq.len()] == seq)
                })
                .flatten()
        };
        let end = last(&self.end);
        let other = std::iter::once(last(&self.start))
            .chain(self.boundaries.iter().map(|b| last(b)))
            .flatten()
            .max();
        match (end, other) {
            (Some(e), Some(o)) if e > o => None,
            (Some(_), None) => None,
            _ => Some(self.end.clone()),
        }
    }
}

/// `chat_template_kwargs.enable_thinking` (default on), as the qwen3
/// parser reads it.
pub fn thinking_enabled(chat_template_kwargs: Option<&serde_json::Value>) -> bool {
    chat_template_kwargs
        .and_then(|k| k.get("enable_thinking"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReasoningParserKind::{DeepseekR1, Qwen3};

    fn s(v: Option<&str>) -> Option<String> {
        v.map(str::to_string)
    }

    #[test]
    fn whole_texts_split_as_vllm_splits_them() {
        // (parser, thinking on, text, thinking, answer)
        type Case<'a> = (
            ReasoningParserKind,
            bool,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            (
                Qwen3,
                true,
                "<think>\nhm\n</think>\n\nHi",
                Some("\nhm\n"),
                Some("\n\nHi"),
            ),
            (Qwen3, true, "hm</think>Hi", Some("hm"), Some("Hi")),
            (Qwen3, true, "still thinking", Some("still thinking"), None),
            (Qwen3, true, "a</think>b</think>c", Some("a"), Some("bc")),
            (
                Qwen3,
                true,
                "plan<tool_call>{}</tool_call>",
                Some("plan"),
                Some("<tool_call>{}</tool_call>"),
            ),
            (Qwen3, true, "</think>", None, None),
            (Qwen3, false, "Hi</think> there", None, Some("Hi there")),
            (Qwen3, false, "<think>x", None, Some("<think>x")),
            (
                DeepseekR1,
                true,
                "<think>a</think>b</think>c",
                Some("a"),
                Some("b</think>c"),
            ),
            (DeepseekR1, true, "a</think>", Some("a"), None),
            (DeepseekR1, true, "</think>b", Some(""), Some("b")),
            (DeepseekR1, true, "no end", Some("no end"), None),
            (DeepseekR1, false, "x</think>y", Some("x"), Some("y")),
            (
                DeepseekR1,
                true,
                "<tool_call>a</think>b",
                Some("<tool_call>a"),
                Some("b"),
            ),
        ];
        for &(kind, on, text, r, c) in cases {
            assert_eq!(
                split(kind, on, text),
                (s(r), s(c)),
                "{kind:?} {on} {text:?}"
            );
        }
    }

    /// Every way of cutting a text into pieces streams the same split.
    #[test]
    fn streams_cut_anywhere_join_to_the_whole_split() {
        let texts = [
            "<think>\nI think é</think>\n\nAnswer </thin k",
            "a<tool_call>{\"name\": \"f\"}</tool_call></think>",
            "</think></think><think>x",
            "<thi",
            "ends with </thi",
        ];
        for kind in [Qwen3, DeepseekR1] {
            for on in [true, false] {
                for text in texts {
                    let (want_r, want_c) = split(kind, on, text);
                    let chars: Vec<(usize, char)> = text.char_indices().collect();
                    // Every single cut point, and cuts at every char.
                    let mut cuttings: Vec<Vec<usize>> =
                        chars.iter().map(|&(i, _)| vec![i]).collect();
                    cuttings.push(chars.iter().map(|&(i, _)| i).collect());
                    for cuts in cuttings {
                        let mut st = ReasoningStream::new(kind, on);
                        let (mut r, mut c) = (String::new(), String::new());
                        let mut from = 0;
                        for &cut in cuts.iter().chain([text.len()].iter()) {
                            let p = st.push(&text[from..cut]);
                            r.push_str(&p.reasoning);
                            c.push_str(&p.content);
                            from = cut;
                        }
                        let p = st.finish();
                        r.push_str(&p.reasoning);
                        c.push_str(&p.content);
                        assert_eq!(
                            want_r.clone().unwrap_or_default(),
                            r,
                            "{kind:?} {on} {text:?} {cuts:?}"
                        );
                        assert_eq!(want_c.clone().unwrap_or_default(), c, "{kind:?} {text:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_prompt_decides_whether_thinking_has_ended() {
        let tok = sluice_engine::Tokenizer::builtin();
        let ids = |t: &str| tok.encode(t, false).unwrap();
        let c = ReasoningConfig::new(DeepseekR1, &tok);
        assert!(!c.end_is_one_token);
        assert_eq!(
            c.structured_after(&ids("Q? <think>"), true),
            Some(ids("</think>"))
        );
        assert_eq!(c.structured_after(&ids("Q?"), true), Some(ids("</think>")));
        assert_eq!(c.structured_after(&ids("<think>a</think>\n"), true), None);
        assert_eq!(
            c.structured_after(&ids("<think>a</think> then <think>"), true),
            Some(ids("</think>"))
        );
        let q = ReasoningConfig::new(Qwen3, &tok);
        assert_eq!(q.structured_after(&ids("Q?"), false), None);
        assert_eq!(
            q.structured_after(&ids("<think>\n\n</think>\n\n"), true),
            None
        );
    }

    #[test]
    fn names_and_thinking_flag() {
        assert_eq!("qwen3".parse(), Ok(Qwen3));
        assert_eq!("deepseek_r1".parse(), Ok(DeepseekR1));
        assert!("r1"
            .parse::<ReasoningParserKind>()
            .unwrap_err()
            .contains("qwen3"));
        assert!(thinking_enabled(None));
        assert!(!thinking_enabled(Some(
            &serde_json::json!({"enable_thinking": false})
        )));
    }
}
