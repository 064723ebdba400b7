//! Row-wise elementwise operations of the decoder: RMSNorm (of rows, and
//! in place of heads), residual add, SwiGLU.
//!
//! These are O(tokens × width) next to the O(tokens × width²) linear
//! layers, but a long prefill still spends real time here (SwiGLU alone
//! touches 4096 × 4864 values per layer at 32 × 128 prompt tokens), so each
//! is compiled for AVX-512 and AVX2 as well as the baseline (the same
//! source, vectorised by the compiler for each; `kernels::multiversion!`
//! runs the path the kernels' one dispatch picks for the op's family) and
//! split over the kernel threads when the batch is large. The arithmetic order follows
//! transformers' f32 code (normalise, then scale by the weight), and a row's
//! result never depends on the other rows or on the path's thread split.

use crate::kernels::math::{dot, exp_f32};
use crate::kernels::{multiversion, num_threads, parallel_for, SyncPtr};

/// Below this many values an op runs on the calling thread (waking the
/// pool would cost more than it saves).
const PARALLEL_MIN_VALUES: usize = 1 << 16;

/// Runs `f(rows)` over `0..num_rows` split in contiguous ranges, in
/// parallel when `num_rows × row_width` is large.
fn for_row_ranges(num_rows: usize, row_width: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = num_threads();
    if threads <= 1 || num_rows < 2 || num_rows * row_width < PARALLEL_MIN_VALUES {
        f(0..num_rows);
        return;
    }
    let parts = (threads * 2).min(num_rows);
    let per = num_rows.div_ceil(parts);
    parallel_for(num_rows.div_ceil(per), |p| {
        f(p * per..((p + 1) * per).min(num_rows))
    });
}

multiversion! { RmsNorm;
    /// `out[t] = x[t] / rms(x[t]) * weight` for rows of `weight.len()`.
    fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let width = weight.len();
        for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            let mean_square = dot::<false>(row, row) / width as f32;
            let inv_rms = 1.0 / (mean_square + eps).sqrt();
            for ((d, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
                *d = w * (v * inv_rms);
            }
        }
    }
}

multiversion! { RmsNorm;
    /// Every `weight.len()`-wide chunk of `x` (one head) RMS-normalised in
    /// place and scaled by `weight`, in `rms_norm_rows`' arithmetic order.
    pub fn rms_norm_heads_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
        let width = weight.len();
        for head in x.chunks_exact_mut(width) {
            let mean_square = dot::<false>(head, head) / width as f32;
            let inv_rms = 1.0 / (mean_square + eps).sqrt();
            for (v, &w) in head.iter_mut().zip(weight) {
                *v = w * (*v * inv_rms);
            }
        }
    }
}

multiversion! { SwiGlu;
    /// `out[t] = silu(gate[t]) * up[t]` for rows `[gate | up]` of `2 × width`.
    fn silu_mul_rows(gate_up: &[f32], width: usize, out: &mut [f32]) {
        for (row, dst) in gate_up.chunks_exact(2 * width).zip(out.chunks_exact_mut(width)) {
            let (gate, up) = row.split_at(width);
            for ((d, &g), &u) in dst.iter_mut().zip(gate).zip(up) {
                let sigmoid = 1.0 / (1.0 + exp_f32(-g));
                *d = g * sigmoid * u;
            }
        }
    }
}

multiversion! { Residual;
    /// `acc += x`.
    fn add_assign_flat(acc: &mut [f32], x: &[f32]) {
        for (a, &b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }
}

/// RMSNorm of every row of `x` (rows of `weight.len()`) into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    let rows = x.len() / width;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    for_row_ranges(rows, width, |r| {
        // SAFETY: row ranges are disjoint and inside `out`.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out_ptr.get().add(r.start * width), r.len() * width)
        };
        rms_norm_rows(&x[r.start * width..r.end * width], weight, eps, dst);
    });
}

/// SwiGLU over rows `[gate (width) | up (width)]` of the fused projection.
pub fn silu_mul(gate_up: &[f32], width: usize, out: &mut [f32]) {
    let rows = out.len() / width;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    for_row_ranges(rows, 2 * width, |r| {
        // SAFETY: row ranges are disjoint and inside `out`.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out_ptr.get().add(r.start * width), r.len() * width)
        };
        silu_mul_rows(&gate_up[r.start * 2 * width..r.end * 2 * width], width, dst);
    });
}

/// GeGLU with transformers' `gelu_pytorch_tanh` over rows `[gate (width)
/// | up (width)]` of the fused projection, rows split over the kernel
/// threads (each row's values are computed the same way on any thread).
pub fn gelu_tanh_mul(gate_up: &[f32], width: usize, out: &mut [f32]) {
    let rows = out.len() / width;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    for_row_ranges(rows, 2 * width, |r| {
        // SAFETY: row ranges are disjoint and inside `out`.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out_ptr.get().add(r.start * width), r.len() * width)
        };
        gelu_tanh_mul_rows(&gate_up[r.start * 2 * width..r.end * 2 * width], width, dst);
    });
}

fn gelu_tanh_mul_rows(gate_up: &[f32], width: usize, out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (row, dst) in gate_up
        .chunks_exact(2 * width)
        .zip(out.chunks_exact_mut(width))
    {
        let (gate, up) = row.split_at(width);
        for ((d, &g), &u) in dst.iter_mut().zip(gate).zip(up) {
            let inner = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
            *d = 0.5 * g * (1.0 + inner.tanh()) * u;
        }
    }
}

/// `acc += x`, the residual connection, over rows of `width`.
pub fn add_assign(acc: &mut [f32], x: &[f32], width: usize) {
    let rows = acc.len() / width;
    let acc_ptr = SyncPtr(acc.as_mut_ptr());
    for_row_ranges(rows, width, |r| {
        // SAFETY: row ranges are disjoint and inside `acc`.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(acc_ptr.get().add(r.start * width), r.len() * width)
        };
        add_assign_flat(dst, &x[r.start * width..r.end * width]);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{last_kernel_path, thread_cap, KernelFamily, KernelPath};
    use crate::model::Rope;

    /// Every op of this file and RoPE, on `path` (inputs small enough to
    /// stay on the calling thread, whose cap `thread_cap` sets): the bits of
    /// each output.
    fn run_ops(path: KernelPath) -> Vec<Vec<u32>> {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let width = 96;
        let x: Vec<f32> = (0..4 * 2 * width)
            .map(|i| ((i * 37) % 101) as f32 / 9.0 - 5.0)
            .collect();
        let w: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 / 64.0).collect();
        thread_cap::with(path, || {
            let mut normed = vec![0.0; x.len()];
            rms_norm(&x, &w, 1e-6, &mut normed);
            let mut heads = x.clone();
            rms_norm_heads_in_place(&mut heads, &w[..32], 1e-6);
            let mut act = vec![0.0; x.len() / 2];
            silu_mul(&x, width, &mut act);
            let mut acc = normed.clone();
            add_assign(&mut acc, &x, width);
            let (cos, sin): (Vec<f32>, Vec<f32>) = (0..16)
                .map(|i| ((i as f32) * 0.3).sin_cos())
                .map(|(s, c)| (c, s))
                .unzip();
            let mut rotated = x.clone();
            Rope::apply(&mut rotated, 32, &cos, &sin);
            vec![
                bits(&normed),
                bits(&heads),
                bits(&act),
                bits(&acc),
                bits(&rotated),
            ]
        })
    }

    /// The compiled-loop families perform the same IEEE operations in the
    /// same order on every path, so every path gives the portable bits.
    #[test]
    fn every_path_gives_the_portable_bits() {
        let portable = run_ops(KernelPath::Portable);
        for path in [KernelPath::Avx2, KernelPath::Avx512] {
            assert_eq!(run_ops(path), portable, "{path}");
        }
        for f in [
            KernelFamily::RmsNorm,
            KernelFamily::SwiGlu,
            KernelFamily::Residual,
            KernelFamily::Rope,
        ] {
            assert!(last_kernel_path(f).is_some(), "{f:?} never dispatched");
        }
    }

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

    #[test]
    fn head_norm_in_place_equals_row_norm() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 13) % 17) as f32 / 3.0 - 2.0)
            .collect();
        let w: Vec<f32> = (0..32).map(|i| 0.5 + i as f32 / 32.0).collect();
        let mut rows = vec![0.0; 96];
        rms_norm(&x, &w, 1e-6, &mut rows);
        let mut heads = x.clone();
        rms_norm_heads_in_place(&mut heads, &w, 1e-6);
        assert_eq!(heads, rows);
    }

    /// Large batches take the parallel split; rows must come out the same
    /// as when computed alone.
    #[test]
    fn parallel_split_is_row_exact() {
        let width = 300;
        let rows = 700;
        let x: Vec<f32> = (0..rows * 2 * width)
            .map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0)
            .collect();
        let mut all = vec![0.0; rows * width];
        silu_mul(&x, width, &mut all);
        let mut one = vec![0.0; width];
        for r in [0, 1, 350, rows - 1] {
            silu_mul(&x[r * 2 * width..(r + 1) * 2 * width], width, &mut one);
            assert_eq!(one, all[r * width..(r + 1) * width]);
        }
        let w: Vec<f32> = (0..width).map(|i| 1.0 + i as f32 / 100.0).collect();
        let mut normed = vec![0.0; rows * 2 * width];
        rms_norm(&x, &w, 1e-6, &mut normed);
        let mut one = vec![0.0; width];
        rms_norm(&x[width * 5..width * 6], &w, 1e-6, &mut one);
        assert_eq!(one, normed[width * 5..width * 6]);
    }
}
