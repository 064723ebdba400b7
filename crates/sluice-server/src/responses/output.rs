//! A turn as the Responses API answers it: the `response` object and its
//! output items (`reasoning`, `message` with `output_text`,
//! `function_call`), built as the outputs arrive, with the typed stream
//! events when streaming: `response.created`, `response.in_progress`, per
//! item `response.output_item.added`, its content (`content_part.added`,
//! `output_text.delta` / `reasoning_text.delta` /
//! `function_call_arguments.delta`, their `.done`, `content_part.done`),
//! `response.output_item.done`, then `response.completed` (its `status`
//! says `completed`, `incomplete` or `cancelled`, as vLLM's does) or
//! `response.failed`. Each event carries its `sequence_number`.
//!
//! One builder serves the three ways a response runs — streamed, awaited,
//! in the background — so they give the same items with the same ids; the
//! final object is what the store keeps and `GET` returns.

use crate::sse::{Named, Render};
use crate::turn::TurnStream;
use serde_json::{json, Map, Value};
use sluice_engine::{RequestOutput, Usage};
use tokio::sync::watch;

fn item_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:016x}{:016x}",
        crate::tools::random_u64(),
        crate::tools::random_u64()
    )
}

/// The two items made of one text part: thinking and the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TextKind {
    Reasoning,
    Message,
}

impl TextKind {
    /// The item as it opens (its part comes with `content_part.added`).
    fn item(self) -> Value {
        match self {
            TextKind::Reasoning => json!({"type": "reasoning", "id": item_id("rs"), "summary": [],
                                          "content": [], "status": "in_progress"}),
            TextKind::Message => json!({"type": "message", "id": item_id("msg"),
                                        "status": "in_progress", "role": "assistant",
                                        "content": []}),
        }
    }

    fn part(self) -> Value {
        match self {
            TextKind::Reasoning => json!({"type": "reasoning_text", "text": ""}),
            TextKind::Message => {
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            }
        }
    }

    fn events(self) -> (&'static str, &'static str) {
        match self {
            TextKind::Reasoning => (
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
            ),
            TextKind::Message => ("response.output_text.delta", "response.output_text.done"),
        }
    }

    /// Adds the fields only the answer's events carry.
    fn extend(self, mut event: Value) -> Value {
        if self == TextKind::Message {
            event["logprobs"] = json!([]);
        }
        event
    }
}

/// What the open item is, and its position in `output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text(TextKind, usize),
    /// A call: its index among the turn's calls, its output index.
    Call(usize, usize),
}

/// Called once with the final response and the assistant's turn as a chat
/// message (what a follow-up continues from).
pub type OnFinish = Box<dyn FnOnce(&Value, Value) + Send>;

pub struct Builder {
    /// The response object without `status`, `output`, `usage`.
    skeleton: Map<String, Value>,
    turn: TurnStream,
    /// Emit stream events (else only build).
    streaming: bool,
    seq: u64,
    items: Vec<Value>,
    open: Option<Open>,
    prompt_tokens: usize,
    output_tokens: usize,
    finish_reason: Option<String>,
    error: Option<String>,
    cancelled: watch::Receiver<bool>,
    on_finish: Option<OnFinish>,
    done: Option<Value>,
    /// Dropped before its end (the client went away): cancelled.
    interrupted: bool,
}

impl Builder {
    pub fn new(
        skeleton: Map<String, Value>,
        turn: TurnStream,
        streaming: bool,
        prompt_tokens: usize,
        cancelled: watch::Receiver<bool>,
        on_finish: OnFinish,
    ) -> Self {
        Builder {
            skeleton,
            turn,
            streaming,
            seq: 0,
            items: Vec::new(),
            open: None,
            prompt_tokens,
            output_tokens: 0,
            finish_reason: None,
            error: None,
            cancelled,
            on_finish: Some(on_finish),
            done: None,
            interrupted: false,
        }
    }

    /// The response as it stands, with `status`.
    pub fn snapshot(&self, status: &str) -> Value {
        let mut r = self.skeleton.clone();
        r.insert("status".into(), json!(status));
        r.insert("output".into(), Value::Array(self.items.clone()));
        r.insert("usage".into(), Value::Null);
        Value::Object(r)
    }

    /// The final response (after `end`).
    pub fn take_final(&mut self) -> Value {
        self.done.take().unwrap_or(Value::Null)
    }

    fn emit(&mut self, events: &mut Vec<Named>, name: &'static str, mut data: Value) {
        if !self.streaming {
            return;
        }
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        events.push(Named {
            event: Some(name),
            data: data.to_string(),
        });
    }

    fn add_item(&mut self, item: Value, events: &mut Vec<Named>) -> usize {
        let index = self.items.len();
        self.items.push(item.clone());
        self.emit(
            events,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        index
    }

    /// Closes the open item: its `.done` events, status `completed`.
    fn close(&mut self, events: &mut Vec<Named>) {
        let Some(open) = self.open.take() else {
            return;
        };
        match open {
            Open::Text(kind, i) => {
                let id = self.items[i]["id"].clone();
                let text = self.items[i]["content"][0]["text"].clone();
                let done = kind.extend(json!({"item_id": id, "output_index": i,
                                              "content_index": 0, "text": text}));
                self.emit(events, kind.events().1, done);
                let part = self.items[i]["content"][0].clone();
                self.emit(
                    events,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                );
                self.items[i]["status"] = json!("completed");
            }
            Open::Call(_, i) => {
                let id = self.items[i]["id"].clone();
                let args = self.items[i]["arguments"].clone();
                let name = self.items[i]["name"].clone();
                self.emit(
                    events,
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": i, "arguments": args, "name": name}),
                );
                self.items[i]["status"] = json!("completed");
            }
        }
        let (Open::Text(_, i) | Open::Call(_, i)) = open;
        let item = self.items[i].clone();
        self.emit(
            events,
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
    }

    /// Appends `text` to the open item of `kind`, opening one (and closing
    /// the item open before) when needed.
    fn text(&mut self, kind: TextKind, text: &str, events: &mut Vec<Named>) {
        let i = match self.open {
            Some(Open::Text(k, i)) if k == kind => i,
            _ => {
                self.close(events);
                let i = self.add_item(kind.item(), events);
                let part = kind.part();
                self.items[i]["content"] = json!([part.clone()]);
                let id = self.items[i]["id"].clone();
                self.emit(
                    events,
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                );
                self.open = Some(Open::Text(kind, i));
                i
            }
        };
        append(&mut self.items[i]["content"][0]["text"], text);
        let id = self.items[i]["id"].clone();
        let delta = kind
            .extend(json!({"item_id": id, "output_index": i, "content_index": 0, "delta": text}));
        self.emit(events, kind.events().0, delta);
    }

    fn call(&mut self, d: crate::tools::ToolCallDelta, events: &mut Vec<Named>) {
        let args = d.function.arguments.unwrap_or_default();
        let i = match (&d.id, &d.function.name) {
            (Some(call_id), Some(name)) => {
                self.close(events);
                let item = json!({"type": "function_call", "id": item_id("fc"),
                                  "call_id": call_id, "name": name, "arguments": "",
                                  "status": "in_progress"});
                let i = self.add_item(item, events);
                self.open = Some(Open::Call(d.index, i));
                i
            }
            _ => match self.open {
                Some(Open::Call(k, i)) if k == d.index => i,
                _ => return,
            },
        };
        if args.is_empty() {
            return;
        }
        append(&mut self.items[i]["arguments"], &args);
        let id = self.items[i]["id"].clone();
        self.emit(
            events,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": i, "delta": args}),
        );
    }

    /// The assistant's turn as a chat message, for the conversation.
    fn assistant_message(&self) -> Value {
        let mut content = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        for item in &self.items {
            match item["type"].as_str() {
                Some("message") => {
                    content.push_str(item["content"][0]["text"].as_str().unwrap_or(""))
                }
                Some("reasoning") => {
                    reasoning.push_str(item["content"][0]["text"].as_str().unwrap_or(""))
                }
                Some("function_call") => calls.push(json!({
                    "id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                })),
                _ => {}
            }
        }
        let mut m = json!({"role": "assistant", "content": content});
        if !reasoning.is_empty() {
            m["reasoning"] = json!(reasoning);
        }
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        m
    }
}

fn append(slot: &mut Value, text: &str) {
    let mut s = slot.as_str().unwrap_or("").to_string();
    s.push_str(text);
    *slot = json!(s);
}

impl Render for Builder {
    fn start(&mut self) -> Vec<Named> {
        let mut events = Vec::new();
        let snap = self.snapshot("in_progress");
        self.emit(&mut events, "response.created", json!({"response": snap}));
        let snap = self.snapshot("in_progress");
        self.emit(
            &mut events,
            "response.in_progress",
            json!({"response": snap}),
        );
        events
    }

    fn output(&mut self, _prompt: usize, out: RequestOutput) -> Vec<Named> {
        let mut events = Vec::new();
        if self.error.is_some() {
            return events;
        }
        self.output_tokens += out.token_ids.len();
        if let Some(err) = out.finished.as_ref().and_then(|f| f.error.as_ref()) {
            self.error = Some(crate::submit::finish_error(err).message);
            return events;
        }
        let fin = out.finished.as_ref();
        let delta = self.turn.push(out.text, fin.is_some(), out.token_ids.len());
        if let Some(r) = delta.reasoning {
            self.text(TextKind::Reasoning, &r, &mut events);
        }
        if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
            self.text(TextKind::Message, &t, &mut events);
        }
        for d in delta.tool_calls {
            self.call(d, &mut events);
        }
        if let Some(f) = fin {
            self.finish_reason = Some(self.turn.finish_reason(f.reason.as_str()).to_string());
        }
        events
    }

    fn end(&mut self, usage: &Usage) -> Vec<Named> {
        let mut events = Vec::new();
        self.close(&mut events);
        let cancelled = *self.cancelled.borrow() || self.interrupted;
        // A cancelled request ends without the engine's count: ours.
        let (input, cached, output) = if usage.prompt_tokens > 0 {
            (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            )
        } else {
            (self.prompt_tokens, 0, self.output_tokens)
        };
        let mut r = self.skeleton.clone();
        let (status, event) = if self.error.is_some() {
            ("failed", "response.failed")
        } else if cancelled {
            ("cancelled", "response.completed")
        } else if self.finish_reason.as_deref() == Some("length") {
            r.insert(
                "incomplete_details".into(),
                json!({"reason": "max_output_tokens"}),
            );
            ("incomplete", "response.completed")
        } else {
            ("completed", "response.completed")
        };
        if let Some(message) = &self.error {
            r.insert(
                "error".into(),
                json!({"code": "server_error", "message": message}),
            );
        }
        r.insert("status".into(), json!(status));
        r.insert("output".into(), Value::Array(self.items.clone()));
        r.insert(
            "usage".into(),
            json!({
                "input_tokens": input,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": self.turn.reasoning_tokens()},
                "total_tokens": input + output,
            }),
        );
        let response = Value::Object(r);
        if let Some(f) = self.on_finish.take() {
            f(&response, self.assistant_message());
        }
        self.emit(&mut events, event, json!({"response": response.clone()}));
        self.done = Some(response);
        events
    }
}

/// Runs a response to its end without streaming it: the final object.
pub async fn collect(
    mut events: futures::stream::BoxStream<'static, crate::submit::Event>,
    mut builder: Builder,
) -> Value {
    use futures::StreamExt;
    let mut usage = Usage::default();
    while let Some(ev) = events.next().await {
        match ev {
            crate::submit::Event::Output { prompt, out } => {
                builder.output(prompt, out);
            }
            crate::submit::Event::Done { usage: u, .. } => crate::submit::add_usage(&mut usage, &u),
        }
    }
    builder.end(&usage);
    builder.take_final()
}

impl Drop for Builder {
    /// A response whose stream was dropped (its client went away, which
    /// aborted the engine request) is recorded as cancelled, with what it
    /// had produced, so that the store never keeps it running.
    fn drop(&mut self) {
        if self.on_finish.is_some() {
            self.interrupted = true;
            self.streaming = false;
            self.end(&Usage::default());
        }
    }
}
