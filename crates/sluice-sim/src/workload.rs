//! Synthetic workloads: `vllm bench serve --dataset-name random` lengths
//! and its Poisson / gamma arrivals, from a seed.
//!
//! The default distributions and range rules are vLLM's (as reproduced in
//! `sluice-cli`'s bench): input and output lengths uniform over the closed
//! intervals `[floor(len·(1−r)), ceil(len·(1+r))]` (output at least 1),
//! gaps gamma-distributed with shape `burstiness` and mean `1/rate`, the
//! arrival times then scaled so the last one is `n/rate`; an infinite rate
//! sends everything at t = 0. The random stream is this crate's own
//! (SplitMix64), so the values differ from vLLM's NumPy stream while the
//! distributions match. Prompts are synthetic token ids.
//!
//! Beyond vLLM's random dataset:
//! - any [`LengthDist`] for input and output lengths (`input_dist`,
//!   `output_dist`);
//! - duration mode (`duration_s`): the arrival process runs unscaled at
//!   `request_rate` until the duration ends, so the request count is
//!   itself random (Poisson for burstiness 1); an infinite rate is refused;
//! - shared-prefix groups: `num_prefix_groups` system prompts of
//!   `prefix_len` tokens, each request picking one at random (seeded) or,
//!   with `PrefixGroupChoice::RoundRobin`, request `i` taking group
//!   `i % num_prefix_groups`.
//!
//! Promise: the same workload (seed included) generates the same requests
//! on every platform.

use crate::lengths::{LengthDist, LengthDistError};
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

    /// Exponential with this mean (inverse transform).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.f64()).ln()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
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

/// Most requests (or conversations) a generator makes (2^24): a duration
/// mode's `rate × duration` above it is refused before any allocation.
pub const MAX_GENERATED_REQUESTS: usize = 1 << 24;

/// Most tokens of one generated prompt or output (2^24, the scheduler's
/// `MAX_MODEL_LEN`): draws are clamped to it, so a mistyped distribution
/// cannot ask for an allocation without bound.
pub const MAX_GENERATED_LEN: usize = sluice_core::config::MAX_MODEL_LEN;
/// Most tokens over all shared prefixes or system prompts (2^26).
pub const MAX_SHARED_PREFIX_TOKENS: usize = 1 << 26;

/// How a request picks its shared-prefix group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixGroupChoice {
    /// Each request picks one of the groups uniformly at random (seeded).
    #[default]
    Random,
    /// Request `i` takes group `i % num_prefix_groups`.
    RoundRobin,
}

/// The random dataset with its arrival process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RandomWorkload {
    /// Requests to send; ignored in duration mode (`duration_s`).
    pub num_prompts: usize,
    /// `--random-input-len`: the default input distribution's length.
    pub input_len: usize,
    /// `--random-output-len`: the default output distribution's length.
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
    /// The prompt's own tokens (after the prefix); `None` is vLLM's
    /// `uniform:input_len,range_ratio`.
    #[serde(default)]
    pub input_dist: Option<LengthDist>,
    /// Output lengths; `None` is `uniform:output_len,range_ratio`.
    #[serde(default)]
    pub output_dist: Option<LengthDist>,
    /// Duration mode: arrivals at `request_rate` (gaps as below, not
    /// rescaled) for as long as they fall before `duration_s`.
    #[serde(default)]
    pub duration_s: Option<f64>,
    #[serde(default)]
    pub prefix_choice: PrefixGroupChoice,
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
            input_dist: None,
            output_dist: None,
            duration_s: None,
            prefix_choice: PrefixGroupChoice::Random,
        }
    }
}

/// Why a workload cannot be generated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("{0} must be {1}")]
    Invalid(&'static str, &'static str),
    /// A length distribution's parameters, with the field it was for.
    #[error("{field}: {source}")]
    Length {
        field: &'static str,
        source: LengthDistError,
    },
    #[error(
        "{what}: about {expected:.0} expected, more than the limit of {limit} \
         (lower the rate or the duration)"
    )]
    TooMany {
        what: &'static str,
        expected: f64,
        limit: usize,
    },
}

/// Validates `request_rate`, `burstiness` and an optional duration the same
/// way for every generator.
pub(crate) fn check_arrivals(
    rate_field: &'static str,
    rate: f64,
    burstiness: f64,
    duration_s: Option<f64>,
) -> Result<(), WorkloadError> {
    use WorkloadError::Invalid;
    if rate.is_nan() || rate <= 0.0 {
        return Err(Invalid(rate_field, "positive"));
    }
    if burstiness.is_nan() || burstiness <= 0.0 {
        return Err(Invalid("burstiness", "positive"));
    }
    if let Some(d) = duration_s {
        if !(d.is_finite() && d > 0.0) {
            return Err(Invalid("duration_s", "finite and positive"));
        }
        if rate.is_infinite() {
            return Err(Invalid(
                rate_field,
                "finite with a duration (an infinite rate sends everything at t = 0)",
            ));
        }
    }
    Ok(())
}

impl RandomWorkload {
    /// The closed intervals of the default uniform input and output
    /// lengths (vLLM's rule, with no special tokens: the simulator has no
    /// tokenizer). With `input_dist` / `output_dist` set, those rule.
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

    /// The input distribution in effect.
    pub fn input_lengths(&self) -> LengthDist {
        self.input_dist.clone().unwrap_or(LengthDist::Uniform {
            len: self.input_len,
            range_ratio: self.range_ratio,
        })
    }

    /// The output distribution in effect.
    pub fn output_lengths(&self) -> LengthDist {
        self.output_dist.clone().unwrap_or(LengthDist::Uniform {
            len: self.output_len,
            range_ratio: self.range_ratio,
        })
    }

    fn validate(&self) -> Result<(), WorkloadError> {
        use WorkloadError::Invalid;
        if !(0.0..1.0).contains(&self.range_ratio) {
            return Err(Invalid("range_ratio", "in [0, 1)"));
        }
        check_arrivals(
            "request_rate",
            self.request_rate,
            self.burstiness,
            self.duration_s,
        )?;
        if self.num_prefix_groups == 0 {
            return Err(Invalid("num_prefix_groups", "at least 1"));
        }
        if self.prefix_len > MAX_GENERATED_LEN
            || self.prefix_len.saturating_mul(self.num_prefix_groups) > MAX_SHARED_PREFIX_TOKENS
        {
            return Err(Invalid(
                "prefix_len × num_prefix_groups",
                "at most 2^26 tokens (and prefix_len at most 2^24)",
            ));
        }
        if self.duration_s.is_none() && self.num_prompts > MAX_GENERATED_REQUESTS {
            return Err(WorkloadError::TooMany {
                what: "requests",
                expected: self.num_prompts as f64,
                limit: MAX_GENERATED_REQUESTS,
            });
        }
        if self.vocab == 0 {
            return Err(Invalid("vocab", "at least 1"));
        }
        let input = self.input_lengths();
        input.validate().map_err(|source| WorkloadError::Length {
            field: "input lengths",
            source,
        })?;
        self.output_lengths()
            .validate()
            .map_err(|source| WorkloadError::Length {
                field: "output lengths",
                source,
            })?;
        if let Some((lo, _)) = input.uniform_bounds() {
            if self.prefix_len + lo == 0 {
                return Err(Invalid("input_len", "large enough for a non-empty prompt"));
            }
        }
        if let Some(d) = self.duration_s {
            let expected = self.request_rate * d;
            if expected > MAX_GENERATED_REQUESTS as f64 {
                return Err(WorkloadError::TooMany {
                    what: "requests",
                    expected,
                    limit: MAX_GENERATED_REQUESTS,
                });
            }
        }
        Ok(())
    }

    /// The requests, sorted by arrival; deterministic for the seed.
    ///
    /// Input lengths: the uniform kind keeps vLLM's exact interval (which
    /// may reach 0 when a prefix keeps the prompt non-empty); the other
    /// kinds draw at least 1. Outputs are at least 1. Both are at most
    /// `MAX_GENERATED_LEN`.
    pub fn generate(&self) -> Result<Vec<SimRequest>, WorkloadError> {
        self.validate()?;
        let mut rng = Rng::new(self.seed);
        let prefixes: Vec<Vec<u32>> = (0..self.num_prefix_groups)
            .map(|_| random_tokens(&mut rng, self.prefix_len, self.vocab))
            .collect();
        let (input, output) = (self.input_lengths(), self.output_lengths());
        let input_min = if input.uniform_bounds().is_some() {
            0
        } else {
            1
        };
        let times = match self.duration_s {
            Some(d) => arrivals_until(
                d,
                self.request_rate,
                self.burstiness,
                &mut rng,
                MAX_GENERATED_REQUESTS,
            )
            .map_err(|_| WorkloadError::TooMany {
                what: "requests",
                expected: self.request_rate * d,
                limit: MAX_GENERATED_REQUESTS,
            })?,
            None => send_times(
                self.num_prompts,
                self.request_rate,
                self.burstiness,
                &mut rng,
            ),
        };
        // The group picks draw from a stream of their own, so the lengths,
        // tokens and arrivals of a seed do not depend on how prefix groups
        // are chosen.
        let mut group_rng = Rng::new(Rng::new(self.seed ^ 0x6A09_E667_F3BC_C909).next_u64());
        let mut out = Vec::with_capacity(times.len());
        for (i, arrival_s) in times.into_iter().enumerate() {
            let input_len = input.sample_in(&mut rng, input_min, MAX_GENERATED_LEN);
            let output_len = output.sample(&mut rng, MAX_GENERATED_LEN);
            let group = match self.prefix_choice {
                PrefixGroupChoice::RoundRobin => i % self.num_prefix_groups,
                PrefixGroupChoice::Random => {
                    group_rng.range_inclusive(0, self.num_prefix_groups - 1)
                }
            };
            let mut prompt = prefixes[group].clone();
            prompt.extend(random_tokens(&mut rng, input_len, self.vocab));
            out.push(SimRequest::new(
                format!("{i}"),
                arrival_s,
                prompt,
                output_len,
            ));
        }
        Ok(out)
    }
}

/// `n` token ids uniform below `vocab` (at least 1).
pub fn random_tokens(rng: &mut Rng, n: usize, vocab: u32) -> Vec<u32> {
    let vocab = u64::from(vocab.max(1));
    (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect()
}

/// One gap of the arrival process: gamma with shape `burstiness` and mean
/// `1 / rate` (exponential at burstiness 1); even at infinite burstiness.
pub fn arrival_gap(request_rate: f64, burstiness: f64, rng: &mut Rng) -> f64 {
    if burstiness.is_infinite() {
        1.0 / request_rate
    } else {
        rng.gamma(burstiness, 1.0 / (request_rate * burstiness))
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
            t += arrival_gap(request_rate, burstiness, rng);
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

/// Duration mode: the arrival process itself, unscaled. Arrival `k` is
/// the sum of `k` gaps (the first after one gap, as in `send_times`), kept
/// while it is before `duration_s`. More than `limit` arrivals is an
/// error (`Err(limit)`). The rate must be finite and positive.
pub fn arrivals_until(
    duration_s: f64,
    request_rate: f64,
    burstiness: f64,
    rng: &mut Rng,
    limit: usize,
) -> Result<Vec<f64>, usize> {
    let mut times = Vec::new();
    if !(request_rate.is_finite() && request_rate > 0.0) {
        return Ok(times);
    }
    let mut t = 0.0;
    loop {
        t += arrival_gap(request_rate, burstiness, rng);
        if t >= duration_s {
            return Ok(times);
        }
        if times.len() == limit {
            return Err(limit);
        }
        times.push(t);
    }
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
    fn older_serialised_workloads_still_load() {
        // The fields before length distributions and duration mode.
        let json = r#"{"num_prompts": 3, "input_len": 8, "output_len": 2, "range_ratio": 0.0,
            "prefix_len": 0, "num_prefix_groups": 1, "request_rate": 1.0, "burstiness": 1.0,
            "seed": 0, "vocab": 100}"#;
        let w: RandomWorkload = serde_json::from_str(json).unwrap();
        assert_eq!(w.input_dist, None);
        assert_eq!(w.prefix_choice, PrefixGroupChoice::Random);
        assert_eq!(w.generate().unwrap().len(), 3);
    }

    #[test]
    fn sizes_are_bounded() {
        let e = RandomWorkload {
            prefix_len: 1 << 20,
            num_prefix_groups: 1 << 10,
            ..RandomWorkload::default()
        }
        .generate()
        .unwrap_err();
        assert!(e
            .to_string()
            .starts_with("prefix_len × num_prefix_groups must be at most"));
        let e = RandomWorkload {
            num_prompts: usize::MAX,
            ..RandomWorkload::default()
        }
        .generate()
        .unwrap_err();
        assert!(matches!(e, WorkloadError::TooMany { .. }), "{e}");
        // A mistyped distribution is clamped, not allocated without bound.
        let d = LengthDist::Normal {
            mean: 1e30,
            std: 1.0,
        };
        assert_eq!(
            d.sample(&mut Rng::new(0), MAX_GENERATED_LEN),
            MAX_GENERATED_LEN
        );
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
