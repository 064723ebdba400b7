//! `GET /metrics`: the engine's stats in Prometheus text format, under
//! vLLM's metric names so dashboards and routers written for vLLM work
//! unchanged.

use sluice_engine::{EngineStats, Histogram};
use std::fmt::Write;

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn gauge(out: &mut String, name: &str, help: &str, labels: &str, v: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}"
    );
}

fn counter(out: &mut String, name: &str, help: &str, labels: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {v}"
    );
}

fn histogram(out: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let cum = h.cumulative();
    for (i, b) in h.bounds.iter().enumerate() {
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{b}\"}} {}",
            cum.get(i).copied().unwrap_or(0)
        );
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
}

/// Renders a snapshot for `model_name`.
pub fn render(s: &EngineStats, model_name: &str) -> String {
    let l = format!("model_name=\"{}\"", escape(model_name));
    let mut o = String::with_capacity(8 * 1024);
    gauge(
        &mut o,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &l,
        s.num_running_reqs as f64,
    );
    gauge(
        &mut o,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &l,
        s.num_waiting_reqs as f64,
    );
    gauge(
        &mut o,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &l,
        s.kv_cache_usage,
    );
    counter(
        &mut o,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &l,
        s.prefix_cache_queries,
    );
    counter(
        &mut o,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &l,
        s.prefix_cache_hits,
    );
    counter(
        &mut o,
        "vllm:num_preemptions",
        "Cumulative number of preemptions from the engine.",
        &l,
        s.num_preemptions,
    );
    counter(
        &mut o,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &l,
        s.prompt_tokens,
    );
    counter(
        &mut o,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &l,
        s.generation_tokens,
    );
    let _ = writeln!(o, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter");
    for (reason, v) in [
        ("stop", s.finished.stop),
        ("length", s.finished.length),
        ("abort", s.finished.abort),
        ("error", s.finished.error),
    ] {
        let _ = writeln!(
            o,
            "vllm:request_success_total{{{l},finished_reason=\"{reason}\"}} {v}"
        );
    }
    histogram(
        &mut o,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
        &s.time_to_first_token,
    );
    histogram(
        &mut o,
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &l,
        &s.inter_token_latency,
    );
    histogram(
        &mut o,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &l,
        &s.e2e_latency,
    );
    histogram(
        &mut o,
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &l,
        &s.queue_time,
    );
    histogram(
        &mut o,
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &l,
        &s.request_prompt_tokens,
    );
    histogram(
        &mut o,
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &l,
        &s.request_generation_tokens,
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let mut s = EngineStats {
            time_to_first_token: Histogram::new(&[0.1, 1.0]),
            ..EngineStats::default()
        };
        s.time_to_first_token.observe(0.05);
        s.time_to_first_token.observe(0.5);
        s.time_to_first_token.observe(5.0);
        let text = render(&s, "m");
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 1")
        );
        assert!(
            text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"1\"} 2")
        );
        assert!(text
            .contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3"));
        assert!(text.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\"} 3"));
        assert!(text.contains("# TYPE vllm:num_requests_running gauge"));
        assert!(text.contains("vllm:prefix_cache_queries_total{model_name=\"m\"} 0"));
    }
}
