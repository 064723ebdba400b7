//! Flags shared by the commands that run a model (`generate`, `serve`):
//! which model, how to load it, and the scheduler's options under vLLM's
//! CLI names; and `prepare_engine`, which turns them into an engine ready
//! to start.
//!
//! Promises: every bad value is reported naming its flag, never a panic;
//! with no `--model` the built-in tiny model (dummy weights, byte-level
//! tokenizer) is used and a line on stderr says so.

use crate::exit::{bad_config, config_error};
use crate::simulated::{simulated_executor, simulated_shape, Simulation};
use anyhow::{Context, Result};
use clap::Args;
use sluice_core::kv_cache::GroupingPolicy;
use sluice_core::{HashAlgo, SchedulerConfig, SchedulingPolicy};
use sluice_engine::{Engine, EngineConfig, Executor, StartOptions, TokenId, Tokenizer};
use sluice_model::config::{GenerationConfig, ModelConfig};
use sluice_model::kernels::QuantFormat;
use sluice_model::kv_cache::{KvCacheConfig, KvCacheDtype, KvDtype};
use sluice_model::model::GgufInfo;
use sluice_model::runner::{BackendRegistry, BackendRequest, SpeculationRequest};
use sluice_model::{DType, KvCacheSize, LoadFormat, ModelSpec, SpeculativeConfig};
use sluice_server::logging;
use sluice_sim::LayeredShape;
use std::path::PathBuf;
use std::sync::Arc;

/// The built-in model used when no `--model` is given.
pub const DEFAULT_BUILTIN: &str = "tiny";

/// Which model to run and how.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// A Hugging Face model directory (config.json, *.safetensors,
    /// tokenizer.json), a GGUF file (llama.cpp's format; a directory holding
    /// one, or the first part of a split set), or a Hugging Face Hub model
    /// id ORG/NAME (ORG/NAME:QUANT for a GGUF repository, Q4_K_M when no
    /// quant is given) downloaded into the Hugging Face cache (HF_HOME,
    /// HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE apply). An existing path always
    /// wins. Without it (and without --builtin) the built-in tiny model runs.
    #[arg(long, value_name = "DIR|FILE.gguf|ORG/NAME")]
    pub model: Option<String>,
    /// The branch, tag or commit of a hub --model [default: main].
    #[arg(long, value_name = "REV", requires = "model")]
    pub revision: Option<String>,
    /// The .gguf file of a hub --model to use (its first part for a split
    /// set), instead of ORG/NAME:QUANT.
    #[arg(long, value_name = "NAME", requires = "model")]
    pub gguf_file: Option<String>,
    /// A built-in model config (tiny, qwen2.5-0.5b), run with dummy weights
    /// and the built-in byte-level tokenizer.
    #[arg(long, value_name = "NAME", conflicts_with = "model")]
    pub builtin: Option<String>,
    /// auto (the checkpoint's weights) or dummy (random weights of the
    /// config's shape, no weight files needed).
    #[arg(long, value_name = "FORMAT", default_value = "auto")]
    pub load_format: LoadFormat,
    /// Weight dtype: auto (the checkpoint's; a GGUF file's tensors as
    /// stored), f32 or bf16 (a GGUF file's float tensors converted; its
    /// quantized ones stay as they are).
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    pub dtype: DType,
    /// Quantize the linear weights of a float checkpoint (safetensors, or a
    /// GGUF file's float tensors) at load: q8_0 (near lossless, half of
    /// bf16's bytes) or q4_0 (a quarter), llama.cpp's block formats.
    #[arg(long, value_name = "TYPE", value_parser = parse_quantization)]
    pub quantization: Option<QuantFormat>,
    /// Seed of dummy weights and of the default per-request sampling seeds.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub model_seed: u64,
    /// Memory for the KV cache, e.g. 512MiB, 2GiB, 1000000000 (bytes).
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub kv_cache_memory: usize,
    /// KV cache element type: auto (float16, llama.cpp's default), float32
    /// (exact), bfloat16, float16 or q8_0 (llama.cpp's 8-bit blocks, 34
    /// bytes per 32 elements). A simulated
    /// executor also takes fp8, fp8_e4m3, fp8_e5m2, and reads auto as the
    /// model's dtype, as vLLM does.
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// The backend that runs the model (`cpu`; the names are those of
    /// sluice-model's backend registry).
    #[arg(long, value_name = "NAME", default_value = sluice_model::runner::DEFAULT_BACKEND)]
    pub backend: String,
    /// Kernel threads (default: every core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// Speculative decoding, as vLLM's flag: a JSON object, e.g.
    /// '{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4}' or '{"method": "suffix"}' (vLLM's fields,
    /// defaults and messages; also num_speculative_tokens_per_batch_size
    /// and disable_by_batch_size). Outputs are the same as without it.
    #[arg(long, value_name = "JSON", value_parser = parse_speculative_config)]
    pub speculative_config: Option<SpeculativeConfig>,
}

pub fn parse_speculative_config(s: &str) -> Result<SpeculativeConfig, String> {
    SpeculativeConfig::parse(s).map_err(|e| format!("{e:#}"))
}

/// The scheduler's options, under vLLM's names.
#[derive(Args, Clone, Debug)]
pub struct SchedulerArgs {
    /// Most requests running at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Token budget of one step [default: 8192, or max-model-len if larger
    /// with chunked prefill off].
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// Context length (prompt + output) [default: the model's
    /// max_position_embeddings].
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks in host memory, overriding --kv-cache-memory.
    #[arg(long, value_name = "N")]
    pub num_gpu_blocks_override: Option<usize>,
    /// Reuse KV blocks of identical prompt prefixes (on by default).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// Split long prompts over several steps (on by default).
    #[arg(long, overrides_with = "no_enable_chunked_prefill")]
    pub enable_chunked_prefill: bool,
    /// Turn chunked prefill off (a prompt is computed in one step).
    #[arg(long, overrides_with = "enable_chunked_prefill")]
    pub no_enable_chunked_prefill: bool,
    /// Most tokens one request may take in a step when others wait (0 = off).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub long_prefill_token_threshold: usize,
    /// fcfs or priority.
    #[arg(long, value_name = "POLICY", default_value = "fcfs")]
    pub scheduling_policy: SchedulingPolicy,
    /// Block hash of the prefix cache, as vLLM names it: sha256 (the
    /// default), sha256_cbor, xxhash or xxhash_cbor (faster, not collision
    /// resistant against an adversary). PYTHONHASHSEED, when set, seeds the
    /// hash chain as it does in vLLM.
    #[arg(long, value_name = "ALGO", default_value = "sha256")]
    pub prefix_caching_hash_algo: HashAlgo,
    /// Keep every layer's KV cache as full attention does: one KV cache
    /// group, no blocks freed outside a sliding window, so a block costs a
    /// page of every layer (vLLM's flag; the layers still attend only
    /// inside their windows).
    #[arg(long)]
    pub disable_hybrid_kv_cache_manager: bool,
}

impl SchedulerArgs {
    /// Which windowed layers get KV cache groups of their own: sliding
    /// windows unless `--disable-hybrid-kv-cache-manager`; chunked-local
    /// layers never (vLLM turns its hybrid manager off for them unless
    /// `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE` is set, keeping
    /// them as full attention).
    pub fn grouping(&self) -> GroupingPolicy {
        GroupingPolicy {
            hybrid: !self.disable_hybrid_kv_cache_manager,
            chunked_local: false,
        }
    }
}

/// The block-hash seed: vLLM derives the root of its hash chain from
/// `PYTHONHASHSEED` when that is set, so sluice reads it too, here where the
/// scheduler config is built (sluice-core reads no environment). Refuses a
/// value that is not UTF-8 rather than guessing at its bytes.
pub fn hash_seed_from_env() -> Result<Option<String>, String> {
    match std::env::var("PYTHONHASHSEED") {
        Ok(s) => Ok(Some(s)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err("PYTHONHASHSEED: not valid UTF-8".to_string())
        }
    }
}

/// "1GiB", "512MiB", "64KiB", "2GB", "1000" (bytes).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 512MiB, 2GiB, 1000000)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let bytes = value * scale;
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(format!("{s:?} must be a positive size"));
    }
    Ok(bytes as usize)
}

/// A model loaded, its tokenizer, and the engine configuration, before the
/// engine thread starts (a command may adjust `config` first).
pub struct PreparedEngine {
    pub config: EngineConfig,
    pub executor: Box<dyn Executor>,
    pub tokenizer: Arc<Tokenizer>,
    /// A name for the model (its directory's name, or the built-in's).
    pub model_name: String,
    /// What the startup summary says of the model.
    pub info: crate::startup::ModelInfo,
}

impl PreparedEngine {
    /// Starts the engine thread; a configuration the engine refuses is a
    /// `ConfigError` (exit status 2).
    pub fn start(self) -> Result<Engine> {
        self.start_with_kv_event_sink(None)
    }

    /// [`PreparedEngine::start`], each step's KV cache events going to
    /// `sink` when there is one.
    pub fn start_with_kv_event_sink(
        self,
        sink: Option<Box<dyn sluice_engine::KvEventSink>>,
    ) -> Result<Engine> {
        self.start_with_options(StartOptions {
            kv_event_sink: sink,
            ..StartOptions::default()
        })
    }

    /// [`PreparedEngine::start`] with `options`.
    pub fn start_with_options(self, options: StartOptions) -> Result<Engine> {
        Engine::start_with_options(self.config, self.executor, self.tokenizer, options).map_err(
            |e| {
                let message = flag_error(&e);
                match e {
                    sluice_engine::EngineError::Invalid(_) => bad_config(message),
                    _ => anyhow::anyhow!(message),
                }
            },
        )
    }
}

/// An engine error naming a flag as the user typed it (`max_model_len` →
/// `--max-model-len`).
pub fn flag_error(e: &sluice_engine::EngineError) -> String {
    match e {
        sluice_engine::EngineError::Invalid(f) => {
            format!("--{}: {}", f.field.replace('_', "-"), f.message)
        }
        other => other.to_string(),
    }
}

/// `--model X` for error context; a hub model adds where it was put.
fn model_label(r: &crate::hub::ResolvedModel) -> String {
    match &r.hub_id {
        Some(id) => format!("--model {id} ({})", r.path.display()),
        None => format!("--model {}", r.path.display()),
    }
}

/// `q8_0`, `q4_0`, ...: the formats that can be made at load.
fn parse_quantization(s: &str) -> Result<QuantFormat, String> {
    match QuantFormat::from_name(s) {
        Some(f) if f.can_quantize() && !f.is_float() => Ok(f),
        _ => Err(format!(
            "{s:?} is not a format sluice quantizes to at load (q8_0, q4_0, q4_1, q5_0, q5_1)"
        )),
    }
}

/// The served name of a GGUF model file.
fn gguf_model_name(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    // `NAME-00001-of-00003`: the set's name.
    match stem
        .rsplit_once("-of-")
        .and_then(|(head, _)| head.rsplit_once('-'))
    {
        Some((base, part)) if part.len() == 5 && part.bytes().all(|b| b.is_ascii_digit()) => {
            base.to_string()
        }
        _ => stem.to_string(),
    }
}

/// A local `--model` directory must be a Hugging Face model directory
/// (`config.json`) or hold a GGUF file; else a configuration error naming
/// the directory and what it lacks (exit status 2).
fn check_model_dir(r: &crate::hub::ResolvedModel) -> Result<()> {
    let dir = &r.path;
    if !dir.is_dir() || dir.join("config.json").exists() || sluice_model::gguf::is_gguf_model(dir) {
        return Ok(());
    }
    let empty = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none());
    Err(bad_config(if empty {
        format!(
            "{}: the directory is empty (a model directory holds config.json, \
             *.safetensors and tokenizer.json, or a .gguf file)",
            model_label(r)
        )
    } else {
        format!(
            "{}: no config.json and no .gguf file in the directory (a model directory holds \
             config.json, *.safetensors and tokenizer.json, or a .gguf file)",
            model_label(r)
        )
    }))
}

/// Loads the model and tokenizer and builds the engine configuration.
pub fn prepare_engine(model: &ModelArgs, sched: &SchedulerArgs) -> Result<PreparedEngine> {
    prepare(model, sched, None)
}

/// `serve --executor simulated`: the model's config and tokenizer (never
/// its weights: a hub model downloads without them, a directory's weight
/// files are not read, a GGUF file is mapped for its metadata only) and a
/// `SimulatedExecutor` timed by `sim`'s profile.
pub fn prepare_simulated_engine(
    model: &ModelArgs,
    sched: &SchedulerArgs,
    sim: &Simulation,
) -> Result<PreparedEngine> {
    prepare(model, sched, Some(sim))
}

/// A model's configs and where they came from, without its weights.
fn read_model_meta(
    resolved: Option<&crate::hub::ResolvedModel>,
    builtin: Option<&str>,
) -> Result<(ModelConfig, GenerationConfig, Option<GgufInfo>)> {
    match (resolved, builtin) {
        (Some(r), _) if sluice_model::gguf::is_gguf_model(&r.path) => {
            let file = sluice_model::gguf::resolve(&r.path)?;
            let g = sluice_model::gguf::GgufModel::open(&file)?;
            let info = GgufInfo {
                path: file,
                vocab: g.vocab,
                sampling_defaults: g.sampling_defaults,
            };
            Ok((g.config, g.generation, Some(info)))
        }
        (Some(r), _) => {
            if !r.path.is_dir() {
                anyhow::bail!("model directory {} does not exist", r.path.display());
            }
            let config = ModelConfig::from_file(&r.path.join("config.json"))?;
            let generation = GenerationConfig::load(&r.path, &config)?;
            Ok((config, generation, None))
        }
        (None, Some(name)) => {
            let (config, generation) = sluice_model::builtin::config(name)?;
            Ok((config, generation, None))
        }
        (None, None) => anyhow::bail!("no model given"),
    }
}

fn prepare(
    model: &ModelArgs,
    sched: &SchedulerArgs,
    sim: Option<&Simulation>,
) -> Result<PreparedEngine> {
    if let Some(n) = model.threads {
        sluice_model::kernels::set_num_threads(n as usize);
    }
    // A hub id becomes a snapshot directory in the Hugging Face cache here,
    // before anything else, so the rest loads it like any local directory.
    let resolved = match &model.model {
        Some(m) => Some(crate::hub::resolve_model(
            m,
            model.revision.as_deref(),
            model.gguf_file.as_deref(),
            model.load_format != LoadFormat::Dummy && sim.is_none(),
        )?),
        None => None,
    };
    if let Some(r) = &resolved {
        check_model_dir(r)?;
    }
    let model_dir: Option<PathBuf> = resolved.as_ref().map(|r| r.path.clone());
    let builtin = builtin_name(model, sim);
    let spec = ModelSpec {
        dir: model_dir.clone(),
        builtin: builtin.clone(),
        // A built-in config has no weight files: dummy is the only format.
        load_format: if builtin.is_some() {
            LoadFormat::Dummy
        } else {
            model.load_format
        },
        dtype: model.dtype,
        seed: model.model_seed,
        quantization: model.quantization,
    };
    let label = || match &resolved {
        Some(r) => model_label(r),
        None => format!("--builtin {}", builtin.as_deref().unwrap_or_default()),
    };
    // A model that cannot be loaded (a missing tensor, a wrong shape, an
    // unsupported type or architecture) is bad input: exit status 2.
    let (loaded, model_config, generation_config, gguf) = match sim {
        None => {
            // An unknown backend is refused before any weight is read.
            BackendRegistry::default()
                .get(&model.backend)
                .map_err(|e| bad_config(format!("--backend: {e}")))?;
            let loaded = sluice_model::load_model(&spec)
                .with_context(label)
                .map_err(config_error)?;
            let (c, g, info) = (
                loaded.config.clone(),
                loaded.generation_config.clone(),
                loaded.gguf.clone(),
            );
            (Some(loaded), c, g, info)
        }
        Some(_) => {
            let (c, g, info) = read_model_meta(resolved.as_ref(), builtin.as_deref())
                .with_context(label)
                .map_err(config_error)?;
            (None, c, g, info)
        }
    };
    let tokenizer = open_tokenizer(resolved.as_ref(), gguf.as_ref())?;
    let model_name = served_model_name(resolved.as_ref(), builtin.as_deref(), gguf.as_ref());

    let enable_chunked_prefill = !sched.no_enable_chunked_prefill;
    let max_model_len = sched
        .max_model_len
        .unwrap_or(model_config.max_position_embeddings);
    if max_model_len > model_config.max_position_embeddings {
        return Err(bad_config(format!(
            "--max-model-len: {max_model_len} is larger than the model's max_position_embeddings ({})",
            model_config.max_position_embeddings
        )));
    }
    let max_num_batched_tokens =
        sched
            .max_num_batched_tokens
            .unwrap_or(if enable_chunked_prefill {
                8192
            } else {
                max_model_len.max(8192)
            });
    if sched.block_size == 0 {
        return Err(bad_config("--block-size: must be at least 1"));
    }
    // The element type before any weight is read: q8_0 on a head size it
    // cannot store is known from the config.
    let kv_dtype = match sim {
        Some(_) => KvDtype::F32,
        None => kv_dtype(model.kv_cache_dtype, &model_config)?,
    };
    let eos_ids: Vec<TokenId> = tokenizer
        .eos_token_id()
        .into_iter()
        .chain(generation_config.eos_token_ids.iter().copied())
        .collect();
    check_speculation(model, sim, max_num_batched_tokens, max_model_len)?;
    let executor: Box<dyn Executor> = match (sim, &loaded) {
        (Some(sim), _) => {
            // Token ids the tokenizer can decode and the model could emit.
            let vocab = model_config.vocab_size.min(tokenizer.vocab_size());
            let shape = simulated_shape(resolved.as_ref(), &model_config)?;
            let shape = LayeredShape {
                shape: shape.shape.with_kv_cache_dtype(model.kv_cache_dtype),
                ..shape
            };
            let mut exec =
                simulated_executor(sim, &shape, sched, vocab, model.model_seed, eos_ids)?;
            if let Some(spec) = &model.speculative_config {
                let s = crate::simulated::sim_speculation(spec, sched.max_num_seqs, max_model_len);
                exec = exec.with_speculation(s?);
            }
            Box::new(exec)
        }
        (None, Some(loaded)) => {
            let speculation = model
                .speculative_config
                .as_ref()
                .map(|config| SpeculationRequest {
                    config,
                    max_model_len,
                    max_num_seqs: sched.max_num_seqs,
                });
            model_executor(model, sched, loaded, kv_dtype, speculation, &label())?
        }
        (None, None) => anyhow::bail!("internal: no model loaded"),
    };
    let mut scheduler = SchedulerConfig {
        max_num_seqs: sched.max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        block_size: sched.block_size,
        enable_prefix_caching: !sched.no_enable_prefix_caching,
        enable_chunked_prefill,
        long_prefill_token_threshold: sched.long_prefill_token_threshold,
        policy: sched.scheduling_policy,
        prefix_caching_hash_algo: sched.prefix_caching_hash_algo,
        hash_seed: hash_seed_from_env().map_err(bad_config)?,
        ..SchedulerConfig::default()
    };
    if let Some(s) = &model.speculative_config {
        s.apply_to(&mut scheduler);
    }
    let config =
        EngineConfig::new(scheduler).with_model_eos(&tokenizer, &generation_config.eos_token_ids);
    let blocks = kv_layout(sched, kv_dtype);
    let info = crate::startup::ModelInfo::of(label(), &model_config, loaded.as_ref(), &blocks);
    Ok(PreparedEngine {
        config,
        executor,
        tokenizer: Arc::new(tokenizer),
        model_name,
        info,
    })
}

/// `--speculative-config` against the other flags, as vLLM checks it.
fn check_speculation(
    model: &ModelArgs,
    sim: Option<&Simulation>,
    max_num_batched_tokens: usize,
    max_model_len: usize,
) -> Result<()> {
    let Some(spec) = &model.speculative_config else {
        return Ok(());
    };
    // The simulated executor needs synthetic acceptance, a real model
    // refuses it (`sim_speculation`, `SpeculativeConfig::drafter`).
    if sim.is_some() && spec.synthetic_acceptance_rates.is_none() {
        return Err(bad_config(crate::simulated::NEEDS_SYNTHETIC));
    }
    // vLLM: the budget must hold a token beyond the lookahead slots.
    if max_num_batched_tokens <= spec.num_lookahead_tokens() {
        return Err(bad_config(format!(
            "--speculative-config: --max-num-batched-tokens {max_num_batched_tokens} leaves no \
             slot to schedule a token beside {} lookahead tokens",
            spec.num_lookahead_tokens()
        )));
    }
    // A verification holds the sequence's last token and every draft.
    if spec.num_speculative_tokens >= max_model_len {
        return Err(bad_config(format!(
            "--speculative-config: num_speculative_tokens={} does not fit in --max-model-len \
             {max_model_len} beside the token it continues",
            spec.num_speculative_tokens
        )));
    }
    Ok(())
}

/// The executor of a loaded model on `--backend`, its KV cache sized by
/// `--kv-cache-memory` or `--num-gpu-blocks-override` and stored as
/// `kv_dtype`; `label` names the model in errors.
fn model_executor(
    model: &ModelArgs,
    sched: &SchedulerArgs,
    loaded: &sluice_model::LoadedModel,
    kv_dtype: KvDtype,
    speculation: Option<SpeculationRequest<'_>>,
    label: &str,
) -> Result<Box<dyn Executor>> {
    let kv_size = match sched.num_gpu_blocks_override {
        Some(n) => KvCacheSize::Blocks(n),
        None => KvCacheSize::Bytes(model.kv_cache_memory),
    };
    // The flag that sized the cache, so that a cache that cannot fit reads
    // `--kv-cache-memory: 100 GiB requested for the KV cache, but only ...`
    // (and exits 2, a configuration error).
    let kv_flag = match sched.num_gpu_blocks_override {
        Some(n) => format!("--num-gpu-blocks-override {n}"),
        None => "--kv-cache-memory".to_string(),
    };
    // The KV size first, so that its error names its flag; then the
    // backend reads the weights (an error names the tensor).
    kv_size
        .resolve(&loaded.config, kv_layout(sched, kv_dtype))
        .context(kv_flag)
        .map_err(config_error)?;
    let request = BackendRequest {
        model: loaded,
        block_size: sched.block_size,
        kv_cache_size: kv_size,
        grouping: sched.grouping(),
        kv_dtype,
        seed: model.model_seed,
        speculation,
    };
    BackendRegistry::default()
        .create(&model.backend, &request)
        .with_context(|| label.to_string())
        .map_err(config_error)
}

/// What `--kv-cache-dtype` stores for `config`'s heads on the CPU runner
/// (a configuration error naming the flag otherwise).
pub fn kv_dtype(flag: KvCacheDtype, config: &ModelConfig) -> Result<KvDtype> {
    KvDtype::resolve(flag, config.head_dim)
        .context("--kv-cache-dtype")
        .map_err(config_error)
}

/// The KV cache's layout (block size, grouping, element type) the flags
/// ask for; its size comes from `--kv-cache-memory` or the override.
fn kv_layout(sched: &SchedulerArgs, dtype: KvDtype) -> KvCacheConfig {
    KvCacheConfig::new(sched.block_size, 0)
        .with_grouping(sched.grouping())
        .with_dtype(dtype)
}

/// The built-in model to run: `--builtin`, or the default one (said in
/// the log) when neither `--model` nor `--builtin` is given.
fn builtin_name(model: &ModelArgs, sim: Option<&Simulation>) -> Option<String> {
    match (&model.model, &model.builtin) {
        (None, None) => {
            logging::info(&format!(
                "no --model given: running the built-in {DEFAULT_BUILTIN:?} model ({}, \
                 byte-level tokenizer)",
                if sim.is_some() {
                    "simulated"
                } else {
                    "dummy weights"
                }
            ));
            Some(DEFAULT_BUILTIN.to_string())
        }
        (None, Some(name)) => Some(name.clone()),
        (Some(_), _) => None,
    }
}

/// The model's tokenizer: the GGUF file's vocabulary (its sampling
/// recommendations logged, not applied), the directory's
/// `tokenizer.json`, or the built-in byte-level one.
pub(crate) fn open_tokenizer(
    resolved: Option<&crate::hub::ResolvedModel>,
    gguf: Option<&GgufInfo>,
) -> Result<Tokenizer> {
    Ok(match (resolved, gguf) {
        (Some(r), Some(gguf)) => {
            for line in &gguf.sampling_defaults {
                logging::info(&format!(
                    "the GGUF file recommends {line} (not applied: requests set their own \
                     sampling)"
                ));
            }
            let tok = Tokenizer::from_gguf_vocab(&gguf.vocab)
                .with_context(|| model_label(r))
                .map_err(config_error)?;
            for w in tok.warnings() {
                logging::info(&format!("tokenizer: {w}"));
            }
            tok
        }
        (Some(r), None) => Tokenizer::from_dir(&r.path)
            .with_context(|| model_label(r))
            .map_err(config_error)?,
        (None, _) => Tokenizer::builtin(),
    })
}

/// The name clients pass as `model` (before `--served-model-name`).
fn served_model_name(
    resolved: Option<&crate::hub::ResolvedModel>,
    builtin: Option<&str>,
    gguf: Option<&GgufInfo>,
) -> String {
    match (resolved, builtin) {
        // Clients see a hub model under its id, as vLLM does.
        (
            Some(crate::hub::ResolvedModel {
                hub_id: Some(id), ..
            }),
            _,
        ) => id.clone(),
        // A GGUF file: its name without `.gguf` (and without a split
        // suffix), e.g. `SmolLM2-135M-Instruct.Q4_1`.
        (Some(_), _) if gguf.is_some() => {
            gguf.map(|g| gguf_model_name(&g.path)).unwrap_or_default()
        }
        (Some(crate::hub::ResolvedModel { path: dir, .. }), _) => dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| dir.display().to_string()),
        (None, Some(name)) => name.to_string(),
        (None, None) => DEFAULT_BUILTIN.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("0").is_err());
    }
}
