//! One simulation: the flags turned into a setup (model shape, step-time
//! model, scheduler config, KV cache size), the workload at one rate, and
//! the run itself.

use super::*;

/// Everything fixed for a run except the request rate and replica count.
pub(super) struct Setup {
    pub(super) shape: LayeredShape,
    pub(super) model: Box<dyn StepTimeModel + Send + Sync>,
    pub(super) hardware: Option<Hardware>,
    pub(super) config: SchedulerConfig,
    pub(super) kv_note: String,
    /// A fitted profile's range: runs say how many steps went beyond it.
    pub(super) fitted_range: Option<StepRange>,
    /// `--dataset-name trace`'s file, read once.
    pub(super) trace: Option<LoadedTrace>,
}

/// Token ids of synthetic prompts are drawn below this.
pub(super) const SYNTHETIC_VOCAB: u32 = 32_000;

pub(super) fn setup(args: &RunArgs) -> Result<Setup> {
    let mut shape =
        LayeredShape::load(&args.model).map_err(|e| bad_config(format!("--model: {e}")))?;
    shape.shape = shape.shape.with_kv_cache_dtype(args.kv_cache_dtype);
    if args.tensor_parallel_size == 0 {
        return Err(bad_config("--tensor-parallel-size: must be at least 1"));
    }
    let profile =
        Profile::load(&args.hardware).map_err(|e| bad_config(format!("--hardware: {e}")))?;
    let model = profile
        .step_model(Some(&shape.shape), args.tensor_parallel_size)
        .map_err(|e| bad_config(format!("--hardware {}: {e}", args.hardware)))?;
    let hardware = profile.hardware().copied();
    let fitted_range = match &profile {
        Profile::Fitted(f) => f.fitted_range,
        _ => None,
    };
    let s = &args.sched;
    if s.block_size == 0 {
        return Err(bad_config("--block-size: must be at least 1"));
    }
    let (num_gpu_blocks, kv_note) = match s.num_gpu_blocks_override {
        Some(n) => (n, format!("{n} KV blocks (--num-gpu-blocks-override)")),
        None => simulated_kv_blocks(
            &profile,
            &shape,
            s.grouping(),
            args.tensor_parallel_size,
            args.gpu_memory_utilization,
            s.block_size,
        )?,
    };
    let enable_chunked_prefill = !s.no_enable_chunked_prefill;
    let max_model_len = s.max_model_len.unwrap_or(32_768);
    let config = SchedulerConfig {
        max_num_seqs: s.max_num_seqs,
        max_num_batched_tokens: s
            .max_num_batched_tokens
            .unwrap_or(if enable_chunked_prefill {
                8192
            } else {
                max_model_len.max(8192)
            }),
        max_model_len,
        block_size: s.block_size,
        num_gpu_blocks,
        enable_prefix_caching: !s.no_enable_prefix_caching,
        enable_chunked_prefill,
        long_prefill_token_threshold: s.long_prefill_token_threshold,
        policy: s.scheduling_policy,
        prefix_caching_hash_algo: s.prefix_caching_hash_algo,
        hash_seed: hash_seed_from_env().map_err(bad_config)?,
        // The groups the engine would get from the model's executor.
        kv_cache_groups: shape.kv_layer_groups(s.grouping()).specs,
        cache_dtype: args.kv_cache_dtype.name().to_string(),
        ..SchedulerConfig::default()
    };
    // A `sluice replay` trace was recorded under its own scheduler config:
    // its decisions are that config's, so it replaces the flags'.
    let trace = load_trace_dataset(args)?;
    let replay = trace
        .as_ref()
        .and_then(|t| t.replay.as_ref())
        .map(|r| r.config.clone());
    let (config, kv_note) = match replay {
        Some(replay) => {
            eprintln!(
                "sluice simulate: the replay trace sets the scheduler config ({} KV blocks of \
                 {} tokens, {} batched tokens); the scheduler flags are not used",
                replay.num_gpu_blocks, replay.block_size, replay.max_num_batched_tokens
            );
            let note = format!(
                "{} KV blocks (the replay trace's config)",
                replay.num_gpu_blocks
            );
            (replay, note)
        }
        None => (config, kv_note),
    };
    sluice_core::Scheduler::new(config.clone()).map_err(|e| bad_config(e.to_string()))?;
    Ok(Setup {
        shape,
        model,
        hardware,
        config,
        kv_note,
        fitted_range,
        trace,
    })
}

/// The trace file of `--dataset-name trace`, read once for every run.
pub(super) fn load_trace_dataset(args: &RunArgs) -> Result<Option<LoadedTrace>> {
    if args.dataset_name != "trace" {
        return Ok(None);
    }
    let path = args
        .dataset_path
        .as_ref()
        .ok_or_else(|| bad_config("--dataset-path: --dataset-name trace needs a trace file"))?;
    let opts = TraceOptions {
        seed: args.seed,
        vocab: SYNTHETIC_VOCAB,
        max_requests: None,
    };
    let loaded = load_trace_with(path, &opts).map_err(|e| bad_config(e.to_string()))?;
    if let Some(replay) = &loaded.replay {
        if !replay.aborts.is_empty() {
            eprintln!(
                "sluice simulate: the trace aborts {} request(s); aborts are not simulated, \
                 those requests run to their output length",
                replay.aborts.len()
            );
        }
    }
    Ok(Some(loaded))
}

/// The requests of one run at `rate` requests (or conversations) per second.
pub(super) fn workload(args: &RunArgs, setup: &Setup, rate: f64) -> Result<Vec<SimRequest>> {
    let config = &setup.config;
    let vocab = SYNTHETIC_VOCAB;
    match args.dataset_name.as_str() {
        "trace" => match &setup.trace {
            Some(trace) => Ok(trace.requests.clone()),
            None => Err(bad_config(
                "--dataset-path: --dataset-name trace needs a trace file",
            )),
        },
        "multi-turn" => {
            let w = ConversationWorkload {
                num_conversations: args.num_prompts,
                duration_s: args.duration,
                conversation_rate: rate,
                burstiness: args.burstiness,
                turns: args.num_turns.clone(),
                first_message: args.input_len_dist.clone().unwrap_or(LengthDist::Uniform {
                    len: args.random_input_len,
                    range_ratio: args.random_range_ratio,
                }),
                later_message: args.input_len_dist.clone().unwrap_or(LengthDist::Uniform {
                    len: args.random_input_len,
                    range_ratio: args.random_range_ratio,
                }),
                output: args.output_len_dist.clone().unwrap_or(LengthDist::Uniform {
                    len: args.random_output_len,
                    range_ratio: args.random_range_ratio,
                }),
                think_time: ThinkTime::Exponential {
                    mean: args.think_time,
                },
                system_prompt_len: args.random_prefix_len,
                num_system_prompts: args.num_prefix_groups,
                max_model_len: config.max_model_len,
                seed: args.seed,
                vocab,
            };
            w.generate().map_err(workload_error)
        }
        _ => match &args.tokenizer {
            Some(dir) => vllm_random_workload(args, dir, rate),
            None => RandomWorkload {
                num_prompts: args.num_prompts,
                input_len: args.random_input_len,
                output_len: args.random_output_len,
                range_ratio: args.random_range_ratio,
                prefix_len: args.random_prefix_len,
                num_prefix_groups: args.num_prefix_groups,
                request_rate: rate,
                burstiness: args.burstiness,
                seed: args.seed,
                vocab,
                input_dist: args.input_len_dist.clone(),
                output_dist: args.output_len_dist.clone(),
                duration_s: args.duration,
                ..RandomWorkload::default()
            }
            .generate()
            .map_err(workload_error),
        },
    }
}

/// A workload the generator refused, under the flag that set the field.
pub(super) fn workload_error(e: WorkloadError) -> anyhow::Error {
    let flag = |field: &str| match field {
        "request_rate" | "conversation_rate" => "--request-rate",
        "burstiness" => "--burstiness",
        "duration_s" => "--duration",
        "range_ratio" => "--random-range-ratio",
        "num_prefix_groups" | "num_system_prompts" => "--num-prefix-groups",
        "input_len" | "input lengths" | "first message lengths" | "later message lengths" => {
            "--random-input-len / --input-len-dist"
        }
        "output_len" | "output lengths" | "output" => "--random-output-len / --output-len-dist",
        "think_time" => "--think-time",
        "turns" => "--num-turns",
        _ => "",
    };
    let (field, message) = match &e {
        WorkloadError::Invalid(field, what) => (*field, format!("must be {what}")),
        WorkloadError::Length { field, source } => (*field, source.to_string()),
        WorkloadError::TooMany { .. } => ("", e.to_string()),
    };
    match flag(field) {
        "" => bad_config(e.to_string()),
        f => bad_config(format!("{f}: {message}")),
    }
}

/// `vllm bench serve --dataset-name random`'s requests and send times,
/// exactly (the same code `sluice bench` sends them with).
pub(super) fn vllm_random_workload(
    args: &RunArgs,
    dir: &std::path::Path,
    rate: f64,
) -> Result<Vec<SimRequest>> {
    if args.input_len_dist.is_some() || args.output_len_dist.is_some() || args.duration.is_some() {
        return Err(bad_config(
            "--tokenizer draws vLLM's own random dataset: it takes --random-* lengths and \
             --num-prompts, not --input-len-dist / --output-len-dist / --duration",
        ));
    }
    if args.num_prefix_groups != 1 {
        return Err(bad_config(
            "--num-prefix-groups: vLLM's random dataset has one shared prefix; drop \
             --tokenizer to simulate several",
        ));
    }
    let seed = u32::try_from(args.seed)
        .map_err(|_| bad_config("--seed: with --tokenizer it must fit in 32 bits (NumPy's)"))?;
    // The tokenizer `sluice bench --tokenizer` takes: a GGUF file's
    // vocabulary or a Hugging Face directory.
    let tok = if sluice_model::gguf::is_gguf_model(dir) {
        bench::dataset::BenchTokenizer::from_gguf(dir)
    } else {
        bench::dataset::BenchTokenizer::from_dir(dir)
    };
    let tok = tok
        .with_context(|| format!("--tokenizer {}", dir.display()))
        .map_err(crate::exit::config_error)?;
    let params = bench::dataset::RandomParams {
        num_requests: args.num_prompts,
        input_len: args.random_input_len,
        output_len: args.random_output_len,
        prefix_len: args.random_prefix_len,
        range_ratio: (args.random_range_ratio, args.random_range_ratio),
        seed,
        request_id_prefix: String::new(),
    };
    let samples =
        bench::dataset::sample_random(&tok, &params).map_err(crate::exit::config_error)?;
    let times = bench::arrivals::send_times(samples.len(), rate, args.burstiness, seed);
    samples
        .iter()
        .zip(times)
        .enumerate()
        .map(|(i, (s, t))| {
            let mut ids = tok.encode(&s.prompt)?;
            // The server adds the special tokens the count includes (BOS).
            while ids.len() < s.prompt_len {
                ids.insert(0, 0);
            }
            ids.truncate(s.prompt_len.max(1));
            Ok(SimRequest::new(
                format!("{i}"),
                t,
                ids,
                s.expected_output_len.max(1),
            ))
        })
        .collect()
}

pub(super) fn simulate(
    args: &RunArgs,
    setup: &Setup,
    requests: &[SimRequest],
    replicas: usize,
    progress: Option<&indicatif::ProgressBar>,
) -> Result<SimResult> {
    let router = args.router;
    let seed = args.seed;
    let factory = move || router.build(seed);
    if args.max_concurrency == Some(0) {
        return Err(bad_config("--max-concurrency: must be at least 1"));
    }
    let mut config = setup.config.clone();
    if let Some(spec) = &args.speculative_config {
        spec.apply_to(&mut config);
    }
    let mut sim = Simulator::new(config, &*setup.model).with_max_concurrency(args.max_concurrency);
    if let Some(spec) = &args.speculative_config {
        let s = crate::simulated::sim_speculation(
            spec,
            setup.config.max_num_seqs,
            setup.config.max_model_len,
        )?;
        sim = sim.with_speculation(s, args.seed);
    }
    if let Some(pd) = &args.pd {
        let (p, d) = parse_pd(pd)?;
        let link = match (args.kv_link_bandwidth, &setup.hardware) {
            (Some(gbs), _) if gbs > 0.0 && gbs.is_finite() => gbs * 1e9,
            (Some(gbs), _) => {
                return Err(bad_config(format!(
                    "--kv-link-bandwidth: {gbs} must be a positive number of GB/s"
                )))
            }
            (None, Some(hw)) => hw.interconnect_bandwidth,
            (None, None) => {
                return Err(bad_config(
                    "--kv-link-bandwidth: the profile has no interconnect bandwidth; give one",
                ))
            }
        };
        sim = sim.with_pd(
            PdConfig {
                prefill: p,
                decode: d,
                kv_bytes_per_token: setup.shape.shape.kv_bytes_per_token() as f64,
                link_bandwidth: link,
                transfer_latency_s: setup
                    .hardware
                    .as_ref()
                    .map_or(0.0, |h| h.collective_latency_s),
            },
            Box::new(factory),
        );
    } else if replicas > 1 {
        sim = sim.with_replicas(replicas, Box::new(factory));
    }
    if let Some(bar) = progress {
        let bar = bar.clone();
        sim = sim.with_progress(Box::new(move |done| bar.set_position(done as u64)));
    }
    sim.run(requests).map_err(|e| bad_config(e.to_string()))
}

pub(super) fn progress_bar(args: &RunArgs, total: usize) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if args.no_progress || !std::io::stderr().is_terminal() || total < 10_000 {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {pos}/{len} requests ({eta} left)",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

pub(super) fn run_simulation(args: &RunArgs) -> Result<()> {
    let setup = setup(args)?;
    if args.replicas == 0 {
        return Err(bad_config("--replicas: must be at least 1"));
    }
    if args.request_rate.is_nan() || args.request_rate <= 0.0 {
        return Err(bad_config("--request-rate: must be positive (or inf)"));
    }
    if let Some(sweep) = &args.sweep_rate {
        let rates = parse_sweep_rate(sweep)?;
        return sweep_rates(args, &setup, &rates);
    }
    if let Some(range) = &args.sweep_replicas {
        let (a, b) = parse_range("--sweep-replicas", range)?;
        if args.pd.is_some() {
            return Err(bad_config("--sweep-replicas: not with --pd"));
        }
        return sweep_replicas(args, &setup, a, b);
    }
    let requests = workload(args, &setup, args.request_rate)?;
    let bar = progress_bar(args, requests.len());
    let t0 = Instant::now();
    let result = simulate(args, &setup, &requests, args.replicas, bar.as_ref())?;
    let wall = t0.elapsed().as_secs_f64();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    warn_beyond_fit(&setup, &result);
    if let Some(path) = &args.timeline {
        write_timeline(path, &result)?;
    }
    if args.json {
        let mut v = report_json(args, &result, args.slo.as_ref(), args.request_rate);
        if let Value::Object(m) = &mut v {
            m.insert("simulation_wall_s".into(), json!(wall));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_summary(args, &setup, &result, args.slo.as_ref());
        eprintln!(
            "simulated {} steps of {} replica(s) in {:.2} s ({:.0} steps/s)",
            result.steps.len(),
            result.replicas.len(),
            wall,
            result.steps.len() as f64 / wall.max(1e-9)
        );
    }
    Ok(())
}
