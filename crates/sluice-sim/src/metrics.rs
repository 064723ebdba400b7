//! Serving metrics of a simulated run, as `vllm bench serve` computes
//! them, and their JSON under `--save-result`'s key names.
//!
//! Definitions (vLLM's): TTFT = first token − arrival; E2EL = finish −
//! arrival; TPOT = (E2EL − TTFT) ÷ (output tokens − 1), for requests with
//! more than one token; ITL = the gaps between consecutive tokens of a
//! request; duration = from t = 0 (the benchmark's start) to the last
//! finish. Statistics are in milliseconds, percentiles NumPy's default
//! linear method. Keys vLLM lacks (preemptions, prefix-cache hit rate,
//! KV usage, batch size, simulated steps) are sluice's additions.

use crate::sim::{RequestTimeline, SimResult, StepLog};
use serde_json::{json, Map, Value};

/// `np.percentile(values, p)`, linear method, with NumPy's lerp (from the
/// upper neighbour past the midpoint); empty gives 0.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile_of_sorted(&v, p)
}

/// `percentile` of values already sorted ascending (sort once, ask many).
pub fn percentile_of_sorted(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let n = v.len();
    let virtual_index = (n - 1) as f64 * (p / 100.0);
    let prev = virtual_index.floor().clamp(0.0, (n - 1) as f64);
    let (lo, hi) = (prev as usize, (prev as usize + 1).min(n - 1));
    let t = virtual_index - prev;
    let (a, b) = (v[lo], v[hi]);
    if t >= 0.5 {
        b - (b - a) * (1.0 - t)
    } else {
        a + (b - a) * t
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

fn std_dev(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let m = mean(values);
    (values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / values.len() as f64).sqrt()
}

/// Mean, median, std, p90, p99 of one metric, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub mean_ms: f64,
    pub median_ms: f64,
    /// Population standard deviation (`np.std`).
    pub std_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

impl Stats {
    pub fn of(seconds: &[f64]) -> Stats {
        let mut sorted = seconds.to_vec();
        sorted.sort_unstable_by(f64::total_cmp);
        Stats {
            mean_ms: mean(seconds) * 1000.0,
            median_ms: percentile_of_sorted(&sorted, 50.0) * 1000.0,
            std_ms: std_dev(seconds) * 1000.0,
            p90_ms: percentile_of_sorted(&sorted, 90.0) * 1000.0,
            p99_ms: percentile_of_sorted(&sorted, 99.0) * 1000.0,
        }
    }
}

/// The summary of a simulated run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimReport {
    pub completed: usize,
    pub duration_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft: Stats,
    pub tpot: Stats,
    pub itl: Stats,
    pub e2el: Stats,
    pub num_preemptions: u64,
    pub prefix_cache_hit_rate: f64,
    pub mean_kv_cache_usage: f64,
    pub peak_kv_cache_usage: f64,
    pub mean_batch_size: f64,
    pub peak_batch_size: usize,
    pub num_steps: usize,
}

impl SimReport {
    /// The whole run (every replica).
    pub fn from_result(r: &SimResult) -> SimReport {
        SimReport::of(
            r,
            r.requests.iter(),
            r.steps.iter(),
            r.preemptions,
            (r.prefix_cache_queries, r.prefix_cache_hits),
        )
    }

    /// One replica: the requests whose tokens it produced and its steps
    /// (a prefill replica under P/D has steps but no requests of its own).
    /// Duration and throughputs are over the whole run's duration.
    pub fn for_replica(r: &SimResult, replica: usize) -> SimReport {
        let stats = r.replicas.get(replica).cloned().unwrap_or_default();
        let prefill_only = replica < r.num_prefill_replicas;
        SimReport::of(
            r,
            r.requests
                .iter()
                .filter(|t| !prefill_only && t.replica == replica),
            r.steps.iter().filter(|s| s.replica == replica),
            stats.preemptions,
            (stats.prefix_cache_queries, stats.prefix_cache_hits),
        )
    }

    fn of<'a>(
        r: &SimResult,
        requests: impl Iterator<Item = &'a RequestTimeline>,
        steps: impl Iterator<Item = &'a StepLog> + Clone,
        preemptions: u64,
        (queries, hits): (u64, u64),
    ) -> SimReport {
        let (mut ttfts, mut tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![]);
        let (mut completed, mut input, mut output) = (0, 0, 0);
        for t in requests {
            let (Some(first), Some(finish)) = (t.first_token_s(), t.finish_s) else {
                continue;
            };
            completed += 1;
            input += t.prompt_len;
            let n = t.token_times.len();
            output += n;
            let ttft = first - t.arrival_s;
            let e2el = finish - t.arrival_s;
            ttfts.push(ttft);
            e2els.push(e2el);
            if n > 1 {
                tpots.push((e2el - ttft) / (n - 1) as f64);
            }
            itls.extend(t.token_times.windows(2).map(|w| w[1] - w[0]));
        }
        let duration = r.end_s;
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let kv: Vec<f64> = steps.clone().map(|s| s.kv_usage).collect();
        let batch: Vec<f64> = steps.clone().map(|s| s.num_reqs as f64).collect();
        SimReport {
            completed,
            duration_s: duration,
            total_input_tokens: input,
            total_output_tokens: output,
            request_throughput: per_s(completed as f64),
            output_throughput: per_s(output as f64),
            total_token_throughput: per_s((input + output) as f64),
            ttft: Stats::of(&ttfts),
            tpot: Stats::of(&tpots),
            itl: Stats::of(&itls),
            e2el: Stats::of(&e2els),
            num_preemptions: preemptions,
            prefix_cache_hit_rate: if queries > 0 {
                hits as f64 / queries as f64
            } else {
                0.0
            },
            mean_kv_cache_usage: mean(&kv),
            peak_kv_cache_usage: kv.iter().copied().fold(0.0, f64::max),
            mean_batch_size: mean(&batch),
            peak_batch_size: steps.map(|s| s.num_reqs).max().unwrap_or(0),
            num_steps: kv.len(),
        }
    }

    /// The report as `vllm bench serve --save-result` names it
    /// (`mean_ttft_ms`, `p99_itl_ms`, ...), plus sluice's keys.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("duration", json!(self.duration_s));
        put("completed", json!(self.completed));
        put("failed", json!(0));
        put("total_input_tokens", json!(self.total_input_tokens));
        put("total_output_tokens", json!(self.total_output_tokens));
        put("request_throughput", json!(self.request_throughput));
        put("output_throughput", json!(self.output_throughput));
        put("total_token_throughput", json!(self.total_token_throughput));
        for (name, s) in [
            ("ttft", &self.ttft),
            ("tpot", &self.tpot),
            ("itl", &self.itl),
            ("e2el", &self.e2el),
        ] {
            put(&format!("mean_{name}_ms"), json!(s.mean_ms));
            put(&format!("median_{name}_ms"), json!(s.median_ms));
            put(&format!("std_{name}_ms"), json!(s.std_ms));
            put(&format!("p90_{name}_ms"), json!(s.p90_ms));
            put(&format!("p99_{name}_ms"), json!(s.p99_ms));
        }
        put("num_preemptions", json!(self.num_preemptions));
        put("prefix_cache_hit_rate", json!(self.prefix_cache_hit_rate));
        put("mean_kv_cache_usage", json!(self.mean_kv_cache_usage));
        put("peak_kv_cache_usage", json!(self.peak_kv_cache_usage));
        put("mean_batch_size", json!(self.mean_batch_size));
        put("peak_batch_size", json!(self.peak_batch_size));
        put("num_steps", json!(self.num_steps));
        Value::Object(m)
    }
}
