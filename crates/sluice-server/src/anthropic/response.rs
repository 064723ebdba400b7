//! A turn as Anthropic's Messages API answers it: a `message` with
//! `thinking`, `text` and `tool_use` content blocks, `stop_reason`,
//! `stop_sequence` and `usage`; or, streamed, Anthropic's events:
//! `message_start`, `ping`, per block `content_block_start`,
//! `content_block_delta` (`thinking_delta` + `signature_delta`,
//! `text_delta`, `input_json_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason and usage) and `message_stop`.
//!
//! Usage is Anthropic's: `input_tokens` counts the prompt tokens not read
//! from the prefix cache, `cache_read_input_tokens` those that were (their
//! sum is the prompt).

use crate::sse::{Named, Render};
use crate::turn::{TurnOutput, TurnStream};
use serde_json::{json, Value};
use sluice_engine::{Finished, RequestOutput, StopReason, Usage};

/// `stop_reason` and `stop_sequence` for a finish, given the reason after
/// tool calls (`tool_calls` where calls were made).
pub fn stop_fields(reason: &str, f: &Finished) -> (Value, Value) {
    match reason {
        "tool_calls" => (json!("tool_use"), Value::Null),
        "length" => (json!("max_tokens"), Value::Null),
        "stop" => match &f.stop_reason {
            Some(StopReason::String(s)) => (json!("stop_sequence"), json!(s)),
            _ => (json!("end_turn"), Value::Null),
        },
        // Aborted: Anthropic has no reason for it.
        _ => (Value::Null, Value::Null),
    }
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

/// A thinking block's `signature`: Anthropic signs thinking so that it can
/// check it when echoed back; here it is only an opaque token (as vLLM's).
fn signature() -> String {
    format!(
        "{:016x}{:016x}",
        crate::tools::random_u64(),
        crate::tools::random_u64()
    )
}

/// A tool call's `input`: its arguments as a JSON object. Arguments that
/// are not one (a forced call cut by `max_tokens`) come back as a text
/// block instead, so that nothing is lost.
fn tool_use_block(call: &crate::tools::ToolCall) -> Value {
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(input @ Value::Object(_)) => json!({
            "type": "tool_use", "id": call.id, "name": call.name, "input": input,
        }),
        _ => json!({"type": "text", "text": call.arguments}),
    }
}

/// The content blocks of a finished turn.
pub fn content_blocks(out: &TurnOutput) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(r) = &out.reasoning {
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": signature()}));
    }
    if let Some(t) = out.content.as_ref().filter(|t| !t.is_empty()) {
        blocks.push(json!({"type": "text", "text": t}));
    }
    blocks.extend(out.tool_calls.iter().map(tool_use_block));
    blocks
}

/// The whole `message` object.
pub fn message_json(
    id: &str,
    model: &str,
    content: Vec<Value>,
    (stop_reason, stop_sequence): (Value, Value),
    usage: Value,
) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    })
}

/// Anthropic's error object.
pub fn error_json(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn event(name: &'static str, data: Value) -> Named {
    Named {
        event: Some(name),
        data: data.to_string(),
    }
}

/// The kind of the content block open in a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    /// A tool call: its index among the turn's calls.
    ToolUse(usize),
}

/// The streaming renderer of one Messages request (one choice).
pub struct Stream {
    id: String,
    model: String,
    prompt_tokens: usize,
    turn: TurnStream,
    started: bool,
    failed: bool,
    /// The open block and its index.
    open: Option<(Block, usize)>,
    next_index: usize,
    stop: (Value, Value),
}

impl Stream {
    pub fn new(id: String, model: String, prompt_tokens: usize, turn: TurnStream) -> Self {
        Stream {
            id,
            model,
            prompt_tokens,
            turn,
            started: false,
            failed: false,
            open: None,
            next_index: 0,
            stop: (Value::Null, Value::Null),
        }
    }

    fn start(&mut self, events: &mut Vec<Named>) {
        if self.started {
            return;
        }
        self.started = true;
        let usage = json!({"input_tokens": self.prompt_tokens, "output_tokens": 0});
        let message = message_json(
            &self.id,
            &self.model,
            Vec::new(),
            (Value::Null, Value::Null),
            usage,
        );
        events.push(event(
            "message_start",
            json!({"type": "message_start", "message": message}),
        ));
        events.push(event("ping", json!({"type": "ping"})));
    }

    fn close(&mut self, events: &mut Vec<Named>) {
        let Some((kind, index)) = self.open.take() else {
            return;
        };
        if kind == Block::Thinking {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": signature()}}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }

    /// Opens a block of `kind` (closing the one open) unless it is open.
    fn open(&mut self, kind: Block, start: Value, events: &mut Vec<Named>) -> usize {
        if let Some((k, i)) = self.open {
            if k == kind {
                return i;
            }
        }
        self.close(events);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((kind, index));
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        index
    }

    fn delta(index: usize, delta: Value) -> Named {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }
}

impl Render for Stream {
    fn output(&mut self, _prompt: usize, out: RequestOutput) -> Vec<Named> {
        let mut events = Vec::new();
        if self.failed {
            return events;
        }
        self.start(&mut events);
        if let Some(err) = out.finished.as_ref().and_then(|f| f.error.as_ref()) {
            let e = crate::submit::finish_error(err);
            let kind = super::error_type(e.status);
            events.push(event("error", error_json(kind, &e.message)));
            self.failed = true;
            return events;
        }
        let fin = out.finished.as_ref();
        let delta = self.turn.push(out.text, fin.is_some(), out.token_ids.len());
        if let Some(r) = delta.reasoning {
            let i = self.open(
                Block::Thinking,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                &mut events,
            );
            events.push(Self::delta(
                i,
                json!({"type": "thinking_delta", "thinking": r}),
            ));
        }
        if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
            let i = self.open(
                Block::Text,
                json!({"type": "text", "text": ""}),
                &mut events,
            );
            events.push(Self::delta(i, json!({"type": "text_delta", "text": t})));
        }
        for call in delta.tool_calls {
            let args = call.function.arguments.unwrap_or_default();
            let index = match (&call.id, &call.function.name) {
                // The first delta of a call names it: a new block.
                (Some(id), Some(name)) => Some(self.open(
                    Block::ToolUse(call.index),
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    &mut events,
                )),
                _ => match self.open {
                    Some((Block::ToolUse(k), i)) if k == call.index => Some(i),
                    _ => None,
                },
            };
            if let Some(i) = index.filter(|_| !args.is_empty()) {
                events.push(Self::delta(
                    i,
                    json!({"type": "input_json_delta", "partial_json": args}),
                ));
            }
        }
        if let Some(f) = fin {
            self.stop = stop_fields(self.turn.finish_reason(f.reason.as_str()), f);
            self.close(&mut events);
        }
        events
    }

    fn end(&mut self, usage: &Usage) -> Vec<Named> {
        let mut events = Vec::new();
        if self.failed {
            return events;
        }
        self.start(&mut events);
        self.close(&mut events);
        let (stop_reason, stop_sequence) =
            std::mem::replace(&mut self.stop, (Value::Null, Value::Null));
        events.push(event(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   "usage": usage_json(usage)}),
        ));
        events.push(event("message_stop", json!({"type": "message_stop"})));
        events
    }
}
