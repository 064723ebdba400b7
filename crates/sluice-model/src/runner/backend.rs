//! The seam between the runner's device-independent half (request states,
//! the flattened batch with its block tables and slot mapping, sampling,
//! logprobs) and what computes the forward pass: [`ForwardBackend`], and
//! the CPU model behind it, [`CpuBackend`].
//!
//! A backend owns the model and the KV cache storage; the runner hands it
//! one [`ForwardBatch`] per step and asks for logits rows, in bounded
//! chunks, of the rows the batch marked (`logits_rows`). A CUDA backend or a
//! simulated model implements the trait and reuses the runner as it is
//! (`ModelRunner::with_backend`).
//!
//! Promises of [`CpuBackend`]: a warm step allocates nothing (its workspace
//! and the logits buffer only grow); logits rows are those of
//! `Model::forward_hidden` then `Model::compute_logits`, bit for bit.

use crate::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use crate::model::{ForwardBatch, LoadedModel, Model, Workspace};
use anyhow::{bail, Result};
use sluice_core::kv_cache::{AttentionKind, KvCacheGroupSpec};
use std::ops::Range;
use std::sync::Arc;

/// What computes the forward pass of a step for the runner.
///
/// Protocol, per step: one [`forward`](Self::forward), then any number of
/// [`logits`](Self::logits) calls for row ranges of that step's
/// `batch.logits_rows`. The batch's block ids are inside `0..num_kv_blocks`
/// and its slots follow its block tables (the runner checks both).
pub trait ForwardBackend: Send {
    /// Width of a logits row: token ids are `0..vocab_size`.
    fn vocab_size(&self) -> usize;

    /// Blocks in the KV pool, null block included (the scheduler's
    /// `num_gpu_blocks`).
    fn num_kv_blocks(&self) -> usize;

    /// Tokens per KV block.
    fn block_size(&self) -> usize;

    /// The KV cache groups, in order: every batch brings one block table
    /// per group (`ForwardBatch::block_tables`).
    fn kv_cache_groups(&self) -> Vec<KvCacheGroupSpec> {
        vec![KvCacheGroupSpec::FULL]
    }

    /// How the KV cache stores its elements, if the backend says
    /// (reported as vLLM's `cache_dtype`).
    fn kv_cache_dtype(&self) -> Option<KvDtype> {
        None
    }

    /// Runs `batch`: writes its tokens' K/V into the cache at
    /// `batch.slot_mapping` and keeps what [`logits`](Self::logits) needs
    /// for `batch.logits_rows`. An error (a token id outside the
    /// vocabulary, say) fails the step.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<()>;

    /// The logits of `rows` (indices into the last forward's
    /// `logits_rows`) into `out[..rows.len() × vocab]`, `out` grown as
    /// needed (never shrunk, so a warm step does not allocate).
    fn logits(&mut self, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()>;
}

/// The CPU model with its paged KV cache.
pub struct CpuBackend {
    model: Arc<Model>,
    kv: KvCache,
    kv_config: KvCacheConfig,
    workspace: Workspace,
    /// Rows of `workspace.final_hidden()` the last forward left.
    num_rows: usize,
}

impl CpuBackend {
    /// `loaded`'s weights read into a CPU [`Model`] ([`Model::build`]),
    /// with a KV cache of `kv_config` (allocated lazily: pages are committed
    /// as blocks are first written).
    pub fn new(loaded: &LoadedModel, kv_config: KvCacheConfig) -> Result<Self> {
        Self::with_model(Arc::new(Model::build(loaded)?), kv_config)
    }

    /// A backend over weights already read (several runners may share one
    /// model).
    pub fn with_model(model: Arc<Model>, kv_config: KvCacheConfig) -> Result<Self> {
        let kv = KvCache::new(&model.config, kv_config)?;
        check_windows(&model, &kv)?;
        Ok(CpuBackend {
            kv,
            model,
            kv_config,
            workspace: Workspace::default(),
            num_rows: 0,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }
}

/// A group that frees blocks outside a window may only hold layers that
/// attend inside that window (a model loaded with another plan than its
/// config's could break this).
fn check_windows(model: &Model, kv: &KvCache) -> Result<()> {
    for (l, layer) in model.layers.iter().enumerate() {
        let group = kv.group_specs()[kv.group_of(l)].kind;
        let attends = layer.shape.kind();
        if group != AttentionKind::Full && group != attends {
            bail!(
                "layer {l} attends as {attends:?} but its KV cache group keeps {group:?}: the \
                 cache would free keys the layer reads"
            );
        }
    }
    Ok(())
}

impl ForwardBackend for CpuBackend {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn num_kv_blocks(&self) -> usize {
        self.kv_config.num_blocks
    }

    fn block_size(&self) -> usize {
        self.kv_config.block_size
    }

    fn kv_cache_groups(&self) -> Vec<KvCacheGroupSpec> {
        self.kv.group_specs().to_vec()
    }

    fn kv_cache_dtype(&self) -> Option<KvDtype> {
        Some(self.kv.dtype())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<()> {
        self.num_rows = 0;
        self.model
            .forward_hidden(batch, &mut self.kv, &mut self.workspace)?;
        self.num_rows = batch.logits_rows.len();
        Ok(())
    }

    fn logits(&mut self, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        if rows.start > rows.end || rows.end > self.num_rows {
            bail!(
                "logits rows {rows:?} asked for, but the last forward pass kept {} rows",
                self.num_rows
            );
        }
        let h = self.model.config.hidden_size;
        let hidden = &self.workspace.final_hidden()[rows.start * h..rows.end * h];
        self.model.compute_logits(hidden, rows.len(), out);
        Ok(())
    }
}
