//! `sluice bench-model`: model throughput through the real scheduler and
//! model runner (schedule → execute → update_from_output, the engine's
//! loop), no HTTP, no tokenizer — on a built-in shape with dummy weights, or
//! on a real model (a GGUF file or a Hugging Face directory; `--load-format
//! dummy` gives its shape random weights).
//!
//! Figures (each the median over `--repeats` runs):
//! - prefill tok/s: one request of `--prompt-len` tokens; its prefill step
//!   (which also samples its first token);
//! - decode tok/s at each `--concurrency` level: output tokens per second
//!   over the steps in which every request is decoding (aggregate over the
//!   batch);
//! - output tok/s including prefill: all output tokens of the run over its
//!   whole wall time (the anchor's "incl. prefill" figure);
//! - peak RSS (`VmHWM`);
//! - the stream read bandwidth measured in the same run, and batch-1
//!   decode as a fraction of the bound it sets (weight bytes read per
//!   token ÷ bandwidth).
//!
//! The readable table goes to stderr, one JSON object to stdout.

use crate::exit::{bad_config, config_error, exit_code};
use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_core::kv_cache::GroupingPolicy;
use sluice_core::Executor;
use sluice_core::{NewRequest, SamplingParams, Scheduler, SchedulerConfig};
use sluice_model::kernels::QuantFormat;
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::model::Model;
use sluice_model::runner::{ModelRunner, SpeculationRequest};
use sluice_model::ModelExecutor;
use sluice_model::{builtin, load_dummy_as, load_model, DType, LoadFormat, LoadedModel, ModelSpec};
use std::process::ExitCode;

mod profile;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct BenchModelArgs {
    /// A built-in model shape (dummy weights: tiny, qwen2.5-0.5b), or a
    /// model file: a GGUF file (or a directory holding one) or a Hugging
    /// Face model directory.
    #[arg(long, default_value = "qwen2.5-0.5b", value_name = "NAME|PATH")]
    model: String,
    /// Vocabulary size of a built-in shape (32000, the size the README's
    /// llama.cpp and transformers figures were measured with).
    #[arg(long, default_value_t = 32000)]
    vocab_size: usize,
    /// Weight dtype: auto (bf16 for a built-in shape; a file's own), bf16
    /// or f32.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// For a model file: auto (its weights) or dummy (random weights of its
    /// shape).
    #[arg(long, default_value = "auto", value_name = "FORMAT")]
    load_format: LoadFormat,
    /// Quantize a float checkpoint's linear weights at load (q8_0, q4_0).
    #[arg(long, value_name = "TYPE")]
    quantization: Option<String>,
    /// Kernel threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// New tokens per request.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Concurrency levels for the decode figures, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8, 32])]
    concurrency: Vec<usize>,
    /// Runs per figure; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Scheduler token budget per step.
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: usize,
    /// Seed of the dummy weights and prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Every layer in one full-attention KV cache group (vLLM's flag): a
    /// sliding-window layer keeps all its tokens.
    #[arg(long)]
    disable_hybrid_kv_cache_manager: bool,
    /// KV cache element type, as `serve` takes it: auto, float32,
    /// bfloat16, float16 or q8_0.
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    kv_cache_dtype: sluice_model::kv_cache::KvCacheDtype,
    /// Speculative decoding, as `serve --speculative-config` takes it. The
    /// prompts are random tokens, so n-gram and suffix drafts only match
    /// what the model repeats; the acceptance rate and mean acceptance
    /// length over all runs are reported.
    #[arg(long, value_name = "JSON", value_parser = crate::options::parse_speculative_config)]
    speculative_config: Option<sluice_model::SpeculativeConfig>,
    /// Instead of the throughput figures, measure a table profile for
    /// `sluice simulate --hardware PATH` on a grid of step shapes up to
    /// --max-num-batched-tokens tokens, max(--concurrency) decode rows and
    /// --profile-max-model-len tokens of context, and write it to PATH.
    #[arg(long, value_name = "PATH")]
    profile: Option<std::path::PathBuf>,
    /// The longest request the profile's grid covers (the engine's
    /// --max-model-len).
    #[arg(long, value_name = "N", default_value_t = 2048)]
    profile_max_model_len: usize,
    /// The KV cache `serve` will have (its --kv-cache-memory): the profile
    /// records it in blocks, so the simulator needs no
    /// --num-gpu-blocks-override.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = crate::options::parse_size)]
    kv_cache_memory: usize,
}

/// Speculative decoding's counters over the runs (vLLM's names).
#[derive(Clone, Copy, Debug, Default)]
struct SpecCounts {
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
}

pub fn run(args: BenchModelArgs) -> ExitCode {
    match bench(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice bench-model: {e:#}");
            exit_code(&e)
        }
    }
}

/// Timing of one workload run.
struct RunTiming {
    /// Output tokens per second over the steps where all requests decode.
    decode_tok_s: f64,
    /// All output tokens over the whole run.
    output_tok_s: f64,
    /// Duration of the first step (the prefill, when it fits one step).
    first_step: Duration,
    /// KV blocks in use after the last step where every request decoded
    /// and none had finished (what the sequences hold at their length,
    /// out-of-window blocks freed).
    decode_blocks: usize,
}

struct Bench {
    loaded: LoadedModel,
    exec: ModelExecutor,
    spec: SpecCounts,
    sched_config: SchedulerConfig,
    prompt_len: usize,
    output_len: usize,
    next_prompt: u64,
}

impl Bench {
    /// Distinct pseudo-random prompts, so no run hits the prefix cache of
    /// an earlier one.
    fn prompt(&mut self) -> Vec<u32> {
        self.next_prompt += 1;
        let mut s = self.next_prompt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let vocab = self.loaded.config.vocab_size as u64;
        (0..self.prompt_len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % vocab) as u32
            })
            .collect()
    }

    fn run(&mut self, num_reqs: usize, max_tokens: usize) -> Result<RunTiming> {
        let mut sched = Scheduler::new(self.sched_config.clone())
            .map_err(|e| anyhow::anyhow!("scheduler config: {e}"))?;
        for i in 0..num_reqs {
            let params = SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(max_tokens)
            };
            let prompt = self.prompt();
            sched
                .add_request(NewRequest::new(format!("r{i}"), prompt, params))
                .map_err(|e| anyhow::anyhow!("request: {e}"))?;
        }
        let start = Instant::now();
        let mut first_step = None;
        let (mut decode_time, mut decode_tokens) = (Duration::ZERO, 0usize);
        let mut output_tokens = 0usize;
        let mut decode_blocks = 0;
        let pool_blocks = self.sched_config.num_gpu_blocks.saturating_sub(1);
        while sched.has_unfinished_requests() {
            let t0 = Instant::now();
            let so = sched.schedule();
            let out = self.exec.execute(&so)?;
            let updates = sched.update_from_output(&so, &out);
            if let Some(drafts) = self.exec.take_draft_token_ids() {
                sched.update_draft_token_ids(&drafts);
            }
            let dt = t0.elapsed();
            first_step.get_or_insert(dt);
            let sampled: usize = updates.iter().map(|u| u.new_token_ids.len()).sum();
            output_tokens += sampled;
            let mut step_drafts = 0;
            for (id, d) in &so.scheduled_spec_decode_tokens {
                let got = updates.iter().find(|u| u.req_id == *id);
                let n = got.map_or(0, |u| u.new_token_ids.len());
                self.spec.drafts += 1;
                self.spec.draft_tokens += d.len() as u64;
                self.spec.accepted += n.saturating_sub(1) as u64;
                step_drafts += d.len();
            }
            // Every request decodes (a verification row is a decode).
            let all_decoding = so.num_scheduled_tokens.len() == num_reqs
                && so.total_num_scheduled_tokens == num_reqs + step_drafts;
            if all_decoding {
                decode_time += dt;
                decode_tokens += sampled;
                if sched.get_num_unfinished_requests() == num_reqs {
                    let free = sched.kv_cache_manager().num_free_blocks();
                    decode_blocks = pool_blocks.saturating_sub(free);
                }
            }
            if so.total_num_scheduled_tokens == 0 {
                bail!("the scheduler stalled (KV cache too small?)");
            }
        }
        let total = start.elapsed();
        // Deliver the finished ids so the runner drops its request state.
        let so = sched.schedule();
        self.exec.execute(&so)?;
        Ok(RunTiming {
            // NaN (null in the JSON) when no step had every request decoding.
            decode_tok_s: if decode_tokens == 0 {
                f64::NAN
            } else {
                decode_tokens as f64 / decode_time.as_secs_f64()
            },
            output_tok_s: output_tokens as f64 / total.as_secs_f64(),
            first_step: first_step.unwrap_or_default(),
            decode_blocks,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Stream read bandwidth in bytes/s on the kernel threads: the best of a
/// few passes over a buffer far larger than the caches (the figure a
/// decode step's weight reads are bounded by).
fn stream_read_bandwidth() -> f64 {
    const BYTES: usize = 512 << 20;
    const CHUNK: usize = 1 << 17; // 1 MiB of u64
    let buf: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let chunks = buf.len().div_ceil(CHUNK);
    let mut best = 0.0f64;
    for _ in 0..5 {
        let total = std::sync::atomic::AtomicU64::new(0);
        let t0 = Instant::now();
        sluice_model::kernels::parallel_for(chunks, |c| {
            let part = &buf[c * CHUNK..((c + 1) * CHUNK).min(buf.len())];
            // Eight independent lanes, so loads (not the fold) bound it.
            let mut acc = [0u64; 8];
            for w in part.chunks_exact(8) {
                for l in 0..8 {
                    acc[l] ^= w[l];
                }
            }
            let folded = acc.iter().fold(0, |a, &x| a ^ x);
            total.fetch_xor(folded, std::sync::atomic::Ordering::Relaxed);
        });
        std::hint::black_box(total.into_inner());
        best = best.max(BYTES as f64 / t0.elapsed().as_secs_f64());
    }
    best
}

/// Weight bytes a decode step reads per token: every layer, the final
/// norm and the head (the embedding itself when tied; an untied
/// embedding only gives one row).
fn bytes_read_per_token(m: &Model) -> usize {
    match &m.lm_head {
        Some(_) => m.weight_bytes() - m.embed_tokens.size_in_bytes(),
        None => m.weight_bytes(),
    }
}

/// Peak resident set size in bytes (`VmHWM` of /proc/self/status).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The KV pool for `max_conc` requests of `seq_len` tokens, each at its
/// full length in every group: a sliding group holds at most its window and
/// a step's tokens (vLLM's admission cap per group).
fn kv_config(
    config: &sluice_model::config::ModelConfig,
    args: &BenchModelArgs,
    grouping: GroupingPolicy,
    max_conc: usize,
    seq_len: usize,
) -> Result<KvCacheConfig> {
    let budget = args.max_num_batched_tokens.max(max_conc);
    let per_seq: usize = config
        .kv_layer_groups(grouping)
        .specs
        .iter()
        .map(|g| g.max_blocks_per_request(args.block_size, budget, seq_len))
        .sum();
    let num_blocks = max_conc
        .checked_mul(per_seq)
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| anyhow::anyhow!("the KV cache size overflows"))?;
    let dtype = crate::options::kv_dtype(args.kv_cache_dtype, config)?;
    Ok(KvCacheConfig::new(args.block_size, num_blocks)
        .with_grouping(grouping)
        .with_dtype(dtype))
}

/// The executor over `runner`, drafting as `--speculative-config` says (a
/// draft model's KV pool laid out as the target's).
fn executor(
    runner: ModelRunner,
    loaded: &LoadedModel,
    args: &BenchModelArgs,
    max_model_len: usize,
    max_num_seqs: usize,
) -> Result<ModelExecutor> {
    let draft_kv = KvCacheConfig::new(args.block_size, runner.num_kv_blocks())
        .with_dtype(runner.kv_cache_dtype().unwrap_or_default());
    let exec = ModelExecutor::from_runner(runner);
    let Some(config) = &args.speculative_config else {
        return Ok(exec);
    };
    let req = SpeculationRequest {
        config,
        max_model_len,
        max_num_seqs,
    };
    let s = req
        .build(loaded, draft_kv)
        .context("--speculative-config")
        .map_err(config_error)?;
    Ok(exec.with_speculation(s))
}

/// The scheduler of the runs: the pool as sized, no prefix caching (every
/// prompt is new anyway), the lookahead slots speculation needs.
fn scheduler_config(
    args: &BenchModelArgs,
    num_blocks: usize,
    max_model_len: usize,
    max_conc: usize,
    exec: &ModelExecutor,
) -> SchedulerConfig {
    let spec = args.speculative_config.as_ref();
    let mut cfg = SchedulerConfig {
        block_size: args.block_size,
        num_gpu_blocks: num_blocks,
        max_model_len,
        max_num_seqs: max_conc.max(1),
        max_num_batched_tokens: args.max_num_batched_tokens.max(max_conc),
        enable_prefix_caching: false,
        kv_cache_groups: exec.runner().kv_cache_groups(),
        ..SchedulerConfig::default()
    };
    if let Some(s) = spec {
        s.apply_to(&mut cfg);
    }
    cfg
}

/// The size flags checked: the largest concurrency and the sequence length
/// the KV pool must hold for each request.
fn check_sizes(args: &BenchModelArgs) -> Result<(usize, usize)> {
    if args.repeats == 0 || args.prompt_len == 0 || args.output_len == 0 {
        return Err(bad_config(
            "--repeats, --prompt-len and --output-len must be at least 1",
        ));
    }
    if args.concurrency.contains(&0) {
        return Err(bad_config("--concurrency levels must be at least 1"));
    }
    if args.block_size == 0 {
        return Err(bad_config("--block-size must be at least 1"));
    }
    // The KV pool holds every request at its full length; its size comes
    // from four flags, so overflow is a configuration error too.
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    let kv_flags = "--concurrency, --prompt-len, --output-len, --block-size";
    let seq_len = if args.profile.is_some() {
        if args.speculative_config.is_some() {
            return Err(bad_config(
                "--profile: measures steps without speculative decoding; drop \
                 --speculative-config",
            ));
        }
        // Every decode row of the largest batch at the longest context.
        Some(args.profile_max_model_len.saturating_sub(1))
    } else {
        args.prompt_len.checked_add(args.output_len)
    };
    let Some(seq_len) = seq_len else {
        return Err(bad_config(format!(
            "{kv_flags}: the KV cache size overflows"
        )));
    };
    Ok((max_conc, seq_len))
}

fn bench(args: &BenchModelArgs) -> Result<()> {
    let dtype: DType = args
        .dtype
        .parse()
        .map_err(|e| bad_config(format!("--dtype: {e}")))?;
    let quantization = match &args.quantization {
        None => None,
        Some(q) => match QuantFormat::from_name(q) {
            Some(f) if f.can_quantize() && !f.is_float() => Some(f),
            _ => {
                return Err(bad_config(format!(
                    "--quantization: {q:?} is not a format sluice quantizes to at load (q8_0, \
                     q4_0, q4_1, q5_0, q5_1)"
                )))
            }
        },
    };
    let (max_conc, seq_len) = check_sizes(args)?;
    let kv_flags = "--concurrency, --prompt-len, --output-len, --block-size";
    sluice_model::kernels::set_num_threads(args.threads);
    let grouping = GroupingPolicy {
        hybrid: !args.disable_hybrid_kv_cache_manager,
        ..GroupingPolicy::default()
    };
    let path = std::path::Path::new(&args.model);
    if !path.exists() && crate::hub::looks_like_path(&args.model, |p| p.exists()) {
        return Err(bad_config(format!(
            "--model: {}",
            crate::hub::missing_path(path)
        )));
    }
    let t0 = Instant::now();
    let (loaded, weights_desc) = if path.exists() {
        let weights_desc = match (args.load_format, &quantization) {
            (LoadFormat::Dummy, _) => format!("dummy {} weights of its shape", args.dtype),
            (_, Some(q)) => format!("its weights quantized to {q} at load"),
            (_, None) if args.dtype == "auto" => "its weights as stored".to_string(),
            (_, None) => format!("its weights as {}", args.dtype),
        };
        let spec = ModelSpec {
            dir: Some(path.to_path_buf()),
            builtin: None,
            load_format: args.load_format,
            dtype,
            seed: args.seed,
            quantization,
        };
        let loaded = load_model(&spec)
            .with_context(|| format!("--model {}", path.display()))
            .map_err(config_error)?;
        kv_config(&loaded.config, args, grouping, max_conc, seq_len)
            .and_then(|kv| kv.check(&loaded.config))
            .context(kv_flags)
            .map_err(config_error)?;
        (loaded, weights_desc)
    } else {
        let (mut config, mut generation) = builtin::config(&args.model)
            .context("--model (neither a built-in shape nor an existing path)")
            .map_err(config_error)?;
        config.vocab_size = args.vocab_size;
        // A smaller vocabulary may cut off the EOS ids; the benchmark
        // ignores EOS anyway.
        let in_vocab = |id: &u32| (*id as usize) < args.vocab_size;
        config.eos_token_ids.retain(in_vocab);
        generation.eos_token_ids.retain(in_vocab);
        config
            .validate()
            .context("--vocab-size")
            .map_err(config_error)?;
        // Before the weights are generated (seconds): a KV cache that
        // cannot fit is known from the shape alone.
        kv_config(&config, args, grouping, max_conc, seq_len)
            .and_then(|kv| kv.check(&config))
            .context(kv_flags)
            .map_err(config_error)?;
        let weights = match quantization {
            Some(q) => q,
            None if dtype == DType::F32 => QuantFormat::F32,
            None => QuantFormat::Bf16,
        };
        let weights_desc = format!("the built-in shape, dummy {weights:?} weights");
        (
            load_dummy_as(config, generation, weights, args.seed)?,
            weights_desc,
        )
    };
    let load_s = t0.elapsed().as_secs_f64();

    let max_model_len = seq_len.saturating_add(1);
    let kv = kv_config(&loaded.config, args, grouping, max_conc, seq_len)
        .context(kv_flags)
        .map_err(config_error)?;
    let num_blocks = kv.num_blocks;
    let kv_dtype = kv.dtype;
    let groups = loaded.config.kv_layer_groups(grouping);
    let block_bytes = kv.block_bytes(&loaded.config);
    let runner = ModelRunner::new(&loaded, kv)
        .context(kv_flags)
        .map_err(config_error)?;
    let exec = executor(runner, &loaded, args, max_model_len, max_conc.max(1))?;
    let sched_config = scheduler_config(args, num_blocks, max_model_len, max_conc, &exec);
    let mut b = Bench {
        exec,
        spec: SpecCounts::default(),
        sched_config,
        // A profile's warm-up stays inside its model length.
        prompt_len: if args.profile.is_some() {
            args.prompt_len.min(args.profile_max_model_len / 2)
        } else {
            args.prompt_len
        },
        output_len: args.output_len,
        next_prompt: args.seed << 32,
        loaded,
    };

    // Warm-up: thread pool, buffers at their largest shapes.
    b.run(max_conc, 2)?;

    if let Some(out) = &args.profile {
        // A file by its name: the profile travels to other machines.
        let model = std::path::Path::new(&args.model);
        let name = model
            .file_name()
            .filter(|_| model.exists())
            .map_or(args.model.clone(), |n| n.to_string_lossy().into_owned());
        let desc = format!("{name} ({weights_desc})");
        return profile::write(&mut b, args, out, &desc, kv_dtype);
    }

    let mut figures = measure(&mut b, args)?;
    figures.kv = Some(KvFigures {
        groups: groups.specs.len(),
        dtype: kv_dtype.name(),
        block_bytes,
        block_size: args.block_size,
        seq_len,
        per_seq_blocks: figures.kv_peak_one,
    });
    figures.spec = args.speculative_config.as_ref().map(|_| b.spec);

    report(
        args,
        b.loaded.config.vocab_size,
        &weights_desc,
        load_s,
        &figures,
    );
    Ok(())
}

/// What one bench-model run measured.
struct Figures {
    /// Prompt tokens per second of one request's prefill (median).
    prefill: f64,
    /// Per concurrency level: decode and output tok/s (medians).
    levels: Vec<(usize, f64, f64)>,
    peak_rss: Option<u64>,
    weight_bytes: usize,
    /// Weight bytes one decode step reads.
    per_token: usize,
    /// This machine's stream read bandwidth, bytes per second.
    bandwidth: f64,
    /// One request's decode rate against the bandwidth bound.
    bound_fraction: Option<f64>,
    /// The KV blocks one request held while decoding, at its last step.
    kv_peak_one: usize,
    kv: Option<KvFigures>,
    /// Speculative decoding's counters, when it was on.
    spec: Option<SpecCounts>,
}

/// What the KV cache held for one sequence at its full length.
struct KvFigures {
    groups: usize,
    /// The cache's element type (`--kv-cache-dtype`, resolved).
    dtype: &'static str,
    /// Bytes of one pool block (one block of every layer slot of a group).
    block_bytes: usize,
    block_size: usize,
    seq_len: usize,
    per_seq_blocks: usize,
}

/// The warmed-up runs: prefill, then each concurrency level, `--repeats`
/// times each.
fn measure(b: &mut Bench, args: &BenchModelArgs) -> Result<Figures> {
    let prefill: Vec<f64> = (0..args.repeats)
        .map(|_| {
            b.run(1, 1)
                .map(|t| args.prompt_len as f64 / t.first_step.as_secs_f64())
        })
        .collect::<Result<_>>()?;
    let prefill = median(prefill);

    let mut levels = Vec::new();
    let mut kv_peak_one = 0;
    for &c in &args.concurrency {
        let mut decode = Vec::new();
        let mut output = Vec::new();
        for _ in 0..args.repeats {
            let t = b.run(c, b.output_len)?;
            if c == 1 {
                kv_peak_one = kv_peak_one.max(t.decode_blocks);
            }
            decode.push(t.decode_tok_s);
            output.push(t.output_tok_s);
        }
        levels.push((c, median(decode), median(output)));
    }
    let peak_rss = peak_rss_bytes();
    let weight_bytes = b.exec.runner().model().weight_bytes();
    let per_token = bytes_read_per_token(b.exec.runner().model());
    let bandwidth = stream_read_bandwidth();
    let decode_1 = levels.iter().find(|&&(c, _, _)| c == 1).map(|&(_, d, _)| d);
    let bound_fraction = decode_1.map(|d| d * per_token as f64 / bandwidth);
    Ok(Figures {
        prefill,
        levels,
        peak_rss,
        weight_bytes,
        per_token,
        bandwidth,
        bound_fraction,
        kv_peak_one,
        kv: None,
        spec: None,
    })
}

/// The figures as a table on stderr and one JSON object on stdout.
fn report(
    args: &BenchModelArgs,
    vocab_size: usize,
    weights_desc: &str,
    load_s: f64,
    figures: &Figures,
) {
    let Figures {
        prefill,
        peak_rss,
        weight_bytes,
        per_token,
        bandwidth,
        bound_fraction,
        ..
    } = *figures;
    let levels = &figures.levels;
    eprintln!(
        "sluice bench-model: {}: {}, vocab {} ({:.0} MB of weights), {} threads, \
         prompt {} -> {} new tokens, median of {} runs, load {:.1} s",
        args.model,
        weights_desc,
        vocab_size,
        weight_bytes as f64 / 1e6,
        args.threads,
        args.prompt_len,
        args.output_len,
        args.repeats,
        load_s
    );
    eprintln!("  {:<34} {:>10}", "figure", "value");
    eprintln!("  {:<34} {:>10.1}", "prefill tok/s", prefill);
    for &(conc, decode, output) in levels {
        eprintln!(
            "  {:<34} {:>10.1}",
            format!("decode tok/s, {conc} concurrent"),
            decode
        );
        eprintln!(
            "  {:<34} {:>10.1}",
            format!("output tok/s incl. prefill, {conc}"),
            output
        );
    }
    if let Some(rss) = peak_rss {
        eprintln!("  {:<34} {:>10.0}", "peak RSS MB", rss as f64 / 1e6);
    }
    eprintln!(
        "  {:<34} {:>10.1}",
        "stream read GB/s (same run)",
        bandwidth / 1e9
    );
    if let Some(f) = bound_fraction {
        eprintln!(
            "  {:<34} {:>10.2}",
            format!(
                "1-request decode / bound ({:.0} MB/token)",
                per_token as f64 / 1e6
            ),
            f
        );
    }

    if let Some(kv) = &figures.kv {
        let slots = kv.block_bytes / kv.block_size;
        eprintln!(
            "  {:<34} {:>10.1}",
            format!(
                "KV MiB, 1 request near {} tokens ({} blocks)",
                kv.seq_len, kv.per_seq_blocks
            ),
            (kv.per_seq_blocks * kv.block_bytes) as f64 / (1 << 20) as f64
        );
        eprintln!(
            "  {:<34} {:>10}",
            format!(
                "  in {} groups, {} B per token-slot ({})",
                kv.groups, slots, kv.dtype
            ),
            ""
        );
    }
    let spec_json = figures.spec.map(|c| {
        let (rate, mean_len) = crate::generate::acceptance(c.drafts, c.draft_tokens, c.accepted);
        eprintln!(
            "  {:<34} {:>10.1}",
            format!("speculation: accepted % of {} drafts", c.draft_tokens),
            100.0 * rate
        );
        eprintln!(
            "  {:<34} {:>10.2}",
            "speculation: mean acceptance length", mean_len
        );
        serde_json::json!({
            "num_drafts": c.drafts,
            "num_draft_tokens": c.draft_tokens,
            "num_accepted_tokens": c.accepted,
            "acceptance_rate": rate,
            "mean_acceptance_length": mean_len,
        })
    });
    let kv_json = figures.kv.as_ref().map(|kv| {
        serde_json::json!({
            "groups": kv.groups,
            "dtype": kv.dtype,
            "block_size": kv.block_size,
            "block_bytes": kv.block_bytes,
            "seq_len": kv.seq_len,
            "blocks_one_request_decoding": kv.per_seq_blocks,
            "bytes_one_request_decoding": kv.per_seq_blocks * kv.block_bytes,
        })
    });
    let json = serde_json::json!({
        "model": args.model,
        "vocab_size": vocab_size,
        "dtype": args.dtype,
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "weight_bytes": weight_bytes,
        "weight_bytes_read_per_token": per_token,
        "stream_read_bytes_per_s": bandwidth,
        "decode_1_fraction_of_bandwidth_bound": bound_fraction,
        "prefill_tok_s": prefill,
        "decode_tok_s": levels.iter().map(|&(c, d, _)| (c.to_string(), d.into())).collect::<serde_json::Map<_, _>>(),
        "output_tok_s_incl_prefill": levels.iter().map(|&(c, _, o)| (c.to_string(), o.into())).collect::<serde_json::Map<_, _>>(),
        "peak_rss_bytes": peak_rss,
        "kv_cache": kv_json,
        "spec_decode": spec_json,
    });
    println!("{json}");
}
