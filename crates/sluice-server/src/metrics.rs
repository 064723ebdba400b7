//! `GET /metrics`: the engine's stats in Prometheus text format, exactly as
//! vLLM 0.33 exposes them (one engine: `engine="0"`) — the same family
//! names, types, label keys and values, bucket bounds, HELP strings and
//! `_created` companions, rendered as prometheus_client renders them — so
//! dashboards, alerts and routers written for vLLM work unchanged, and
//! vLLM and sluice replicas behind one Prometheus aggregate (their `le`
//! label values must be byte-identical for `histogram_quantile` to combine
//! them). `docs/metrics.md` lists every family and where sluice differs.
//!
//! Order: the process families (Linux), the `vllm:` families in vLLM's
//! registration order, then the HTTP families (`http_metrics.rs`).
//! Families vLLM exports with one engine but that cannot move in sluice
//! (external / multimodal caches, MFU estimates, the offload tiers) are
//! exported with 0, as vLLM exports them.

use crate::http_metrics::HttpMetrics;
use sluice_core::SchedulerConfig;
use sluice_engine::{EngineStats, Histogram};
use std::fmt::Write;

/// `repr()` of a Python float: the shortest digits that round-trip, in
/// positional notation for decimal exponents -4..16, else `1e+16` style;
/// positional values always carry a fraction (`1.0`).
pub fn python_float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sign = if v.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` prints the same shortest round-trip digits Python
    // uses, as `d.ddde<exp>`.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Position of the decimal point relative to the first digit.
    let point = exp + 1;
    if v == 0.0 {
        return format!("{sign}0.0");
    }
    if (-4 < point) && (point <= 16) {
        let n = digits.len() as i32;
        if point <= 0 {
            let zeros = "0".repeat((-point) as usize);
            format!("{sign}0.{zeros}{digits}")
        } else if point >= n {
            let zeros = "0".repeat((point - n) as usize);
            format!("{sign}{digits}{zeros}.0")
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
    }
}

/// prometheus_client's `floatToGoString`: how it renders every sample
/// value and every `le` bound. `+Inf`, `-Inf`, `NaN`; positive values of 7
/// or more integer digits switch to Go's exponent form (`1e+06`,
/// `1.796115002389645e+09`); everything else is Python's `repr`
/// (`1.0`, `0.3`, `2560.0`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    let s = python_float_repr(v);
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let mantissa = format!("{}.{}{}", &s[..1], &s[1..dot], &s[dot + 1..]);
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+{:02}", dot - 1)
        }
        _ => s,
    }
}

/// A label value, escaped as the text format wants it.
fn escape_label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample's labels as `(key, value)` pairs, in any order.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// The text of one exposition, written family by family.
pub struct Exposition {
    out: String,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition::new()
    }
}

impl Exposition {
    pub fn new() -> Self {
        Exposition {
            out: String::with_capacity(64 * 1024),
        }
    }

    pub fn finish(self) -> String {
        self.out
    }

    /// `# HELP` and `# TYPE` lines.
    pub fn header(&mut self, name: &str, help: &str, kind: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; labels are written sorted by key, as prometheus_client
    /// writes them.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            let mut sorted: Vec<&(&str, &str)> = labels.iter().collect();
            sorted.sort_by_key(|(k, _)| *k);
            self.out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", go_float(value));
    }

    pub fn gauge(&mut self, name: &str, help: &str, children: &[(Labels<'_>, f64)]) {
        self.header(name, help, "gauge");
        for (labels, v) in children {
            self.sample(name, labels, *v);
        }
    }

    /// A counter `base_total` and its `base_created` gauge family (one
    /// creation time per child).
    pub fn counter(&mut self, base: &str, help: &str, children: &[(Labels<'_>, f64, f64)]) {
        let total = format!("{base}_total");
        self.header(&total, help, "counter");
        for (labels, v, _) in children {
            self.sample(&total, labels, *v);
        }
        self.created(base, help, children.iter().map(|(l, _, c)| (*l, *c)));
    }

    /// A histogram (buckets with `le`, `_count`, `_sum` per child) and its
    /// `_created` gauge family.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        children: &[(Labels<'_>, &Histogram, f64)],
    ) {
        self.header(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (base, h, _) in children {
            let cumulative = h.cumulative();
            let bounds = h.bounds.iter().copied().chain([f64::INFINITY]);
            for (bound, n) in bounds.zip(cumulative) {
                let le = go_float(bound);
                let mut labels: Vec<(&str, &str)> = base.to_vec();
                labels.push(("le", &le));
                self.sample(&bucket, &labels, n as f64);
            }
            self.sample(&format!("{name}_count"), base, h.count as f64);
            self.sample(&format!("{name}_sum"), base, h.sum);
        }
        self.created(name, help, children.iter().map(|(l, _, c)| (*l, *c)));
    }

    /// A summary without quantiles (`_count`, `_sum`) and its `_created`.
    pub fn summary(&mut self, name: &str, help: &str, children: &[(Labels<'_>, u64, f64, f64)]) {
        self.header(name, help, "summary");
        for (labels, count, sum, _) in children {
            self.sample(&format!("{name}_count"), labels, *count as f64);
            self.sample(&format!("{name}_sum"), labels, *sum);
        }
        self.created(name, help, children.iter().map(|(l, _, _, c)| (*l, *c)));
    }

    /// prometheus_client moves each child's `_created` sample into a gauge
    /// family of its own after the family.
    fn created<'a>(
        &mut self,
        base: &str,
        help: &str,
        children: impl Iterator<Item = (Labels<'a>, f64)>,
    ) {
        let name = format!("{base}_created");
        self.header(&name, help, "gauge");
        for (labels, created) in children {
            self.sample(&name, labels, created);
        }
    }
}

/// `str()` of a Python bool, as vLLM's `metrics_info` writes it.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The label values of `vllm:cache_config_info`: every key of vLLM's
/// `CacheConfig.__dict__` plus `engine` (38), sorted. Where sluice has the
/// setting, its real value; where a real vLLM engine fills a value in
/// after start-up (KV capacity), sluice's figure computed vLLM's way;
/// otherwise vLLM's default as `str()` renders it.
pub fn cache_config_labels(c: &SchedulerConfig) -> Vec<(&'static str, String)> {
    let block_size = c.block_size.max(1);
    // vLLM's `get_kv_cache_capacity` for one full-attention group: the pool
    // over the blocks one max_model_len request needs.
    let blocks_per_request = c.max_model_len.div_ceil(block_size).max(1);
    let max_concurrency = c.num_gpu_blocks as f64 / blocks_per_request as f64;
    let size_tokens = (max_concurrency * c.max_model_len as f64).floor();
    let hash_algo = c.prefix_caching_hash_algo.as_str();
    let none = || "None".to_string();
    vec![
        ("_block_size_resolved", "True".into()),
        ("block_size", c.block_size.to_string()),
        // vLLM would print its default "auto" (= the model's dtype), but
        // sluice's KV cache is f32 whatever the weights' dtype, so "auto"
        // would claim bf16 for a bf16 model. The honest value, though not
        // one vLLM accepts for --kv-cache-dtype.
        ("cache_dtype", "float32".into()),
        ("cache_hit_alignment_tokens", none()),
        ("effective_attention_block_size", c.block_size.to_string()),
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
        ("sliding_window", none()),
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

/// Renders the whole exposition: process, engine (for `model_name`, with
/// the scheduler configuration `config`) and, when given, HTTP families.
pub fn render(
    s: &EngineStats,
    config: &SchedulerConfig,
    model_name: &str,
    http: Option<&HttpMetrics>,
) -> String {
    let mut w = Exposition::new();
    process::render(&mut w);
    render_engine(&mut w, s, config, model_name);
    if let Some(http) = http {
        http.render(&mut w);
    }
    w.finish()
}

/// The `vllm:` families, in vLLM's registration order.
pub fn render_engine(w: &mut Exposition, s: &EngineStats, c: &SchedulerConfig, model_name: &str) {
    let l: &[(&str, &str)] = &[("engine", "0"), ("model_name", model_name)];
    let t0 = s.started_unix_secs;
    let with = |k: &'static str, v: &'static str| -> [(&'static str, &str); 3] {
        [("engine", "0"), ("model_name", model_name), (k, v)]
    };

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

    lora_requests_info(w);

    let info = cache_config_labels(c);
    let info: Vec<(&str, &str)> = info.iter().map(|(k, v)| (*k, v.as_str())).collect();
    w.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &[(&info, 1.0)],
    );
}

/// prometheus_client's process collector (`process_*`), from `/proc` on
/// Linux; nothing elsewhere. Its `python_*` collectors describe a Python
/// interpreter and have no counterpart in a Rust process.
mod process {
    use super::Exposition;

    #[cfg(target_os = "linux")]
    pub fn render(w: &mut Exposition) {
        let (page_size, ticks) = linux::auxv_page_size_and_ticks();
        if let Some(st) = linux::read_stat(page_size, ticks) {
            w.gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                &[(&[], st.virtual_memory_bytes)],
            );
            w.gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                &[(&[], st.resident_memory_bytes)],
            );
            w.gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                &[(&[], st.start_time_seconds)],
            );
            // A counter without `_created`, as prometheus_client's.
            w.header(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                "counter",
            );
            w.sample("process_cpu_seconds_total", &[], st.cpu_seconds);
        }
        if let Some((open, max)) = linux::fds() {
            w.gauge(
                "process_open_fds",
                "Number of open file descriptors.",
                &[(&[], open)],
            );
            w.gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                &[(&[], max)],
            );
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn render(_w: &mut Exposition) {}

    #[cfg(target_os = "linux")]
    mod linux {
        pub struct Stat {
            pub virtual_memory_bytes: f64,
            pub resident_memory_bytes: f64,
            pub start_time_seconds: f64,
            pub cpu_seconds: f64,
        }

        /// `sysconf(_SC_PAGESIZE)` and `sysconf(_SC_CLK_TCK)` without libc:
        /// the kernel hands both to every process in its auxiliary vector
        /// (`AT_PAGESZ`, `AT_CLKTCK`), which is where libc reads them.
        pub fn auxv_page_size_and_ticks() -> (f64, f64) {
            const AT_PAGESZ: usize = 6;
            const AT_CLKTCK: usize = 17;
            let (mut page, mut ticks) = (4096.0, 100.0);
            let Ok(bytes) = std::fs::read("/proc/self/auxv") else {
                return (page, ticks);
            };
            let word = std::mem::size_of::<usize>();
            for pair in bytes.chunks_exact(2 * word) {
                let read = |b: &[u8]| {
                    let mut w = [0u8; std::mem::size_of::<usize>()];
                    w.copy_from_slice(b);
                    usize::from_ne_bytes(w)
                };
                let (key, value) = (read(&pair[..word]), read(&pair[word..]));
                match key {
                    AT_PAGESZ if value > 0 => page = value as f64,
                    AT_CLKTCK if value > 0 => ticks = value as f64,
                    _ => {}
                }
            }
            (page, ticks)
        }

        fn boot_time() -> Option<f64> {
            let stat = std::fs::read_to_string("/proc/stat").ok()?;
            stat.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse().ok())
        }

        /// `/proc/self/stat` as prometheus_client reads it (the fields after
        /// the command name, which may itself contain spaces or `)`).
        pub fn read_stat(page_size: f64, ticks: f64) -> Option<Stat> {
            let btime = boot_time()?;
            let text = std::fs::read_to_string("/proc/self/stat").ok()?;
            let (_, rest) = text.rsplit_once(')')?;
            let parts: Vec<f64> = rest
                .split_whitespace()
                .map(|p| p.parse().unwrap_or(0.0))
                .collect();
            let field = |i: usize| parts.get(i).copied();
            Some(Stat {
                virtual_memory_bytes: field(20)?,
                resident_memory_bytes: field(21)? * page_size,
                start_time_seconds: field(19)? / ticks + btime,
                cpu_seconds: (field(11)? + field(12)?) / ticks,
            })
        }

        /// Open descriptors and the soft limit on them.
        pub fn fds() -> Option<(f64, f64)> {
            let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
            let max = limits
                .lines()
                .find(|l| l.starts_with("Max open file"))?
                .split_whitespace()
                .nth(3)?
                .parse::<f64>()
                .ok()?;
            let open = std::fs::read_dir("/proc/self/fd").ok()?.count();
            Some((open as f64, max))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_render_as_prometheus_client_renders_them() {
        for (v, want) in [
            (1.0, "1.0"),
            (0.3, "0.3"),
            (0.001, "0.001"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (2560.0, "2560.0"),
            (16384.0, "16384.0"),
            (100000.0, "100000.0"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (2e7, "2e+07"),
            (1.796115002389645e9, "1.796115002389645e+09"),
            (4.217421824e9, "4.217421824e+09"),
            (1e16, "1e+16"),
            (1e22, "1e+22"),
            (0.0, "0.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (0.11777777777777779, "0.11777777777777779"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float(v), want, "{v:e}");
        }
        assert_eq!(python_float_repr(31.9375), "31.9375");
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(1e15), "1000000000000000.0");
        assert_eq!(python_float_repr(1e-5), "1e-05");
        assert_eq!(python_float_repr(1.5e-7), "1.5e-07");
    }

    fn stats() -> EngineStats {
        let c = SchedulerConfig::default();
        let mut s = sluice_engine::stats::StatsCollector::new(512, c.max_model_len).snapshot();
        s.started_unix_secs = 1.7e9;
        s.time_to_first_token = Histogram::new(&[0.1, 1.0]);
        s.time_to_first_token.observe(0.05);
        s.time_to_first_token.observe(0.5);
        s.time_to_first_token.observe(5.0);
        s
    }

    #[test]
    fn histogram_buckets_are_cumulative_sorted_and_end_with_inf() {
        let text = render_text(&stats());
        for line in [
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"m\"} 1.0",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 2.0",
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 3.0",
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 3.0",
            "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 5.55",
            "vllm:time_to_first_token_seconds_created{engine=\"0\",model_name=\"m\"} 1.7e+09",
            "# TYPE vllm:time_to_first_token_seconds_created gauge",
            "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"2000.0\",model_name=\"m\"} 0.0",
            "# TYPE vllm:num_requests_running gauge",
            "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 0.0",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"repetition\",model_name=\"m\"} 0.0",
            "vllm:admission_rejections_total{model_name=\"m\",reason=\"max_num_queued_tokens\"} 0.0",
            "vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1.0",
            "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"16384.0\",model_name=\"m\"} 0.0",
            "# TYPE vllm:iteration_tokens_total histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    fn render_text(s: &EngineStats) -> String {
        let mut w = Exposition::new();
        render_engine(&mut w, s, &SchedulerConfig::default(), "m");
        w.finish()
    }

    #[test]
    fn cache_config_info_has_vllms_38_keys_sorted_with_sluices_values() {
        let c = SchedulerConfig {
            num_gpu_blocks: 512,
            max_model_len: 256,
            block_size: 16,
            ..SchedulerConfig::default()
        };
        let labels = cache_config_labels(&c);
        assert_eq!(labels.len(), 38);
        assert!(labels.windows(2).all(|w| w[0].0 < w[1].0));
        let get = |k: &str| {
            labels
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("block_size"), Some("16"));
        assert_eq!(get("num_gpu_blocks"), Some("512"));
        assert_eq!(get("enable_prefix_caching"), Some("True"));
        assert_eq!(get("prefix_caching_hash_algo"), Some("sha256"));
        assert_eq!(get("kv_cache_max_concurrency"), Some("32.0"));
        assert_eq!(get("kv_cache_size_tokens"), Some("8192"));
        assert_eq!(get("kv_cache_dtype_skip_layers"), Some("[]"));
        assert_eq!(get("engine"), Some("0"));
    }

    #[test]
    fn lora_requests_info_is_vllms_with_no_adapters() {
        let mut w = Exposition::new();
        lora_requests_info(&mut w);
        let text = w.finish();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("# HELP vllm:lora_requests_info Running stats on lora requests.")
        );
        assert_eq!(lines.next(), Some("# TYPE vllm:lora_requests_info gauge"));
        let sample = lines.next().unwrap_or_default();
        let value = sample
            .strip_prefix(
                "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} ",
            )
            .unwrap_or_else(|| panic!("{sample}"));
        // A unix timestamp, as set_to_current_time writes it.
        let t: f64 = value.parse().unwrap();
        assert!(t > 1.7e9, "{t}");
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut w = Exposition::new();
        w.sample("x", &[("b", "a\"b\\c\nd"), ("a", "1")], 2.0);
        assert_eq!(w.finish(), "x{a=\"1\",b=\"a\\\"b\\\\c\\nd\"} 2.0\n");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_families_come_from_proc() {
        let mut w = Exposition::new();
        process::render(&mut w);
        let text = w.finish();
        for family in [
            "process_virtual_memory_bytes gauge",
            "process_resident_memory_bytes gauge",
            "process_start_time_seconds gauge",
            "process_cpu_seconds_total counter",
            "process_open_fds gauge",
            "process_max_fds gauge",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{text}");
        }
        let start: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            start > now - 86400.0 * 365.0 && start <= now + 1.0,
            "{start}"
        );
    }
}
