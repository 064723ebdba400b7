//! A step-time model fitted to measured steps: a step log (`sluice serve
//! --step-log`, one [`StepRecord`] a line) in, a [`FittedModel`] and how
//! well it predicts steps it was not fitted on out.
//!
//! The model is linear in seven features of a step ([`StepFeatures`]),
//! each with a cost that cannot be negative:
//! - `intercept`: the fixed cost of a step (scheduling, launches);
//! - `prefill_tokens`, `decode_tokens`: tokens computed by prefill rows
//!   and by decode rows (one per decode row); the GEMMs' share;
//! - `rows`: scheduled requests (per-request input preparation,
//!   attention metadata);
//! - `prefill_attention_pairs`: Σ over prefill rows of `n·c + n(n+1)/2`
//!   (query-key pairs of a chunk of `n` tokens on `c` cached ones), the
//!   compute-bound attention of prefill;
//! - `decode_context`: Σ over decode rows of the context they attend to
//!   (`c + 1`), the memory-bound KV reads of decode;
//! - `sampling_rows`: rows that sample (LM head, sampler).
//!
//! "Piecewise where it helps": besides one coefficient set for all steps
//! (`single`), a fit may keep one set for decode-only steps and one for
//! steps with prefill (`by_phase`), or one per total-token bucket
//! (`by_tokens`, bucket edges at the training steps' quantiles). Which
//! one is chosen by error on steps none of them was fitted on.
//!
//! Protocol of [`fit`], deterministic for its input: records are taken in
//! log order after `skip_first_steps` (warm-up: compilation, CUDA-graph
//! capture), less those whose target time is not a positive number; every
//! `held_out_every`-th of them (the 5th, 10th, … by default) is held out
//! and used for nothing but the reported errors. Every 4th remaining step
//! is a validation step: each segmentation is fitted on the rest and
//! scored on those, the best (lowest MAPE; the simpler on a tie) is
//! refitted on all training steps, and the held-out errors of that final
//! model are reported, so the selection never sees a held-out step.
//!
//! Solver: non-negative least squares (Lawson and Hanson's active-set
//! method on the normal equations, solved by Cholesky), by default on
//! relative errors (each step weighted by 1 / its time, since the report
//! is in percent and steps range over two orders of magnitude). Columns
//! are scaled to unit RMS first, and a ridge of 1e-9 of the diagonal keeps
//! collinear features solvable (in a decode-only log `decode_tokens`,
//! `rows` and `sampling_rows` are the same number); it changes no
//! well-posed fit measurably. With non-negative coefficients on
//! non-negative features a prediction is never negative; it is floored at
//! one microsecond so that it is always positive.

use crate::metrics::percentile;
use crate::step::{StepShape, StepTimeModel};
use crate::steplog::StepRecord;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
    fn of(self, r: &StepRecord) -> f64 {
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
    fn matches(&self, f: &StepFeatures) -> bool {
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

/// How [`fit`] works; `Default` is the documented protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FitOptions {
    pub target: FitTarget,
    /// Every this-many-th usable step is held out (at least 2).
    pub held_out_every: usize,
    /// Leading records to ignore (warm-up).
    pub skip_first_steps: usize,
    /// Minimise relative (true) or absolute squared error.
    pub relative_error: bool,
    /// Buckets of a `by_tokens` fit (at least 2).
    pub token_buckets: usize,
    /// The segmentations to try (all by default).
    pub segmentations: Vec<Segmentation>,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            target: FitTarget::StepS,
            held_out_every: 5,
            skip_first_steps: 0,
            relative_error: true,
            token_buckets: 3,
            segmentations: Segmentation::ALL.to_vec(),
        }
    }
}

/// One segmentation's score on the validation steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateScore {
    pub segmentation: Segmentation,
    pub validation_mape_pct: f64,
}

/// What [`fit`] made and how well it does on held-out steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FitReport {
    pub model: FittedModel,
    pub train_steps: usize,
    pub held_out_steps: usize,
    /// Records left out: warm-up and non-positive times.
    pub skipped_steps: usize,
    /// Mean absolute percentage error on the held-out steps.
    pub held_out_mape_pct: f64,
    pub held_out_median_ape_pct: f64,
    pub held_out_p90_ape_pct: f64,
    /// Coefficient of determination on the held-out steps (`None` when
    /// their times are all equal).
    pub held_out_r2: Option<f64>,
    /// Every segmentation tried, in order; empty when there were too few
    /// steps to validate and `single` was taken.
    pub candidates: Vec<CandidateScore>,
}

/// Why a fit could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error(
        "{usable} usable steps ({skipped} skipped): at least {needed} are needed to fit {NUM_FEATURES} coefficients and hold some out"
    )]
    TooFewSteps {
        usable: usize,
        skipped: usize,
        needed: usize,
    },
    #[error("fit options: {0}")]
    BadOption(String),
}

/// One step as the solver sees it.
#[derive(Clone, Copy, Debug)]
struct Sample {
    f: StepFeatures,
    y: f64,
}

/// Fits a model to `records` as the module doc describes.
pub fn fit(records: &[StepRecord], options: &FitOptions) -> Result<FitReport, FitError> {
    if options.held_out_every < 2 {
        return Err(FitError::BadOption(format!(
            "`held_out_every` {}: expected at least 2",
            options.held_out_every
        )));
    }
    if options.token_buckets < 2 {
        return Err(FitError::BadOption(format!(
            "`token_buckets` {}: expected at least 2",
            options.token_buckets
        )));
    }
    if options.segmentations.is_empty() {
        return Err(FitError::BadOption("`segmentations` is empty".into()));
    }
    let mut skipped = records.len().min(options.skip_first_steps);
    let mut samples = Vec::with_capacity(records.len());
    for r in records.iter().skip(options.skip_first_steps) {
        let y = options.target.of(r);
        if y.is_finite() && y > 0.0 {
            samples.push(Sample {
                f: StepFeatures::of(&r.shape()),
                y,
            });
        } else {
            skipped += 1;
        }
    }
    let k = options.held_out_every;
    let (mut train, mut held_out) = (Vec::new(), Vec::new());
    for (i, s) in samples.iter().enumerate() {
        if i % k == k - 1 {
            held_out.push(*s);
        } else {
            train.push(*s);
        }
    }
    let needed_train = NUM_FEATURES + 1;
    if train.len() < needed_train || held_out.is_empty() {
        // The smallest log with that many training steps and one held out.
        let needed = (needed_train * k).div_ceil(k - 1).max(k);
        return Err(FitError::TooFewSteps {
            usable: samples.len(),
            skipped,
            needed,
        });
    }

    // Segmentation choice on validation steps carved from the training
    // steps only.
    let (mut fit_part, mut validation) = (Vec::new(), Vec::new());
    for (i, s) in train.iter().enumerate() {
        if i % 4 == 3 {
            validation.push(*s);
        } else {
            fit_part.push(*s);
        }
    }
    let mut candidates = Vec::new();
    let mut chosen = Segmentation::Single;
    if fit_part.len() >= 2 * NUM_FEATURES && !validation.is_empty() {
        let mut best = f64::INFINITY;
        for &seg in &options.segmentations {
            let Some(model) = fit_segmentation(&fit_part, seg, options) else {
                continue;
            };
            let mape = errors(&model, &validation).mape;
            candidates.push(CandidateScore {
                segmentation: seg,
                validation_mape_pct: mape,
            });
            // Strictly better only: on a tie the earlier (simpler) stays.
            if mape < best {
                best = mape;
                chosen = seg;
            }
        }
    } else if let Some(&first) = options.segmentations.first() {
        chosen = first;
    }
    let model = fit_segmentation(&train, chosen, options)
        .or_else(|| fit_segmentation(&train, Segmentation::Single, options))
        .unwrap_or_else(|| single(&train, options, Segmentation::Single));
    let e = errors(&model, &held_out);
    Ok(FitReport {
        model,
        train_steps: train.len(),
        held_out_steps: held_out.len(),
        skipped_steps: skipped,
        held_out_mape_pct: e.mape,
        held_out_median_ape_pct: e.median,
        held_out_p90_ape_pct: e.p90,
        held_out_r2: e.r2,
        candidates,
    })
}

struct Errors {
    mape: f64,
    median: f64,
    p90: f64,
    r2: Option<f64>,
}

fn errors(model: &FittedModel, samples: &[Sample]) -> Errors {
    let ape: Vec<f64> = samples
        .iter()
        .map(|s| (model.predict_features(&s.f) - s.y).abs() / s.y * 100.0)
        .collect();
    let n = samples.len().max(1) as f64;
    let mean_y = samples.iter().map(|s| s.y).sum::<f64>() / n;
    let ss_tot: f64 = samples.iter().map(|s| (s.y - mean_y).powi(2)).sum();
    let ss_res: f64 = samples
        .iter()
        .map(|s| (model.predict_features(&s.f) - s.y).powi(2))
        .sum();
    Errors {
        mape: ape.iter().sum::<f64>() / n,
        median: percentile(&ape, 50.0),
        p90: percentile(&ape, 90.0),
        r2: (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot),
    }
}

/// A piece needs this many steps of its own, else it takes the
/// coefficients fitted on all steps.
const MIN_PIECE_STEPS: usize = 2 * NUM_FEATURES;

fn single(samples: &[Sample], options: &FitOptions, seg: Segmentation) -> FittedModel {
    FittedModel {
        segmentation: seg,
        target: options.target,
        pieces: vec![Piece {
            decode_only: None,
            min_tokens: 0,
            max_tokens: None,
            coefficients: solve(samples, options.relative_error),
            train_steps: samples.len(),
        }],
    }
}

/// A model of segmentation `seg` fitted on `samples`; `None` when the
/// segmentation does not apply (one phase or one token bucket only).
fn fit_segmentation(
    samples: &[Sample],
    seg: Segmentation,
    options: &FitOptions,
) -> Option<FittedModel> {
    let rel = options.relative_error;
    let global = || solve(samples, rel);
    let piece =
        |decode_only: Option<bool>, min: usize, max: Option<usize>, global: &Coefficients| {
            let mut p = Piece {
                decode_only,
                min_tokens: min,
                max_tokens: max,
                coefficients: *global,
                train_steps: 0,
            };
            let mine: Vec<Sample> = samples
                .iter()
                .copied()
                .filter(|s| p.matches(&s.f))
                .collect();
            if mine.len() >= MIN_PIECE_STEPS {
                p.coefficients = solve(&mine, rel);
                p.train_steps = mine.len();
            }
            p
        };
    match seg {
        Segmentation::Single => Some(single(samples, options, seg)),
        Segmentation::ByPhase => {
            let decode = samples.iter().filter(|s| s.f.decode_only).count();
            if decode == 0 || decode == samples.len() {
                return None;
            }
            let g = global();
            Some(FittedModel {
                segmentation: seg,
                target: options.target,
                pieces: vec![
                    piece(Some(true), 0, None, &g),
                    piece(Some(false), 0, None, &g),
                ],
            })
        }
        Segmentation::ByTokens => {
            let tokens: Vec<f64> = samples.iter().map(|s| s.f.total_tokens as f64).collect();
            let b = options.token_buckets;
            let mut edges: Vec<usize> = (1..b)
                .map(|i| percentile(&tokens, 100.0 * i as f64 / b as f64).floor() as usize)
                .collect();
            edges.dedup();
            let max = samples.iter().map(|s| s.f.total_tokens).max().unwrap_or(0);
            edges.retain(|&e| e < max);
            if edges.is_empty() {
                return None;
            }
            let g = global();
            let mut pieces = Vec::with_capacity(edges.len() + 1);
            let mut lo = 0;
            for &e in &edges {
                pieces.push(piece(None, lo, Some(e), &g));
                lo = e + 1;
            }
            pieces.push(piece(None, lo, None, &g));
            Some(FittedModel {
                segmentation: seg,
                target: options.target,
                pieces,
            })
        }
    }
}

/// Non-negative least squares of `samples`' times on their features.
fn solve(samples: &[Sample], relative: bool) -> Coefficients {
    let p = NUM_FEATURES;
    let rows: Vec<([f64; NUM_FEATURES], f64)> = samples
        .iter()
        .map(|s| {
            let w = if relative { 1.0 / s.y } else { 1.0 };
            let mut x = s.f.as_array();
            x.iter_mut().for_each(|v| *v *= w);
            (x, s.y * w)
        })
        .collect();
    // Scale each column to unit RMS so that seconds-per-token and
    // seconds-per-pair coefficients meet the solver on equal terms.
    let n = rows.len().max(1) as f64;
    let mut scale = [0.0; NUM_FEATURES];
    for (x, _) in &rows {
        for j in 0..p {
            scale[j] += x[j] * x[j];
        }
    }
    scale.iter_mut().for_each(|s| *s = (*s / n).sqrt());
    let mut g = vec![vec![0.0; p]; p];
    let mut h = vec![0.0; p];
    for (x, y) in &rows {
        for i in 0..p {
            if scale[i] == 0.0 {
                continue;
            }
            let xi = x[i] / scale[i];
            h[i] += xi * y;
            for j in 0..p {
                if scale[j] != 0.0 {
                    g[i][j] += xi * x[j] / scale[j];
                }
            }
        }
    }
    let usable: Vec<bool> = scale.iter().map(|&s| s > 0.0 && s.is_finite()).collect();
    let z = nnls_gram(&g, &h, &usable);
    let mut c = [0.0; NUM_FEATURES];
    for j in 0..p {
        if usable[j] {
            c[j] = z[j] / scale[j];
        }
    }
    Coefficients::from_array(c)
}

/// Lawson–Hanson NNLS on the normal equations: minimises `xᵀGx − 2hᵀx`
/// over `x ≥ 0` (and `x_j = 0` where `!usable[j]`).
pub(crate) fn nnls_gram(g: &[Vec<f64>], h: &[f64], usable: &[bool]) -> Vec<f64> {
    let p = h.len();
    let mut x = vec![0.0; p];
    let mut passive = vec![false; p];
    let scale = h.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-300);
    let tol = 1e-12 * scale;
    for _ in 0..10 * p {
        // Gradient of the objective's negative half: h − Gx.
        let w: Vec<f64> = (0..p)
            .map(|i| h[i] - (0..p).map(|j| g[i][j] * x[j]).sum::<f64>())
            .collect();
        let Some(j) = (0..p)
            .filter(|&j| usable[j] && !passive[j] && w[j] > tol)
            .max_by(|&a, &b| w[a].total_cmp(&w[b]))
        else {
            break;
        };
        passive[j] = true;
        for _ in 0..10 * p {
            let z = solve_passive(g, h, &passive);
            if (0..p).all(|i| !passive[i] || z[i] > 0.0) {
                x = z;
                break;
            }
            // Step from x toward z as far as feasibility allows, and drop
            // the coefficients that reach zero.
            let alpha = (0..p)
                .filter(|&i| passive[i] && z[i] <= 0.0)
                .map(|i| x[i] / (x[i] - z[i]))
                .fold(f64::INFINITY, f64::min);
            let alpha = if alpha.is_finite() { alpha } else { 0.0 };
            for i in 0..p {
                x[i] += alpha * (z[i] - x[i]);
                if passive[i] && x[i] <= 1e-15 * scale.max(1.0) {
                    passive[i] = false;
                    x[i] = 0.0;
                }
            }
        }
    }
    x.iter_mut().for_each(|v| *v = v.max(0.0));
    x
}

/// The unconstrained least-squares solution on the passive set (zeros
/// elsewhere), by Cholesky with a small ridge.
fn solve_passive(g: &[Vec<f64>], h: &[f64], passive: &[bool]) -> Vec<f64> {
    let idx: Vec<usize> = (0..h.len()).filter(|&i| passive[i]).collect();
    let k = idx.len();
    let mut out = vec![0.0; h.len()];
    if k == 0 {
        return out;
    }
    let diag = idx
        .iter()
        .map(|&i| g[i][i])
        .fold(0.0f64, f64::max)
        .max(1e-300);
    let mut ridge = 1e-9 * diag;
    for _ in 0..6 {
        let mut a: Vec<Vec<f64>> = idx
            .iter()
            .map(|&i| idx.iter().map(|&j| g[i][j]).collect())
            .collect();
        for (d, row) in a.iter_mut().enumerate() {
            row[d] += ridge;
        }
        let b: Vec<f64> = idx.iter().map(|&i| h[i]).collect();
        if let Some(z) = cholesky_solve(&mut a, &b) {
            for (t, &i) in idx.iter().enumerate() {
                out[i] = z[t];
            }
            return out;
        }
        ridge *= 1000.0;
    }
    out
}

/// Solves `a z = b` for symmetric positive-definite `a` (overwritten
/// with its Cholesky factor); `None` when a pivot is not positive.
// Index loops read as the textbook recurrences; iterators would not.
#[allow(clippy::needless_range_loop)]
pub(crate) fn cholesky_solve(a: &mut [Vec<f64>], b: &[f64]) -> Option<Vec<f64>> {
    let k = b.len();
    for j in 0..k {
        let mut d = a[j][j];
        for t in 0..j {
            d -= a[j][t] * a[j][t];
        }
        if !(d > 0.0 && d.is_finite()) {
            return None;
        }
        let d = d.sqrt();
        a[j][j] = d;
        for i in j + 1..k {
            let mut s = a[i][j];
            for t in 0..j {
                s -= a[i][t] * a[j][t];
            }
            a[i][j] = s / d;
        }
    }
    // L y = b, then Lᵀ z = y.
    let mut y = vec![0.0; k];
    for i in 0..k {
        let mut s = b[i];
        for t in 0..i {
            s -= a[i][t] * y[t];
        }
        y[i] = s / a[i][i];
    }
    let mut z = vec![0.0; k];
    for i in (0..k).rev() {
        let mut s = y[i];
        for t in i + 1..k {
            s -= a[t][i] * z[t];
        }
        z[i] = s / a[i][i];
    }
    Some(z)
}

/// Why a step log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StepLogError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file} line {line}: {problem}")]
    Line {
        file: String,
        line: usize,
        problem: String,
    },
}

/// Reads a step log (JSON lines; blank lines skipped).
pub fn read_step_log(path: &Path) -> Result<Vec<StepRecord>, StepLogError> {
    let text = std::fs::read_to_string(path).map_err(|source| StepLogError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_step_log(&text, &path.display().to_string())
}

/// Parses step-log text; `file` is what errors name.
pub fn parse_step_log(text: &str, file: &str) -> Result<Vec<StepRecord>, StepLogError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |problem: String| StepLogError::Line {
            file: file.to_string(),
            line: i + 1,
            problem,
        };
        let mut de = serde_json::Deserializer::from_str(line);
        let rec: StepRecord = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                bad(e.inner().to_string())
            } else {
                bad(format!("field `{path}`: {}", e.inner()))
            }
        })?;
        if rec.rows.len() != rec.num_reqs {
            return Err(bad(format!(
                "field `rows`: {} rows but `num_reqs` is {}",
                rec.rows.len(),
                rec.num_reqs
            )));
        }
        for (field, v) in [("step_s", rec.step_s), ("forward_s", rec.forward_s)] {
            if !v.is_finite() || v < 0.0 {
                return Err(bad(format!(
                    "field `{field}`: {v}, expected a non-negative number of seconds"
                )));
            }
        }
        out.push(rec);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_small_system() {
        let mut a = vec![vec![4.0, 2.0], vec![2.0, 3.0]];
        let z = cholesky_solve(&mut a, &[10.0, 8.0]).unwrap();
        // 4x + 2y = 10, 2x + 3y = 8 → x = 1.75, y = 1.5.
        assert!((z[0] - 1.75).abs() < 1e-12 && (z[1] - 1.5).abs() < 1e-12);
        let mut singular = vec![vec![1.0, 1.0], vec![1.0, 1.0]];
        assert!(cholesky_solve(&mut singular, &[1.0, 1.0]).is_none());
    }

    #[test]
    fn nnls_clamps_a_coefficient_that_least_squares_makes_negative() {
        // Least squares of y = [1, 2] on columns [1, 1] and [1, 0]:
        // unconstrained x = (2, −1); with x ≥ 0 the best is (1.5, 0).
        let g = vec![vec![2.0, 1.0], vec![1.0, 1.0]];
        let h = vec![3.0, 1.0];
        let x = nnls_gram(&g, &h, &[true, true]);
        // (The ridge moves it by 1e-9 relative.)
        assert!((x[0] - 1.5).abs() < 1e-6 && x[1] == 0.0, "{x:?}");
    }
}
