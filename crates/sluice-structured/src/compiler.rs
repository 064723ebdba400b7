//! Compiling constraints: one llguidance parser factory per model, a pool of
//! plain threads that compile off the caller's thread, and a bounded cache of
//! compiled grammars keyed by `Constraint::cache_key`.
//!
//! Promises: a constraint compiles to the same grammar on the pool as on the
//! calling thread; a compile error or a panic inside llguidance comes back
//! as a `CompileError`, never takes a pool thread down; the cache holds at
//! most `cache_capacity` entries (least recently used goes first) and also
//! remembers errors, so a client repeating a bad constraint costs one
//! compile.

use crate::matcher::GrammarMatcher;
use crate::vocab::{StructuredVocab, VocabShared};
use crate::{CompileError, Constraint, JsonFormat};
use anyhow::Result;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::json;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// Compiled-grammar messages longer than this are cut: a Lark error quotes
/// the offending line, and a client's line can be huge.
const MAX_MESSAGE_CHARS: usize = 2000;

/// Compiles constraints on a small thread pool, with a bounded cache keyed by
/// `Constraint::cache_key` (compiled once, each request gets its own
/// matcher). Cheap to clone (Arc inside); Send + Sync.
#[derive(Clone)]
pub struct GrammarCompiler {
    core: Arc<Core>,
    pool: Arc<Pool>,
}

/// What compiling needs; shared by the callers and the pool threads.
struct Core {
    factory: ParserFactory,
    vocab: Arc<VocabShared>,
    cache: Mutex<Cache>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The job queue. Dropping it (the last `GrammarCompiler` clone) closes the
/// queue; the threads finish the jobs already queued and exit.
struct Pool {
    jobs: Mutex<mpsc::Sender<Job>>,
}

struct Job {
    constraint: Constraint,
    reply: mpsc::Sender<Result<CompiledGrammar, CompileError>>,
}

type Compiled = Result<CompiledGrammar, CompileError>;

/// Least-recently-used by a use counter; eviction scans, which is fine for
/// the few hundred entries a server keeps.
struct Cache {
    capacity: usize,
    tick: u64,
    entries: HashMap<String, (Compiled, u64)>,
}

impl Cache {
    fn get(&mut self, key: &str) -> Option<Compiled> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(v, used)| {
            *used = tick;
            v.clone()
        })
    }

    fn insert(&mut self, key: String, value: Compiled) {
        if self.capacity == 0 {
            return;
        }
        self.tick += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, self.tick));
    }
}

impl GrammarCompiler {
    /// `threads`: pool size (vLLM uses max(1, (cpus+1)/2)); `cache_capacity`:
    /// compiled grammars kept.
    pub fn new(
        vocab: StructuredVocab,
        threads: usize,
        cache_capacity: usize,
    ) -> Result<GrammarCompiler> {
        let shared = vocab.shared;
        // Builds the slicer's sub-tries of the whole vocabulary: the costly
        // part, done once per model.
        let mut factory = ParserFactory::new_simple(&shared.tok_env)?;
        // Warnings would go to stderr; errors are for clients, without the
        // parser state and grammar dump.
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        let core = Arc::new(Core {
            factory,
            vocab: shared,
            cache: Mutex::new(Cache {
                capacity: cache_capacity,
                tick: 0,
                entries: HashMap::new(),
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let core = core.clone();
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("sluice-grammar-{i}"))
                .spawn(move || worker(&core, &rx))?;
        }
        Ok(GrammarCompiler {
            core,
            pool: Arc::new(Pool {
                jobs: Mutex::new(tx),
            }),
        })
    }

    /// Compiles on the calling thread (or returns the cached grammar): the
    /// server uses it to turn a bad constraint into a 400 before submitting.
    pub fn compile(&self, constraint: &Constraint) -> Result<CompiledGrammar, CompileError> {
        self.core.compile(constraint)
    }

    /// Compiles on the pool; poll the result.
    pub fn compile_async(&self, constraint: Constraint) -> PendingGrammar {
        let (reply, rx) = mpsc::channel();
        // A cached grammar needs no trip through the pool.
        let key = constraint.cache_key();
        if let Some(hit) = self.core.cached(&key) {
            let _ = reply.send(hit);
            return PendingGrammar { rx: Some(rx) };
        }
        // If the pool cannot be reached the job (and `reply`) is dropped,
        // and `rx` reports the disconnect as an error.
        if let Ok(jobs) = self.pool.jobs.lock() {
            let _ = jobs.send(Job { constraint, reply });
        }
        PendingGrammar { rx: Some(rx) }
    }

    pub fn vocab_size(&self) -> usize {
        self.core.vocab.vocab_size
    }

    pub fn mask_words(&self) -> usize {
        self.core.vocab.mask_words
    }

    /// The stop ids every matcher allows where its grammar can end.
    pub fn stop_ids(&self) -> &[u32] {
        &self.core.vocab.stop_ids
    }

    /// (hits, misses) of the cache, for tests and metrics.
    pub fn cache_stats(&self) -> (u64, u64) {
        (
            self.core.hits.load(Ordering::Relaxed),
            self.core.misses.load(Ordering::Relaxed),
        )
    }
}

fn worker(core: &Core, rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // The lock is held only while waiting for the next job.
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else {
            return;
        };
        // `Core::compile` already catches llguidance's panics; this guards
        // the rest, so one bad job never takes a thread out of the pool.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| core.compile(&job.constraint)))
            .unwrap_or_else(|_| {
                Err(CompileError::new(
                    "internal error while compiling the grammar",
                ))
            });
        // The requester may have gone away; nothing to do then.
        let _ = job.reply.send(result);
    }
}

impl Core {
    fn cached(&self, key: &str) -> Option<Compiled> {
        let hit = self.cache.lock().ok()?.get(key);
        if hit.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    fn compile(&self, constraint: &Constraint) -> Compiled {
        let key = constraint.cache_key();
        if let Some(hit) = self.cached(&key) {
            return hit;
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Compiled outside the lock: two requests for the same new
        // constraint may both compile it, which costs time, not correctness.
        let result = self.compile_uncached(constraint);
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(key, result.clone());
        }
        result
    }

    fn compile_uncached(&self, constraint: &Constraint) -> Compiled {
        let grammar = top_level_grammar(constraint)?;
        let parser =
            std::panic::catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
                .map_err(|_| CompileError::new("internal error while compiling the grammar"))?
                .map_err(|e| compile_error(&e.to_string()))?;
        let mut template = Matcher::new(Ok(parser));
        if let Some(e) = template.get_error() {
            return Err(compile_error(&e));
        }
        // The first mask: some grammars are too complex only once the lexer
        // runs (fuel limits), and that is better found here, as a 400, than
        // at the first decode step. It also builds the lexer states every
        // request's first step needs, and matchers copy them.
        if !template.is_stopped() {
            if let Err(e) = template.compute_mask() {
                return Err(compile_error(&e.to_string()));
            }
        }
        Ok(CompiledGrammar {
            inner: Arc::new(CompiledInner {
                template: Mutex::new(template),
                vocab: self.vocab.clone(),
            }),
        })
    }
}

/// llguidance's message, trimmed for a client.
fn compile_error(message: &str) -> CompileError {
    let message = message.trim();
    let message = match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message.to_string(),
    };
    CompileError::new(message)
}

/// The llguidance grammar of a constraint (data only; compiling is the
/// factory's).
fn top_level_grammar(constraint: &Constraint) -> Result<TopLevelGrammar, CompileError> {
    Ok(match constraint {
        Constraint::Json { schema, format } => {
            TopLevelGrammar::from_json_schema(format.apply(schema.clone())?)
        }
        // Any object: `strict` has no properties to close it to.
        Constraint::JsonObject { format } => TopLevelGrammar::from_json_schema(
            JsonFormat {
                strict: false,
                ..format.clone()
            }
            .apply(json!({"type": "object"}))?,
        ),
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Constraint::Choice(choices) => TopLevelGrammar::from_lark(choice_lark(choices)?),
        Constraint::Grammar(lark) => TopLevelGrammar::from_lark(lark.clone()),
    })
}

/// `start: "a" | "b"` with each choice a JSON string literal (Lark string
/// syntax in llguidance); an empty choice makes the alternation optional
/// (Lark literals cannot be empty).
fn choice_lark(choices: &[String]) -> Result<String, CompileError> {
    if choices.is_empty() {
        return Err(CompileError::new("a choice needs at least one string"));
    }
    let mut alts = Vec::with_capacity(choices.len());
    for c in choices.iter().filter(|c| !c.is_empty()) {
        let lit = serde_json::to_string(c)
            .map_err(|e| CompileError::new(format!("choice {c:?}: {e}")))?;
        // serde_json leaves U+007F raw, which llguidance's Lark lexer
        // refuses.
        alts.push(lit.replace('\u{7f}', "\\u007f"));
    }
    let has_empty = choices.iter().any(String::is_empty);
    Ok(match (alts.is_empty(), has_empty) {
        (true, _) => "start: \"\"?".to_string(),
        (false, false) => format!("start: {}", alts.join(" | ")),
        (false, true) => format!("start: ({})?", alts.join(" | ")),
    })
}

/// The result of `compile_async`.
pub struct PendingGrammar {
    rx: Option<mpsc::Receiver<Compiled>>,
}

impl PendingGrammar {
    /// The result once compiled (then None forever after taking it is
    /// fine), None while compiling.
    pub fn try_take(&mut self) -> Option<Result<CompiledGrammar, CompileError>> {
        let rx = self.rx.as_ref()?;
        let result = match rx.try_recv() {
            Ok(r) => r,
            Err(mpsc::TryRecvError::Empty) => return None,
            Err(mpsc::TryRecvError::Disconnected) => Err(pool_gone()),
        };
        self.rx = None;
        Some(result)
    }

    /// Blocks until compiled.
    pub fn wait(self) -> Result<CompiledGrammar, CompileError> {
        match self.rx {
            Some(rx) => rx.recv().unwrap_or_else(|_| Err(pool_gone())),
            None => Err(CompileError::new("the compiled grammar was already taken")),
        }
    }
}

fn pool_gone() -> CompileError {
    CompileError::new("internal error: the grammar compiler stopped")
}

/// A compiled constraint. Clones share it; Send + Sync.
#[derive(Clone)]
pub struct CompiledGrammar {
    inner: Arc<CompiledInner>,
}

struct CompiledInner {
    /// A matcher at the start of the grammar, copied for each request. A
    /// mutex because cloning takes the shared lexer's lock anyway and the
    /// matcher type does not promise `Sync`.
    template: Mutex<Matcher>,
    vocab: Arc<VocabShared>,
}

impl CompiledGrammar {
    /// A fresh matcher at the start of the grammar, with its own copy of the
    /// lexer (`deep_clone`): llguidance's plain clone shares the lexer's
    /// lazily built DFA behind a mutex held for the whole mask computation,
    /// so sequences of one grammar would compute their masks one at a time,
    /// and since the cached template shares it too, the DFA would grow with
    /// every request the grammar ever served until it hit llguidance's
    /// `max_lexer_states` and failed them all. Measured (examples/
    /// structured_bench, release, SmolLM2's 49k vocabulary, JSON schema
    /// walks): the copy costs ~11 µs per matcher (vs 0.5 µs shared) and
    /// masks ~4.6 µs mean (vs 3.1 µs shared, which reuses other sequences'
    /// DFA states). See `matcher_sharing_lexer` for the other trade.
    pub fn matcher(&self) -> GrammarMatcher {
        self.make(true)
    }

    /// A fresh matcher sharing the lexer with every other matcher of this
    /// grammar made this way: DFA states one sequence builds serve the
    /// others, but their mask computations take turns.
    pub fn matcher_sharing_lexer(&self) -> GrammarMatcher {
        self.make(false)
    }

    fn make(&self, deep: bool) -> GrammarMatcher {
        let m = match self.inner.template.lock() {
            Ok(t) if deep => t.deep_clone(),
            Ok(t) => t.clone(),
            Err(_) => Matcher::new(Err(anyhow::anyhow!("the compiled grammar is unusable"))),
        };
        GrammarMatcher::new(m, self.inner.vocab.clone())
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_lark_quotes_and_escapes() {
        assert_eq!(
            choice_lark(&["a".into(), "b\"\u{7f}".into()]).unwrap(),
            r#"start: "a" | "b\"\u007f""#
        );
        assert_eq!(
            choice_lark(&["".into(), "x".into()]).unwrap(),
            r#"start: ("x")?"#
        );
        assert!(choice_lark(&[]).is_err());
    }

    #[test]
    fn cache_evicts_least_recently_used() {
        let mut c = Cache {
            capacity: 2,
            tick: 0,
            entries: HashMap::new(),
        };
        let e = |m: &str| Err(CompileError::new(m));
        c.insert("a".into(), e("a"));
        c.insert("b".into(), e("b"));
        assert!(c.get("a").is_some());
        c.insert("c".into(), e("c"));
        assert!(c.get("b").is_none());
        assert!(c.get("a").is_some() && c.get("c").is_some());
        assert_eq!(c.entries.len(), 2);
    }
}
