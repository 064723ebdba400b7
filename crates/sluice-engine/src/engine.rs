//! `Engine`: the handle callers hold (cheap to clone, `Send + Sync`), and
//! the thread that runs the `EngineCore` step loop.
//!
//! Everything a handle does is non-blocking: `generate` validates the
//! request on the caller's thread (so errors come back at once, naming the
//! field), then hands it to the engine thread over a channel and returns the
//! request's stream. The engine thread sleeps on that channel while it has
//! no work. Only `shutdown_blocking` waits (for the thread to end).

use crate::core::EngineCore;
use crate::error::EngineError;
use crate::executor::Executor;
use crate::kv_events::KvEventSink;
use crate::limits::{check_token_ids, queued_tokens, RequestLimits};
use crate::request::{GenerateRequest, RequestOutput};
use crate::stats::{AdmissionCounters, EngineStats};
use crate::step_log::StepLog;
use crate::stop::StopStrings;
use crate::stream::RequestStream;
use sluice_core::{FieldError, SamplingParams, SchedulerConfig, TokenId};
use sluice_structured::{Constraint, GrammarCompiler, PendingGrammar, StructuredVocab};
use sluice_tokenizer::Tokenizer;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::watch;

/// Engine settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// The scheduler's settings. `num_gpu_blocks` is replaced by the
    /// executor's `num_kv_blocks()` when the engine starts.
    pub scheduler: SchedulerConfig,
    /// New requests are refused with `EngineError::Overloaded` while at
    /// least this many scheduler requests wait (`None`: never).
    pub max_waiting_requests: Option<usize>,
    /// Most `logprobs` / `prompt_logprobs` a request may ask for (vLLM's
    /// `max_logprobs`, 20).
    pub max_logprobs: usize,
    /// The model's primary EOS (usually the tokenizer's): becomes each
    /// request's `eos_token_id` unless it sets `ignore_eos`.
    pub eos_token_id: Option<TokenId>,
    /// Further EOS ids (a generation config's list): added to each
    /// request's `stop_token_ids` unless it sets `ignore_eos`.
    pub extra_eos_token_ids: Vec<TokenId>,
    /// Bounds on what one request may ask for and on the queue.
    pub limits: RequestLimits,
}

impl EngineConfig {
    pub fn new(scheduler: SchedulerConfig) -> Self {
        EngineConfig {
            scheduler,
            max_waiting_requests: None,
            max_logprobs: 20,
            eos_token_id: None,
            extra_eos_token_ids: Vec::new(),
            limits: RequestLimits::default(),
        }
    }

    /// The model's EOS ids as vLLM takes them: the tokenizer's EOS first
    /// (else the generation config's first), the generation config's list
    /// as further stop tokens.
    pub fn with_model_eos(mut self, tokenizer: &Tokenizer, generation_eos: &[TokenId]) -> Self {
        self.eos_token_id = tokenizer
            .eos_token_id()
            .or_else(|| generation_eos.first().copied());
        self.extra_eos_token_ids = generation_eos.to_vec();
        self
    }
}

/// What `Engine::start_with_options` adds to the step loop.
#[derive(Default)]
pub struct StartOptions {
    /// Where each step's KV cache events go (see [`crate::kv_events`]; the
    /// scheduler records them only with
    /// `SchedulerConfig::enable_kv_cache_events`).
    pub kv_event_sink: Option<Box<dyn KvEventSink>>,
    /// One line per step that scheduled tokens (see [`crate::step_log`]).
    pub step_log: Option<StepLog>,
}

/// How `shutdown` treats requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Accept nothing new, let every accepted request finish, then stop.
    Drain,
    /// Abort every request (finish reason `abort`) and stop.
    Abort,
}

/// Messages to the engine thread.
pub(crate) enum Command {
    Add(Box<PendingRequest>),
    /// From a dropped stream: the request's engine-internal sequence number
    /// (immune to a later request reusing the id).
    AbortSeq(u64),
    /// From `Engine::abort`: by the caller's id.
    AbortId(String),
    Shutdown(ShutdownMode),
    /// From `Engine::reset_prefix_cache`: the scheduler's answer goes back
    /// on the channel (`true`: the cache was emptied).
    ResetPrefixCache {
        reset_running_requests: bool,
        reply: tokio::sync::oneshot::Sender<bool>,
    },
}

/// A validated request on its way to the engine thread.
pub(crate) struct PendingRequest {
    pub seq: u64,
    pub request_id: String,
    pub prompt_token_ids: Vec<TokenId>,
    /// With the model's EOS applied.
    pub params: SamplingParams,
    pub priority: i64,
    pub cache_salt: Option<String>,
    pub arrival: Instant,
    pub sender: tokio::sync::mpsc::UnboundedSender<RequestOutput>,
    /// `params.stop` compiled (on the caller's thread, not the engine's).
    pub stops: Arc<StopStrings>,
    /// Output bytes sent on `sender` and not yet read by the stream.
    pub buffered: Arc<AtomicUsize>,
    /// The structured-output grammar, compiling on the compiler's pool.
    pub grammar: Option<PendingGrammar>,
    /// The grammar holds after these tokens (`GenerateRequest::structured_after`).
    pub grammar_after: Option<Vec<TokenId>>,
}

/// Compiled grammars kept for reuse (most services send a few schemas
/// over and over).
const GRAMMAR_CACHE_SIZE: usize = 256;

/// State shared by the handles and the engine thread. The hot path (one
/// step) touches only atomics and one uncontended lock (stats).
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub tokenizer: Arc<Tokenizer>,
    /// Token ids valid everywhere: below both the model's and the
    /// tokenizer's vocabulary.
    pub vocab_size: usize,
    /// The model's logits width (what a grammar bitmask row covers).
    pub logits_width: usize,
    /// Structured outputs' compiler, built on first use (the token trie of
    /// a large vocabulary takes a moment) on a caller's thread, never the
    /// engine's.
    pub grammar: OnceLock<Result<GrammarCompiler, String>>,
    pub accepting: AtomicBool,
    pub alive: AtomicBool,
    /// Scheduler requests waiting, as of the last step.
    pub num_waiting: AtomicUsize,
    /// Scheduler requests accepted by `generate` but not yet taken by the
    /// engine thread.
    pub num_pending: AtomicUsize,
    /// Prompt + `max_tokens` tokens of the completions not started yet
    /// (pending or waiting, never scheduled).
    pub waiting_tokens: AtomicUsize,
    pub next_seq: AtomicU64,
    /// Caller ids of live requests (duplicates are refused).
    pub live_ids: Mutex<HashSet<String>>,
    pub stats: Mutex<EngineStats>,
    /// Requests refused by a queue limit; counted here because refusals
    /// happen on the callers' threads and never reach the engine thread.
    pub admission: AdmissionCounters,
    pub stopped: watch::Sender<bool>,
}

impl Shared {
    /// The structured-output compiler, built on the first call.
    pub(crate) fn grammar_compiler(&self) -> Result<&GrammarCompiler, String> {
        self.grammar
            .get_or_init(|| {
                let mut stop_ids: Vec<TokenId> = self.config.eos_token_id.into_iter().collect();
                stop_ids.extend(&self.config.extra_eos_token_ids);
                stop_ids.dedup();
                if stop_ids.is_empty() {
                    return Err("structured outputs need the model's EOS token, and this \
                                model has none"
                        .to_string());
                }
                let vocab =
                    StructuredVocab::new(self.tokenizer.clone(), self.logits_width, &stop_ids)
                        .map_err(|e| format!("structured outputs: {e:#}"))?;
                // vLLM's pool size for grammar compilation.
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                GrammarCompiler::new(vocab, (cpus.div_ceil(2)).max(1), GRAMMAR_CACHE_SIZE)
                    .map_err(|e| format!("structured outputs: {e:#}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    pub(crate) fn release_id(&self, request_id: &str) {
        if let Ok(mut ids) = self.live_ids.lock() {
            ids.remove(request_id);
        }
    }

    /// The engine thread is done: refuse everything from now on.
    pub(crate) fn mark_stopped(&self) {
        self.accepting.store(false, Ordering::SeqCst);
        self.alive.store(false, Ordering::SeqCst);
        if let Ok(mut ids) = self.live_ids.lock() {
            ids.clear();
        }
        self.stopped.send_replace(true);
    }
}

struct Handle {
    shared: Arc<Shared>,
    commands: Sender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stopped: watch::Receiver<bool>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The last handle is gone: nobody can shut the engine down any more,
        // so do it now (without waiting: this may run on an async runtime).
        let _ = self.commands.send(Command::Shutdown(ShutdownMode::Abort));
    }
}

/// A handle to a running engine (see the module docs). Clones share the
/// engine; when the last clone is dropped the engine aborts everything and
/// stops.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Handle>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("accepting", &self.is_accepting())
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl Engine {
    /// Starts the engine thread. The scheduler's KV pool is sized from
    /// `executor.num_kv_blocks()`. Fails, naming the option, when the
    /// scheduler configuration is invalid.
    pub fn start(
        config: EngineConfig,
        executor: Box<dyn Executor>,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<Engine, EngineError> {
        Self::start_with_options(config, executor, tokenizer, StartOptions::default())
    }

    /// [`Engine::start`], with each step's KV cache events sent to `sink`
    /// (see [`crate::kv_events`]; the scheduler records them only with
    /// `SchedulerConfig::enable_kv_cache_events`).
    pub fn start_with_kv_event_sink(
        config: EngineConfig,
        executor: Box<dyn Executor>,
        tokenizer: Arc<Tokenizer>,
        sink: Box<dyn KvEventSink>,
    ) -> Result<Engine, EngineError> {
        let options = StartOptions {
            kv_event_sink: Some(sink),
            ..StartOptions::default()
        };
        Self::start_with_options(config, executor, tokenizer, options)
    }

    /// [`Engine::start`] with what `options` adds to the loop.
    pub fn start_with_options(
        config: EngineConfig,
        executor: Box<dyn Executor>,
        tokenizer: Arc<Tokenizer>,
        options: StartOptions,
    ) -> Result<Engine, EngineError> {
        let (mut core, engine) = EngineCore::new(config, executor, tokenizer)?;
        if let Some(sink) = options.kv_event_sink {
            core.set_kv_event_sink(sink);
        }
        if let Some(log) = options.step_log {
            core.set_step_log(log);
        }
        let shared = engine.inner.shared.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-engine".into())
            .spawn(move || {
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || core.run()));
                if result.is_err() {
                    // The core (and with it every request's sender) is gone:
                    // streams end with an error; new requests get `Dead`.
                    shared.mark_stopped();
                }
            })
            .map_err(|e| {
                EngineError::Invalid(FieldError::new(
                    "engine",
                    format!("cannot start the engine thread: {e}"),
                ))
            })?;
        if let Ok(mut t) = engine.inner.thread.lock() {
            *t = Some(thread);
        }
        Ok(engine)
    }

    pub(crate) fn from_parts(shared: Arc<Shared>, commands: Sender<Command>) -> Engine {
        let stopped = shared.stopped.subscribe();
        Engine {
            inner: Arc::new(Handle {
                shared,
                commands,
                thread: Mutex::new(None),
                stopped,
            }),
        }
    }

    /// Submits a request. Validates it first (the error names the field),
    /// refuses it when the engine is overloaded or shutting down, and
    /// returns its output stream. Never blocks.
    pub fn generate(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        let shared = &self.inner.shared;
        if !shared.alive.load(Ordering::SeqCst) {
            return Err(EngineError::Dead);
        }
        if !shared.accepting.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        let params = validate(shared, &request)?;
        let n = params.n;
        if let Some(limit) = shared.config.max_waiting_requests {
            let num_waiting = shared.num_waiting.load(Ordering::SeqCst)
                + shared.num_pending.load(Ordering::SeqCst);
            if num_waiting >= limit {
                shared.admission.reject_queued_reqs();
                return Err(EngineError::Overloaded { num_waiting, limit });
            }
        }
        let tokens = queued_tokens(request.prompt_token_ids.len(), &params);
        if let Some(limit) = shared.config.limits.max_waiting_tokens {
            if tokens > limit {
                // Waiting would never help: refuse it for good, not 503.
                return Err(EngineError::Invalid(FieldError::new(
                    "max_tokens",
                    format!(
                        "the request asks for {tokens} tokens ((prompt + max_tokens) × n), more \
                         than the server queues at once ({limit}, --max-waiting-tokens)"
                    ),
                )));
            }
            let waiting_tokens = shared.waiting_tokens.load(Ordering::SeqCst);
            if waiting_tokens.saturating_add(tokens) > limit {
                shared.admission.reject_queued_tokens();
                return Err(EngineError::OverloadedTokens {
                    waiting_tokens,
                    limit,
                });
            }
        }
        // Compiled here, on the caller's thread: a long stop list costs the
        // caller, not every request the engine loop serves.
        let stops = Arc::new(StopStrings::new(
            &params.stop,
            params.include_stop_str_in_output,
        ));
        let seq = shared.next_seq.fetch_add(1, Ordering::SeqCst);
        let request_id = match request.request_id {
            Some(id) => id,
            None => format!("req-{seq}"),
        };
        {
            let mut ids = shared.live_ids.lock().map_err(|_| EngineError::Dead)?;
            if !ids.insert(request_id.clone()) {
                return Err(EngineError::Invalid(FieldError::new(
                    "request_id",
                    format!("a request with id {request_id:?} is already running"),
                )));
            }
        }
        let grammar = match request.structured {
            Some(constraint) => match shared.grammar_compiler() {
                Ok(compiler) => Some(compiler.compile_async(constraint)),
                Err(e) => {
                    shared.release_id(&request_id);
                    return Err(EngineError::Invalid(FieldError::new(
                        "structured_outputs",
                        e,
                    )));
                }
            },
            None => None,
        };
        let (sender, rx) = tokio::sync::mpsc::unbounded_channel();
        let num_prompt_tokens = request.prompt_token_ids.len();
        let buffered = Arc::new(AtomicUsize::new(0));
        shared.num_pending.fetch_add(n, Ordering::SeqCst);
        shared.waiting_tokens.fetch_add(tokens, Ordering::SeqCst);
        let pending = PendingRequest {
            seq,
            request_id: request_id.clone(),
            prompt_token_ids: request.prompt_token_ids,
            params,
            priority: request.priority,
            cache_salt: request.cache_salt,
            arrival: Instant::now(),
            sender,
            stops,
            buffered: buffered.clone(),
            grammar,
            grammar_after: request.structured_after.filter(|t| !t.is_empty()),
        };
        if self
            .inner
            .commands
            .send(Command::Add(Box::new(pending)))
            .is_err()
        {
            shared.num_pending.fetch_sub(n, Ordering::SeqCst);
            shared.waiting_tokens.fetch_sub(tokens, Ordering::SeqCst);
            shared.release_id(&request_id);
            return Err(EngineError::Dead);
        }
        Ok(RequestStream::new(
            request_id,
            seq,
            num_prompt_tokens,
            n,
            rx,
            self.inner.commands.clone(),
            buffered,
        ))
    }

    /// The checks `generate` makes of a request (prompt length, token ids,
    /// sampling values, limits), without submitting it: for a caller that
    /// answers what the engine would run (the render endpoints), so that
    /// it refuses exactly what `generate` refuses. Admission (queue
    /// limits) is not checked: nothing is queued.
    pub fn validate(&self, request: &GenerateRequest) -> Result<(), EngineError> {
        validate(&self.inner.shared, request).map(drop)
    }

    /// Aborts a live request by its id: each unfinished completion gets a
    /// final output with reason `abort`, its blocks are freed at once.
    /// Unknown ids are ignored.
    pub fn abort(&self, request_id: &str) {
        let _ = self
            .inner
            .commands
            .send(Command::AbortId(request_id.to_string()));
    }

    /// Empties the prefix cache (vLLM's `POST /reset_prefix_cache`): every
    /// cached block that no request holds is forgotten, so later prompts
    /// are computed again. Runs on the engine thread between two steps.
    /// With `reset_running_requests`, the running requests are preempted
    /// first (they resume later by recomputing), so that their blocks can
    /// go too. Resolves to `false` when blocks are still held (vLLM's
    /// `success: false`; the caller may retry), `Err(Dead)` when the
    /// engine thread is gone.
    pub async fn reset_prefix_cache(
        &self,
        reset_running_requests: bool,
    ) -> Result<bool, EngineError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.inner
            .commands
            .send(Command::ResetPrefixCache {
                reset_running_requests,
                reply,
            })
            .map_err(|_| EngineError::Dead)?;
        // A dropped reply: the thread ended before handling the command.
        answer.await.map_err(|_| EngineError::Dead)
    }

    /// A snapshot of the engine's statistics (as of its last step).
    pub fn stats(&self) -> EngineStats {
        let shared = &self.inner.shared;
        let mut stats = shared.stats.lock().map(|s| s.clone()).unwrap_or_default();
        // What the admission limit counts: the snapshot is as of the last
        // step, while `num_waiting` already holds the requests the engine
        // took since, and `num_pending` those it has not taken yet.
        stats.num_waiting_reqs =
            shared.num_waiting.load(Ordering::SeqCst) + shared.num_pending.load(Ordering::SeqCst);
        stats.admission_rejections = shared.admission.snapshot();
        stats
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.shared.tokenizer
    }

    /// Token ids below this are valid everywhere (the model embeds them,
    /// the tokenizer decodes them).
    pub fn vocab_size(&self) -> usize {
        self.inner.shared.vocab_size
    }

    /// The vocabulary check every endpoint shares: each id below
    /// `vocab_size()`, else an error naming `field` and the position.
    pub fn check_token_ids(&self, field: &'static str, ids: &[TokenId]) -> Result<(), FieldError> {
        check_token_ids(field, ids.iter().copied(), self.vocab_size())
    }

    /// The configuration in force (`scheduler.num_gpu_blocks` is the
    /// executor's pool).
    pub fn config(&self) -> &EngineConfig {
        &self.inner.shared.config
    }

    /// Compiles a structured-output constraint on the calling thread (or
    /// finds it compiled), so a caller can refuse a bad one before
    /// accepting the request: the error is the reason, for a 400. Blocks
    /// for as long as the compilation takes (milliseconds; call it off an
    /// async runtime's workers).
    pub fn compile_constraint(&self, constraint: &Constraint) -> Result<(), String> {
        let compiler = self.inner.shared.grammar_compiler()?;
        compiler
            .compile(constraint)
            .map(drop)
            .map_err(|e| e.message)
    }

    /// Whether `generate` accepts requests now (for a readiness probe).
    pub fn is_accepting(&self) -> bool {
        self.inner.shared.alive.load(Ordering::SeqCst)
            && self.inner.shared.accepting.load(Ordering::SeqCst)
    }

    /// Whether the engine thread is still running.
    pub fn is_alive(&self) -> bool {
        self.inner.shared.alive.load(Ordering::SeqCst)
    }

    /// Stops the engine: from now on `generate` fails with `ShuttingDown`;
    /// requests in flight finish (`Drain`) or are aborted (`Abort`); resolves
    /// when the engine thread has ended. Calling it again with `Abort` while
    /// a drain is under way aborts what is left.
    pub async fn shutdown(&self, mode: ShutdownMode) {
        self.begin_shutdown(mode);
        let mut stopped = self.inner.stopped.clone();
        let _ = stopped.wait_for(|s| *s).await;
        self.join();
    }

    /// `shutdown` for synchronous callers: blocks until the thread ended.
    pub fn shutdown_blocking(&self, mode: ShutdownMode) {
        self.begin_shutdown(mode);
        self.join();
    }

    fn begin_shutdown(&self, mode: ShutdownMode) {
        self.inner.shared.accepting.store(false, Ordering::SeqCst);
        let _ = self.inner.commands.send(Command::Shutdown(mode));
    }

    fn join(&self) {
        let thread = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// The checks `Scheduler::add_request` would make, and the engine's own,
/// on the caller's thread. Returns the parameters with the model's EOS.
fn validate(shared: &Shared, request: &GenerateRequest) -> Result<SamplingParams, EngineError> {
    let bad = |field: &'static str, message: String| {
        Err(EngineError::Invalid(FieldError::new(field, message)))
    };
    let config = &shared.config;
    let mut params = request.sampling_params.clone();
    params.apply_model_eos(config.eos_token_id, &config.extra_eos_token_ids);
    let prompt = &request.prompt_token_ids;
    if prompt.is_empty() {
        return bad("prompt", "the prompt is empty".into());
    }
    let max_model_len = config.scheduler.max_model_len;
    if prompt.len() >= max_model_len {
        return bad(
            "prompt",
            format!(
                "the prompt has {} tokens, but the model's context length (max_model_len) is \
                 {max_model_len} tokens and at least one must be left for the output",
                prompt.len()
            ),
        );
    }
    let vocab = shared.vocab_size;
    check_token_ids("prompt", prompt.iter().copied(), vocab)?;
    // The user's stop ids, not the model's EOS ids added to them above.
    check_token_ids(
        "stop_token_ids",
        request.sampling_params.stop_token_ids.iter().copied(),
        vocab,
    )?;
    check_token_ids(
        "logit_bias",
        params.logit_bias.iter().map(|&(id, _)| id),
        vocab,
    )?;
    config.limits.check(&params)?;
    if params.max_tokens == 0 {
        return bad("max_tokens", "must be at least 1".into());
    }
    params.validate()?;
    for (field, value) in [
        ("logprobs", params.logprobs),
        ("prompt_logprobs", params.prompt_logprobs),
    ] {
        if let Some(k) = value {
            if k > config.max_logprobs {
                return bad(
                    field,
                    format!(
                        "at most {} logprobs may be requested, got {k}",
                        config.max_logprobs
                    ),
                );
            }
        }
    }
    if request.request_id.as_deref() == Some("") {
        return bad("request_id", "must not be empty".into());
    }
    Ok(params)
}
