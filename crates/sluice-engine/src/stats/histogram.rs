//! Histograms in Prometheus' shape: `Histogram` (inline bucket counts, so
//! observing and copying allocate nothing) and vLLM's bucket boundaries
//! (`vllm/v1/metrics/buckets.py` and the fixed sets of `loggers.py`).

use serde::Serialize;

/// vLLM's `REQUEST_LATENCY_BUCKETS` (e2e, queue, prefill, decode and
/// inference time), seconds.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's `TIME_TO_FIRST_TOKEN_BUCKETS`, seconds.
pub const TIME_TO_FIRST_TOKEN_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `INTER_TOKEN_LATENCY_BUCKETS` (also time per output token),
/// seconds.
pub const INTER_TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's `ITERATION_TOKENS_BUCKETS`: fixed, whatever the step budget.
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// vLLM's `REQUEST_PARAMS_N_BUCKETS`.
pub const REQUEST_PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// vLLM's `REQUEST_NUM_PREEMPTIONS_BUCKETS` (0 lands in `le="1.0"`).
pub const REQUEST_NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// Most bounds a histogram may have: the longest 1-2-5 series over a
/// `usize` `max_model_len` has 58, every fixed set fewer.
pub const MAX_BUCKETS: usize = 63;

/// vLLM's request-token buckets (`build_1_2_5_buckets`): 1, 2, 5, 10, 20,
/// 50, ... up to `max_model_len` included.
pub fn request_tokens_buckets(max_model_len: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            let Some(v) = m.checked_mul(scale).filter(|&v| v <= max_model_len) else {
                return out;
            };
            out.push(v as f64);
        }
        let Some(next) = scale.checked_mul(10) else {
            return out;
        };
        scale = next;
    }
}

/// A Prometheus histogram with at most `MAX_BUCKETS` bounds. The counts
/// live inline, so observing and copying a snapshot never allocate (the
/// bounds are copied only when they differ, i.e. on the first copy).
#[derive(Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds, ascending; `+Inf` is implicit.
    pub bounds: Vec<f64>,
    /// Observations per bucket, NOT cumulative; the first
    /// `bounds.len() + 1` are used (the last of those for
    /// `x > bounds[last]`), see `counts()`.
    counts: [u64; MAX_BUCKETS + 1],
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(&[])
    }
}

impl Serialize for Histogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Histogram", 4)?;
        st.serialize_field("bounds", &self.bounds)?;
        st.serialize_field("counts", self.counts())?;
        st.serialize_field("sum", &self.sum)?;
        st.serialize_field("count", &self.count)?;
        st.end()
    }
}

impl Clone for Histogram {
    fn clone(&self) -> Self {
        Histogram {
            bounds: self.bounds.clone(),
            counts: self.counts,
            sum: self.sum,
            count: self.count,
        }
    }

    fn clone_from(&mut self, src: &Self) {
        if self.bounds != src.bounds {
            self.bounds.clone_from(&src.bounds);
        }
        self.counts = src.counts;
        self.sum = src.sum;
        self.count = src.count;
    }
}

impl Histogram {
    /// A histogram over `bounds` (ascending); bounds past `MAX_BUCKETS` are
    /// dropped (no vLLM bucket set has that many).
    pub fn new(bounds: &[f64]) -> Self {
        Histogram {
            bounds: bounds[..bounds.len().min(MAX_BUCKETS)].to_vec(),
            counts: [0; MAX_BUCKETS + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Counts `x` in the first bucket whose bound is >= `x` (Prometheus'
    /// `le`, prometheus_client's `bisect_left`).
    pub fn observe(&mut self, x: f64) {
        let i = self.bounds.partition_point(|&b| b < x);
        self.counts[i] += 1;
        self.sum += x;
        self.count += 1;
    }

    /// Observations per bucket, not cumulative, `+Inf` last.
    pub fn counts(&self) -> &[u64] {
        &self.counts[..self.bounds.len() + 1]
    }

    /// Cumulative counts per bound (Prometheus `le` buckets), `+Inf` last.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts()
            .iter()
            .scan(0u64, |acc, &c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_le() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for x in [0.5, 1.0, 1.5, 3.0] {
            h.observe(x);
        }
        assert_eq!(h.counts(), &[2, 1, 1]);
        assert_eq!(h.cumulative(), vec![2, 3, 4]);
        assert_eq!(h.count, 4);
        assert_eq!(h.sum, 6.0);
    }

    #[test]
    fn token_buckets_follow_1_2_5() {
        assert_eq!(
            request_tokens_buckets(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(
            request_tokens_buckets(256),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0]
        );
        assert_eq!(request_tokens_buckets(4096).len(), 11);
        // The whole usize range fits the inline counts.
        let all = request_tokens_buckets(usize::MAX);
        assert!(all.len() <= MAX_BUCKETS, "{}", all.len());
        assert_eq!(Histogram::new(&all).bounds.len(), all.len());
    }
}
