//! `RequestStream`: the caller's end of one request.
//!
//! Outputs arrive over an unbounded channel (the engine thread must never
//! wait for a slow reader); the stream ends after every completion's final
//! output. Promises:
//! - dropping the stream before that aborts the request: the engine frees
//!   its KV blocks on its next loop iteration, whatever the request was
//!   doing (waiting, prefilling, decoding);
//! - a stream always ends with a `finished` output per completion, even if
//!   the engine thread died (then the reason is `error`).

use crate::engine::Command;
use crate::request::{Finished, RequestOutput, Usage};
use sluice_core::FinishReason;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc::UnboundedReceiver;

/// The outputs of one request, in order. Implements `futures_core::Stream`
/// for async servers; `next().await` and `blocking_next()` do the same
/// without the trait.
pub struct RequestStream {
    request_id: String,
    seq: u64,
    num_prompt_tokens: usize,
    rx: UnboundedReceiver<RequestOutput>,
    commands: Sender<Command>,
    finished: Vec<bool>,
    num_finished: usize,
    usage: Usage,
    /// Bytes sent by the engine and not yet taken from `rx` (the engine
    /// aborts the request past its limit: a reader that stopped reading).
    buffered: Arc<AtomicUsize>,
}

/// What an output costs while it waits in a stream's channel, roughly in
/// bytes: its text, token ids and logprobs, plus the envelope.
pub(crate) fn output_cost(out: &RequestOutput) -> usize {
    let logprobs: usize = out
        .logprobs
        .iter()
        .map(|l| 16 + 8 * l.top.len())
        .sum::<usize>()
        + out
            .prompt_logprobs
            .as_ref()
            .map_or(0, |p| p.iter().map(|l| 16 + 8 * l.top.len()).sum());
    64 + out.text.len() + 4 * out.token_ids.len() + logprobs
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("request_id", &self.request_id)
            .field("n", &self.finished.len())
            .field("num_finished", &self.num_finished)
            .finish()
    }
}

impl RequestStream {
    pub(crate) fn new(
        request_id: String,
        seq: u64,
        num_prompt_tokens: usize,
        n: usize,
        rx: UnboundedReceiver<RequestOutput>,
        commands: Sender<Command>,
        buffered: Arc<AtomicUsize>,
    ) -> Self {
        RequestStream {
            request_id,
            seq,
            num_prompt_tokens,
            rx,
            commands,
            finished: vec![false; n],
            num_finished: 0,
            usage: Usage {
                prompt_tokens: num_prompt_tokens,
                ..Usage::default()
            },
            buffered,
        }
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// Number of completions (`n`).
    pub fn n(&self) -> usize {
        self.finished.len()
    }

    /// Whether every completion has delivered its final output.
    pub fn is_finished(&self) -> bool {
        self.num_finished == self.finished.len()
    }

    /// Token counts of what was received so far (final once finished).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The next output; `None` once every completion finished.
    pub async fn next(&mut self) -> Option<RequestOutput> {
        if self.is_finished() {
            return None;
        }
        let out = self.rx.recv().await;
        self.observe(out)
    }

    /// `next` for synchronous callers. Must not be called from inside an
    /// async runtime (it blocks the thread).
    pub fn blocking_next(&mut self) -> Option<RequestOutput> {
        if self.is_finished() {
            return None;
        }
        let out = self.rx.blocking_recv();
        self.observe(out)
    }

    /// An output if one is ready, without waiting (for callers that drive
    /// an `EngineCore` themselves). `None` also when nothing is ready yet:
    /// check `is_finished`.
    pub fn try_next(&mut self) -> Option<RequestOutput> {
        if self.is_finished() {
            return None;
        }
        match self.rx.try_recv() {
            Ok(out) => self.observe(Some(out)),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => self.observe(None),
        }
    }

    /// Aborts the request (the same as dropping the stream).
    pub fn abort(self) {}

    /// Bookkeeping of every output handed out; `None` from the channel
    /// (the engine dropped the request without finishing it) becomes an
    /// error output for the next unfinished completion.
    fn observe(&mut self, out: Option<RequestOutput>) -> Option<RequestOutput> {
        let out = match out {
            Some(out) => {
                let cost = output_cost(&out);
                // Saturating: the engine's final outputs are not counted.
                let _ = self
                    .buffered
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                        Some(b.saturating_sub(cost))
                    });
                out
            }
            None => {
                let index = self.finished.iter().position(|f| !f)?;
                RequestOutput {
                    index,
                    token_ids: Vec::new(),
                    text: String::new(),
                    logprobs: Vec::new(),
                    prompt_logprobs: None,
                    finished: Some(Finished {
                        reason: FinishReason::Error,
                        stop_reason: None,
                        num_output_tokens: 0,
                        num_cached_tokens: 0,
                        error: Some("the engine stopped before the request finished".into()),
                    }),
                }
            }
        };
        self.usage.completion_tokens += out.token_ids.len();
        if let Some(f) = &out.finished {
            self.usage.cached_tokens = self.usage.cached_tokens.max(f.num_cached_tokens);
            if let Some(done) = self.finished.get_mut(out.index) {
                if !*done {
                    *done = true;
                    self.num_finished += 1;
                }
            }
        }
        Some(out)
    }
}

impl futures_core::Stream for RequestStream {
    type Item = RequestOutput;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RequestOutput>> {
        if self.is_finished() {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(out) => Poll::Ready(self.observe(out)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.is_finished() {
            // The engine may be gone already; then there is nothing to free.
            let _ = self.commands.send(Command::AbortSeq(self.seq));
        }
    }
}
