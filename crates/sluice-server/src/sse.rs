//! Server-sent events for streamed responses. OpenAI's shape (`respond`):
//! one `data: {json}` event per chunk, an optional usage chunk, then
//! `data: [DONE]`. Named events (`respond_events`, Anthropic's shape):
//! `event: NAME` + `data: {json}`, whatever the renderer ends with, and no
//! `[DONE]`.
//!
//! The response body owns the engine streams: when the client disconnects,
//! hyper drops the body, which drops the streams, which aborts the requests
//! (their KV blocks are freed at once).

use crate::submit::{add_usage, Event};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, StreamExt};
use sluice_engine::{RequestOutput, Usage};
use std::collections::VecDeque;
use std::convert::Infallible;

/// One event to send: its name (none: an unnamed `data:` event) and data.
pub struct Named {
    pub event: Option<&'static str>,
    pub data: String,
}

/// Turns a request's outputs into events.
pub trait Render: Send + 'static {
    /// The events that open the stream, before any output.
    fn start(&mut self) -> Vec<Named> {
        Vec::new()
    }
    /// The events for one output of prompt `prompt`.
    fn output(&mut self, prompt: usize, out: RequestOutput) -> Vec<Named>;
    /// The last events, once every prompt is done (`usage`: their total).
    fn end(&mut self, usage: &Usage) -> Vec<Named>;
}

struct State<R> {
    events: BoxStream<'static, Event>,
    render: R,
    usage: Usage,
    pending: VecDeque<Named>,
    done: bool,
}

/// Streams `events` through `render`.
pub fn respond_events<R: Render>(events: BoxStream<'static, Event>, mut render: R) -> Response {
    let pending = render.start().into();
    let state = State {
        events,
        render,
        usage: Usage::default(),
        pending,
        done: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.pending.pop_front() {
                // The name first, as Anthropic writes its events.
                let mut ev = SseEvent::default();
                if let Some(name) = item.event {
                    ev = ev.event(name);
                }
                let ev = ev.data(item.data);
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.done {
                return None;
            }
            match st.events.next().await {
                Some(Event::Output { prompt, out }) => {
                    let items = st.render.output(prompt, out);
                    st.pending.extend(items);
                }
                Some(Event::Done { usage, .. }) => add_usage(&mut st.usage, &usage),
                None => {
                    let items = st.render.end(&st.usage);
                    st.pending.extend(items);
                    st.done = true;
                }
            }
        }
    });
    Sse::new(body)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// OpenAI's stream: closures for the chunks, `[DONE]` at the end.
struct OpenAi<F, U> {
    on_output: F,
    usage_chunk: Option<U>,
}

fn unnamed(data: String) -> Named {
    Named { event: None, data }
}

impl<F, U> Render for OpenAi<F, U>
where
    F: FnMut(usize, RequestOutput) -> Vec<String> + Send + 'static,
    U: FnOnce(&Usage) -> String + Send + 'static,
{
    fn output(&mut self, prompt: usize, out: RequestOutput) -> Vec<Named> {
        (self.on_output)(prompt, out)
            .into_iter()
            .map(unnamed)
            .collect()
    }

    fn end(&mut self, usage: &Usage) -> Vec<Named> {
        let mut items = Vec::new();
        if let Some(render) = self.usage_chunk.take() {
            items.push(unnamed(render(usage)));
        }
        items.push(unnamed("[DONE]".to_string()));
        items
    }
}

/// Streams `events` as OpenAI SSE: `on_output` turns each output into zero
/// or more JSON chunks; at the end, `usage_chunk` (if any) renders the
/// total usage.
pub fn respond<F, U>(
    events: BoxStream<'static, Event>,
    on_output: F,
    usage_chunk: Option<U>,
) -> Response
where
    F: FnMut(usize, RequestOutput) -> Vec<String> + Send + 'static,
    U: FnOnce(&Usage) -> String + Send + 'static,
{
    respond_events(
        events,
        OpenAi {
            on_output,
            usage_chunk,
        },
    )
}
