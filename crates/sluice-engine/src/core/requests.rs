//! The request table: one `Parent` per caller request and one `Child` per
//! scheduler request (`n` > 1 makes `n` children sharing a stream and a
//! caller id). Requests come in here, get their children and scheduler
//! requests, and leave here: `finish_child` releases a completion whatever
//! ended it, `abort_parent` ends a whole request, `fail_all` every one.

use super::EngineCore;
use crate::engine::{PendingRequest, ShutdownMode};
use crate::output::CompletionText;
use crate::request::{Finished, RequestOutput};
use crate::stats::FinishedRequestStats;
use sluice_core::{FinishReason, NewRequest, RequestId, RequestStatus, SampleLogprobs, TokenId};
use sluice_structured::GrammarMatcher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One caller request: `n` scheduler requests ("children") sharing a
/// stream.
pub(super) struct Parent {
    pub(super) request_id: String,
    pub(super) sender: UnboundedSender<RequestOutput>,
    /// Output bytes sent and not yet read by the caller.
    pub(super) buffered: Arc<AtomicUsize>,
    /// Child ids by completion index.
    pub(super) children: Vec<RequestId>,
    pub(super) num_unfinished: usize,
    /// Most tokens one finished completion generated so far
    /// (`vllm:request_max_num_generation_tokens`).
    pub(super) max_num_generation_tokens: usize,
}

/// One scheduler request (one completion).
pub(super) struct Child {
    pub(super) parent: u64,
    pub(super) index: usize,
    pub(super) text: CompletionText,
    pub(super) num_prompt_tokens: usize,
    pub(super) num_output_tokens: usize,
    pub(super) num_cached_tokens: usize,
    /// Prompt + `max_tokens`: what it holds of `Shared::waiting_tokens`
    /// until it is first scheduled.
    pub(super) queued_tokens: usize,
    /// `max_tokens` as the engine got it (`vllm:request_params_max_tokens`).
    pub(super) max_tokens: usize,
    pub(super) arrival: Instant,
    pub(super) first_scheduled: Option<Instant>,
    pub(super) first_token: Option<Instant>,
    pub(super) last_token: Option<Instant>,
    /// Times the scheduler preempted it.
    pub(super) num_preemptions: usize,
    /// Prompt logprobs gathered across prefill chunks until the first
    /// output carries them (`None`: not asked for).
    pub(super) prompt_logprobs: Option<Vec<SampleLogprobs>>,
    /// Structured outputs: the completion's grammar state, advanced by
    /// every token it is given (`None` while compiling, or unconstrained).
    pub(super) grammar: Option<GrammarMatcher>,
    /// The request's `stop_token_ids` its grammar does not know: allowed
    /// wherever the grammar can end (as vLLM adds them to the matcher's stop
    /// set), besides the model's EOS ids the grammar already allows.
    pub(super) grammar_stop_ids: Vec<TokenId>,
    /// While `Some`, the grammar waits: no mask, no matcher steps, until the
    /// completion's tokens end with the gate's sequence.
    pub(super) grammar_gate: Option<GrammarGate>,
}

/// The token sequence after which a completion's grammar holds, and how
/// much of it the latest tokens match.
pub(super) struct GrammarGate {
    pub(super) end: Vec<TokenId>,
    pub(super) recent: Vec<TokenId>,
}

impl GrammarGate {
    /// Takes one generated token; true once the sequence is complete.
    pub(super) fn passes(&mut self, t: TokenId) -> bool {
        self.recent.push(t);
        if self.recent.len() > self.end.len() {
            self.recent.remove(0);
        }
        self.recent == self.end
    }
}

impl EngineCore {
    pub(super) fn add_request(&mut self, mut req: PendingRequest) {
        let n = req.params.n;
        let grammar = req.grammar.take();
        let grammar_stops = match &grammar {
            Some(_) => self.grammar_stop_ids(&req.params.stop_token_ids),
            None => Vec::new(),
        };
        // Waiting from now on, until `run_step` stores the scheduler's count
        // right after `schedule()`. Added before the pending count drops, so
        // that the admission limit (waiting + pending) never misses it.
        self.shared.num_waiting.fetch_add(n, Ordering::SeqCst);
        self.shared.num_pending.fetch_sub(n, Ordering::SeqCst);
        let queued_tokens = req
            .prompt_token_ids
            .len()
            .saturating_add(req.params.max_tokens);
        if self.shutdown == Some(ShutdownMode::Abort) {
            // Accepted just before the shutdown: never started.
            self.record_unstarted(&req, FinishReason::Abort);
            // Never waited after all (only this thread stores the count).
            self.shared.num_waiting.fetch_sub(n, Ordering::SeqCst);
            self.release_queued_tokens(queued_tokens.saturating_mul(n));
            self.shared.release_id(&req.request_id);
            send_finished(&req.sender, n, FinishReason::Abort, None);
            return;
        }
        let arrival_time = req
            .arrival
            .saturating_duration_since(self.started)
            .as_secs_f64();
        let mut children = Vec::with_capacity(n);
        for index in 0..n {
            let child_id: RequestId = if n == 1 {
                format!("{}", req.seq).into()
            } else {
                format!("{}-{index}", req.seq).into()
            };
            let mut params = req.params.clone();
            if n > 1 {
                // vLLM's parallel sampling: distinct seeds, one copy of the
                // prompt logprobs.
                params.seed = params.seed.map(|s| s.wrapping_add(index as u64));
                if index > 0 {
                    params.prompt_logprobs = None;
                }
            }
            let wants_prompt_logprobs = params.prompt_logprobs.is_some();
            let text =
                CompletionText::with_stops(&req.prompt_token_ids, &params, req.stops.clone());
            let new = NewRequest {
                id: child_id.clone(),
                prompt_token_ids: req.prompt_token_ids.clone(),
                sampling_params: Arc::new(params),
                priority: req.priority,
                arrival_time,
                cache_salt: req.cache_salt.clone(),
                needs_grammar: grammar.is_some(),
                num_external_computed_tokens: 0,
            };
            if let Err(e) = self.scheduler.add_request(new) {
                // Validated on the caller's side, so this is an engine bug;
                // fail the whole request rather than run half of it.
                self.scheduler
                    .finish_requests(&children, RequestStatus::FinishedError);
                for id in &children {
                    self.children.remove(id);
                }
                self.record_unstarted(&req, FinishReason::Error);
                // Never waited after all (only this thread stores the count).
                self.shared.num_waiting.fetch_sub(n, Ordering::SeqCst);
                self.release_queued_tokens(queued_tokens.saturating_mul(n));
                self.shared.release_id(&req.request_id);
                send_finished(&req.sender, n, FinishReason::Error, Some(e.to_string()));
                return;
            }
            self.children.insert(
                child_id.clone(),
                Child {
                    parent: req.seq,
                    index,
                    text,
                    num_prompt_tokens: req.prompt_token_ids.len(),
                    num_output_tokens: 0,
                    num_cached_tokens: 0,
                    queued_tokens,
                    max_tokens: req.params.max_tokens,
                    arrival: req.arrival,
                    first_scheduled: None,
                    first_token: None,
                    last_token: None,
                    num_preemptions: 0,
                    prompt_logprobs: wants_prompt_logprobs.then(Vec::new),
                    grammar: None,
                    grammar_stop_ids: grammar_stops.clone(),
                    grammar_gate: req.grammar_after.as_ref().map(|end| GrammarGate {
                        end: end.clone(),
                        recent: Vec::with_capacity(end.len()),
                    }),
                },
            );
            children.push(child_id);
        }
        if let Some(pending) = grammar {
            self.pending_grammars.push((req.seq, pending));
        }
        self.ids.insert(req.request_id.clone(), req.seq);
        self.parents.insert(
            req.seq,
            Parent {
                request_id: req.request_id,
                sender: req.sender,
                buffered: req.buffered,
                children,
                num_unfinished: n,
                max_num_generation_tokens: 0,
            },
        );
    }

    /// Releases one completion, however it ended: its scheduler request
    /// (blocks back to the pool now, if it was still live), its state, its
    /// stats, and the parent when it was the last completion.
    pub(super) fn finish_child(&mut self, child_id: &RequestId, reason: FinishReason) {
        let Some(child) = self.children.remove(child_id) else {
            return;
        };
        // No-op when the scheduler finished it itself.
        let status = match reason {
            FinishReason::Stop => RequestStatus::FinishedStopped,
            FinishReason::Length => RequestStatus::FinishedLengthCapped,
            FinishReason::Abort => RequestStatus::FinishedAborted,
            FinishReason::Error | FinishReason::Repetition => RequestStatus::FinishedError,
        };
        self.scheduler.finish_requests(&[child_id], status);
        self.release_queued_tokens(child.queued_tokens);
        // Every finished completion, aborted ones included (unlike vLLM,
        // which drops those its client cancelled): the success counter and
        // the finished-request histograms must count the same requests.
        self.stats.record_finished(&FinishedRequestStats {
            reason,
            arrival: child.arrival,
            first_scheduled: child.first_scheduled,
            first_token: child.first_token,
            last_token: child.last_token,
            finished: Instant::now(),
            num_prompt_tokens: child.num_prompt_tokens,
            num_generation_tokens: child.num_output_tokens,
            num_cached_tokens: child.num_cached_tokens,
            max_tokens: child.max_tokens,
            num_preemptions: child.num_preemptions,
        });
        let done = match self.parents.get_mut(&child.parent) {
            Some(p) => {
                p.num_unfinished -= 1;
                p.max_num_generation_tokens =
                    p.max_num_generation_tokens.max(child.num_output_tokens);
                p.num_unfinished == 0
            }
            None => false,
        };
        if done {
            if let Some(p) = self.parents.remove(&child.parent) {
                self.stats
                    .record_request_finished(p.children.len(), p.max_num_generation_tokens);
                self.ids.remove(&p.request_id);
                self.shared.release_id(&p.request_id);
            }
        }
    }

    /// Ends every unfinished completion of a request with `reason` and
    /// tells its stream (if it still listens).
    pub(super) fn abort_parent(&mut self, seq: u64, reason: FinishReason, error: Option<String>) {
        let Some(parent) = self.parents.get(&seq) else {
            return;
        };
        let sender = parent.sender.clone();
        let live: Vec<RequestId> = parent
            .children
            .iter()
            .filter(|c| self.children.contains_key(*c))
            .cloned()
            .collect();
        for id in live {
            if let Some(child) = self.children.get_mut(&id) {
                let _ = sender.send(RequestOutput {
                    index: child.index,
                    token_ids: Vec::new(),
                    text: String::new(),
                    logprobs: Vec::new(),
                    prompt_logprobs: None,
                    finished: Some(Finished {
                        reason,
                        stop_reason: None,
                        num_output_tokens: child.num_output_tokens,
                        num_cached_tokens: child.num_cached_tokens,
                        error: error.clone(),
                    }),
                });
            }
            self.finish_child(&id, reason);
        }
    }

    pub(super) fn fail_all(&mut self, reason: FinishReason, error: Option<String>) {
        let seqs: Vec<u64> = self.parents.keys().copied().collect();
        for seq in seqs {
            self.abort_parent(seq, reason, error.clone());
        }
    }

    /// Stats for a request that ended before its completions reached the
    /// scheduler (a shutdown, a scheduler refusal): each completion counts
    /// as finished, with no phase, so that every accepted request is in
    /// the finished-request families.
    pub(super) fn record_unstarted(&mut self, req: &PendingRequest, reason: FinishReason) {
        let now = Instant::now();
        let f = FinishedRequestStats {
            reason,
            arrival: req.arrival,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            finished: now,
            num_prompt_tokens: req.prompt_token_ids.len(),
            num_generation_tokens: 0,
            num_cached_tokens: 0,
            max_tokens: req.params.max_tokens,
            num_preemptions: 0,
        };
        for _ in 0..req.params.n {
            self.stats.record_finished(&f);
        }
        self.stats.record_request_finished(req.params.n, 0);
    }

    /// Tokens of completions that started (or ended unstarted) leave the
    /// waiting-token bound.
    pub(super) fn release_queued_tokens(&self, tokens: usize) {
        if tokens > 0 {
            let _ =
                self.shared
                    .waiting_tokens
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                        Some(w.saturating_sub(tokens))
                    });
        }
    }
}

/// Final outputs for a request that never reached the scheduler.
fn send_finished(
    sender: &UnboundedSender<RequestOutput>,
    n: usize,
    reason: FinishReason,
    error: Option<String>,
) {
    for index in 0..n {
        let _ = sender.send(RequestOutput {
            index,
            token_ids: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            prompt_logprobs: None,
            finished: Some(Finished {
                reason,
                stop_reason: None,
                num_output_tokens: 0,
                num_cached_tokens: 0,
                error: error.clone(),
            }),
        });
    }
}
