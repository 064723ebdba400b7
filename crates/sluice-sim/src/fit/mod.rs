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

mod log;
mod model;
mod nnls;
mod protocol;
#[cfg(test)]
mod tests;

pub use log::*;
pub use model::*;
use nnls::*;
pub use protocol::*;
