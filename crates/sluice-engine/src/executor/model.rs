//! `ModelExecutor`: the `Executor` over sluice-model's `ModelRunner`, i.e.
//! a real forward pass on CPU with the paged KV cache.
//!
//! It only sizes the KV pool and forwards each step; the runner owns the
//! persistent batch, the KV storage and sampling.

use super::Executor;
use anyhow::Result;
use sluice_core::{ModelRunnerOutput, SchedulerOutput};
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::runner::ModelRunner;
use sluice_model::LoadedModel;

/// How large the KV pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheSize {
    /// Exactly this many blocks, null block included (vLLM's
    /// `--num-gpu-blocks-override`).
    Blocks(usize),
    /// As many blocks as fit in this many bytes (`--kv-cache-memory`).
    Bytes(usize),
}

/// Runs scheduler steps on a loaded model.
pub struct ModelExecutor {
    runner: ModelRunner,
    vocab_size: usize,
}

impl ModelExecutor {
    /// A runner for `model` with blocks of `block_size` tokens. `seed`
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
        Ok(ModelExecutor {
            runner,
            vocab_size: model.config.vocab_size,
        })
    }

    pub fn runner(&self) -> &ModelRunner {
        &self.runner
    }
}

impl Executor for ModelExecutor {
    fn num_kv_blocks(&self) -> usize {
        self.runner.num_kv_blocks()
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.vocab_size)
    }

    fn execute(&mut self, scheduler_output: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        self.runner.execute(scheduler_output)
    }
}
