//! The fit itself: options, the held-out / validation protocol of the
//! module doc, the candidate segmentations and their scores, the report.

use super::*;

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
pub(super) struct Sample {
    pub(super) f: StepFeatures,
    pub(super) y: f64,
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

pub(super) struct Errors {
    pub(super) mape: f64,
    pub(super) median: f64,
    pub(super) p90: f64,
    pub(super) r2: Option<f64>,
}

pub(super) fn errors(model: &FittedModel, samples: &[Sample]) -> Errors {
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
pub(super) const MIN_PIECE_STEPS: usize = 2 * NUM_FEATURES;

pub(super) fn single(samples: &[Sample], options: &FitOptions, seg: Segmentation) -> FittedModel {
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
pub(super) fn fit_segmentation(
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
