//! The figures, computed as vLLM's `calculate_metrics`
//! (`vllm/benchmarks/serve.py`) computes them from the per-request
//! outputs, over successful requests only:
//!
//! - output tokens of a request: the server's `usage.completion_tokens`,
//!   or (when absent or 0) the tokenizer's count of the generated text;
//! - TPOT of a request with more than one output token:
//!   `(latency - ttft) / (output_tokens - 1)`;
//! - ITL: every gap between output chunks, of all requests pooled;
//! - throughputs: completed requests, output tokens, and input + output
//!   tokens over the benchmark duration;
//! - mean, median, population standard deviation and NumPy's default
//!   (linear) percentiles, in milliseconds; an empty series reports 0;
//! - peak output tokens/s and peak concurrency, over whole-second buckets
//!   from the first request's start.

use super::dataset::BenchTokenizer;
use super::request::RequestOutput;

/// `np.percentile(values, p)`, linear method (shared with the simulator,
/// which reports the same metrics).
pub use sluice_sim::metrics::percentile;

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Population standard deviation (`np.std`, ddof 0).
pub fn std_dev(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let m = mean(values);
    (values.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / values.len() as f64).sqrt()
}

/// `np.median`: the middle value, or the mean of the two middle values.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One metric's statistics, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    /// (percentile, value) per `--metric-percentiles`.
    pub percentiles: Vec<(f64, f64)>,
}

/// Statistics of `values` (seconds), reported in milliseconds.
pub fn stats(values: &[f64], percentiles: &[f64]) -> Stats {
    Stats {
        mean: mean(values) * 1000.0,
        median: median(values) * 1000.0,
        std: std_dev(values) * 1000.0,
        percentiles: percentiles
            .iter()
            .map(|&p| (p, percentile(values, p) * 1000.0))
            .collect(),
    }
}

#[derive(Clone, Debug)]
pub struct Metrics {
    pub completed: usize,
    pub failed: usize,
    pub total_input: usize,
    pub total_output: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft: Stats,
    pub tpot: Stats,
    pub itl: Stats,
    pub e2el: Stats,
    pub max_output_tokens_per_s: f64,
    pub max_concurrent_requests: usize,
    /// Output tokens per request as counted (0 for unsuccessful ones).
    pub output_lens: Vec<usize>,
}

/// Output tokens of a successful request, as vLLM counts them.
pub fn output_tokens(out: &RequestOutput, tokenizer: &BenchTokenizer) -> usize {
    match out.output_tokens {
        Some(n) if n > 0 => n as usize,
        // vLLM tokenizes the text when the server sent no (or zero) usage;
        // a text the tokenizer cannot take counts as nothing.
        _ => tokenizer
            .encode(&out.generated_text)
            .map(|t| t.len())
            .unwrap_or(0),
    }
}

/// TPOT of one request; `None` with at most one output token.
pub fn tpot(latency: f64, ttft: f64, output_tokens: usize) -> Option<f64> {
    (output_tokens > 1).then(|| (latency - ttft) / (output_tokens - 1) as f64)
}

pub fn calculate(
    outputs: &[RequestOutput],
    duration_s: f64,
    tokenizer: &BenchTokenizer,
    percentiles: &[f64],
) -> Metrics {
    let mut output_lens = Vec::with_capacity(outputs.len());
    let (mut total_input, mut completed, mut failed) = (0, 0, 0);
    let (mut ttfts, mut tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![]);
    for out in outputs {
        if !out.success() {
            output_lens.push(0);
            // A deliberate hang-up is not a failure; vLLM has none.
            if out.outcome != super::request::Outcome::Disconnected {
                failed += 1;
            }
            continue;
        }
        let n = output_tokens(out, tokenizer);
        output_lens.push(n);
        total_input += out.prompt_len;
        if let Some(t) = tpot(out.latency, out.ttft, n) {
            tpots.push(t);
        }
        itls.extend_from_slice(&out.itl);
        ttfts.push(out.ttft);
        e2els.push(out.latency);
        completed += 1;
    }
    let total_output: usize = output_lens.iter().sum();
    let (max_output_tokens_per_s, max_concurrent_requests) = peaks(outputs);
    Metrics {
        completed,
        failed,
        total_input,
        total_output,
        request_throughput: completed as f64 / duration_s,
        output_throughput: total_output as f64 / duration_s,
        total_token_throughput: (total_input + total_output) as f64 / duration_s,
        ttft: stats(&ttfts, percentiles),
        tpot: stats(&tpots, percentiles),
        itl: stats(&itls, percentiles),
        e2el: stats(&e2els, percentiles),
        max_output_tokens_per_s,
        max_concurrent_requests,
        output_lens,
    }
}

/// Peak output chunks per whole second and peak requests active in one
/// second, over the successful requests (vLLM counts each output chunk as
/// one token here).
fn peaks(outputs: &[RequestOutput]) -> (f64, usize) {
    let ok: Vec<&RequestOutput> = outputs.iter().filter(|o| o.success()).collect();
    if ok.is_empty() {
        return (0.0, 0);
    }
    let min_start = ok
        .iter()
        .map(|o| o.start_time)
        .fold(f64::INFINITY, f64::min);
    let max_end = ok
        .iter()
        .map(|o| o.start_time + o.latency)
        .fold(f64::NEG_INFINITY, f64::max);
    let buckets = (max_end - min_start).ceil() as usize + 1;
    let mut tokens = vec![0usize; buckets];
    let mut active = vec![0usize; buckets];
    for o in ok {
        let mut t = o.start_time + o.ttft;
        let mut times = vec![t];
        for gap in &o.itl {
            t += gap;
            times.push(t);
        }
        for t in times {
            let b = t - min_start;
            if b >= 0.0 && (b as usize) < buckets {
                tokens[b as usize] += 1;
            }
        }
        let first = (o.start_time - min_start) as usize;
        let last = ((o.start_time + o.latency - min_start) as usize).min(buckets - 1);
        for slot in &mut active[first..=last.max(first)] {
            *slot += 1;
        }
    }
    let max_tokens = tokens.iter().copied().max().unwrap_or(0);
    (max_tokens as f64, active.iter().copied().max().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::super::request::Outcome;
    use super::*;

    #[test]
    fn percentiles_equal_numpys_linear_method() {
        // np.percentile(v, p) for NumPy 2.3.5.
        let v = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 1.3];
        for (p, want) in [
            (0.0, 0.1),
            (10.0, 0.16000000000000003),
            (25.0, 0.25),
            (50.0, 0.4),
            (90.0, 1.06),
            (99.0, 1.2759999999999998),
            (100.0, 1.3),
        ] {
            assert_eq!(percentile(&v, p), want, "p{p}");
        }
        let w = [5.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&w, 99.0), 4.9399999999999995);
        assert_eq!(percentile(&w, 50.0), 2.5);
        assert_eq!(percentile(&w, 33.3), 1.9989999999999999);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
        assert_eq!(median(&w), 2.5);
        assert_eq!(median(&v), 0.4);
        assert!((std_dev(&w) - 1.479019945774904).abs() < 1e-15);
    }

    #[test]
    fn tpot_is_decode_time_per_token_after_the_first() {
        assert_eq!(tpot(1.0, 0.2, 5), Some(0.2));
        assert_eq!(tpot(1.0, 0.2, 1), None);
        assert_eq!(tpot(1.0, 0.2, 0), None);
    }

    fn output(start: f64, ttft: f64, itl: Vec<f64>, tokens: Option<u64>) -> RequestOutput {
        let latency = ttft + itl.iter().sum::<f64>();
        RequestOutput {
            outcome: Outcome::Success,
            generated_text: "abc".into(),
            latency,
            output_tokens: tokens,
            ttft,
            itl,
            prompt_len: 10,
            error: String::new(),
            start_time: start,
            client_queue_time: 0.0,
        }
    }

    #[test]
    fn metrics_follow_vllm_arithmetic() {
        let tok = BenchTokenizer::builtin().unwrap();
        let mut failed = output(0.0, 0.0, vec![], None);
        failed.outcome = Outcome::Failed;
        let mut hung_up = output(0.0, 0.1, vec![], None);
        hung_up.outcome = Outcome::Disconnected;
        let outs = vec![
            output(0.0, 0.5, vec![0.25, 0.25], Some(3)),
            // Usage missing: the builtin tokenizer counts "abc" as 3 tokens;
            // two chunks carried them (ITL count != tokens - 1).
            output(0.5, 1.0, vec![1.0], None),
            failed,
            hung_up,
        ];
        let m = calculate(&outs, 2.0, &tok, &[50.0]);
        assert_eq!((m.completed, m.failed), (2, 1));
        assert_eq!(m.output_lens, vec![3, 3, 0, 0]);
        assert_eq!((m.total_input, m.total_output), (20, 6));
        assert_eq!(m.request_throughput, 1.0);
        assert_eq!(m.output_throughput, 3.0);
        assert_eq!(m.total_token_throughput, 13.0);
        assert_eq!(m.ttft.mean, 750.0);
        // TPOT: (1.0 - 0.5) / 2 and (2.0 - 1.0) / 2.
        assert_eq!(m.tpot.mean, 375.0);
        assert_eq!(m.tpot.percentiles, vec![(50.0, 375.0)]);
        // ITLs pooled: 0.25, 0.25, 1.0.
        assert_eq!(m.itl.median, 250.0);
        assert_eq!(m.itl.mean, 500.0);
        assert_eq!(m.e2el.mean, 1500.0);
        // Chunks at 0.5, 0.75 (second 0), 1.0, 1.5 (second 1) and 2.5;
        // both requests are active in seconds 0 and 1.
        assert_eq!(m.max_output_tokens_per_s, 2.0);
        assert_eq!(m.max_concurrent_requests, 2);
    }

    #[test]
    fn no_success_reports_zeros() {
        let tok = BenchTokenizer::builtin().unwrap();
        let m = calculate(&[], 1.0, &tok, &[99.0]);
        assert_eq!(m.ttft.percentiles, vec![(99.0, 0.0)]);
        assert_eq!(
            (m.max_output_tokens_per_s, m.max_concurrent_requests),
            (0.0, 0)
        );
    }
}
