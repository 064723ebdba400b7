//! What a run reports: vLLM's summary table (same line labels and widths),
//! vLLM's result JSON (same keys; the per-request arrays only with
//! `--save-detailed`) and its file name, and sluice's extras (503s,
//! hang-ups, the KV-drain check, the server's RSS) after vLLM's table.

use super::args::Config;
use super::metrics::{stats, Metrics, Stats};
use super::request::RequestOutput;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::path::PathBuf;

/// The prompt length asked for: `--random-input-len` (plus the prefix)
/// and the interval vLLM draws each request's length from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Requested {
    pub nominal: usize,
    pub min: usize,
    pub max: usize,
}

impl Requested {
    /// The lengths as the server counts them: vLLM draws the sampled part
    /// in `length_bounds` without the special tokens encoding adds, which
    /// come on top.
    pub fn new(p: &super::dataset::RandomParams, num_special: usize) -> anyhow::Result<Self> {
        let ((lo, hi), _) = super::dataset::length_bounds(p, num_special)?;
        Ok(Requested {
            nominal: p.input_len + p.prefix_len,
            min: lo + p.prefix_len + num_special,
            max: hi + p.prefix_len + num_special,
        })
    }
}

/// Mean, standard deviation, min and max of the successful requests'
/// prompt lengths (the server's usage `prompt_tokens` when it sent them).
pub fn achieved(outputs: &[RequestOutput]) -> Option<(f64, f64, usize, usize)> {
    let lens: Vec<usize> = outputs
        .iter()
        .filter(|o| o.success())
        .map(|o| o.prompt_len)
        .collect();
    let (min, max) = (*lens.iter().min()?, *lens.iter().max()?);
    let n = lens.len() as f64;
    let mean = lens.iter().sum::<usize>() as f64 / n;
    let var = lens.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / n;
    Some((mean, var.sqrt(), min, max))
}

/// sluice's own observations, beside vLLM's figures.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// The prompt length asked for.
    pub requested: Option<Requested>,
    pub overloaded: usize,
    pub disconnected: usize,
    /// The drain metrics after the run, and whether they reached 0.
    pub drain: Option<([f64; 3], bool)>,
    pub rss_kib_before: Option<u64>,
    pub rss_kib_after: Option<u64>,
}

pub struct Run<'a> {
    pub cfg: &'a Config,
    pub model_id: &'a str,
    pub tokenizer_id: &'a str,
    pub duration: f64,
    pub outputs: &'a [RequestOutput],
    pub metrics: &'a Metrics,
    pub extras: Extras,
    /// `YYYYMMDD-HHMMSS` (UTC).
    pub date: String,
}

/// Python's `str(float)` for the values that reach file names and labels.
pub fn py_float(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x.fract() == 0.0 && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// vLLM's percentile key word: `99`, `99.9`.
fn p_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {value:<10}");
}

fn fline(out: &mut String, label: &str, value: f64) {
    let _ = writeln!(out, "{label:<40} {value:<10.2}");
}

/// The metrics with statistics, in vLLM's order: (key, label, header,
/// stats), those not selected by `--percentile-metrics` left out.
fn selected_metrics(run: &Run) -> Vec<(&'static str, &'static str, &'static str, Stats)> {
    let cfg = run.cfg;
    let m = run.metrics;
    let mut all = vec![
        ("ttft", "TTFT", "Time to First Token", m.ttft.clone()),
        (
            "tpot",
            "TPOT",
            "Time per Output Token (excl. 1st token)",
            m.tpot.clone(),
        ),
        ("itl", "ITL", "Inter-token Latency", m.itl.clone()),
        ("e2el", "E2EL", "End-to-end Latency", m.e2el.clone()),
    ];
    // Client-side queueing exists only under --max-concurrency.
    if cfg.max_concurrency.is_some() {
        let ok = run.outputs.iter().filter(|o| o.success());
        let queue: Vec<f64> = ok.clone().map(|o| o.client_queue_time).collect();
        all.push((
            "client_queue_time",
            "Client Queue Time",
            "Client-side Queueing",
            stats(&queue, &cfg.percentiles),
        ));
        if cfg.request_rate.is_finite() {
            let incl: Vec<f64> = ok.map(|o| o.latency + o.client_queue_time).collect();
            all.push((
                "e2el_including_client_queue",
                "E2EL incl. Client Queue",
                "Queue-inclusive End-to-end Latency",
                stats(&incl, &cfg.percentiles),
            ));
        }
    }
    all.into_iter()
        .filter(|(k, ..)| cfg.percentile_metrics.iter().any(|s| s == k))
        .collect()
}

/// vLLM's "Serving Benchmark Result" table, then sluice's extras when
/// there is any to tell.
pub fn summary(run: &Run) -> String {
    let (cfg, m) = (run.cfg, run.metrics);
    let mut s = String::new();
    let _ = writeln!(s, "{:=^50}", " Serving Benchmark Result ");
    line(&mut s, "Successful requests:", m.completed);
    line(&mut s, "Failed requests:", m.failed);
    if let Some(c) = cfg.max_concurrency {
        line(&mut s, "Maximum request concurrency:", c);
    }
    if cfg.request_rate.is_finite() {
        fline(&mut s, "Request rate configured (RPS):", cfg.request_rate);
    }
    fline(&mut s, "Benchmark duration (s):", run.duration);
    line(&mut s, "Total input tokens:", m.total_input);
    line(&mut s, "Total generated tokens:", m.total_output);
    fline(&mut s, "Request throughput (req/s):", m.request_throughput);
    fline(
        &mut s,
        "Output token throughput (tok/s):",
        m.output_throughput,
    );
    fline(
        &mut s,
        "Peak output token throughput (tok/s):",
        m.max_output_tokens_per_s,
    );
    fline(
        &mut s,
        "Peak concurrent requests:",
        m.max_concurrent_requests as f64,
    );
    fline(
        &mut s,
        "Total token throughput (tok/s):",
        m.total_token_throughput,
    );
    for (_, name, header, st) in selected_metrics(run) {
        let _ = writeln!(s, "{header:-^50}");
        fline(&mut s, &format!("Mean {name} (ms):"), st.mean);
        fline(&mut s, &format!("Median {name} (ms):"), st.median);
        for (p, v) in &st.percentiles {
            fline(&mut s, &format!("P{} {name} (ms):", p_word(*p)), *v);
        }
    }
    let _ = writeln!(s, "{}", "=".repeat(50));

    let e = &run.extras;
    let any = e.overloaded > 0
        || cfg.disconnect_fraction > 0.0
        || e.drain.is_some()
        || e.rss_kib_before.is_some()
        || e.rss_kib_after.is_some()
        || e.requested.is_some();
    if any {
        let _ = writeln!(s, "{:-^50}", " sluice ");
        if let Some(r) = e.requested {
            let range = if r.min == r.max {
                String::new()
            } else {
                format!(" (each in [{}, {}])", r.min, r.max)
            };
            line(
                &mut s,
                "Prompt tokens requested:",
                format!("{}{range}", r.nominal),
            );
        }
        if let Some((mean, std, min, max)) = achieved(run.outputs) {
            line(
                &mut s,
                "Prompt tokens achieved (mean ± std):",
                format!("{mean:.1} ± {std:.1} (min {min}, max {max})"),
            );
        }
        line(&mut s, "503 responses (among the failed):", e.overloaded);
        if cfg.disconnect_fraction > 0.0 {
            line(&mut s, "Hung up on after the first chunk:", e.disconnected);
        }
        if let Some(([kv, run_n, wait], ok)) = e.drain {
            let verdict = if ok { "drained" } else { "NOT DRAINED" };
            line(
                &mut s,
                "KV cache after the run:",
                format!("{verdict} (kv usage {kv}, running {run_n}, waiting {wait})"),
            );
        }
        let mib =
            |k: Option<u64>| k.map_or("?".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
        if e.rss_kib_before.is_some() || e.rss_kib_after.is_some() {
            line(
                &mut s,
                "Server RSS before / after (MiB):",
                format!("{} / {}", mib(e.rss_kib_before), mib(e.rss_kib_after)),
            );
        }
        let _ = writeln!(s, "{}", "=".repeat(50));
    }
    s
}

/// The arrays `--save-detailed` keeps (vLLM drops them otherwise).
const DETAILED: [&str; 7] = [
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
];

fn rate_json(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!("inf")
    }
}

/// vLLM's result object, every per-request array included, plus sluice's
/// extras.
pub fn result_json(run: &Run) -> Map<String, Value> {
    let (cfg, m, outs) = (run.cfg, run.metrics, run.outputs);
    let mut r = Map::new();
    let mut put = |k: &str, v: Value| {
        r.insert(k.to_string(), v);
    };
    put("date", json!(run.date));
    put("endpoint_type", json!(cfg.backend.name()));
    put("backend", json!(cfg.backend.name()));
    put("label", json!(cfg.label));
    put("model_id", json!(run.model_id));
    put("tokenizer_id", json!(run.tokenizer_id));
    put("num_prompts", json!(cfg.num_prompts));
    put("request_rate", rate_json(cfg.request_rate));
    put("burstiness", rate_json(cfg.burstiness));
    put("max_concurrency", json!(cfg.max_concurrency));
    put("duration", json!(run.duration));
    put("completed", json!(m.completed));
    put("failed", json!(m.failed));
    put("total_input_tokens", json!(m.total_input));
    put("total_output_tokens", json!(m.total_output));
    put("request_throughput", json!(m.request_throughput));
    put("request_goodput", Value::Null);
    put("output_throughput", json!(m.output_throughput));
    put("total_token_throughput", json!(m.total_token_throughput));
    put(
        "input_lens",
        json!(outs.iter().map(|o| o.prompt_len).collect::<Vec<_>>()),
    );
    put("output_lens", json!(m.output_lens));
    put(
        "ttfts",
        json!(outs.iter().map(|o| o.ttft).collect::<Vec<_>>()),
    );
    put(
        "itls",
        json!(outs.iter().map(|o| &o.itl).collect::<Vec<_>>()),
    );
    put(
        "latencies",
        json!(outs.iter().map(|o| o.latency).collect::<Vec<_>>()),
    );
    put(
        "start_times",
        json!(outs.iter().map(|o| o.start_time).collect::<Vec<_>>()),
    );
    put(
        "queue_times",
        json!(outs.iter().map(|o| o.client_queue_time).collect::<Vec<_>>()),
    );
    put(
        "generated_texts",
        json!(outs.iter().map(|o| &o.generated_text).collect::<Vec<_>>()),
    );
    put(
        "errors",
        json!(outs.iter().map(|o| &o.error).collect::<Vec<_>>()),
    );
    put("max_output_tokens_per_s", json!(m.max_output_tokens_per_s));
    put("max_concurrent_requests", json!(m.max_concurrent_requests));
    put("rtfx", json!(0.0));
    for (key, _, _, st) in selected_metrics(run) {
        put(&format!("mean_{key}_ms"), json!(st.mean));
        put(&format!("median_{key}_ms"), json!(st.median));
        put(&format!("std_{key}_ms"), json!(st.std));
        for (p, v) in &st.percentiles {
            put(&format!("p{}_{key}_ms", p_word(*p)), json!(v));
        }
    }
    let e = &run.extras;
    if let Some(r) = e.requested {
        put("requested_input_len", json!(r.nominal));
        put("requested_input_len_min", json!(r.min));
        put("requested_input_len_max", json!(r.max));
    }
    if let Some((mean, std, min, max)) = achieved(run.outputs) {
        put("mean_input_len", json!(mean));
        put("std_input_len", json!(std));
        put("min_input_len", json!(min));
        put("max_input_len", json!(max));
    }
    put("overloaded", json!(e.overloaded));
    put("disconnected", json!(e.disconnected));
    if let Some(([kv, running, waiting], ok)) = e.drain {
        put("kv_cache_usage_after", json!(kv));
        put("num_requests_running_after", json!(running));
        put("num_requests_waiting_after", json!(waiting));
        put("kv_drained", json!(ok));
    }
    put("server_rss_kib_before", json!(e.rss_kib_before));
    put("server_rss_kib_after", json!(e.rss_kib_after));
    r
}

/// The object without the per-request arrays.
pub fn strip_detailed(mut r: Map<String, Value>) -> Map<String, Value> {
    for k in DETAILED {
        r.remove(k);
    }
    r
}

/// vLLM's `compute_result_filename`.
pub fn result_path(cfg: &Config, model_id: &str, date: &str) -> PathBuf {
    let name = match &cfg.result_filename {
        Some(n) => n.clone(),
        None => {
            let base_model = model_id.rsplit('/').next().unwrap_or(model_id);
            let conc = cfg
                .max_concurrency
                .map_or(String::new(), |c| format!("-concurrency{c}"));
            let label = cfg.label.as_deref().unwrap_or(cfg.backend.name());
            format!(
                "{label}-{}qps{conc}-{base_model}-{date}.json",
                py_float(cfg.request_rate)
            )
        }
    };
    match &cfg.result_dir {
        Some(d) => d.join(name),
        None => PathBuf::from(name),
    }
}

/// `YYYYMMDD-HHMMSS` of a Unix time, in UTC (vLLM uses local time; sluice
/// has no time-zone database).
pub fn date_string(unix_secs: u64) -> String {
    let t = i64::try_from(unix_secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_number_words() {
        assert_eq!(py_float(f64::INFINITY), "inf");
        assert_eq!(py_float(10.0), "10.0");
        assert_eq!(py_float(2.5), "2.5");
        assert_eq!(p_word(99.0), "99");
        assert_eq!(p_word(99.9), "99.9");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(date_string(0), "19700101-000000");
        // 2024-02-29 13:14:15 UTC.
        assert_eq!(date_string(1_709_212_455), "20240229-131415");
    }

    #[test]
    fn table_lines_are_vllms() {
        let mut s = String::new();
        fline(&mut s, "Benchmark duration (s):", 1.5);
        assert_eq!(
            s,
            format!("{:<40} {:<10}\n", "Benchmark duration (s):", "1.50")
        );
        assert_eq!(
            format!("{:=^50}", " Serving Benchmark Result "),
            "============ Serving Benchmark Result ============"
        );
        assert_eq!(
            format!("{:-^50}", "Time to First Token"),
            "---------------Time to First Token----------------"
        );
    }
}
