//! The backend registry: which device runs a loaded model, by name
//! (`--backend cpu`). A backend is a factory that turns a [`LoadedModel`]
//! and the KV cache's size into an engine [`Executor`], usually a
//! [`ModelExecutor`] over its own [`ForwardBackend`](super::ForwardBackend)
//! so that it gets the runner's scheduling protocol, sampling and logprobs
//! unchanged.
//!
//! Promises: names are unique (registering one twice replaces it, so a
//! caller can swap the CPU backend in tests); an unknown name is an error
//! listing every known one, in registration order; nothing is built until
//! [`BackendRegistry::create`].

use crate::drafter::SpeculativeConfig;
use crate::executor::{KvCacheSize, ModelExecutor, Speculation};
use crate::kv_cache::{KvCacheConfig, KvDtype};
use crate::LoadedModel;
use anyhow::{anyhow, Context, Result};
use sluice_core::kv_cache::GroupingPolicy;
use sluice_core::Executor;

/// What a backend is asked to build.
#[derive(Clone, Copy)]
pub struct BackendRequest<'a> {
    pub model: &'a LoadedModel,
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// The KV pool's size (`--num-gpu-blocks-override` or
    /// `--kv-cache-memory`).
    pub kv_cache_size: KvCacheSize,
    /// Which windowed layers get KV cache groups of their own
    /// (`--disable-hybrid-kv-cache-manager` turns `hybrid` off).
    pub grouping: GroupingPolicy,
    /// How the KV cache stores its elements (`--kv-cache-dtype`,
    /// resolved).
    pub kv_dtype: KvDtype,
    /// Seeds the default per-request seeds (`--model-seed`).
    pub seed: u64,
    /// Speculative decoding (`--speculative-config`), if asked for.
    pub speculation: Option<SpeculationRequest<'a>>,
}

/// Speculative decoding for a backend to set up.
#[derive(Clone, Copy, Debug)]
pub struct SpeculationRequest<'a> {
    pub config: &'a SpeculativeConfig,
    /// The engine's `--max-model-len`.
    pub max_model_len: usize,
    /// The engine's `--max-num-seqs` (the batch-size schedule's extent).
    pub max_num_seqs: usize,
}

impl SpeculationRequest<'_> {
    /// The drafter for `target` and its k per batch size; a draft model's
    /// KV pool is laid out as `draft_kv` (the target's block size, element
    /// type and number of blocks: every running request can hold both).
    pub fn build(&self, target: &LoadedModel, draft_kv: KvCacheConfig) -> Result<Speculation> {
        Ok(Speculation {
            drafter: self.config.drafter(target, draft_kv)?,
            k_by_batch_size: self.config.k_by_batch_size(self.max_num_seqs),
            max_model_len: self.max_model_len,
        })
    }
}

/// Builds an executor for a request.
pub type BackendFactory = fn(&BackendRequest<'_>) -> Result<Box<dyn Executor>>;

/// One registered backend.
#[derive(Clone, Copy, Debug)]
pub struct BackendEntry {
    /// The name `--backend` takes.
    pub name: &'static str,
    /// One line for help texts.
    pub description: &'static str,
    pub factory: BackendFactory,
}

/// The backends a binary can run models on.
#[derive(Clone, Debug)]
pub struct BackendRegistry {
    entries: Vec<BackendEntry>,
}

/// The backend `--backend` names when not given.
pub const DEFAULT_BACKEND: &str = "cpu";

fn cpu(req: &BackendRequest<'_>) -> Result<Box<dyn Executor>> {
    let layout = KvCacheConfig::new(req.block_size, 0)
        .with_grouping(req.grouping)
        .with_dtype(req.kv_dtype);
    let mut exec = ModelExecutor::with_layout(req.model, layout, req.kv_cache_size, req.seed)?;
    if let Some(spec) = &req.speculation {
        let draft_kv =
            KvCacheConfig::new(req.block_size, exec.num_kv_blocks()).with_dtype(req.kv_dtype);
        let s = spec
            .build(req.model, draft_kv)
            .context("--speculative-config")?;
        exec = exec.with_speculation(s);
    }
    Ok(Box::new(exec))
}

impl Default for BackendRegistry {
    /// The backends this crate implements: `cpu`.
    fn default() -> Self {
        let mut r = BackendRegistry {
            entries: Vec::new(),
        };
        r.register(BackendEntry {
            name: DEFAULT_BACKEND,
            description: "this crate's CPU kernels and paged KV cache",
            factory: cpu,
        });
        r
    }
}

impl BackendRegistry {
    /// Adds `entry`, replacing a backend of the same name.
    pub fn register(&mut self, entry: BackendEntry) {
        match self.entries.iter_mut().find(|e| e.name == entry.name) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
    }

    /// The registered names, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// The backend called `name`, or an error listing the known ones.
    pub fn get(&self, name: &str) -> Result<&BackendEntry> {
        self.entries.iter().find(|e| e.name == name).ok_or_else(|| {
            anyhow!(
                "unknown backend {name:?} (known: {})",
                self.names().join(", ")
            )
        })
    }

    /// Builds the executor of backend `name` for `req`.
    pub fn create(&self, name: &str, req: &BackendRequest<'_>) -> Result<Box<dyn Executor>> {
        (self.get(name)?.factory)(req)
    }
}
