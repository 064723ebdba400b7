//! `ModelExecutor`: the engine's `Executor` (the trait of
//! `sluice_core::executor`) over this crate's `ModelRunner`, i.e. a real
//! forward pass with the paged KV cache, on the CPU by default.
//!
//! It only sizes the KV pool and forwards each step; the runner owns the
//! persistent batch and sampling, the backend the KV storage. It lives here
//! rather than in sluice-engine so that the engine depends on the executor
//! trait alone, not on this crate.

use crate::kv_cache::KvCacheConfig;
use crate::runner::{CpuBackend, ForwardBackend, ModelRunner};
use crate::LoadedModel;
use anyhow::Result;
use sluice_core::{Executor, ModelRunnerOutput, SchedulerOutput};

/// How large the KV pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheSize {
    /// Exactly this many blocks, null block included (vLLM's
    /// `--num-gpu-blocks-override`).
    Blocks(usize),
    /// As many blocks as fit in this many bytes (`--kv-cache-memory`).
    Bytes(usize),
}

/// Runs scheduler steps on a loaded model (through any forward backend).
pub struct ModelExecutor<B: ForwardBackend = CpuBackend> {
    runner: ModelRunner<B>,
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
        let kv = match kv_cache_size {
            KvCacheSize::Blocks(n) => KvCacheConfig::new(block_size, n),
            KvCacheSize::Bytes(bytes) => {
                KvCacheConfig::from_memory_budget(&model.config, block_size, bytes)?
            }
        };
        let runner = ModelRunner::new(model, kv)?.with_seed(seed);
        Ok(ModelExecutor { runner })
    }
}

impl<B: ForwardBackend> ModelExecutor<B> {
    /// An executor over a runner on any backend.
    pub fn from_runner(runner: ModelRunner<B>) -> Self {
        ModelExecutor { runner }
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

    fn execute(&mut self, scheduler_output: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        self.runner.execute(scheduler_output)
    }
}
