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

mod engine;
mod exposition;
mod process;
#[cfg(test)]
mod tests;

pub use engine::{cache_config_labels, lora_requests_info, render_engine};
pub use exposition::{go_float, python_float_repr, Exposition, Labels};

use crate::http_metrics::HttpMetrics;
use sluice_core::SchedulerConfig;
use sluice_engine::EngineStats;

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
