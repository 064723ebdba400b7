//! `EngineCore`: the synchronous step loop. It owns the scheduler, the
//! executor and every request's engine-side state; nothing else touches
//! them, so there are no locks on the hot path.
//!
//! One `step()`: take the commands that arrived (new requests, aborts,
//! shutdown), `schedule()` → `execute()` → `update_from_output()`, then
//! route each request's new tokens through its detokenizer and stop strings
//! to its stream. With a step log, each step that scheduled tokens is
//! written as one `StepRecord` line: its shape right after `schedule()`,
//! `execute()`'s wall time (`forward_s`) and the whole step's (`step_s`:
//! from taking the commands to publishing the stats, so a simulator that
//! advances its clock by `step_s` per step keeps serving's pace).
//!
//! Ownership (TGI style): a request's resources are released by one
//! function, `finish_child`, whatever ends it — EOS / stop / length from the
//! scheduler, a stop string, an abort (explicit, or its stream dropped), a
//! model error, shutdown. Its blocks are back in the pool before the next
//! `schedule()`.

use crate::engine::{Command, Engine, EngineConfig, PendingRequest, Shared, ShutdownMode};
use crate::error::EngineError;
use crate::executor::Executor;
use crate::kv_events::{unix_time, KvEventSink};
use crate::output::CompletionText;
use crate::request::{Finished, RequestOutput, StopReason};
use crate::stats::{AdmissionCounters, EngineStats, FinishedRequestStats, StatsCollector};
use crate::step_log::StepLog;
use crate::stream::output_cost;
use sluice_core::GrammarBitmask;
use sluice_core::{
    FinishReason, ModelRunnerOutput, NewRequest, RequestId, RequestStatus, SampleLogprobs,
    Scheduler, SchedulerOutput, StopReason as CoreStopReason, TokenId,
};
use sluice_core::{StepRecord, StepShape};
use sluice_structured::{GrammarMatcher, PendingGrammar};
use sluice_tokenizer::Tokenizer;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

/// How long the loop pauses after a step that could schedule nothing.
const STALL_WAIT: Duration = Duration::from_millis(5);

/// One caller request: `n` scheduler requests ("children") sharing a
/// stream.
struct Parent {
    request_id: String,
    sender: UnboundedSender<RequestOutput>,
    /// Output bytes sent and not yet read by the caller.
    buffered: Arc<AtomicUsize>,
    /// Child ids by completion index.
    children: Vec<RequestId>,
    num_unfinished: usize,
    /// Most tokens one finished completion generated so far
    /// (`vllm:request_max_num_generation_tokens`).
    max_num_generation_tokens: usize,
}

/// One scheduler request (one completion).
struct Child {
    parent: u64,
    index: usize,
    text: CompletionText,
    num_prompt_tokens: usize,
    num_output_tokens: usize,
    num_cached_tokens: usize,
    /// Prompt + `max_tokens`: what it holds of `Shared::waiting_tokens`
    /// until it is first scheduled.
    queued_tokens: usize,
    /// `max_tokens` as the engine got it (`vllm:request_params_max_tokens`).
    max_tokens: usize,
    arrival: Instant,
    first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Times the scheduler preempted it.
    num_preemptions: usize,
    /// Prompt logprobs gathered across prefill chunks until the first
    /// output carries them (`None`: not asked for).
    prompt_logprobs: Option<Vec<SampleLogprobs>>,
    /// Structured outputs: the completion's grammar state, advanced by
    /// every token it is given (`None` while compiling, or unconstrained).
    grammar: Option<GrammarMatcher>,
    /// The request's `stop_token_ids` its grammar does not know: allowed
    /// wherever the grammar can end (as vLLM adds them to the matcher's stop
    /// set), besides the model's EOS ids the grammar already allows.
    grammar_stop_ids: Vec<TokenId>,
}

/// The step loop (see the module docs). Drive it yourself with `step()`, or
/// let `Engine::start` run it on its own thread.
pub struct EngineCore {
    scheduler: Scheduler,
    executor: Box<dyn Executor>,
    tokenizer: Arc<Tokenizer>,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    parents: HashMap<u64, Parent>,
    children: HashMap<RequestId, Child>,
    /// Caller id → parent sequence number.
    ids: HashMap<String, u64>,
    stats: StatsCollector,
    started: Instant,
    shutdown: Option<ShutdownMode>,
    /// Every handle and stream is gone: nobody can send anything again.
    disconnected: bool,
    /// The last step scheduled no token (requests wait for blocks that no
    /// running request will free soon): the loop pauses instead of spinning.
    stalled: bool,
    /// Grammars still compiling, by parent: their completions wait in the
    /// scheduler's grammar state (vLLM's `WAITING_FOR_FSM`) until then.
    pending_grammars: Vec<(u64, PendingGrammar)>,
    /// Reused bitmask buffer (one row per constrained request scheduled).
    grammar_bitmask: Option<GrammarBitmask>,
    /// Where each step's KV cache events go (`None`: they are discarded).
    kv_events: Option<Box<dyn KvEventSink>>,
    /// One line per step that scheduled tokens (`None`: no log).
    step_log: Option<StepLog>,
    /// The step being run, for the log: filled by `run_step`, finished
    /// and written by `step`.
    step_record: Option<StepRecord>,
    /// Steps run (`schedule()` calls), logged or not.
    num_steps: u64,
}

impl EngineCore {
    /// A core and the handle that feeds it. The scheduler's KV pool is the
    /// executor's `num_kv_blocks()`.
    pub fn new(
        mut config: EngineConfig,
        executor: Box<dyn Executor>,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<(EngineCore, Engine), EngineError> {
        config.scheduler.num_gpu_blocks = executor.num_kv_blocks();
        config.scheduler.validate()?;
        // The block tables the scheduler hands out index the executor's
        // pool: both must mean the same number of tokens per block.
        if executor.block_size() != config.scheduler.block_size {
            return Err(EngineError::Invalid(sluice_core::FieldError::new(
                "block_size",
                format!(
                    "the scheduler's block size ({}) differs from the executor's KV cache \
                     block size ({}); they must be equal",
                    config.scheduler.block_size,
                    executor.block_size()
                ),
            )));
        }
        // vLLM refuses to start when one sequence of max_model_len tokens
        // cannot fit in the pool: such a request would be preempted forever.
        let sc = &config.scheduler;
        let capacity = sc.num_gpu_blocks.saturating_sub(1) * sc.block_size;
        if capacity < sc.max_model_len {
            return Err(EngineError::Invalid(sluice_core::FieldError::new(
                "max_model_len",
                format!(
                    "({}) is larger than the KV cache can hold ({capacity} tokens in {} blocks \
                     of {}); lower max_model_len or give the KV cache more memory / blocks",
                    sc.max_model_len,
                    sc.num_gpu_blocks.saturating_sub(1),
                    sc.block_size
                ),
            )));
        }
        let scheduler = Scheduler::new(config.scheduler.clone())?;
        let stats = StatsCollector::new(
            config.scheduler.num_gpu_blocks,
            config.scheduler.max_model_len,
        );
        let (stopped, _) = watch::channel(false);
        let vocab_size = executor
            .vocab_size()
            .map_or(tokenizer.vocab_size(), |v| v.min(tokenizer.vocab_size()));
        let logits_width = executor.vocab_size().unwrap_or(tokenizer.vocab_size());
        let shared = Arc::new(Shared {
            vocab_size,
            logits_width,
            grammar: std::sync::OnceLock::new(),
            config,
            tokenizer: tokenizer.clone(),
            accepting: AtomicBool::new(true),
            alive: AtomicBool::new(true),
            num_waiting: AtomicUsize::new(0),
            num_pending: AtomicUsize::new(0),
            waiting_tokens: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            live_ids: Mutex::new(HashSet::new()),
            stats: Mutex::new(stats.snapshot()),
            admission: AdmissionCounters::default(),
            stopped,
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = Engine::from_parts(shared.clone(), tx);
        let core = EngineCore {
            scheduler,
            executor,
            tokenizer,
            shared,
            commands: rx,
            parents: HashMap::new(),
            children: HashMap::new(),
            ids: HashMap::new(),
            stats,
            started: Instant::now(),
            shutdown: None,
            disconnected: false,
            stalled: false,
            pending_grammars: Vec::new(),
            grammar_bitmask: None,
            kv_events: None,
            step_log: None,
            step_record: None,
            num_steps: 0,
        };
        Ok((core, engine))
    }

    /// Whether a step would do anything: requests to schedule, or finished
    /// ids the executor has not been told about.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_unfinished_requests() || self.scheduler.has_finished_requests()
    }

    /// Whether the loop should end (shutdown finished, or nobody left).
    pub fn is_done(&self) -> bool {
        match self.shutdown {
            Some(ShutdownMode::Abort) => true,
            Some(ShutdownMode::Drain) => !self.has_work(),
            None => self.disconnected,
        }
    }

    /// Sends each step's KV cache events to `sink` from now on (see
    /// [`crate::kv_events`]).
    pub fn set_kv_event_sink(&mut self, sink: Box<dyn KvEventSink>) {
        self.kv_events = Some(sink);
    }

    /// Writes one line per step that scheduled tokens to `log` from now on
    /// (see [`crate::step_log`]).
    pub fn set_step_log(&mut self, log: StepLog) {
        self.step_log = Some(log);
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.snapshot()
    }

    /// Takes every command that has arrived, then runs one
    /// schedule → execute → update step if there is work. Never blocks.
    /// Returns whether a step ran.
    pub fn step(&mut self) -> bool {
        let start = Instant::now();
        self.drain_commands();
        if self.shutdown == Some(ShutdownMode::Abort) || !self.has_work() {
            self.publish();
            return false;
        }
        self.executor.begin_step();
        self.run_step(start);
        self.publish();
        if let Some(mut record) = self.step_record.take() {
            record.step_s = start.elapsed().as_secs_f64();
            if let Some(log) = self.step_log.as_mut() {
                log.write(&record);
            }
        }
        true
    }

    /// The engine thread's loop: steps while there is work, sleeps on the
    /// command channel while there is none, returns after shutdown.
    pub fn run(mut self) {
        while !self.is_done() {
            if !self.has_work() {
                // Idle: what the log holds goes out before the wait.
                if let Some(log) = self.step_log.as_mut() {
                    log.flush();
                }
                match self.commands.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => self.disconnected = true,
                }
                continue;
            }
            if self.stalled {
                // Nothing could run last step; wait a little for an abort
                // or a new request rather than spin.
                match self.commands.recv_timeout(STALL_WAIT) {
                    Ok(cmd) => self.handle(cmd),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => self.disconnected = true,
                }
            }
            self.step();
        }
        self.fail_all(FinishReason::Abort, None);
        self.publish();
        if let Some(log) = self.step_log.as_mut() {
            log.flush();
        }
        self.shared.mark_stopped();
    }

    fn drain_commands(&mut self) {
        loop {
            match self.commands.try_recv() {
                Ok(cmd) => self.handle(cmd),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add(req) => self.add_request(*req),
            Command::AbortSeq(seq) => self.abort_parent(seq, FinishReason::Abort, None),
            Command::AbortId(id) => {
                if let Some(&seq) = self.ids.get(&id) {
                    self.abort_parent(seq, FinishReason::Abort, None);
                }
            }
            Command::Shutdown(mode) => {
                self.shared.accepting.store(false, Ordering::SeqCst);
                if self.shutdown != Some(ShutdownMode::Abort) {
                    self.shutdown = Some(mode);
                }
                if mode == ShutdownMode::Abort {
                    self.fail_all(FinishReason::Abort, None);
                }
            }
            Command::ResetPrefixCache {
                reset_running_requests,
                reply,
            } => {
                let ok = self.scheduler.reset_prefix_cache(reset_running_requests);
                // The caller may have given up waiting; nothing to undo.
                let _ = reply.send(ok);
            }
        }
    }

    fn add_request(&mut self, mut req: PendingRequest) {
        let n = req.params.n;
        let grammar = req.grammar.take();
        // The request's stop ids its grammar does not already allow at its
        // end (usually none: the model's EOS ids are the grammar's), so the
        // per-step `can_stop` check runs only where it can matter.
        let grammar_stops: Vec<TokenId> = match &grammar {
            // Built already: `generate` compiled the grammar with it.
            Some(_) => match self.shared.grammar_compiler() {
                Ok(compiler) => req
                    .params
                    .stop_token_ids
                    .iter()
                    .copied()
                    .filter(|t| !compiler.stop_ids().contains(t))
                    .collect(),
                Err(_) => Vec::new(),
            },
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

    /// Gives each completion whose grammar has compiled its own matcher and
    /// lets the scheduler admit it; a grammar that failed to compile fails
    /// its request (vLLM: "Invalid structured outputs: ...").
    fn poll_grammars(&mut self) {
        let mut i = 0;
        while i < self.pending_grammars.len() {
            let (seq, pending) = &mut self.pending_grammars[i];
            let seq = *seq;
            let Some(result) = pending.try_take() else {
                i += 1;
                continue;
            };
            self.pending_grammars.swap_remove(i);
            let Some(parent) = self.parents.get(&seq) else {
                continue;
            };
            match result {
                Ok(grammar) => {
                    for id in parent.children.clone() {
                        if let Some(child) = self.children.get_mut(&id) {
                            child.grammar = Some(grammar.matcher());
                            self.scheduler.set_grammar_ready(&id);
                        }
                    }
                }
                Err(e) => self.abort_parent(
                    seq,
                    FinishReason::Error,
                    Some(format!("Invalid structured outputs: {e}")),
                ),
            }
        }
    }

    /// The allowed tokens of every scheduled completion that has a grammar,
    /// for the runner to mask its logits with.
    fn fill_grammar_bitmask(&mut self, sched_out: &mut SchedulerOutput) {
        let t0 = Instant::now();
        let words = self.shared.logits_width.div_ceil(32);
        let mut mask = self
            .grammar_bitmask
            .take()
            .unwrap_or_else(|| GrammarBitmask::new(words));
        mask.req_ids.clear();
        mask.words.clear();
        for s in &sched_out.num_scheduled_tokens {
            let Some(child) = self.children.get_mut(&s.req_id) else {
                continue;
            };
            let Some(m) = child.grammar.as_mut() else {
                continue;
            };
            let row = mask.push_row(s.req_id.clone());
            m.fill_bitmask(row);
            if !child.grammar_stop_ids.is_empty() && m.can_stop() {
                for &t in &child.grammar_stop_ids {
                    if let Some(w) = row.get_mut(t as usize / 32) {
                        *w |= 1 << (t % 32);
                    }
                }
            }
        }
        if mask.is_empty() {
            self.grammar_bitmask = Some(mask);
        } else {
            let secs = t0.elapsed().as_secs_f64();
            self.stats.record_grammar_masks(mask.req_ids.len(), secs);
            sched_out.grammar_bitmask = Some(mask);
        }
    }

    fn run_step(&mut self, start: Instant) {
        if !self.pending_grammars.is_empty() {
            self.poll_grammars();
        }
        let mut sched_out = self.scheduler.schedule();
        let step_index = self.num_steps;
        self.num_steps += 1;
        // The shape as the scheduler saw it, before the update moves on;
        // steps without tokens stay out of the log (see `step_log`).
        let mut record = match &self.step_log {
            Some(log) if log.is_active() && sched_out.total_num_scheduled_tokens > 0 => {
                let shape = StepShape::from_output(&sched_out, &self.scheduler);
                let mut r = StepRecord::from_shape(&shape, self.shared.config.scheduler.block_size);
                r.step = step_index;
                r.t_s = start.saturating_duration_since(self.started).as_secs_f64();
                Some(r)
            }
            _ => None,
        };
        self.fill_grammar_bitmask(&mut sched_out);
        // The admission limit's count, exact again now that the requests
        // taken this step are either scheduled or waiting (not only after
        // the model ran).
        let (_, num_waiting) = self.scheduler.get_request_counts();
        self.shared.num_waiting.store(num_waiting, Ordering::SeqCst);
        self.stalled = sched_out.is_empty() && sched_out.finished_req_ids.is_empty();
        let now = Instant::now();
        let mut started_tokens = 0usize;
        for new in &sched_out.scheduled_new_reqs {
            if let Some(c) = self.children.get_mut(&new.req_id) {
                if c.first_scheduled.is_none() {
                    c.first_scheduled = Some(now);
                    started_tokens += std::mem::take(&mut c.queued_tokens);
                }
                c.num_cached_tokens = c.num_cached_tokens.max(new.num_computed_tokens);
            }
        }
        self.release_queued_tokens(started_tokens);
        for id in &sched_out.preempted_req_ids {
            if let Some(c) = self.children.get_mut(id) {
                c.num_preemptions += 1;
            }
        }
        let forward_start = Instant::now();
        let result = self.executor.execute(&sched_out);
        if let Some(r) = record.as_mut() {
            r.forward_s = forward_start.elapsed().as_secs_f64();
        }
        let runner_out = match result {
            Ok(out) => out,
            Err(e) => {
                // The model failed: every request in flight fails with it
                // (their state in the executor is suspect); the engine
                // itself goes on serving.
                self.fail_all(
                    FinishReason::Error,
                    Some(format!("model execution failed: {e:#}")),
                );
                return;
            }
        };
        self.stats.record_step();
        let outputs = self.scheduler.update_from_output(&sched_out, &runner_out);
        // Taken even without a sink, so they never pile up in the scheduler.
        let events = self.scheduler.take_kv_cache_events();
        if !events.is_empty() {
            if let Some(sink) = self.kv_events.as_mut() {
                sink.publish(unix_time(), events);
            }
        }
        // The bitmask buffer is kept for the next step.
        self.grammar_bitmask = sched_out.grammar_bitmask.take();
        self.collect_prompt_logprobs(&runner_out);
        let had_outputs = !outputs.is_empty();
        for out in outputs {
            self.route(&sched_out, &runner_out, out);
        }
        self.stats.end_step(had_outputs);
        self.step_record = record;
        self.take_drafts();
    }

    /// Hands the executor's drafts for the next step to the scheduler
    /// (vLLM's `update_draft_token_ids` after `update_from_output`). A
    /// structured-output request's drafts are dropped: its grammar would
    /// have to check every draft position, which only its matcher can.
    fn take_drafts(&mut self) {
        let Some(mut drafts) = self.executor.take_draft_token_ids() else {
            return;
        };
        drafts.retain(|(id, d)| {
            !d.is_empty() && self.children.get(id).is_some_and(|c| c.grammar.is_none())
        });
        if !drafts.is_empty() {
            self.scheduler.update_draft_token_ids(&drafts);
        }
    }

    fn collect_prompt_logprobs(&mut self, runner_out: &ModelRunnerOutput) {
        for pl in &runner_out.prompt_logprobs {
            if let Some(child) = self.children.get_mut(&pl.req_id) {
                let want = child.num_prompt_tokens.saturating_sub(1);
                if let Some(acc) = child.prompt_logprobs.as_mut() {
                    // A recompute after preemption reports them again.
                    let room = want.saturating_sub(acc.len());
                    acc.extend(pl.positions.iter().take(room).cloned());
                }
            }
        }
    }

    /// Sends one request's step output; finishes it if it ended.
    fn route(
        &mut self,
        _sched_out: &SchedulerOutput,
        runner_out: &ModelRunnerOutput,
        out: sluice_core::EngineCoreOutput,
    ) {
        let Some(child) = self.children.get_mut(&out.req_id) else {
            return;
        };
        if let Some(m) = child.grammar.as_mut() {
            // In update_from_output's order, as vLLM's scheduler advances
            // its matchers. A token outside the mask cannot be sampled, so
            // a rejection means the request's state is broken: fail it. A
            // request stop id where the grammar could end is not the
            // grammar's to follow: it ends the request.
            let stops = &child.grammar_stop_ids;
            let accepted = out
                .new_token_ids
                .iter()
                .all(|&t| (stops.contains(&t) && m.can_stop()) || m.accept_token(t));
            if !accepted {
                let error = m.error().unwrap_or_default();
                let seq = child.parent;
                self.abort_parent(
                    seq,
                    FinishReason::Error,
                    Some(format!("the grammar rejected a sampled token: {error}")),
                );
                return;
            }
        }
        let now = Instant::now();
        let scheduler_finished = out.finish_reason.is_some();
        let stop_terminated = out.finish_reason == Some(FinishReason::Stop);
        let step = child.text.update(
            &self.tokenizer,
            &out.new_token_ids,
            stop_terminated,
            scheduler_finished,
        );
        let kept = step.num_kept_tokens;
        child.num_cached_tokens = child.num_cached_tokens.max(out.num_cached_tokens);
        if kept > 0 {
            match child.last_token {
                None => {
                    child.first_token = Some(now);
                    self.stats.record_first_token(
                        now.saturating_duration_since(child.arrival).as_secs_f64(),
                        child.num_prompt_tokens,
                        child.num_cached_tokens,
                    );
                }
                Some(last) => self
                    .stats
                    .record_inter_token(now.saturating_duration_since(last).as_secs_f64()),
            }
            child.last_token = Some(now);
            self.stats.record_generation_tokens(kept);
        }
        child.num_output_tokens += kept;
        let logprobs: Vec<SampleLogprobs> = runner_out
            .sample_logprobs(out.index)
            .map(|lps| lps.iter().take(kept).flatten().cloned().collect())
            .unwrap_or_default();
        let finished = if let Some(stop) = step.stop_string {
            Some((FinishReason::Stop, Some(StopReason::String(stop))))
        } else {
            out.finish_reason.map(|reason| {
                let stop_reason = match out.stop_reason {
                    Some(CoreStopReason::Token(t)) => Some(StopReason::Token(t)),
                    _ => None,
                };
                (reason, stop_reason)
            })
        };
        let prompt_logprobs = if child.last_token.is_some() || finished.is_some() {
            child.prompt_logprobs.take()
        } else {
            None
        };
        let output = RequestOutput {
            index: child.index,
            token_ids: out.new_token_ids[..kept].to_vec(),
            text: step.text,
            logprobs,
            prompt_logprobs,
            finished: finished.as_ref().map(|(reason, stop_reason)| Finished {
                reason: *reason,
                stop_reason: stop_reason.clone(),
                num_output_tokens: child.num_output_tokens,
                num_cached_tokens: child.num_cached_tokens,
                error: None,
            }),
        };
        let parent_seq = child.parent;
        let cost = output_cost(&output);
        let limit = self.shared.config.limits.max_stream_buffer_bytes;
        let (delivered, overflowed) = match self.parents.get(&parent_seq) {
            Some(p) => {
                let sent = p.sender.send(output).is_ok();
                let buffered = p.buffered.fetch_add(cost, Ordering::AcqRel) + cost;
                (sent, sent && buffered > limit)
            }
            None => (false, false),
        };
        if let Some((reason, _)) = finished {
            self.finish_child(&out.req_id, reason);
        }
        if !delivered {
            // The caller is gone (its stream's abort is on its way too).
            self.abort_parent(parent_seq, FinishReason::Abort, None);
        } else if overflowed && self.parents.contains_key(&parent_seq) {
            // The caller stopped reading: generating on would only grow
            // memory, and its blocks serve others better.
            if let Some(p) = self.parents.get(&parent_seq) {
                eprintln!(
                    "sluice: aborting request {}: its client has not read {limit} bytes of \
                     output (--max-stream-buffer-bytes)",
                    p.request_id
                );
            }
            self.abort_parent(parent_seq, FinishReason::Abort, None);
        }
    }

    /// Releases one completion, however it ended: its scheduler request
    /// (blocks back to the pool now, if it was still live), its state, its
    /// stats, and the parent when it was the last completion.
    fn finish_child(&mut self, child_id: &RequestId, reason: FinishReason) {
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
    fn abort_parent(&mut self, seq: u64, reason: FinishReason, error: Option<String>) {
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

    fn fail_all(&mut self, reason: FinishReason, error: Option<String>) {
        let seqs: Vec<u64> = self.parents.keys().copied().collect();
        for seq in seqs {
            self.abort_parent(seq, reason, error.clone());
        }
    }

    /// Stats for a request that ended before its completions reached the
    /// scheduler (a shutdown, a scheduler refusal): each completion counts
    /// as finished, with no phase, so that every accepted request is in
    /// the finished-request families.
    fn record_unstarted(&mut self, req: &PendingRequest, reason: FinishReason) {
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
    fn release_queued_tokens(&self, tokens: usize) {
        if tokens > 0 {
            let _ =
                self.shared
                    .waiting_tokens
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                        Some(w.saturating_sub(tokens))
                    });
        }
    }

    /// Publishes gauges and the stats snapshot for the handles.
    fn publish(&mut self) {
        let s = self.scheduler.make_stats();
        self.stats.record_scheduler(&s, 0);
        self.shared.num_waiting.store(
            s.num_waiting_reqs + s.num_skipped_waiting_reqs,
            Ordering::SeqCst,
        );
        if let Ok(mut published) = self.shared.stats.lock() {
            self.stats.publish_into(&mut published);
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
