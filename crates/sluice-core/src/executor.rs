//! The seam between the engine loop and whatever computes tokens: the
//! [`Executor`] trait.
//!
//! It lives here, beside [`SchedulerOutput`] and [`ModelRunnerOutput`]
//! (the two values that cross it), so that both sides depend only on this
//! crate: the engine drives any `Executor` without depending on a model
//! crate, and a model crate (sluice-model's `ModelExecutor`, a future CUDA
//! one) implements it without depending on the engine.
//!
//! An `Executor` receives every `SchedulerOutput` in order (the incremental
//! protocol: full data for new requests, deltas for cached ones, finished
//! and preempted ids) and answers with the sampled tokens. It owns the KV
//! cache storage; the scheduler only hands out block ids, so the executor
//! tells the engine how many blocks its pool holds and how many tokens a
//! block holds (the engine refuses a scheduler whose block size differs).

use crate::kv_cache::KvCacheGroupSpec;
use crate::output::{DraftTokenIds, ModelRunnerOutput, SchedulerOutput};

/// Runs scheduler steps. Lives on the engine thread (hence `Send`).
pub trait Executor: Send {
    /// Blocks in the KV pool, null block included: becomes the scheduler's
    /// `num_gpu_blocks`.
    fn num_kv_blocks(&self) -> usize;

    /// Tokens per KV block, the one the pool was built with: it must equal
    /// the scheduler's `block_size` (the engine checks, naming both).
    fn block_size(&self) -> usize;

    /// Token ids the model accepts (`0..vocab_size`), if known: prompts with
    /// other ids are refused up front instead of failing a step.
    fn vocab_size(&self) -> Option<usize> {
        None
    }

    /// The KV cache groups of the model's layers, in order: what the
    /// scheduler's `kv_cache_groups` becomes (one full-attention group for
    /// a plain decoder; a hybrid model's sliding-window groups beside its
    /// full one). `SchedulerOutput` then carries one block table per group.
    fn kv_cache_groups(&self) -> Vec<KvCacheGroupSpec> {
        vec![KvCacheGroupSpec::FULL]
    }

    /// The KV cache's element type, as vLLM's `cache_dtype` names it
    /// (`bfloat16`, `float32`, `q8_0`, ...), if the executor holds one:
    /// what `SchedulerConfig::cache_dtype` becomes.
    fn kv_cache_dtype(&self) -> Option<&'static str> {
        None
    }

    /// The engine begins a step: called before `schedule()`, so an
    /// executor that paces itself (a simulated one) can count scheduling
    /// inside the step's time.
    fn begin_step(&mut self) {}

    /// Executes one step. Called for every `schedule()`, also when nothing
    /// was scheduled (so the executor drops finished requests' state). An
    /// error fails every request in flight; the engine keeps serving.
    fn execute(&mut self, scheduler_output: &SchedulerOutput) -> anyhow::Result<ModelRunnerOutput>;

    /// Draft tokens proposed for the next step (speculative decoding),
    /// taken once after each `execute`; `None` without a drafter. A request
    /// with drafts is scheduled them next step
    /// (`SchedulerOutput::scheduled_spec_decode_tokens`), and its
    /// `ModelRunnerOutput` row holds the accepted drafts plus one token.
    fn take_draft_token_ids(&mut self) -> Option<DraftTokenIds> {
        None
    }
}

impl<E: Executor + ?Sized> Executor for Box<E> {
    fn num_kv_blocks(&self) -> usize {
        (**self).num_kv_blocks()
    }
    fn block_size(&self) -> usize {
        (**self).block_size()
    }
    fn begin_step(&mut self) {
        (**self).begin_step()
    }
    fn vocab_size(&self) -> Option<usize> {
        (**self).vocab_size()
    }
    fn kv_cache_groups(&self) -> Vec<KvCacheGroupSpec> {
        (**self).kv_cache_groups()
    }
    fn kv_cache_dtype(&self) -> Option<&'static str> {
        (**self).kv_cache_dtype()
    }
    fn execute(&mut self, scheduler_output: &SchedulerOutput) -> anyhow::Result<ModelRunnerOutput> {
        (**self).execute(scheduler_output)
    }
    fn take_draft_token_ids(&mut self) -> Option<DraftTokenIds> {
        (**self).take_draft_token_ids()
    }
}
