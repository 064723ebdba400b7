//! Row-wise f32 helpers for the model author to adopt: `dot`, `axpy`,
//! `rms_norm`, `silu_mul`, `softmax_in_place`, `add_bias`.
//!
//! Owns: nothing but these functions. Promises: each row's result depends
//! only on that row (fixed 16-lane order plus `tree16` for reductions, so
//! batch invariance carries over), and the loops are written so the compiler
//! vectorises them; each is compiled for AVX-512, AVX2 and the baseline
//! (`multiversion!`) and run on the path the one dispatch picks for
//! `KernelFamily::Elementwise`. The versions perform the same IEEE
//! operations in the same order, so they give the same bits.

// Tile and lane loops index several arrays by the same (i, j, l); ranges
// read closer to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::dispatch::multiversion;
use super::reduce::tree16;

/// `Σ a[i]·b[i]`: lane `l` accumulates `i ≡ l (mod 16)` in order, then
/// `tree16`.
///
/// # Panics
/// If the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    dot_impl(a, b)
}

multiversion! {
    fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0.0f32; 16];
        let mut ca = a.chunks_exact(16);
        let mut cb = b.chunks_exact(16);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for l in 0..16 {
                acc[l] += x[l] * y[l];
            }
        }
        for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
            acc[l] += x * y;
        }
        tree16(&acc)
    }
}

/// `y += a·x`.
///
/// # Panics
/// If the lengths differ.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: lengths differ");
    axpy_impl(a, x, y);
}

multiversion! {
    fn axpy_impl(a: f32, x: &[f32], y: &mut [f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }
}

/// `Σ v²` in the `dot` order.
fn sum_squares(v: &[f32]) -> f32 {
    dot(v, v)
}

/// RMSNorm of each row of `x` (rows of `weight.len()`):
/// `out = x / sqrt(mean(x²) + eps) · weight`.
///
/// # Panics
/// If `x` is not a whole number of rows or `out` differs in length.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let h = weight.len();
    assert!(
        h > 0 && x.len().is_multiple_of(h),
        "rms_norm: x is not rows of {h}"
    );
    assert_eq!(x.len(), out.len(), "rms_norm: out length");
    rms_norm_impl(x, weight, eps, out);
}

multiversion! {
    fn rms_norm_impl(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let h = weight.len();
        for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
            let inv = 1.0 / (sum_squares(xr) / h as f32 + eps).sqrt();
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(weight) {
                *o = v * inv * g;
            }
        }
    }
}

/// SwiGLU on rows laid out `[gate (width) | up (width)]`:
/// `out = silu(gate) · up`, rows of `width`.
///
/// # Panics
/// If the shapes disagree.
pub fn silu_mul(gate_up: &[f32], width: usize, out: &mut [f32]) {
    assert!(
        width > 0 && gate_up.len().is_multiple_of(2 * width),
        "silu_mul: gate_up is not rows of 2×{width}"
    );
    assert_eq!(out.len() * 2, gate_up.len(), "silu_mul: out length");
    silu_mul_impl(gate_up, width, out);
}

multiversion! {
    fn silu_mul_impl(gate_up: &[f32], width: usize, out: &mut [f32]) {
        for (gu, or) in gate_up
            .chunks_exact(2 * width)
            .zip(out.chunks_exact_mut(width))
        {
            let (g, u) = gu.split_at(width);
            for ((o, &g), &u) in or.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        }
    }
}

/// Softmax of one row, in place (max-subtracted; an all-`-inf` row becomes
/// all zeros rather than NaN).
pub fn softmax_in_place(x: &mut [f32]) {
    softmax_impl(x);
}

multiversion! {
    fn softmax_impl(x: &mut [f32]) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            x.fill(0.0);
            return;
        }
        let mut sum = 0.0f32;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in x.iter_mut() {
            *v *= inv;
        }
    }
}

/// Adds `bias` to every row of `x` (rows of `bias.len()`).
///
/// # Panics
/// If `x` is not a whole number of rows.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    let n = bias.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n),
        "add_bias: x is not rows of {n}"
    );
    add_bias_impl(x, bias);
}

multiversion! {
    fn add_bias_impl(x: &mut [f32], bias: &[f32]) {
        let n = bias.len();
        for row in x.chunks_exact_mut(n) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
    }

    #[test]
    fn rms_norm_and_softmax_basics() {
        let x = [3.0f32; 8];
        let mut out = [0.0f32; 8];
        rms_norm(&x, &[2.0; 4], 0.0, &mut out);
        assert!(out.iter().all(|&v| (v - 2.0).abs() < 1e-6));
        let mut s = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        softmax_in_place(&mut s);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6 && s[3] == 0.0 && s[2] > s[1]);
        let gu = [0.0f32, 1.0, 5.0, 7.0];
        let mut o = [9.0f32; 2];
        silu_mul(&gu, 2, &mut o);
        assert_eq!(o[0], 0.0);
        assert!((o[1] - 1.0 / (1.0 + (-1.0f32).exp()) * 7.0).abs() < 1e-6);
    }
}
