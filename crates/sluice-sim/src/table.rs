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
//! decode entry, an empty step `step_overhead_s`, and a mixed step one of
//! two rules (`mixed_rule`):
//! - `additive` (the default): `prefill + decode − step_overhead_s` (both
//!   entries include the step's fixed cost, which a mixed step pays once);
//! - `merged`: the decode rows join the chunk, as they join its matmuls:
//!   the prefill entry at `chunk + rows` tokens, plus what the decode rows'
//!   attention adds over the shortest measured context (`decode(rows,
//!   context) − decode(rows, first context)`). Where decode rows cost
//!   mostly matmul rows (a CPU, or a GPU past its memory-bound batch) this
//!   holds; where they cost mostly the weights' bytes, `additive` does.
//!
//! Merging prefill rows is an approximation: it charges the weights once per
//! step, as the hardware reads them, but the attention of several short rows
//! as one longer one.
//!
//! Decode rows that share cached blocks (a common prefix hit in the prefix
//! cache; `RowShape::shared_context`) read that KV once per step, not once
//! per row. A table may carry `decode.shared`: the same grid measured with
//! every row on one cached prefix (`time_s`), and the fraction of the rows'
//! context that was shared there (`fraction`: shared tokens ÷ Σ context).
//! A decode part whose shared fraction is `f` then costs `distinct + (f ÷
//! fraction) · (shared − distinct)`, both entries interpolated at the
//! step's batch and mean context; without `decode.shared` sharing is not
//! priced (every row's context is taken as its own).
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
//!             "time_s": [[0.011, 0.012], [0.013, 0.018], [0.020, 0.040]],
//!             "shared": {"time_s": [[0.011, 0.012], [0.012, 0.014], [0.016, 0.022]],
//!                        "fraction": [[0, 0], [0.88, 0.93], [0.92, 0.98]]}},
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
    /// The measurement's spread at each point (seconds between the fastest
    /// and the slowest repeat), when the table was measured with repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_s: Option<Vec<Vec<f64>>>,
}

/// Decode-only step times over (batch size × mean context).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeTable {
    pub batch_size: Vec<f64>,
    pub mean_context: Vec<f64>,
    pub time_s: Vec<Vec<f64>>,
    /// As [`PrefillTable::spread_s`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_s: Option<Vec<Vec<f64>>>,
    /// The grid measured with every row on one cached prefix ([module
    /// docs](self)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedDecode>,
}

/// Decode steps whose rows share one cached prefix, on the decode grid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedDecode {
    pub time_s: Vec<Vec<f64>>,
    /// Shared tokens ÷ Σ context of each point's steps, in [0, 1].
    pub fraction: Vec<Vec<f64>>,
}

/// Measured step times, interpolated ([module docs](self)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableModel {
    pub prefill: PrefillTable,
    pub decode: DecodeTable,
    /// The fixed cost included in every entry, paid once by a mixed step
    /// under the additive rule.
    #[serde(default)]
    pub step_overhead_s: f64,
    /// How a step with both prefill and decode rows is priced.
    #[serde(default, skip_serializing_if = "MixedRule::is_additive")]
    pub mixed_rule: MixedRule,
}

/// How a table prices a step with prefill and decode rows ([module
/// docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MixedRule {
    #[default]
    Additive,
    Merged,
}

impl MixedRule {
    fn is_additive(&self) -> bool {
        *self == MixedRule::Additive
    }
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
    spread: Option<&[Vec<f64>]>,
) -> Result<(), String> {
    check_axis(&format!("{table}.{x_name}"), x)?;
    check_axis(&format!("{table}.{y_name}"), y)?;
    check_values(table, "time_s", (x_name, x), (y_name, y), time)?;
    match spread {
        Some(s) => check_values(table, "spread_s", (x_name, x), (y_name, y), s),
        None => Ok(()),
    }
}

fn check_values(
    table: &str,
    field: &str,
    (x_name, x): (&str, &[f64]),
    (y_name, y): (&str, &[f64]),
    time: &[Vec<f64>],
) -> Result<(), String> {
    if time.len() != x.len() {
        return Err(format!(
            "`{table}.{field}`: {} rows, expected {} (one per `{x_name}` value)",
            time.len(),
            x.len()
        ));
    }
    for (i, row) in time.iter().enumerate() {
        if row.len() != y.len() {
            return Err(format!(
                "`{table}.{field}[{i}]`: {} values, expected {} (one per `{y_name}` value)",
                row.len(),
                y.len()
            ));
        }
        for (j, &v) in row.iter().enumerate() {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "`{table}.{field}[{i}][{j}]`: {v}, expected a non-negative number of seconds"
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
            p.spread_s.as_deref(),
        )?;
        let d = &self.decode;
        check_grid(
            "decode",
            ("batch_size", &d.batch_size),
            ("mean_context", &d.mean_context),
            &d.time_s,
            d.spread_s.as_deref(),
        )?;
        if let Some(sh) = &d.shared {
            let axes = (
                ("batch_size", d.batch_size.as_slice()),
                ("mean_context", d.mean_context.as_slice()),
            );
            check_values("decode.shared", "time_s", axes.0, axes.1, &sh.time_s)?;
            check_values("decode.shared", "fraction", axes.0, axes.1, &sh.fraction)?;
            for (i, row) in sh.fraction.iter().enumerate() {
                if let Some(j) = row.iter().position(|&f| f > 1.0) {
                    return Err(format!(
                        "`decode.shared.fraction[{i}][{j}]`: {}, expected a fraction in [0, 1]",
                        row[j]
                    ));
                }
            }
        }
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

    /// A mixed step under `rule`: `chunk_tokens` prefill tokens on
    /// `context` cached beside `rows` decode rows of `mean_context`.
    pub fn mixed_time(
        &self,
        rule: MixedRule,
        chunk: (f64, f64),
        (rows, mean_context): (f64, f64),
    ) -> f64 {
        self.mixed_time_shared(rule, chunk, (rows, mean_context, 0.0))
    }

    /// As `mixed_time`, the decode rows' context `shared` shared
    /// (`decode_time_shared`).
    pub fn mixed_time_shared(
        &self,
        rule: MixedRule,
        (chunk_tokens, context): (f64, f64),
        (rows, mean_context, shared): (f64, f64, f64),
    ) -> f64 {
        let decode = self.decode_time_shared(rows, mean_context, shared);
        match rule {
            MixedRule::Additive => {
                self.prefill_time(chunk_tokens, context) + decode - self.step_overhead_s
            }
            MixedRule::Merged => {
                let shortest = self.decode.mean_context.first().copied().unwrap_or(0.0);
                let attention = (decode - self.decode_time(rows, shortest)).max(0.0);
                self.prefill_time(chunk_tokens + rows, context) + attention
            }
        }
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

    /// `batch_size` decode rows of `mean_context`, the fraction `shared`
    /// of their context shared ([module docs](self)); the plain entry
    /// without `decode.shared`.
    pub fn decode_time_shared(&self, batch_size: f64, mean_context: f64, shared: f64) -> f64 {
        let distinct = self.decode_time(batch_size, mean_context);
        let d = &self.decode;
        let Some(sh) = d.shared.as_ref().filter(|_| shared > 0.0) else {
            return distinct;
        };
        let at = |grid: &[Vec<f64>]| {
            interpolate(
                &d.batch_size,
                &d.mean_context,
                grid,
                batch_size,
                mean_context,
            )
        };
        let reference = at(&sh.fraction);
        if reference <= 0.0 {
            return distinct;
        }
        let w = (shared / reference).min(1.0 / reference);
        (distinct + w * (at(&sh.time_s) - distinct)).max(0.0)
    }
}

/// A step as the tables see it: its prefill rows as one chunk (tokens,
/// token-weighted mean cached context) and its decode rows as one batch
/// (rows, mean context, the shared fraction of their context); `None` for
/// a part the step lacks.
type Lookup = (Option<(f64, f64)>, Option<(f64, f64, f64)>);

fn lookup(step: &StepShape) -> Lookup {
    let (mut p_tokens, mut p_ctx_weighted) = (0.0, 0.0);
    let (mut d_rows, mut d_ctx, mut d_shared) = (0.0, 0.0, 0.0);
    for r in &step.rows {
        let (n, c) = (r.new_tokens as f64, r.context_before as f64);
        if r.is_decode() {
            d_rows += 1.0;
            d_ctx += c + n;
            d_shared += r.shared_context as f64;
        } else {
            p_tokens += n;
            p_ctx_weighted += n * c;
        }
    }
    (
        (p_tokens > 0.0).then(|| (p_tokens, p_ctx_weighted / p_tokens)),
        (d_rows > 0.0).then(|| (d_rows, d_ctx / d_rows, d_shared / d_ctx)),
    )
}

/// `v` lies outside the measured points `axis` (below the first or past
/// the last).
fn off_axis(axis: &[f64], v: f64) -> bool {
    axis.first().is_some_and(|&lo| v < lo) || axis.last().is_some_and(|&hi| v > hi)
}

impl StepTimeModel for TableModel {
    fn prices_shared_context(&self) -> bool {
        self.decode.shared.is_some()
    }

    fn outside_range(&self, step: &StepShape) -> bool {
        let (mut prefill, decode) = lookup(step);
        if let (MixedRule::Merged, Some((n, _)), Some((rows, _, _))) =
            (self.mixed_rule, prefill.as_mut(), decode)
        {
            // The merged rule looks the chunk up with the decode rows in it.
            *n += rows;
        }
        let (p, d) = (&self.prefill, &self.decode);
        prefill.is_some_and(|(n, c)| off_axis(&p.chunk_tokens, n) || off_axis(&p.context, c))
            || decode
                .is_some_and(|(n, c, _)| off_axis(&d.batch_size, n) || off_axis(&d.mean_context, c))
    }

    fn step_time(&self, step: &StepShape) -> f64 {
        let t = match lookup(step) {
            (Some(p), Some(d)) => self.mixed_time_shared(self.mixed_rule, p, d),
            (Some((n, c)), None) => self.prefill_time(n, c),
            (None, Some((n, c, f))) => self.decode_time_shared(n, c, f),
            (None, None) => self.step_overhead_s,
        };
        t.max(MIN_PREDICTION_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::RowShape;
    use proptest::prelude::*;

    /// A table whose times grow along both axes of both tables, from
    /// increments (so monotone by construction), on the given axes.
    fn monotone_table(xs: &[f64], ys: &[f64], inc: &[f64]) -> TableModel {
        let grid = |inc_off: usize| -> Vec<Vec<f64>> {
            let mut g = vec![vec![0.0; ys.len()]; xs.len()];
            let mut k = inc_off;
            for i in 0..xs.len() {
                for j in 0..ys.len() {
                    let below: f64 = if i > 0 { g[i - 1][j] } else { 0.001 };
                    let left = if j > 0 { g[i][j - 1] } else { 0.001 };
                    g[i][j] = below.max(left) + inc[k % inc.len()];
                    k += 1;
                }
            }
            g
        };
        TableModel {
            prefill: PrefillTable {
                chunk_tokens: xs.to_vec(),
                context: ys.to_vec(),
                time_s: grid(0),
                spread_s: None,
            },
            decode: DecodeTable {
                batch_size: xs.to_vec(),
                mean_context: ys.to_vec(),
                time_s: grid(3),
                spread_s: None,
                shared: None,
            },
            step_overhead_s: 0.0005,
            mixed_rule: MixedRule::Additive,
        }
    }

    fn axis(v: Vec<f64>) -> Vec<f64> {
        let mut a: Vec<f64> = Vec::new();
        let mut x = 0.0;
        for d in v {
            x += d;
            a.push(x);
        }
        a
    }

    proptest! {
        /// On a grid point the table answers the measured value; between
        /// points (inside the grid) it never decreases along an axis where
        /// the measurements do not.
        #[test]
        fn exact_on_the_grid_and_monotone_between(
            dx in proptest::collection::vec(1.0f64..500.0, 1..6),
            dy in proptest::collection::vec(1.0f64..500.0, 1..6),
            inc in proptest::collection::vec(0.0f64..0.01, 1..8),
            probes in proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0, 0.0f64..0.2), 1..20),
        ) {
            let (xs, ys) = (axis(dx), axis(dy));
            let t = monotone_table(&xs, &ys, &inc);
            for (i, &x) in xs.iter().enumerate() {
                for (j, &y) in ys.iter().enumerate() {
                    prop_assert_eq!(t.prefill_time(x, y), t.prefill.time_s[i][j]);
                    prop_assert_eq!(t.decode_time(x, y), t.decode.time_s[i][j]);
                }
            }
            let (x_hi, y_hi) = (xs[xs.len() - 1], ys[ys.len() - 1]);
            for (fx, fy, step) in probes {
                let (x, y) = (fx * x_hi, fy * y_hi);
                // Within the grid (beyond it the linear extrapolation of
                // each axis may cross: those steps are flagged instead).
                let (x2, y2) = ((x + step * x_hi).min(x_hi), (y + step * y_hi).min(y_hi));
                let eps = 1e-12;
                prop_assert!(t.prefill_time(x2, y) + eps >= t.prefill_time(x, y));
                prop_assert!(t.prefill_time(x, y2) + eps >= t.prefill_time(x, y));
                prop_assert!(t.decode_time(x2, y) + eps >= t.decode_time(x, y));
                prop_assert!(t.decode_time(x, y2) + eps >= t.decode_time(x, y));
            }
        }
    }

    #[test]
    fn steps_outside_the_grid_are_flagged() {
        let t = monotone_table(&[1.0, 16.0, 256.0], &[0.0, 512.0], &[0.001]);
        let row = |new_tokens, context_before| RowShape {
            new_tokens,
            context_before,
            samples: true,
            shared_context: 0,
        };
        let step = |rows: Vec<RowShape>| StepShape { rows };
        // Inside: chunks of 1..256 tokens on 0..512 cached, 1..256 decode
        // rows of mean context 0..512.
        assert!(!t.outside_range(&step(vec![row(100, 100)])));
        assert!(!t.outside_range(&step(vec![row(1, 200), row(1, 300)])));
        // A chunk past the largest measured, a context past the longest.
        assert!(t.outside_range(&step(vec![row(300, 0)])));
        assert!(t.outside_range(&step(vec![row(100, 600)])));
        // Two chunks merge into one of their total tokens.
        assert!(t.outside_range(&step(vec![row(200, 0), row(200, 0)])));
        // Decode rows whose mean context (own token included) passes 512.
        assert!(t.outside_range(&step(vec![row(1, 600)])));
        assert!(!t.outside_range(&step(vec![row(1, 511)])));
        // A mixed step is outside if either part is.
        assert!(t.outside_range(&step(vec![row(1, 100), row(400, 0)])));
        // An empty step is never outside.
        assert!(!t.outside_range(&step(vec![])));
    }

    /// The merged rule by hand: 4 decode rows of context 102 beside a
    /// 16-token chunk cost the 20-token chunk plus what context 102 adds
    /// to 4 rows over context 2; the additive rule the two entries less
    /// the overhead.
    #[test]
    fn mixed_rules_by_hand() {
        let mut t = TableModel {
            prefill: PrefillTable {
                chunk_tokens: vec![1.0, 16.0, 20.0],
                context: vec![0.0, 100.0],
                time_s: vec![vec![0.003, 0.004], vec![0.010, 0.012], vec![0.013, 0.016]],
                spread_s: None,
            },
            decode: DecodeTable {
                batch_size: vec![1.0, 4.0],
                mean_context: vec![2.0, 102.0],
                time_s: vec![vec![0.003, 0.0035], vec![0.004, 0.006]],
                spread_s: None,
                shared: None,
            },
            step_overhead_s: 0.002,
            mixed_rule: MixedRule::Additive,
        };
        let row = |new_tokens, context_before| RowShape {
            new_tokens,
            context_before,
            samples: true,
            shared_context: 0,
        };
        // Four decode rows at context 101 (+1: their own token) and a chunk.
        let mut rows = vec![row(1, 101); 4];
        rows.push(row(16, 0));
        let step = StepShape { rows };
        assert!((t.step_time(&step) - (0.010 + 0.006 - 0.002)).abs() < 1e-12);
        assert!(!t.outside_range(&step));
        t.mixed_rule = MixedRule::Merged;
        assert!((t.step_time(&step) - (0.013 + (0.006 - 0.004))).abs() < 1e-12);
        // Merged, the chunk is looked up with the rows in it: 16 + 4 = 20
        // is the last chunk measured, one more row is past it.
        assert!(!t.outside_range(&step));
        let mut rows = vec![row(1, 101); 5];
        rows.push(row(16, 0));
        assert!(t.outside_range(&StepShape { rows }));
        // The rule round-trips; additive, the default, is left out.
        let text = serde_json::to_string(&t).unwrap();
        assert!(text.contains("\"mixed_rule\":\"merged\""), "{text}");
        assert_eq!(TableModel::from_json_str(&text, "t.json").unwrap(), t);
        t.mixed_rule = MixedRule::Additive;
        assert!(!serde_json::to_string(&t).unwrap().contains("mixed_rule"));
    }

    /// Shared-prefix pricing by hand: 4 rows at mean context 102, the
    /// shared grid measured at fraction 0.6 there (0.006 distinct, 0.0045
    /// shared). Half the rows' context shared is 0.5 / 0.6 of the way; no
    /// sharing is the distinct entry; a table without `decode.shared`
    /// ignores sharing.
    #[test]
    fn shared_context_interpolates_between_distinct_and_shared() {
        let mut t = monotone_table(&[1.0, 4.0], &[2.0, 102.0], &[0.001]);
        t.decode.time_s = vec![vec![0.003, 0.0035], vec![0.004, 0.006]];
        let row = |shared_context| RowShape {
            new_tokens: 1,
            context_before: 101,
            samples: true,
            shared_context,
        };
        // 4 rows × 102 = 408 context tokens; 204 shared is half.
        let half = StepShape {
            rows: vec![row(0), row(68), row(68), row(68)],
        };
        let none = StepShape {
            rows: vec![row(0); 4],
        };
        assert!((t.step_time(&half) - 0.006).abs() < 1e-12);
        t.decode.shared = Some(SharedDecode {
            time_s: vec![vec![0.003, 0.0035], vec![0.004, 0.0045]],
            fraction: vec![vec![0.0, 0.0], vec![0.6, 0.6]],
        });
        t.validate().unwrap();
        let want = 0.006 + 0.5 / 0.6 * (0.0045 - 0.006);
        assert!((t.step_time(&half) - want).abs() < 1e-12);
        assert!((t.step_time(&none) - 0.006).abs() < 1e-12);
        // On the shared grid point itself: the shared entry.
        assert!((t.decode_time_shared(4.0, 102.0, 0.6) - 0.0045).abs() < 1e-12);
        // A one-row step (no reference fraction) is the distinct entry.
        assert!((t.decode_time_shared(1.0, 102.0, 0.5) - 0.0035).abs() < 1e-12);
        // Round trip, and a fraction above 1 is named.
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(TableModel::from_json_str(&text, "t.json").unwrap(), t);
        t.decode.shared.as_mut().unwrap().fraction[1][0] = 1.5;
        let e = t.validate().unwrap_err();
        assert!(e.contains("`decode.shared.fraction[1][0]`: 1.5"), "{e}");
        t.decode.shared.as_mut().unwrap().time_s.pop();
        let e = t.validate().unwrap_err();
        assert!(
            e.contains("`decode.shared.time_s`: 1 rows, expected 2"),
            "{e}"
        );
    }

    #[test]
    fn spreads_are_validated_like_times() {
        let mut t = monotone_table(&[1.0, 16.0], &[0.0, 512.0], &[0.001]);
        t.decode.spread_s = Some(vec![vec![0.0, 0.0]]);
        let e = t.validate().unwrap_err();
        assert!(e.contains("`decode.spread_s`: 1 rows, expected 2"), "{e}");
        t.decode.spread_s = Some(vec![vec![0.0, -1.0], vec![0.0, 0.0]]);
        let e = t.validate().unwrap_err();
        assert!(e.contains("`decode.spread_s[0][1]`"), "{e}");
        t.decode.spread_s = Some(vec![vec![0.0, 0.1], vec![0.0, 0.0]]);
        t.validate().unwrap();
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(TableModel::from_json_str(&text, "t.json").unwrap(), t);
    }

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
