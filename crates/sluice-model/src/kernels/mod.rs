//! CPU compute kernels for the model runner.
//!
//! Contract (used by the model code; implementations may change freely behind
//! it):
//! - `matmul(x, m, k, w, n, out)`: `out[m×n] = x[m×k] · wᵀ`, where `w` is a
//!   row-major `[n×k]` matrix (the Hugging Face `Linear.weight` layout) in f32
//!   or bf16. `out` is overwritten. Results for one row of `x` must not depend
//!   on `m` or on the other rows (batch invariance), beyond float reassociation
//!   inside the kernel the same for all `m`.
//! - `parallel_for(n, f)`: runs `f(i)` for `i in 0..n` on the kernel thread
//!   pool (`set_num_threads`).
//!
//! This first version is the portable reference; SIMD paths (AVX-512 BF16,
//! AVX2) are selected at run time by CPU feature detection.

/// A weight matrix `[n×k]`, row-major.
#[derive(Clone, Copy, Debug)]
pub enum WeightRef<'a> {
    F32(&'a [f32]),
    /// bf16 values as their raw bit patterns.
    Bf16(&'a [u16]),
}

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `out[m×n] = x[m×k] · wᵀ`.
pub fn matmul(x: &[f32], m: usize, k: usize, w: WeightRef<'_>, n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), m * k, "matmul: x is not m×k");
    assert_eq!(out.len(), m * n, "matmul: out is not m×n");
    match w {
        WeightRef::F32(w) => {
            assert_eq!(w.len(), n * k, "matmul: w is not n×k");
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for j in 0..n {
                    let wr = &w[j * k..(j + 1) * k];
                    out[i * n + j] = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                }
            }
        }
        WeightRef::Bf16(w) => {
            assert_eq!(w.len(), n * k, "matmul: w is not n×k");
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for j in 0..n {
                    let wr = &w[j * k..(j + 1) * k];
                    out[i * n + j] = xr.iter().zip(wr).map(|(a, &b)| a * bf16_to_f32(b)).sum();
                }
            }
        }
    }
}

/// Runs `f(i)` for every `i` in `0..n`, possibly in parallel.
pub fn parallel_for(n: usize, f: impl Fn(usize) + Sync) {
    for i in 0..n {
        f(i);
    }
}

/// Sets the number of kernel threads (default: the machine's cores).
pub fn set_num_threads(_n: usize) {}

/// The number of kernel threads.
pub fn num_threads() -> usize {
    1
}
