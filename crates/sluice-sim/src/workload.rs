//! Synthetic workloads: `vllm bench serve --dataset-name random` lengths
//! and its Poisson / gamma arrivals, from a seed.
//!
//! The distributions and range rules are vLLM's (as reproduced in
//! `sluice-cli`'s bench): input and output lengths uniform over the closed
//! intervals `[floor(len·(1−r)), ceil(len·(1+r))]` (output at least 1),
//! gaps gamma-distributed with shape `burstiness` and mean `1/rate`, the
//! arrival times then scaled so the last one is `n/rate`; an infinite rate
//! sends everything at t = 0. The random stream is this crate's own
//! (SplitMix64), so the values differ from vLLM's NumPy stream while the
//! distributions match. Prompts are synthetic token ids; request `i`
//! belongs to prefix group `i % num_prefix_groups`, whose
//! `prefix_len` leading tokens it shares so prefix caching has hits.

use crate::sim::SimRequest;
use serde::{Deserialize, Serialize};

/// A small seeded generator (SplitMix64): deterministic across platforms.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform over the closed interval `[lo, hi]`.
    pub fn range_inclusive(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo) as u64 + 1;
        lo + (self.next_u64() % span) as usize
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64(); // (0, 1]: ln stays finite
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma(shape, scale) by Marsaglia–Tsang, with the `U^(1/shape)`
    /// boost for shape < 1.
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        if shape < 1.0 {
            let u = 1.0 - self.f64();
            return self.gamma(shape + 1.0, scale) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = 1.0 - self.f64();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }
}

/// The random dataset with its arrival process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RandomWorkload {
    pub num_prompts: usize,
    pub input_len: usize,
    pub output_len: usize,
    /// `--random-range-ratio`, for input and output.
    pub range_ratio: f64,
    /// Shared leading tokens per prefix group (`--random-prefix-len`).
    pub prefix_len: usize,
    /// Groups sharing a prefix; vLLM's random dataset has one.
    pub num_prefix_groups: usize,
    /// Requests per second; infinite sends all at t = 0.
    pub request_rate: f64,
    /// Gamma shape of the gaps; 1 is a Poisson process.
    pub burstiness: f64,
    pub seed: u64,
    /// Token ids are drawn below this.
    pub vocab: u32,
}

impl Default for RandomWorkload {
    fn default() -> Self {
        // vllm bench serve's defaults for the random dataset.
        RandomWorkload {
            num_prompts: 1000,
            input_len: 1024,
            output_len: 128,
            range_ratio: 0.0,
            prefix_len: 0,
            num_prefix_groups: 1,
            request_rate: f64::INFINITY,
            burstiness: 1.0,
            seed: 0,
            vocab: 32_000,
        }
    }
}

/// Why a workload cannot be generated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("{0} must be {1}")]
    Invalid(&'static str, &'static str),
}

impl RandomWorkload {
    /// The closed intervals of input and output lengths (vLLM's rule,
    /// with no special tokens: the simulator has no tokenizer).
    pub fn length_bounds(&self) -> ((usize, usize), (usize, usize)) {
        let r = self.range_ratio;
        let (i, o) = (self.input_len as f64, self.output_len as f64);
        (
            (
                (i * (1.0 - r)).floor() as usize,
                (i * (1.0 + r)).ceil() as usize,
            ),
            (
                ((o * (1.0 - r)).floor() as usize).max(1),
                ((o * (1.0 + r)).ceil() as usize).max(1),
            ),
        )
    }

    fn validate(&self) -> Result<(), WorkloadError> {
        use WorkloadError::Invalid;
        if !(0.0..1.0).contains(&self.range_ratio) {
            return Err(Invalid("range_ratio", "in [0, 1)"));
        }
        if self.request_rate.is_nan() || self.request_rate <= 0.0 {
            return Err(Invalid("request_rate", "positive"));
        }
        if self.burstiness.is_nan() || self.burstiness <= 0.0 {
            return Err(Invalid("burstiness", "positive"));
        }
        if self.num_prefix_groups == 0 {
            return Err(Invalid("num_prefix_groups", "at least 1"));
        }
        if self.vocab == 0 {
            return Err(Invalid("vocab", "at least 1"));
        }
        if self.prefix_len + self.length_bounds().0 .0 == 0 {
            return Err(Invalid("input_len", "large enough for a non-empty prompt"));
        }
        Ok(())
    }

    /// The requests, sorted by arrival; deterministic for the seed.
    pub fn generate(&self) -> Result<Vec<SimRequest>, WorkloadError> {
        self.validate()?;
        let mut rng = Rng::new(self.seed);
        let prefixes: Vec<Vec<u32>> = (0..self.num_prefix_groups)
            .map(|_| self.tokens(&mut rng, self.prefix_len))
            .collect();
        let ((ilo, ihi), (olo, ohi)) = self.length_bounds();
        let times = send_times(
            self.num_prompts,
            self.request_rate,
            self.burstiness,
            &mut rng,
        );
        let mut out = Vec::with_capacity(self.num_prompts);
        for (i, arrival_s) in times.into_iter().enumerate() {
            let input = rng.range_inclusive(ilo, ihi);
            let output_len = rng.range_inclusive(olo, ohi);
            let mut prompt = prefixes[i % self.num_prefix_groups].clone();
            prompt.extend(self.tokens(&mut rng, input));
            out.push(SimRequest::new(
                format!("{i}"),
                arrival_s,
                prompt,
                output_len,
            ));
        }
        Ok(out)
    }

    fn tokens(&self, rng: &mut Rng, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % self.vocab as u64) as u32)
            .collect()
    }
}

/// vLLM's arrival rule: cumulative gamma gaps scaled so the last arrival
/// is at `n / rate`; an infinite rate sends all at 0, an infinite
/// burstiness evenly.
pub fn send_times(n: usize, request_rate: f64, burstiness: f64, rng: &mut Rng) -> Vec<f64> {
    if request_rate.is_infinite() {
        return vec![0.0; n];
    }
    let mut t = 0.0;
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            t += if burstiness.is_infinite() {
                1.0 / request_rate
            } else {
                rng.gamma(burstiness, 1.0 / (request_rate * burstiness))
            };
            t
        })
        .collect();
    if let Some(&last) = times.last() {
        if last > 0.0 {
            let factor = (n as f64 / request_rate) / last;
            for x in &mut times {
                *x *= factor;
            }
        }
    }
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_stay_in_vllms_bounds() {
        let w = RandomWorkload {
            num_prompts: 500,
            input_len: 100,
            output_len: 10,
            range_ratio: 0.25,
            prefix_len: 5,
            ..RandomWorkload::default()
        };
        assert_eq!(w.length_bounds(), ((75, 125), (7, 13)));
        for r in w.generate().unwrap() {
            assert!((80..=130).contains(&r.prompt.len()));
            assert!((7..=13).contains(&r.output_len));
        }
    }

    #[test]
    fn gamma_mean_matches() {
        let mut rng = Rng::new(7);
        for shape in [0.5, 1.0, 4.0] {
            let n = 20_000;
            let m: f64 = (0..n).map(|_| rng.gamma(shape, 2.0)).sum::<f64>() / n as f64;
            assert!(
                (m - 2.0 * shape).abs() < 0.1 * shape.max(1.0),
                "{shape}: {m}"
            );
        }
    }

    #[test]
    fn arrivals_end_at_n_over_rate() {
        let t = send_times(100, 4.0, 1.0, &mut Rng::new(1));
        assert!((t[99] - 25.0).abs() < 1e-9);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(
            send_times(3, f64::INFINITY, 1.0, &mut Rng::new(1)),
            [0.0; 3]
        );
    }
}
