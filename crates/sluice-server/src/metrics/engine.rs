//! The `vllm:` families of one engine (`engine="0"`), in vLLM's
//! registration order, one function per group of families; and the label
//! sets of its two info gauges.

use super::exposition::{python_float_repr, Exposition, Labels};
use sluice_core::kv_cache::AttentionKind;
use sluice_core::SchedulerConfig;
use sluice_engine::EngineStats;

/// `str()` of a Python bool, as vLLM's `metrics_info` writes it.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The block size of the full-attention groups, when they share one.
fn full_attention_block_size(c: &SchedulerConfig) -> Option<usize> {
    let mut sizes = c
        .kv_cache_groups
        .iter()
        .filter(|g| g.kind == AttentionKind::Full)
        .map(|g| g.block_size_or(c.block_size));
    let first = sizes.next()?;
    sizes.all(|b| b == first).then_some(first)
}

/// The window of a model whose every KV cache group is one sliding window.
fn uniform_window(c: &SchedulerConfig) -> Option<usize> {
    let mut windows = c.kv_cache_groups.iter().map(|g| g.sliding_window_tokens());
    let first = windows.next()??;
    windows.all(|w| w == Some(first)).then_some(first)
}

/// The label values of `vllm:cache_config_info`: every key of vLLM's
/// `CacheConfig.__dict__` plus `engine` (38), sorted. Where sluice has the
/// setting, its real value; where a real vLLM engine fills a value in
/// after start-up (KV capacity), sluice's figure computed vLLM's way;
/// otherwise vLLM's default as `str()` renders it.
pub fn cache_config_labels(c: &SchedulerConfig) -> Vec<(&'static str, String)> {
    // vLLM's `get_kv_cache_capacity`: the pool over the blocks one
    // max_model_len request holds across all KV cache groups (a sliding
    // group only its window), so a hybrid model's concurrency counts the
    // blocks its sliding groups give back.
    let blocks_per_request = c.max_blocks_per_request().max(1);
    let max_concurrency = c.num_gpu_blocks as f64 / blocks_per_request as f64;
    let size_tokens = (max_concurrency * c.max_model_len as f64).floor();
    let hash_algo = c.prefix_caching_hash_algo.as_str();
    let none = || "None".to_string();
    vec![
        ("_block_size_resolved", "True".into()),
        ("block_size", c.block_size.to_string()),
        // The type the executor stores, not the flag: sluice's
        // `--kv-cache-dtype auto` is float16, and vLLM's "auto" would claim
        // the model's dtype.
        ("cache_dtype", c.cache_dtype.clone()),
        ("cache_hit_alignment_tokens", none()),
        // The full-attention groups' block size when they share one (vLLM's
        // `_initialize_effective_attention_block_size`); None without any.
        (
            "effective_attention_block_size",
            full_attention_block_size(c).map_or_else(none, |b| b.to_string()),
        ),
        ("enable_mamba_shared_prefix_checkpoint", "False".into()),
        (
            "enable_prefix_caching",
            py_bool(c.enable_prefix_caching).into(),
        ),
        ("engine", "0".into()),
        ("gpu_memory_utilization", "0.92".into()),
        ("hash_block_size", none()),
        ("is_attention_free", "False".into()),
        ("kv_cache_dtype_skip_layers", "[]".into()),
        ("kv_cache_layout", none()),
        (
            "kv_cache_max_concurrency",
            python_float_repr(max_concurrency),
        ),
        ("kv_cache_memory_bytes", none()),
        ("kv_cache_size_tokens", format!("{size_tokens:.0}")),
        ("kv_offloading_backend", "native".into()),
        ("kv_offloading_size", none()),
        ("kv_sharing_fast_prefill", "False".into()),
        ("mamba_block_size", none()),
        ("mamba_cache_dtype", "auto".into()),
        ("mamba_cache_mode", "none".into()),
        ("mamba_page_size_padded", none()),
        ("mamba_ssm_cache_dtype", "auto".into()),
        ("num_cpu_blocks", none()),
        ("num_gpu_blocks", c.num_gpu_blocks.to_string()),
        ("num_gpu_blocks_override", none()),
        ("prefix_cache_retention_interval", "0".into()),
        ("prefix_caching_hash_algo", hash_algo.into()),
        ("prefix_match_unit", none()),
        ("replayssm_buffer_len", "16".into()),
        ("simple_cpu_offload_num_blocks", none()),
        ("skip_page_size_padded", none()),
        // vLLM sets it only for a model whose every layer slides (its
        // `create_engine_config`: `layer_types` absent or all sliding).
        (
            "sliding_window",
            uniform_window(c).map_or_else(none, |w| w.to_string()),
        ),
        ("swa_bounded_replay", "True".into()),
        ("use_kda_recoverssm", "False".into()),
        ("use_replayssm", "False".into()),
        ("user_specified_block_size", "False".into()),
    ]
}

/// `vllm:lora_requests_info` as vLLM renders it with LoRA enabled and no
/// adapter in use: only its three labels (no `engine`, no `model_name`),
/// the adapter lists empty, the value the time of the last update
/// (`set_to_current_time`; vLLM updates it every step, so "now" is what a
/// scrape of a busy vLLM reads). Routers (the Inference Extension's
/// endpoint picker, llm-d's scheduler) read their LoRA affinity from it
/// and log an error per scrape where it is missing.
///
/// `max_lora` is 0, not vLLM's default 1: sluice serves no adapters, and a
/// router that counts free adapter slots must not send a LoRA request
/// here.
pub fn lora_requests_info(w: &mut Exposition) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    w.gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        &[(
            &[
                ("max_lora", "0"),
                ("running_lora_adapters", ""),
                ("waiting_lora_adapters", ""),
            ],
            now,
        )],
    );
}

/// The labels every engine family carries.
fn engine_labels(model_name: &str) -> [(&'static str, &str); 2] {
    [("engine", "0"), ("model_name", model_name)]
}

/// The engine labels and one more.
fn labels_with<'a>(
    model_name: &'a str,
    k: &'static str,
    v: &'static str,
) -> [(&'static str, &'a str); 3] {
    [("engine", "0"), ("model_name", model_name), (k, v)]
}

/// The `vllm:` families, in vLLM's registration order.
pub fn render_engine(w: &mut Exposition, s: &EngineStats, c: &SchedulerConfig, model_name: &str) {
    queue_and_cache_gauges(w, s, model_name);
    token_counters(w, s, model_name);
    spec_decode_counters(w, s, c.num_speculative_tokens, model_name);
    request_counters(w, s, model_name);
    histograms(w, s, model_name);
    info_gauges(w, c);
}

/// The MFU estimate counters (always 0: vLLM moves them only with
/// `--enable-mfu-metrics`), then the scheduler's queues, the sleep state
/// and KV cache usage.
fn queue_and_cache_gauges(w: &mut Exposition, s: &EngineStats, model_name: &str) {
    let engine = engine_labels(model_name);
    let l: &[(&str, &str)] = &engine;
    let t0 = s.started_unix_secs;
    let with = |k: &'static str, v: &'static str| labels_with(model_name, k, v);
    // MFU estimates: vLLM registers them always, they move only with
    // --enable-mfu-metrics.
    for (base, help) in [
        (
            "vllm:estimated_flops_per_gpu",
            "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
        ),
        (
            "vllm:estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
        ),
        (
            "vllm:estimated_write_bytes_per_gpu",
            "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
        ),
    ] {
        w.counter(base, help, &[(l, 0.0, t0)]);
    }

    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &[(l, s.num_running_reqs as f64)],
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &[(l, s.num_waiting_reqs as f64)],
    );
    let deferred = s.num_deferred_waiting_reqs.min(s.num_waiting_reqs);
    w.gauge(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        &[
            (
                &with("reason", "capacity"),
                (s.num_waiting_reqs - deferred) as f64,
            ),
            (&with("reason", "deferred"), deferred as f64),
        ],
    );
    // sluice has no sleep mode: always awake.
    w.gauge(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        &[
            (&with("sleep_state", "awake"), 1.0),
            (&with("sleep_state", "weights_offloaded"), 0.0),
            (&with("sleep_state", "discard_all"), 0.0),
        ],
    );
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &[(l, s.kv_cache_usage)],
    );
}

/// vLLM's speculative decoding counters, present when it is on (as in
/// vLLM): verifications, draft tokens, accepted tokens, and accepted
/// tokens by draft position `0..num_speculative_tokens`.
fn spec_decode_counters(w: &mut Exposition, s: &EngineStats, k: usize, model_name: &str) {
    if k == 0 {
        return;
    }
    let engine = engine_labels(model_name);
    let l: &[(&str, &str)] = &engine;
    let t0 = s.started_unix_secs;
    for (name, help, v) in [
        (
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            s.spec_decode_num_drafts,
        ),
        (
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            s.spec_decode_num_draft_tokens,
        ),
        (
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            s.spec_decode_num_accepted_tokens,
        ),
    ] {
        w.counter(name, help, &[(l, v as f64, t0)]);
    }
    let positions: Vec<String> = (0..k).map(|p| p.to_string()).collect();
    let labels: Vec<Vec<(&str, &str)>> = positions
        .iter()
        .map(|p| {
            let mut v = engine.to_vec();
            v.push(("position", p.as_str()));
            v
        })
        .collect();
    let children: Vec<(Labels<'_>, f64, f64)> = labels
        .iter()
        .enumerate()
        .map(|(p, lv)| {
            let n = s.spec_decode_accepted_per_pos.get(p).copied().unwrap_or(0);
            (&lv[..], n as f64, t0)
        })
        .collect();
    w.counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        &children,
    );
}

/// Prefix cache, preemption and token counters.
fn token_counters(w: &mut Exposition, s: &EngineStats, model_name: &str) {
    let engine = engine_labels(model_name);
    let l: &[(&str, &str)] = &engine;
    let t0 = s.started_unix_secs;
    let with = |k: &'static str, v: &'static str| labels_with(model_name, k, v);
    let one = |v: u64| [(l, v as f64, t0)];
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &one(s.prefix_cache_queries),
    );
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &one(s.prefix_cache_hits),
    );
    // No KV connector, no multimodal inputs: these stay 0.
    w.counter(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
        &one(0),
    );
    w.counter(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
        &one(0),
    );
    w.counter(
        "vllm:mm_cache_queries",
        "Multi-modal cache queries, in terms of number of queried items.",
        &one(0),
    );
    w.counter(
        "vllm:mm_cache_hits",
        "Multi-modal cache hits, in terms of number of cached items.",
        &one(0),
    );
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &one(s.num_preemptions),
    );
    w.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &one(s.prompt_tokens),
    );
    w.counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        &[
            (
                &with("source", "local_compute"),
                s.prompt_tokens_computed as f64,
                t0,
            ),
            (
                &with("source", "local_cache_hit"),
                s.prompt_tokens_cached as f64,
                t0,
            ),
            (&with("source", "external_kv_transfer"), 0.0, t0),
        ],
    );
    w.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        &one(s.prompt_tokens_cached),
    );
    w.counter(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
        &[
            (&with("source", "device"), s.prefix_cache_hits as f64, t0),
            (&with("source", "host"), 0.0, t0),
            (&with("source", "p2p"), 0.0, t0),
            (&with("source", "disk"), 0.0, t0),
            (&with("source", "external_unspecified"), 0.0, t0),
        ],
    );
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &one(s.generation_tokens),
    );
}

/// Finished requests by reason, and admissions a queue limit refused.
fn request_counters(w: &mut Exposition, s: &EngineStats, model_name: &str) {
    let t0 = s.started_unix_secs;
    let with = |k: &'static str, v: &'static str| labels_with(model_name, k, v);
    let reasons = s.finished.by_reason();
    let reason_labels: Vec<[(&str, &str); 3]> = reasons
        .iter()
        .map(|(r, _)| with("finished_reason", r))
        .collect();
    let success: Vec<(Labels<'_>, f64, f64)> = reason_labels
        .iter()
        .zip(reasons)
        .map(|(labels, (_, n))| (&labels[..], n as f64, t0))
        .collect();
    w.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        &success,
    );
    // Frontend queue limits: vLLM counts them per model, not per engine.
    let a = s.admission_rejections;
    w.counter(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        &[
            (
                &[
                    ("model_name", model_name),
                    ("reason", "max_num_queued_reqs"),
                ],
                a.max_num_queued_reqs as f64,
                t0,
            ),
            (
                &[
                    ("model_name", model_name),
                    ("reason", "max_num_queued_tokens"),
                ],
                a.max_num_queued_tokens as f64,
                t0,
            ),
        ],
    );
}

/// The per-request and per-step histograms.
fn histograms(w: &mut Exposition, s: &EngineStats, model_name: &str) {
    let engine = engine_labels(model_name);
    let l: &[(&str, &str)] = &engine;
    let t0 = s.started_unix_secs;
    for (name, help, h) in [
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &s.request_prompt_tokens,
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &s.request_generation_tokens,
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &s.iteration_tokens,
        ),
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            &s.request_max_num_generation_tokens,
        ),
        (
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            &s.request_params_n,
        ),
        (
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            &s.request_params_max_tokens,
        ),
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &s.time_to_first_token,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &s.inter_token_latency,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &s.time_per_output_token,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &s.e2e_latency,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &s.queue_time,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &s.inference_time,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &s.prefill_time,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &s.decode_time,
        ),
        (
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            &s.request_num_preemptions,
        ),
        (
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            &s.request_prefill_kv_computed_tokens,
        ),
    ] {
        w.histogram(name, help, &[(l, h, t0)]);
    }
}

/// `vllm:lora_requests_info`, then `vllm:cache_config_info`.
fn info_gauges(w: &mut Exposition, c: &SchedulerConfig) {
    lora_requests_info(w);

    let info = cache_config_labels(c);
    let info: Vec<(&str, &str)> = info.iter().map(|(k, v)| (*k, v.as_str())).collect();
    w.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &[(&info, 1.0)],
    );
}
