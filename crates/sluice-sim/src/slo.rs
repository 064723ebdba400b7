//! Service-level objectives and goodput, as `vllm bench serve --goodput`
//! defines them.
//!
//! vLLM's rules: a request is *good* when it completed and each objective
//! given holds, inclusively (`metric ≤ objective`): TTFT = first token −
//! arrival, E2EL = finish − arrival, TPOT = (E2EL − TTFT) ÷ (output
//! tokens − 1), taken as 0 for a single-token output (so it always meets
//! a TPOT objective). Objectives are milliseconds, compared in seconds
//! (`ms / 1000`, as vLLM converts them). Request goodput = good requests ÷
//! benchmark duration. vLLM's objective names are exactly `ttft`, `tpot`,
//! `e2el`, any non-empty subset, each non-negative.
//!
//! sluice's addition is *attainment*: the fraction of all requests that
//! are good, and `Slo::meets`, true when it reaches `Slo::attainment`
//! (0.9 unless given: the 90% SLO attainment DistServe uses to define
//! goodput as the highest rate a system sustains). A request that never
//! finished counts against attainment.
//!
//! Text form (`--slo`): comma-separated `key=value` pairs, keys `ttft`,
//! `tpot`, `e2el` in milliseconds and `attainment` as a fraction in
//! (0, 1], e.g. `ttft=500,tpot=50,e2el=20000,attainment=0.95`. `key:value`
//! (vLLM's spelling) is accepted too.

use crate::sim::{RequestTimeline, SimResult};
use std::fmt;
use std::str::FromStr;

/// The default fraction of good requests `Slo::meets` asks for.
pub const DEFAULT_ATTAINMENT: f64 = 0.9;

/// Latency objectives in milliseconds (`None`: not constrained) and the
/// attainment a run must reach.
#[derive(Clone, Debug, PartialEq)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
    /// Fraction of requests that must be good, in (0, 1].
    pub attainment: f64,
}

impl Default for Slo {
    /// No objective: every completed request is good.
    fn default() -> Self {
        Slo {
            ttft_ms: None,
            tpot_ms: None,
            e2el_ms: None,
            attainment: DEFAULT_ATTAINMENT,
        }
    }
}

/// One request's latencies in seconds, as vLLM computes them; `None` for
/// a request that did not complete.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestLatency {
    pub ttft_s: f64,
    /// 0 for a single-token output.
    pub tpot_s: f64,
    pub e2el_s: f64,
}

impl RequestLatency {
    pub fn of(t: &RequestTimeline) -> Option<RequestLatency> {
        let (first, finish) = (t.first_token_s()?, t.finish_s?);
        let ttft_s = first - t.arrival_s;
        let e2el_s = finish - t.arrival_s;
        let n = t.token_times.len();
        let tpot_s = if n > 1 {
            (e2el_s - ttft_s) / (n - 1) as f64
        } else {
            0.0
        };
        Some(RequestLatency {
            ttft_s,
            tpot_s,
            e2el_s,
        })
    }
}

/// Good requests of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Goodput {
    /// Requests that completed within every objective.
    pub good: usize,
    /// Requests considered (completed or not).
    pub total: usize,
    /// `good ÷ duration_s` (0 for a zero duration).
    pub request_goodput: f64,
}

impl Goodput {
    /// `good ÷ total`; 0 when there were no requests.
    pub fn attainment(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.good as f64 / self.total as f64
        }
    }
}

fn within(metric_s: f64, objective_ms: Option<f64>) -> bool {
    // vLLM converts the objective to seconds and keeps `objective >= metric`.
    objective_ms.is_none_or(|ms| ms / 1000.0 >= metric_s)
}

impl Slo {
    /// Whether `t` completed within every objective.
    pub fn is_good(&self, t: &RequestTimeline) -> bool {
        RequestLatency::of(t).is_some_and(|l| {
            within(l.ttft_s, self.ttft_ms)
                && within(l.tpot_s, self.tpot_ms)
                && within(l.e2el_s, self.e2el_ms)
        })
    }

    /// Good requests among `requests` and their rate over `duration_s`
    /// (the benchmark's duration: vLLM's `request_goodput`).
    pub fn goodput(&self, requests: &[RequestTimeline], duration_s: f64) -> Goodput {
        let good = requests.iter().filter(|t| self.is_good(t)).count();
        Goodput {
            good,
            total: requests.len(),
            request_goodput: if duration_s > 0.0 {
                good as f64 / duration_s
            } else {
                0.0
            },
        }
    }

    /// `goodput` of a simulated run over its duration (t = 0 to the last
    /// finish, `SimReport::duration_s`).
    pub fn goodput_of(&self, result: &SimResult) -> Goodput {
        self.goodput(&result.requests, result.end_s)
    }

    /// Whether at least `self.attainment` of the requests were good.
    pub fn meets(&self, goodput: &Goodput) -> bool {
        goodput.total > 0 && goodput.attainment() >= self.attainment
    }
}

/// Why an SLO string did not parse.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SloError {
    #[error("empty SLO; expected e.g. `ttft=500,tpot=50`")]
    Empty,
    #[error("`{0}`: expected key=value")]
    NotAPair(String),
    #[error("unknown SLO key `{0}`; expected ttft, tpot, e2el (milliseconds) or attainment (a fraction)")]
    UnknownKey(String),
    #[error("SLO key `{0}` given twice")]
    Duplicate(String),
    #[error("SLO `{key}`: `{value}` is not a finite, non-negative number of milliseconds")]
    BadMillis { key: String, value: String },
    #[error("SLO `attainment`: `{0}` is not a fraction in (0, 1]")]
    BadAttainment(String),
    #[error("SLO has no objective; give at least one of ttft, tpot, e2el")]
    NoObjective,
}

impl FromStr for Slo {
    type Err = SloError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err(SloError::Empty);
        }
        let mut slo = Slo::default();
        let mut attainment_seen = false;
        for part in s.split(',') {
            let part = part.trim();
            let Some((key, value)) = part.split_once(['=', ':']) else {
                return Err(SloError::NotAPair(part.to_string()));
            };
            let (key, value) = (key.trim(), value.trim());
            let slot = match key {
                "ttft" => &mut slo.ttft_ms,
                "tpot" => &mut slo.tpot_ms,
                "e2el" => &mut slo.e2el_ms,
                "attainment" => {
                    if attainment_seen {
                        return Err(SloError::Duplicate(key.to_string()));
                    }
                    attainment_seen = true;
                    slo.attainment = value
                        .parse::<f64>()
                        .ok()
                        .filter(|a| *a > 0.0 && *a <= 1.0)
                        .ok_or_else(|| SloError::BadAttainment(value.to_string()))?;
                    continue;
                }
                _ => return Err(SloError::UnknownKey(key.to_string())),
            };
            if slot.is_some() {
                return Err(SloError::Duplicate(key.to_string()));
            }
            let ms = value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| SloError::BadMillis {
                    key: key.to_string(),
                    value: value.to_string(),
                })?;
            *slot = Some(ms);
        }
        if slo.ttft_ms.is_none() && slo.tpot_ms.is_none() && slo.e2el_ms.is_none() {
            return Err(SloError::NoObjective);
        }
        Ok(slo)
    }
}

impl fmt::Display for Slo {
    /// The text form `FromStr` reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for (key, v) in [
            ("ttft", self.ttft_ms),
            ("tpot", self.tpot_ms),
            ("e2el", self.e2el_ms),
        ] {
            if let Some(v) = v {
                write!(f, "{sep}{key}={v}")?;
                sep = ",";
            }
        }
        write!(f, "{sep}attainment={}", self.attainment)
    }
}
