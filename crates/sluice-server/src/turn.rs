//! One assistant turn's output, as every chat-shaped API reads it (Chat
//! Completions, Anthropic Messages): the model's text split into thinking
//! and answer by the reasoning parser, the answer read for tool calls
//! (forced by the grammar, or found by the `--tool-call-parser`), and the
//! calls limited as the request's tool settings say.
//!
//! The APIs differ only in how they render a turn; what the text means is
//! decided here, once, streamed or not. Promises: the deltas of a streamed
//! turn concatenate to what `Turn::complete` gives for the whole text (the
//! reasoning and tool parsers' own contracts), and nothing here fails on
//! model output.

use crate::reasoning::{ReasoningParserKind, ReasoningStream};
use crate::tools::choice::{parse_forced, ForcedStream, ToolChoice, ToolConfig};
use crate::tools::{self, StreamDelta, ToolCall, ToolCallDelta, ToolParser, ToolParserKind};

/// How a turn's answer becomes the response: as it is, as the arguments
/// of forced tool calls (`tool_choice` required or named: the grammar made
/// the text a call), or through the `--tool-call-parser` (auto).
#[derive(Clone, Debug)]
pub(crate) enum ToolMode {
    Plain,
    Forced(ToolChoice),
    Auto(ToolParserKind),
}

/// The settings one request's turns are read with.
#[derive(Clone, Debug)]
pub(crate) struct Turn {
    pub mode: ToolMode,
    pub tool_config: ToolConfig,
    /// The reasoning parser and whether this request thinks.
    pub reasoning: Option<(ReasoningParserKind, bool)>,
    /// `include_reasoning`: false drops the thinking from the response.
    pub include_reasoning: bool,
    /// Whether parsed calls reach the response (vLLM's `keeps_tool_calls`).
    pub keeps_calls: bool,
}

/// A finished turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TurnOutput {
    /// The thinking (None without a parser, with `include_reasoning:
    /// false`, or when the model did not think).
    pub reasoning: Option<String>,
    /// The answer; None where vLLM answers null (an empty answer with a
    /// reasoning parser, or calls parsed by the tool parser).
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// What one streamed output adds to a turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TurnDelta {
    /// New thinking (never `Some("")`).
    pub reasoning: Option<String>,
    /// New answer text; `Some("")` where Chat Completions sends an empty
    /// delta (an output whose text is not shown yet).
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl TurnDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_none() && self.content.is_none() && self.tool_calls.is_empty()
    }
}

impl Turn {
    /// The whole text of a finished turn → thinking, answer and calls.
    pub fn complete(&self, text: String) -> TurnOutput {
        let (thinking, text) = match self.reasoning {
            Some((kind, on)) => {
                let (r, answer) = crate::reasoning::split(kind, on, &text);
                (Some(r.filter(|_| self.include_reasoning)), answer)
            }
            None => (None, Some(text)),
        };
        let text = text.unwrap_or_default();
        let (content, calls) = match &self.mode {
            ToolMode::Plain => (Some(text.clone()), Vec::new()),
            // vLLM answers forced calls with content "", not null.
            ToolMode::Forced(c) => (Some(String::new()), parse_forced(c, &text)),
            ToolMode::Auto(k) => tools::parser(*k).extract(&text),
        };
        let calls = if self.keeps_calls {
            self.tool_config.limit_calls(calls)
        } else {
            Vec::new()
        };
        let content = if calls.is_empty() && !matches!(self.mode, ToolMode::Forced(_)) {
            // With a reasoning parser an empty answer is null, as vLLM's.
            (thinking.is_none() || !text.is_empty()).then_some(text)
        } else {
            content
        };
        TurnOutput {
            reasoning: thinking.flatten(),
            content,
            tool_calls: calls,
        }
    }

    /// The finish reason a turn reports: the engine's, or `tool_calls`
    /// where calls were made (vLLM's `resolve_finish_reason`).
    pub fn finish_reason<'a>(&self, engine: &'a str, calls_made: bool) -> &'a str {
        self.tool_config.finish_reason(engine, calls_made)
    }

    /// A fresh streaming state for one choice of this request.
    pub fn stream(&self) -> TurnStream {
        TurnStream {
            tools: match &self.mode {
                ToolMode::Plain => ToolStream::Plain,
                ToolMode::Forced(c) => ToolStream::Forced(ForcedStream::new(c.clone())),
                ToolMode::Auto(k) => ToolStream::Auto(tools::parser(*k)),
            },
            splitter: self.reasoning.map(|(k, on)| ReasoningStream::new(k, on)),
            include_reasoning: self.include_reasoning,
            keeps_calls: self.keeps_calls,
            tool_config: self.tool_config.clone(),
            called: false,
            reasoning_tokens: 0,
        }
    }
}

/// One choice's tool-call state.
enum ToolStream {
    Plain,
    Forced(ForcedStream),
    Auto(Box<dyn ToolParser>),
}

impl ToolStream {
    /// `has_tokens`: the output carries tokens. Plain content streams a
    /// delta for every such output, `""` when their text is not shown yet,
    /// as vLLM does (clients time TTFT and ITL by chunks); a tool parser
    /// decides for itself.
    fn push(&mut self, text: String, finished: bool, has_tokens: bool) -> StreamDelta {
        let mut d = match self {
            ToolStream::Plain => StreamDelta {
                content: (!text.is_empty() || has_tokens).then_some(text),
                tool_calls: Vec::new(),
            },
            ToolStream::Forced(f) => f.push(&text),
            ToolStream::Auto(p) => p.push(&text),
        };
        if finished {
            match self {
                ToolStream::Plain => {}
                ToolStream::Forced(f) => d.append(f.finish()),
                ToolStream::Auto(p) => d.append(p.finish()),
            }
        }
        d
    }
}

/// One choice of a streamed turn.
pub(crate) struct TurnStream {
    tools: ToolStream,
    splitter: Option<ReasoningStream>,
    include_reasoning: bool,
    keeps_calls: bool,
    tool_config: ToolConfig,
    called: bool,
    reasoning_tokens: usize,
}

impl TurnStream {
    /// Feeds the text of one output (`tokens`: how many it carries;
    /// `finished`: it is the last) and returns what to send for it.
    pub fn push(&mut self, text: String, finished: bool, tokens: usize) -> TurnDelta {
        let mut has_tokens = tokens > 0;
        let (thought, answer) = match &mut self.splitter {
            Some(sp) => {
                if !sp.in_answer() {
                    self.reasoning_tokens += tokens;
                }
                let mut piece = sp.push(&text);
                if finished {
                    let rest = sp.finish();
                    piece.reasoning.push_str(&rest.reasoning);
                    piece.content.push_str(&rest.content);
                }
                // A piece of thinking alone sends no empty content.
                has_tokens &= piece.reasoning.is_empty();
                (Some(piece.reasoning), piece.content)
            }
            None => (None, text),
        };
        let thought = thought.filter(|t| !t.is_empty() && self.include_reasoning);
        let mut delta = self.tools.push(answer, finished, has_tokens);
        if self.keeps_calls {
            self.tool_config.limit_delta(&mut delta);
        } else {
            delta.tool_calls.clear();
        }
        self.called |= !delta.tool_calls.is_empty();
        TurnDelta {
            reasoning: thought,
            content: delta.content,
            tool_calls: delta.tool_calls,
        }
    }

    /// Tokens generated while the model was thinking (the end marker
    /// included): `usage.output_tokens_details.reasoning_tokens`.
    pub fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// The finish reason of this choice, given the engine's.
    pub fn finish_reason<'a>(&self, engine: &'a str) -> &'a str {
        self.tool_config.finish_reason(engine, self.called)
    }
}
