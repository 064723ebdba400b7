//! Non-negative least squares: Lawson and Hanson's active-set method on
//! the normal equations, each passive-set solve by Cholesky with a small
//! ridge.

use super::*;

/// Non-negative least squares of `samples`' times on their features.
pub(super) fn solve(samples: &[Sample], relative: bool) -> Coefficients {
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
pub(super) fn solve_passive(g: &[Vec<f64>], h: &[f64], passive: &[bool]) -> Vec<f64> {
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
