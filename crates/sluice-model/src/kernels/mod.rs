//! CPU compute kernels for the model runner.
//!
//! Contract (used by the model code; implementations may change freely behind
//! it):
//! - `matmul(x, m, k, w, n, out)`: `out[m×n] = x[m×k] · wᵀ`, where `w` is a
//!   row-major `[n×k]` matrix (the Hugging Face `Linear.weight` layout) in f32
//!   or bf16. `out` is overwritten. `matmul_bias` adds a per-column bias
//!   (`out = x·wᵀ + b`, the bias added after the dot product, exactly as a
//!   separate add would).
//! - Batch invariance: row `i` of `out` is bitwise the same whatever `m` is,
//!   whatever the other rows of `x` hold, and whatever the thread count —
//!   for a given `k`, weight dtype and kernel path. Why it holds: every
//!   output element is computed by one microkernel call over the whole of
//!   `k` (the driver never splits `k`), and every microkernel of a path
//!   gives each element the same order — lane `l` of a fixed-width
//!   accumulator takes the same elements of `k` in the same sequence, then a
//!   fixed tree adds the lanes (`reduce.rs`). The orders are spelled out in
//!   `gemm_f32.rs` and `gemm_bf16.rs`. Different paths (AVX-512 / AVX2 /
//!   portable) give different, equally valid roundings.
//! - Paths (`KernelPath`), picked at run time by CPU feature detection:
//!   AVX-512 (f32: AVX-512F FMA; bf16: `vdpbf16ps`, which first rounds the
//!   activations to bf16 — about 3 significant digits — so results differ
//!   from an f32-activation product by that rounding), AVX2 + FMA, and
//!   portable Rust. `SLUICE_KERNEL=portable|avx2|avx512|auto` or
//!   `set_kernel_path` cap the path; `matmul_with` picks one per call.
//!   The build needs no `-C target-cpu` and should not use one: SIMD code
//!   is compiled with `#[target_feature]` and only called after detection,
//!   so one binary runs everywhere and still uses AVX-512 BF16 where
//!   present. (`-C target-cpu=native` would only speed up the portable
//!   fallback and the elementwise helpers, and would make the binary crash
//!   on older CPUs.) `cpu_features()` reports what was detected and chosen.
//! - `parallel_for(n, f)`: runs `f(i)` for `i in 0..n` on the kernel thread
//!   pool (`set_num_threads`, default `SLUICE_NUM_THREADS` or the core
//!   count; the caller takes part; nested calls run serially).
//! - `matmul_reference` is the plain triple loop kept for tests.

mod dispatch;
mod elementwise;
mod gemm;
mod gemm_bf16;
mod gemm_f32;
mod pool;
mod reduce;

#[cfg(test)]
mod tests;

pub use dispatch::{
    cpu_features, kernel_path_bf16, kernel_path_f32, set_kernel_path, CpuFeatures, KernelPath,
};
pub use elementwise::{add_bias, axpy, dot, rms_norm, silu_mul, softmax_in_place};
pub use pool::{num_threads, set_num_threads};

use gemm::Problem;
use std::cell::RefCell;

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

/// Rounds to the nearest bf16 (ties to even); NaN stays NaN.
#[inline]
pub fn f32_to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// Per-call choices; `Default` means "what `matmul` does".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulOptions {
    /// Highest path allowed (clamped to what the CPU has); `None`: the
    /// process-wide setting (`set_kernel_path`, `SLUICE_KERNEL`, automatic).
    pub path: Option<KernelPath>,
    /// Threads, the caller included; `None`: `num_threads()`.
    pub threads: Option<usize>,
}

/// `out[m×n] = x[m×k] · wᵀ`.
///
/// # Panics
/// If the slice lengths do not match `m`, `k`, `n`.
pub fn matmul(x: &[f32], m: usize, k: usize, w: WeightRef<'_>, n: usize, out: &mut [f32]) {
    matmul_impl(MatmulOptions::default(), x, m, k, w, None, n, out);
}

/// `out[m×n] = x[m×k] · wᵀ + bias`, the bias (`n` values) added to every
/// row after the dot product; identical to `matmul` then adding `bias`.
///
/// # Panics
/// If the slice lengths do not match `m`, `k`, `n`.
pub fn matmul_bias(
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    bias: &[f32],
    n: usize,
    out: &mut [f32],
) {
    matmul_impl(MatmulOptions::default(), x, m, k, w, Some(bias), n, out);
}

/// `matmul` with an explicit path cap and thread count; returns the path
/// that ran (the request lowered to what the CPU supports).
///
/// # Panics
/// If the slice lengths do not match `m`, `k`, `n`.
pub fn matmul_with(
    opts: MatmulOptions,
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    n: usize,
    out: &mut [f32],
) -> KernelPath {
    matmul_impl(opts, x, m, k, w, None, n, out)
}

fn expect_len(what: &str, len: usize, rows: usize, cols: usize) {
    let want = rows.checked_mul(cols);
    assert!(
        want == Some(len),
        "matmul: {what} has {len} values, expected {rows}×{cols}"
    );
}

#[allow(clippy::too_many_arguments)]
fn matmul_impl(
    opts: MatmulOptions,
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    n: usize,
    out: &mut [f32],
) -> KernelPath {
    expect_len("x", x.len(), m, k);
    expect_len("out", out.len(), m, n);
    if let Some(b) = bias {
        expect_len("bias", b.len(), 1, n);
    }
    let threads = opts.threads.unwrap_or_else(num_threads).max(1);
    let want = opts.path.unwrap_or_else(dispatch::requested_path);
    let cpu = cpu_features();
    match w {
        WeightRef::F32(w) => {
            expect_len("w", w.len(), n, k);
            let path = cpu.clamp_f32(want);
            let p = Problem {
                x,
                ldx: k,
                m,
                k,
                w,
                n,
                bias,
            };
            // SAFETY: `clamp_f32` only returns a path whose features this
            // CPU has.
            unsafe {
                match path {
                    #[cfg(target_arch = "x86_64")]
                    KernelPath::Avx512 => gemm::run(&gemm_f32::AVX512, &p, out, threads),
                    #[cfg(target_arch = "x86_64")]
                    KernelPath::Avx2 => gemm::run(&gemm_f32::AVX2, &p, out, threads),
                    _ => gemm::run(&gemm_f32::PORTABLE, &p, out, threads),
                }
            }
            path
        }
        WeightRef::Bf16(w) => {
            expect_len("w", w.len(), n, k);
            let path = cpu.clamp_bf16(want);
            match path {
                #[cfg(target_arch = "x86_64")]
                KernelPath::Avx512 => {
                    with_x_buffer(m * k.div_ceil(gemm_bf16::X_PAD) * gemm_bf16::X_PAD, |buf| {
                        // SAFETY: `clamp_bf16` returned Avx512, so the CPU has
                        // AVX-512F/BW/VL and AVX-512 BF16.
                        let ldx = unsafe { gemm_bf16::convert_x_avx512(x, m, k, buf) };
                        let p = Problem {
                            x: &buf[..],
                            ldx,
                            m,
                            k,
                            w,
                            n,
                            bias,
                        };
                        // SAFETY: as above; the buffer rows are zero-padded.
                        unsafe { gemm::run(&gemm_bf16::AVX512, &p, out, threads) };
                    })
                }
                #[cfg(target_arch = "x86_64")]
                KernelPath::Avx2 => {
                    let p = Problem {
                        x,
                        ldx: k,
                        m,
                        k,
                        w,
                        n,
                        bias,
                    };
                    // SAFETY: `clamp_bf16` returned Avx2: AVX2 + FMA present.
                    unsafe { gemm::run(&gemm_bf16::AVX2, &p, out, threads) };
                }
                _ => {
                    let p = Problem {
                        x,
                        ldx: k,
                        m,
                        k,
                        w,
                        n,
                        bias,
                    };
                    // SAFETY: the portable kernel needs no CPU feature.
                    unsafe { gemm::run(&gemm_bf16::PORTABLE, &p, out, threads) };
                }
            }
            path
        }
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Scratch for bf16-rounded activations, reused across calls.
    static X_BUFFER: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// Lends `f` a 64-byte-aligned scratch slice of `len` u16 (contents
/// unspecified).
#[cfg(target_arch = "x86_64")]
fn with_x_buffer<R>(len: usize, f: impl FnOnce(&mut [u16]) -> R) -> R {
    const ALIGN_SLACK: usize = 32; // 64 bytes of u16
    let mut f = Some(f);
    let mut call = |v: &mut Vec<u16>| {
        if v.len() < len + ALIGN_SLACK {
            v.resize(len + ALIGN_SLACK, 0);
        }
        let off = v.as_ptr().align_offset(64).min(ALIGN_SLACK);
        let f = f.take().expect("called once");
        f(&mut v[off..off + len])
    };
    let reused = X_BUFFER.with(|cell| cell.try_borrow_mut().ok().map(|mut v| call(&mut v)));
    match reused {
        Some(r) => r,
        // Re-entered on this thread (cannot happen from matmul itself):
        // use a fresh buffer.
        None => call(&mut Vec::new()),
    }
}

/// The plain triple loop (f32 accumulation in `k` order), kept as the
/// reference for tests.
///
/// # Panics
/// If the slice lengths do not match `m`, `k`, `n`.
pub fn matmul_reference(
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    n: usize,
    out: &mut [f32],
) {
    expect_len("x", x.len(), m, k);
    expect_len("out", out.len(), m, n);
    match w {
        WeightRef::F32(w) => {
            expect_len("w", w.len(), n, k);
            for i in 0..m {
                let xr = &x[i * k..(i + 1) * k];
                for j in 0..n {
                    let wr = &w[j * k..(j + 1) * k];
                    out[i * n + j] = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                }
            }
        }
        WeightRef::Bf16(w) => {
            expect_len("w", w.len(), n, k);
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

/// Runs `f(i)` for every `i` in `0..n` on the kernel thread pool (the
/// calling thread included). Each index runs exactly once; the call returns
/// after all of them. A panic in `f` is re-raised here.
pub fn parallel_for(n: usize, f: impl Fn(usize) + Sync) {
    pool::run(num_threads(), n, &f);
}
