//! Server-sent events for streamed responses: one `data: {json}` event per
//! chunk, an optional usage chunk, then `data: [DONE]`.
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

struct State<F, U> {
    events: BoxStream<'static, Event>,
    on_output: F,
    usage_chunk: Option<U>,
    usage: Usage,
    pending: VecDeque<String>,
    done: bool,
}

/// Streams `events` as SSE: `on_output` turns each output into zero or more
/// JSON chunks; at the end, `usage_chunk` (if any) renders the total usage.
pub fn respond<F, U>(
    events: BoxStream<'static, Event>,
    on_output: F,
    usage_chunk: Option<U>,
) -> Response
where
    F: FnMut(usize, RequestOutput) -> Vec<String> + Send + 'static,
    U: FnOnce(&Usage) -> String + Send + 'static,
{
    let state = State {
        events,
        on_output,
        usage_chunk,
        usage: Usage::default(),
        pending: VecDeque::new(),
        done: false,
    };
    let body = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(chunk) = st.pending.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(chunk)), st));
            }
            if st.done {
                return None;
            }
            match st.events.next().await {
                Some(Event::Output { prompt, out }) => {
                    let chunks = (st.on_output)(prompt, out);
                    st.pending.extend(chunks);
                }
                Some(Event::Done { usage, .. }) => add_usage(&mut st.usage, &usage),
                None => {
                    if let Some(render) = st.usage_chunk.take() {
                        st.pending.push_back(render(&st.usage));
                    }
                    st.pending.push_back("[DONE]".to_string());
                    st.done = true;
                }
            }
        }
    });
    Sse::new(body)
        .keep_alive(KeepAlive::default())
        .into_response()
}
