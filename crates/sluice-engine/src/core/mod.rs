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
//!
//! The parts: this module holds the core itself and its step; beside it,
//! `commands` (what the handles send), `requests` (the request table:
//! adding, finishing, aborting), `grammar` (structured outputs: compiling
//! grammars, the bitmask, the matchers), `outputs` (each step's outputs to
//! their streams) and `step_record` (the step log's record of each step).

mod commands;
mod grammar;
mod outputs;
mod requests;
mod step_record;

use self::requests::{Child, Parent};
use crate::engine::{Command, Engine, EngineConfig, Shared, ShutdownMode};
use crate::error::EngineError;
use crate::executor::Executor;
use crate::kv_events::{unix_time, KvEventSink};
use crate::stats::{AdmissionCounters, EngineStats, StatsCollector};
use crate::step_log::StepLog;
use sluice_core::GrammarBitmask;
use sluice_core::StepRecord;
use sluice_core::{FinishReason, RequestId, Scheduler};
use sluice_structured::PendingGrammar;
use sluice_tokenizer::Tokenizer;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long the loop pauses after a step that could schedule nothing.
const STALL_WAIT: Duration = Duration::from_millis(5);

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
        // The executor's layers decide the KV cache groups (a hybrid
        // model's sliding-window groups free out-of-window blocks).
        config.scheduler.kv_cache_groups = executor.kv_cache_groups();
        if let Some(dtype) = executor.kv_cache_dtype() {
            config.scheduler.cache_dtype = dtype.to_string();
        }
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
        check_max_model_len_fits(&config.scheduler)?;
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
        self.write_step_record(start);
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

    fn run_step(&mut self, start: Instant) {
        if !self.pending_grammars.is_empty() {
            self.poll_grammars();
        }
        let mut sched_out = self.scheduler.schedule();
        let step_index = self.num_steps;
        self.num_steps += 1;
        // The shape as the scheduler saw it, before the update moves on.
        let mut record = self.begin_step_record(&sched_out, step_index, start);
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
        self.record_drafts(&sched_out, &runner_out);
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

    /// Counts each request's drafts verified this step and how many the
    /// sampled tokens accepted: a row of `k` drafts samples the accepted
    /// ones plus one token (`Executor::take_draft_token_ids`).
    fn record_drafts(
        &mut self,
        sched_out: &sluice_core::SchedulerOutput,
        runner_out: &sluice_core::ModelRunnerOutput,
    ) {
        let spec = &sched_out.scheduled_spec_decode_tokens;
        if spec.is_empty() {
            return;
        }
        for (index, s) in sched_out.num_scheduled_tokens.iter().enumerate() {
            let Some((_, drafts)) = spec.iter().find(|(id, _)| *id == s.req_id) else {
                continue;
            };
            let sampled = runner_out.sampled(index);
            if !sampled.is_empty() {
                self.stats
                    .record_spec_decode(drafts.len(), sampled.len() - 1);
            }
        }
    }

    /// Hands the executor's drafts for the next step to the scheduler
    /// (vLLM's `update_draft_token_ids` after `update_from_output`). A
    /// structured-output request keeps the drafts its grammar accepts (as
    /// vLLM's `validate_tokens`), cut at the first it refuses; one whose
    /// grammar still waits behind its reasoning gate gets none (a request
    /// whose grammar is compiling has not run, so it has none either).
    fn take_drafts(&mut self) {
        let Some(mut drafts) = self.executor.take_draft_token_ids() else {
            return;
        };
        drafts.retain_mut(|(id, d)| {
            let Some(child) = self.children.get_mut(id) else {
                return false;
            };
            if child.grammar_gate.is_some() {
                return false;
            }
            if let Some(m) = child.grammar.as_mut() {
                let valid = m.validate_tokens(d);
                d.truncate(valid);
            }
            !d.is_empty()
        });
        if !drafts.is_empty() {
            self.scheduler.update_draft_token_ids(&drafts);
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

/// vLLM refuses to start when one sequence of `max_model_len` tokens cannot
/// fit in the pool (such a request would be preempted forever): the blocks
/// every group holds for it at most (a sliding-window group only its window
/// and a step) against the pool without its null block.
fn check_max_model_len_fits(sc: &sluice_core::SchedulerConfig) -> Result<(), EngineError> {
    let needed = sc.max_blocks_per_request();
    let available = sc.num_gpu_blocks.saturating_sub(1);
    if needed > available {
        let groups = if sc.kv_cache_groups.len() > 1 {
            format!(" across its {} KV cache groups", sc.kv_cache_groups.len())
        } else {
            String::new()
        };
        return Err(EngineError::Invalid(sluice_core::FieldError::new(
            "max_model_len",
            format!(
                "({}) is larger than the KV cache can hold ({} tokens in {available} blocks \
                 of {}); a sequence of max_model_len tokens needs {needed} blocks{groups}; \
                 lower max_model_len or give the KV cache more memory / blocks",
                sc.max_model_len,
                available * sc.block_size,
                sc.block_size
            ),
        )));
    }
    Ok(())
}
