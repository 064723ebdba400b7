//! `ModelExecutor`: the engine's `Executor` (the trait of
//! `sluice_core::executor`) over this crate's `ModelRunner`, i.e. a real
//! forward pass with the paged KV cache, on the CPU by default.
//!
//! It only sizes the KV pool and forwards each step; the runner owns the
//! persistent batch and sampling, the backend the KV storage. It lives here
//! rather than in sluice-engine so that the engine depends on the executor
//! trait alone, not on this crate.
//!
//! With a [`Drafter`] ([`ModelExecutor::with_speculation`]) it also
//! proposes, after each step, up to k drafts for every request that
//! sampled (k chosen by the step's batch size, as vLLM's
//! `num_speculative_tokens_per_batch_size`), handed to the engine by
//! `take_draft_token_ids`; without one (the default) it proposes nothing
//! and behaves as if drafting did not exist.

use crate::config::ModelConfig;
use crate::drafter::Drafter;
use crate::kv_cache::KvCacheConfig;
use crate::runner::{CpuBackend, ForwardBackend, ModelRunner};
use crate::LoadedModel;
use anyhow::Result;
use sluice_core::{DraftTokenIds, Executor, ModelRunnerOutput, RequestId, SchedulerOutput};

/// How large the KV pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheSize {
    /// Exactly this many blocks, null block included (vLLM's
    /// `--num-gpu-blocks-override`).
    Blocks(usize),
    /// As many blocks as fit in this many bytes (`--kv-cache-memory`).
    Bytes(usize),
}

impl KvCacheSize {
    /// The KV cache of this size for `model` laid out as `layout` says
    /// (block size, layer grouping, element type: what a block costs; its
    /// `num_blocks` is ignored), checked (at least 2 blocks, a size that
    /// fits in memory), before any weight is read.
    pub fn resolve(self, model: &ModelConfig, layout: KvCacheConfig) -> Result<KvCacheConfig> {
        let kv = layout;
        let kv = match self {
            KvCacheSize::Blocks(num_blocks) => KvCacheConfig { num_blocks, ..kv },
            KvCacheSize::Bytes(bytes) => kv.with_memory_budget(model, bytes)?,
        };
        kv.check(model)?;
        Ok(kv)
    }
}

/// Runs scheduler steps on a loaded model (through any forward backend).
pub struct ModelExecutor<B: ForwardBackend = CpuBackend> {
    runner: ModelRunner<B>,
    drafting: Option<Drafting>,
}

/// What speculative decoding proposes with, and how much.
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    /// Drafts per request after a step that ran `b` requests, at most:
    /// `k_by_batch_size[b]` (the last entry for larger batches).
    pub k_by_batch_size: Vec<usize>,
    /// The engine's `--max-model-len`: no draft reaches past it.
    pub max_model_len: usize,
}

/// The drafter and what it drafts for.
struct Drafting {
    spec: Speculation,
    /// Drafts per request for the requests of the last step.
    k: usize,
    /// Requests that sampled in the last step, in scheduling order.
    sampled: Vec<RequestId>,
}

impl ModelExecutor {
    /// A CPU runner for `model` with blocks of `block_size` tokens. `seed`
    /// seeds the default per-request seeds (requests without their own).
    pub fn new(
        model: &LoadedModel,
        block_size: usize,
        kv_cache_size: KvCacheSize,
        seed: u64,
    ) -> Result<Self> {
        Self::with_layout(
            model,
            KvCacheConfig::new(block_size, 0),
            kv_cache_size,
            seed,
        )
    }

    /// [`new`](Self::new) with the cache laid out as `layout` says: its
    /// block size, layer grouping (`--disable-hybrid-kv-cache-manager`:
    /// one full group) and element type (`--kv-cache-dtype`); its
    /// `num_blocks` is ignored for `kv_cache_size`.
    pub fn with_layout(
        model: &LoadedModel,
        layout: KvCacheConfig,
        kv_cache_size: KvCacheSize,
        seed: u64,
    ) -> Result<Self> {
        let kv = kv_cache_size.resolve(&model.config, layout)?;
        let runner = ModelRunner::new(model, kv)?.with_seed(seed);
        Ok(ModelExecutor::from_runner(runner))
    }
}

impl<B: ForwardBackend> ModelExecutor<B> {
    /// An executor over a runner on any backend.
    pub fn from_runner(runner: ModelRunner<B>) -> Self {
        ModelExecutor {
            runner,
            drafting: None,
        }
    }

    /// Speculative decoding: after each step, `drafter` proposes up to `k`
    /// tokens per request that sampled (none for requests under structured
    /// outputs; a proposal ends before any token outside the vocabulary),
    /// and the runner verifies them the step after. The
    /// scheduler needs `num_lookahead_tokens >= k` so the drafts have KV
    /// slots.
    pub fn with_drafter(self, drafter: Box<dyn Drafter>, k: usize) -> Self {
        self.with_speculation(Speculation {
            drafter,
            k_by_batch_size: vec![k],
            max_model_len: usize::MAX,
        })
    }

    /// Speculative decoding as `spec` says (see [`with_drafter`]).
    ///
    /// [`with_drafter`]: Self::with_drafter
    pub fn with_speculation(mut self, spec: Speculation) -> Self {
        self.drafting = Some(Drafting {
            spec,
            k: 0,
            sampled: Vec::new(),
        });
        self
    }

    pub fn runner(&self) -> &ModelRunner<B> {
        &self.runner
    }
}

impl<B: ForwardBackend> Executor for ModelExecutor<B> {
    fn num_kv_blocks(&self) -> usize {
        self.runner.num_kv_blocks()
    }

    fn block_size(&self) -> usize {
        self.runner.block_size()
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.runner.vocab_size())
    }

    fn kv_cache_groups(&self) -> Vec<sluice_core::kv_cache::KvCacheGroupSpec> {
        self.runner.kv_cache_groups()
    }

    fn kv_cache_dtype(&self) -> Option<&'static str> {
        self.runner.kv_cache_dtype().map(|d| d.name())
    }

    fn execute(&mut self, scheduler_output: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        let out = self.runner.execute(scheduler_output)?;
        if let Some(d) = &mut self.drafting {
            for id in &scheduler_output.finished_req_ids {
                d.spec.drafter.finish(id);
            }
            let batch = scheduler_output.num_scheduled_tokens.len();
            let ks = &d.spec.k_by_batch_size;
            d.k = ks.get(batch).or(ks.last()).copied().unwrap_or(0);
            d.sampled.clear();
            d.sampled.extend(
                scheduler_output
                    .num_scheduled_tokens
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| !out.sampled(i).is_empty())
                    .map(|(_, s)| s.req_id.clone()),
            );
        }
        Ok(out)
    }

    fn take_draft_token_ids(&mut self) -> Option<DraftTokenIds> {
        let d = self.drafting.as_mut()?;
        let vocab = self.runner.vocab_size();
        let mut all = DraftTokenIds::new();
        for id in d.sampled.drain(..) {
            if d.k == 0 {
                continue;
            }
            let Some(view) = self.runner.draft_view(&id, d.spec.max_model_len) else {
                continue;
            };
            let mut drafts = Vec::new();
            d.spec.drafter.propose(&view, d.k, &mut drafts);
            // A token outside the vocabulary would fail the whole step's
            // forward pass; drafts are only a guess, so they end before it.
            let valid = drafts
                .iter()
                .take(d.k)
                .take_while(|&&t| (t as usize) < vocab)
                .count();
            drafts.truncate(valid);
            if !drafts.is_empty() {
                all.push((id.clone(), drafts));
            }
        }
        Some(all)
    }
}
