//! Row-wise elementwise operations of the decoder: RMSNorm, bias, residual
//! add, SwiGLU.
//!
//! These are O(tokens × width) next to the O(tokens × width²) linear layers,
//! so they stay simple loops the compiler vectorises; the arithmetic order
//! follows transformers' f32 code (normalise, then scale by the weight).

use crate::attention::{dot, exp_f32};

/// `out[t] = x[t] / rms(x[t]) * weight` for every row of `width` values.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let mean_square = dot::<false>(row, row) / width as f32;
        let inv_rms = 1.0 / (mean_square + eps).sqrt();
        for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
            *d = w * (v * inv_rms);
        }
    }
}

/// Adds `bias` to every row.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `acc += x`, the residual connection.
pub fn add_assign(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// SwiGLU: `out[t] = silu(gate[t]) * up[t]`, where each input row of
/// `gate_up` is `[gate (width) | up (width)]` (the fused projection).
pub fn silu_mul(gate_up: &[f32], width: usize, out: &mut [f32]) {
    for (row, dst) in gate_up
        .chunks_exact(2 * width)
        .zip(out.chunks_exact_mut(width))
    {
        let (gate, up) = row.split_at(width);
        for ((d, &g), &u) in dst.iter_mut().zip(gate).zip(up) {
            let sigmoid = 1.0 / (1.0 + exp_f32(-g));
            *d = g * sigmoid * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row_is_the_weight() {
        let mut out = vec![0.0; 4];
        rms_norm(&[3.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0, &mut out);
        for (o, w) in out.iter().zip([1.0, 2.0, 3.0, 4.0]) {
            assert!((o - w).abs() < 1e-6);
        }
    }

    #[test]
    fn silu_mul_matches_definition() {
        let gate_up = [-30.0f32, 0.0, 2.5, 95.0, 1.0, 1.0, 2.0, 0.5];
        let mut out = vec![0.0; 4];
        silu_mul(&gate_up, 4, &mut out);
        for i in 0..4 {
            let g = gate_up[i] as f64;
            let want = g / (1.0 + (-g).exp()) * gate_up[4 + i] as f64;
            assert!(
                (out[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1e-6),
                "{i}"
            );
        }
    }
}
