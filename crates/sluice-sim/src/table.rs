//! A table-driven step-time model: measured step times on a grid of batch
//! shapes, interpolated.
//!
//! Two tables, each a whole step's wall time (its fixed overhead
//! included) measured on a grid:
//! - `prefill`: a step of prefill only, `chunk_tokens` new tokens on
//!   `context` tokens already cached;
//! - `decode`: a step of `batch_size` decode rows whose mean context (the
//!   KV each row attends to, its own new token included) is
//!   `mean_context`.
//!
//! A step is looked up as: its prefill rows merged into one chunk of
//! their total tokens, at their token-weighted mean cached context; its
//! decode rows as a batch of their count at their mean context. A
//! prefill-only step costs the prefill entry, a decode-only step the
//! decode entry, a mixed step `prefill + decode − step_overhead_s` (both
//! entries include the step's fixed cost, which a mixed step pays once),
//! an empty step `step_overhead_s`. Merging prefill rows is an
//! approximation: it charges the weights once per step, as the GPU does,
//! but the attention of several short rows as one longer one.
//!
//! Interpolation is bilinear within the grid. Below an axis's first point
//! the value is held (a smaller shape is not assumed to be faster than
//! the smallest measured); beyond its last point it is extrapolated
//! linearly from the last two points (time grows about linearly with
//! tokens once compute-bound). An axis of one point is constant. The
//! result is floored at zero, and a step's time at one microsecond.
//!
//! JSON:
//!
//! ```json
//! {"prefill": {"chunk_tokens": [256, 1024, 4096], "context": [0, 4096],
//!              "time_s": [[0.020, 0.024], [0.060, 0.070], [0.230, 0.260]]},
//!  "decode": {"batch_size": [1, 16, 64], "mean_context": [512, 4096],
//!             "time_s": [[0.011, 0.012], [0.013, 0.018], [0.020, 0.040]]},
//!  "step_overhead_s": 0.004}
//! ```
//!
//! `time_s[i][j]` is the time at the first axis's `i`-th value and the
//! second's `j`-th. Axes must be strictly increasing, finite and
//! non-negative; every row of `time_s` must have one value per point of
//! the second axis. Errors name the field (`prefill.time_s[1]`).

use crate::fit::MIN_PREDICTION_S;
use crate::step::{StepShape, StepTimeModel};
use serde::{Deserialize, Serialize};

/// Prefill-only step times over (chunk tokens × cached context).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillTable {
    pub chunk_tokens: Vec<f64>,
    pub context: Vec<f64>,
    pub time_s: Vec<Vec<f64>>,
}

/// Decode-only step times over (batch size × mean context).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeTable {
    pub batch_size: Vec<f64>,
    pub mean_context: Vec<f64>,
    pub time_s: Vec<Vec<f64>>,
}

/// Measured step times, interpolated ([module docs](self)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableModel {
    pub prefill: PrefillTable,
    pub decode: DecodeTable,
    /// The fixed cost included in every entry, paid once by a mixed step.
    #[serde(default)]
    pub step_overhead_s: f64,
}

/// A table that cannot be used; `problem` names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct TableError {
    pub file: String,
    pub problem: String,
}

fn check_axis(name: &str, axis: &[f64]) -> Result<(), String> {
    if axis.is_empty() {
        return Err(format!("`{name}`: empty, expected at least one point"));
    }
    for (i, &v) in axis.iter().enumerate() {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!(
                "`{name}[{i}]`: {v}, expected a non-negative number"
            ));
        }
        if i > 0 && v <= axis[i - 1] {
            return Err(format!(
                "`{name}`: not strictly increasing at index {i} ({v} after {})",
                axis[i - 1]
            ));
        }
    }
    Ok(())
}

fn check_grid(
    table: &str,
    (x_name, x): (&str, &[f64]),
    (y_name, y): (&str, &[f64]),
    time: &[Vec<f64>],
) -> Result<(), String> {
    check_axis(&format!("{table}.{x_name}"), x)?;
    check_axis(&format!("{table}.{y_name}"), y)?;
    if time.len() != x.len() {
        return Err(format!(
            "`{table}.time_s`: {} rows, expected {} (one per `{x_name}` value)",
            time.len(),
            x.len()
        ));
    }
    for (i, row) in time.iter().enumerate() {
        if row.len() != y.len() {
            return Err(format!(
                "`{table}.time_s[{i}]`: {} values, expected {} (one per `{y_name}` value)",
                row.len(),
                y.len()
            ));
        }
        for (j, &v) in row.iter().enumerate() {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "`{table}.time_s[{i}][{j}]`: {v}, expected a non-negative number of seconds"
                ));
            }
        }
    }
    Ok(())
}

/// The segment of `axis` for `v` and the position in it: `t` in [0, 1]
/// inside, 0 below the first point (held), above 1 past the last
/// (extrapolated).
fn locate(axis: &[f64], v: f64) -> (usize, f64) {
    let n = axis.len();
    if n < 2 || v <= axis[0] {
        return (0, 0.0);
    }
    let i = axis.windows(2).position(|w| v <= w[1]).unwrap_or(n - 2);
    (i, (v - axis[i]) / (axis[i + 1] - axis[i]))
}

fn interpolate(x: &[f64], y: &[f64], time: &[Vec<f64>], xv: f64, yv: f64) -> f64 {
    let (i, tx) = locate(x, xv);
    let (j, ty) = locate(y, yv);
    let i1 = (i + 1).min(x.len() - 1);
    let j1 = (j + 1).min(y.len() - 1);
    let at = |a: usize, b: usize| time[a][b];
    let v = (1.0 - tx) * (1.0 - ty) * at(i, j)
        + tx * (1.0 - ty) * at(i1, j)
        + (1.0 - tx) * ty * at(i, j1)
        + tx * ty * at(i1, j1);
    v.max(0.0)
}

impl TableModel {
    /// Every axis and grid well-formed ([module docs](self)).
    pub fn validate(&self) -> Result<(), String> {
        let p = &self.prefill;
        check_grid(
            "prefill",
            ("chunk_tokens", &p.chunk_tokens),
            ("context", &p.context),
            &p.time_s,
        )?;
        let d = &self.decode;
        check_grid(
            "decode",
            ("batch_size", &d.batch_size),
            ("mean_context", &d.mean_context),
            &d.time_s,
        )?;
        if !(self.step_overhead_s.is_finite() && self.step_overhead_s >= 0.0) {
            return Err(format!(
                "`step_overhead_s`: {}, expected a non-negative number of seconds",
                self.step_overhead_s
            ));
        }
        Ok(())
    }

    /// A table from JSON text, validated; `file` is what errors name.
    pub fn from_json_str(text: &str, file: &str) -> Result<TableModel, TableError> {
        let err = |problem: String| TableError {
            file: file.to_string(),
            problem,
        };
        let mut de = serde_json::Deserializer::from_str(text);
        let t: TableModel = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| err(crate::profile::describe_path_error(&e)))?;
        t.validate().map_err(err)?;
        Ok(t)
    }

    /// The prefill entry at `chunk_tokens` new tokens on `context` cached.
    pub fn prefill_time(&self, chunk_tokens: f64, context: f64) -> f64 {
        let p = &self.prefill;
        interpolate(
            &p.chunk_tokens,
            &p.context,
            &p.time_s,
            chunk_tokens,
            context,
        )
    }

    /// The decode entry at `batch_size` rows of `mean_context`.
    pub fn decode_time(&self, batch_size: f64, mean_context: f64) -> f64 {
        let d = &self.decode;
        interpolate(
            &d.batch_size,
            &d.mean_context,
            &d.time_s,
            batch_size,
            mean_context,
        )
    }
}

impl StepTimeModel for TableModel {
    fn step_time(&self, step: &StepShape) -> f64 {
        let (mut p_tokens, mut p_ctx_weighted) = (0.0, 0.0);
        let (mut d_rows, mut d_ctx) = (0.0, 0.0);
        for r in &step.rows {
            let (n, c) = (r.new_tokens as f64, r.context_before as f64);
            if r.is_decode() {
                d_rows += 1.0;
                d_ctx += c + n;
            } else {
                p_tokens += n;
                p_ctx_weighted += n * c;
            }
        }
        let prefill =
            (p_tokens > 0.0).then(|| self.prefill_time(p_tokens, p_ctx_weighted / p_tokens));
        let decode = (d_rows > 0.0).then(|| self.decode_time(d_rows, d_ctx / d_rows));
        let t = match (prefill, decode) {
            (Some(p), Some(d)) => p + d - self.step_overhead_s,
            (Some(p), None) => p,
            (None, Some(d)) => d,
            (None, None) => self.step_overhead_s,
        };
        t.max(MIN_PREDICTION_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_holds_below_and_extrapolates_above() {
        let axis = [1.0, 2.0, 4.0];
        assert_eq!(locate(&axis, 0.5), (0, 0.0));
        assert_eq!(locate(&axis, 1.5), (0, 0.5));
        assert_eq!(locate(&axis, 2.0), (0, 1.0));
        assert_eq!(locate(&axis, 3.0), (1, 0.5));
        assert_eq!(locate(&axis, 8.0), (1, 3.0));
        assert_eq!(locate(&[5.0], 9.0), (0, 0.0));
    }
}
