//! The fitted step-time model: a step's features, the coefficients that
//! price them, and the pieces (by phase or by token bucket) a model
//! predicts with.

use super::*;

/// The number of features.
pub const NUM_FEATURES: usize = 7;

/// Feature names, in the order of [`StepFeatures::as_array`] and
/// [`Coefficients::as_array`].
pub const FEATURE_NAMES: [&str; NUM_FEATURES] = [
    "intercept",
    "prefill_tokens",
    "decode_tokens",
    "rows",
    "prefill_attention_pairs",
    "decode_context",
    "sampling_rows",
];

/// The least a fitted model predicts, seconds.
pub const MIN_PREDICTION_S: f64 = 1e-6;

/// The features of one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepFeatures {
    pub prefill_tokens: f64,
    pub decode_tokens: f64,
    pub rows: f64,
    pub prefill_attention_pairs: f64,
    pub decode_context: f64,
    pub sampling_rows: f64,
    /// Tokens of the step, for `by_tokens` pieces.
    pub total_tokens: usize,
    /// No prefill row (an empty step counts as decode-only).
    pub decode_only: bool,
}

impl StepFeatures {
    pub fn of(step: &StepShape) -> StepFeatures {
        let mut f = StepFeatures {
            rows: step.rows.len() as f64,
            total_tokens: step.total_tokens(),
            decode_only: true,
            ..StepFeatures::default()
        };
        for r in &step.rows {
            let (n, c) = (r.new_tokens as f64, r.context_before as f64);
            if r.is_decode() {
                f.decode_tokens += n;
                f.decode_context += c + n;
            } else {
                f.decode_only = false;
                f.prefill_tokens += n;
                f.prefill_attention_pairs += n * c + n * (n + 1.0) / 2.0;
            }
            if r.samples {
                f.sampling_rows += 1.0;
            }
        }
        f
    }

    /// The features in [`FEATURE_NAMES`] order, the intercept's 1 first.
    pub fn as_array(&self) -> [f64; NUM_FEATURES] {
        [
            1.0,
            self.prefill_tokens,
            self.decode_tokens,
            self.rows,
            self.prefill_attention_pairs,
            self.decode_context,
            self.sampling_rows,
        ]
    }
}

/// Seconds per unit of each feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Coefficients {
    pub intercept_s: f64,
    pub per_prefill_token_s: f64,
    pub per_decode_token_s: f64,
    pub per_row_s: f64,
    pub per_prefill_attention_pair_s: f64,
    pub per_decode_context_token_s: f64,
    pub per_sampling_row_s: f64,
}

impl Coefficients {
    /// The JSON names, in [`FEATURE_NAMES`] order.
    pub const NAMES: [&'static str; NUM_FEATURES] = [
        "intercept_s",
        "per_prefill_token_s",
        "per_decode_token_s",
        "per_row_s",
        "per_prefill_attention_pair_s",
        "per_decode_context_token_s",
        "per_sampling_row_s",
    ];

    pub fn as_array(&self) -> [f64; NUM_FEATURES] {
        [
            self.intercept_s,
            self.per_prefill_token_s,
            self.per_decode_token_s,
            self.per_row_s,
            self.per_prefill_attention_pair_s,
            self.per_decode_context_token_s,
            self.per_sampling_row_s,
        ]
    }

    pub fn from_array(a: [f64; NUM_FEATURES]) -> Coefficients {
        Coefficients {
            intercept_s: a[0],
            per_prefill_token_s: a[1],
            per_decode_token_s: a[2],
            per_row_s: a[3],
            per_prefill_attention_pair_s: a[4],
            per_decode_context_token_s: a[5],
            per_sampling_row_s: a[6],
        }
    }

    /// Σ coefficient × feature (not floored).
    pub fn dot(&self, f: &StepFeatures) -> f64 {
        self.as_array()
            .iter()
            .zip(f.as_array())
            .map(|(c, x)| c * x)
            .sum()
    }
}

/// How a fitted model splits steps into pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Segmentation {
    /// One coefficient set.
    Single,
    /// Decode-only steps and steps with prefill.
    ByPhase,
    /// Total-token buckets.
    ByTokens,
}

impl Segmentation {
    pub const ALL: [Segmentation; 3] = [
        Segmentation::Single,
        Segmentation::ByPhase,
        Segmentation::ByTokens,
    ];
}

/// The time a model predicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitTarget {
    /// The whole engine step (`StepRecord::step_s`): what the simulator's
    /// clock advances by.
    #[default]
    StepS,
    /// The executor's forward pass only (`StepRecord::forward_s`).
    ForwardS,
}

impl FitTarget {
    pub(super) fn of(self, r: &StepRecord) -> f64 {
        match self {
            FitTarget::StepS => r.step_s,
            FitTarget::ForwardS => r.forward_s,
        }
    }
}

/// One coefficient set and the steps it applies to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Piece {
    /// `Some(true)`: decode-only steps; `Some(false)`: steps with a
    /// prefill row; absent: either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_only: Option<bool>,
    /// Steps of at least this many tokens.
    #[serde(default)]
    pub min_tokens: usize,
    /// Steps of at most this many tokens (absent: no bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    pub coefficients: Coefficients,
    /// Training steps this piece was fitted on (0: too few of its own, so
    /// it holds the coefficients fitted on all steps).
    #[serde(default)]
    pub train_steps: usize,
}

impl Piece {
    pub(super) fn matches(&self, f: &StepFeatures) -> bool {
        self.decode_only.is_none_or(|d| d == f.decode_only)
            && f.total_tokens >= self.min_tokens
            && self.max_tokens.is_none_or(|m| f.total_tokens <= m)
    }
}

/// A fitted step-time model: the first piece that matches a step
/// predicts it (the last piece when none does).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedModel {
    pub segmentation: Segmentation,
    #[serde(default)]
    pub target: FitTarget,
    pub pieces: Vec<Piece>,
}

impl FittedModel {
    /// The piece for `f`.
    pub fn piece(&self, f: &StepFeatures) -> Option<&Piece> {
        self.pieces
            .iter()
            .find(|p| p.matches(f))
            .or(self.pieces.last())
    }

    /// Predicted seconds for a step with features `f`.
    pub fn predict_features(&self, f: &StepFeatures) -> f64 {
        let t = self.piece(f).map_or(0.0, |p| p.coefficients.dot(f));
        t.max(MIN_PREDICTION_S)
    }

    /// At least one piece; every coefficient finite and non-negative.
    /// Errors name the piece and coefficient.
    pub fn validate(&self) -> Result<(), String> {
        if self.pieces.is_empty() {
            return Err("`pieces`: expected at least one piece".into());
        }
        for (i, p) in self.pieces.iter().enumerate() {
            for (name, v) in Coefficients::NAMES.iter().zip(p.coefficients.as_array()) {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!(
                        "`pieces[{i}].coefficients.{name}`: {v}, expected a non-negative number"
                    ));
                }
            }
            if p.max_tokens.is_some_and(|m| m < p.min_tokens) {
                return Err(format!(
                    "`pieces[{i}]`: `max_tokens` is below `min_tokens` {}",
                    p.min_tokens
                ));
            }
        }
        Ok(())
    }
}

impl StepTimeModel for FittedModel {
    fn step_time(&self, step: &StepShape) -> f64 {
        self.predict_features(&StepFeatures::of(step))
    }
}
