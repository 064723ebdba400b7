//! CPU compute kernels for the model runner.
//!
//! Contract (used by the model code; implementations may change freely behind
//! it):
//! - `matmul(x, m, k, w, n, out)`: `out[m×n] = x[m×k] · wᵀ`, where `w` is a
//!   row-major `[n×k]` matrix (the Hugging Face `Linear.weight` layout, and
//!   GGUF's) in any `WeightRef` format: f32, bf16, f16, a block-quantized
//!   GGUF type in ggml's row layout (`WeightRef::Quant`), or the same repacked
//!   at load (`WeightRef::Packed`, `PackedWeight::new`). `out` is overwritten.
//!   `matmul_bias` adds a per-column bias (`out = x·wᵀ + b`, the bias added
//!   after the dot product, exactly as a separate add would).
//!   `matmul_strided` / `matmul_bias_strided` write row `i` at
//!   `out[i·ldc..i·ldc + n]` (`ldc >= n`), so the parts of a fused projection
//!   stored in different formats write their columns straight into one
//!   output; the values are those of the contiguous call, bit for bit.
//! - Batch invariance: row `i` of `out` is bitwise the same whatever `m` is,
//!   whatever the other rows of `x` hold, and whatever the thread count —
//!   for a given `k`, weight format and kernel path. Why it holds: every
//!   output element is computed by one microkernel call over the whole of
//!   `k` (the drivers never split `k`), and every microkernel of a path
//!   gives each element the same order. Float formats: lane `l` of a
//!   fixed-width accumulator takes the same elements of `k` in the same
//!   sequence, then a fixed tree adds the lanes (`reduce.rs`); the orders
//!   are spelled out in `gemm_f32.rs`, `gemm_bf16.rs` and `gemm_f16.rs`, and
//!   different paths give different, equally valid roundings. Quantized
//!   formats: the activation rows are quantized to the format's partner
//!   (Q8_0 / Q8_1 / Q8_K, as llama.cpp does), each block contributes an
//!   exact integer dot product scaled by one FMA, blocks in order (`quant/`
//!   and each file of `formats/`); SIMD lanes hold output columns, so all
//!   paths give the same bits, equal to `dot_row_reference`.
//! - Paths (`KernelPath`), picked at run time by CPU feature detection, per
//!   `KernelFamily` (`dispatch.rs` has the table): AVX-512 (f32: AVX-512F
//!   FMA; bf16: `vdpbf16ps`, which first rounds the activations to bf16 —
//!   about 3 significant digits — so results differ from an f32-activation
//!   product by that rounding; quantized: VNNI `vpdpbusd` at 512 bits),
//!   AVX2 + FMA (quantized: `pmaddubsw`), and portable Rust.
//!   `SLUICE_KERNEL=portable|avx2|avx512|auto` or `set_kernel_path` cap the
//!   path of every kernel family — matmul of every format, attention,
//!   RMSNorm, SwiGLU, residual add, RoPE, sampling (the last five through
//!   `multiversion!`) — and `matmul_with` picks one per call. Every kernel
//!   takes its path from `select_path`, which records it
//!   (`last_kernel_path`).
//!   The build needs no `-C target-cpu` and should not use one: SIMD code
//!   is compiled with `#[target_feature]` and only called after detection,
//!   so one binary runs everywhere and still uses AVX-512 where present.
//!   (`-C target-cpu=native` would only speed up the portable fallback and
//!   would make the binary crash on older CPUs.) `cpu_features()` reports
//!   what was detected and chosen.
//! - Weight formats: `QuantFormat` and its table (`formats/`): block
//!   geometry, `dequantize_row` (equal to gguf-py's bit for bit; also what
//!   embedding lookups of quantized `token_embd` tensors use, through
//!   `WeightRef::row_to_f32`), `quantize_row` for the types gguf-py
//!   quantizes (`--quantization q8_0|q4_0` of safetensors checkpoints).
//! - `parallel_for(n, f)`: runs `f(i)` for `i in 0..n` on the kernel thread
//!   pool (`set_num_threads`, default `SLUICE_NUM_THREADS` or the core
//!   count; the caller takes part; nested calls run serially).
//! - `matmul_reference` is the plain triple loop (quantized weights
//!   dequantized first) kept for tests.

mod dispatch;
pub(crate) mod formats;
mod gemm;
mod gemm_bf16;
mod gemm_f16;
mod gemm_f32;
pub(crate) mod math;
mod pool;
pub(crate) mod quant;
mod reduce;
mod sync_ptr;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_quant;

// The dispatch point, for the kernels outside `kernels/` (model ops,
// attention, sampling).
use dispatch::record_path;
#[cfg(test)]
pub(crate) use dispatch::thread_cap;
pub use dispatch::{
    cpu_features, kernel_path, kernel_path_bf16, kernel_path_f32, last_kernel_path,
    set_kernel_path, CpuFeatures, KernelFamily, KernelPath,
};
pub(crate) use dispatch::{multiversion, select_path};
pub use formats::{FormatError, QuantFormat};
pub use pool::{num_threads, set_num_threads};
pub use quant::{dot_row_reference, quantized_activations, PackedWeight};
pub(crate) use sync_ptr::SyncPtr;

use gemm::Problem;
use std::cell::RefCell;

/// A weight matrix `[n×k]`, row-major.
#[derive(Clone, Copy, Debug)]
pub enum WeightRef<'a> {
    F32(&'a [f32]),
    /// bf16 values as their raw bit patterns.
    Bf16(&'a [u16]),
    /// IEEE f16 values as their raw bit patterns.
    F16(&'a [u16]),
    /// `n` rows of `k / block_size` blocks in ggml's layout (a GGUF tensor's
    /// bytes as stored). Float formats are accepted too (their bytes are
    /// read as `F32` / `F16` / `Bf16` values).
    Quant {
        format: QuantFormat,
        data: &'a [u8],
    },
    /// A quantized matrix repacked at load (bit-identical results, faster).
    Packed(&'a PackedWeight),
}

impl WeightRef<'_> {
    /// The format of the values.
    pub fn format(&self) -> QuantFormat {
        match self {
            WeightRef::F32(_) => QuantFormat::F32,
            WeightRef::Bf16(_) => QuantFormat::Bf16,
            WeightRef::F16(_) => QuantFormat::F16,
            WeightRef::Quant { format, .. } => *format,
            WeightRef::Packed(p) => p.format(),
        }
    }

    /// Row `row` of a `[rows × k]` matrix as f32 into `out` (`k` values):
    /// the embedding lookup. Quantized rows decode exactly as
    /// `QuantFormat::dequantize_row`.
    ///
    /// # Panics
    /// If the row is out of range or `out.len() != k`.
    pub fn row_to_f32(&self, row: usize, k: usize, out: &mut [f32]) {
        assert_eq!(
            out.len(),
            k,
            "row_to_f32: out has {} values, expected {k}",
            out.len()
        );
        match *self {
            WeightRef::F32(v) => out.copy_from_slice(&v[row * k..(row + 1) * k]),
            WeightRef::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[row * k..(row + 1) * k]) {
                    *o = bf16_to_f32(b);
                }
            }
            WeightRef::F16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[row * k..(row + 1) * k]) {
                    *o = half::f16::from_bits(b).to_f32();
                }
            }
            WeightRef::Quant { format, data } => {
                let rb = format
                    .row_bytes(k)
                    .unwrap_or_else(|e| panic!("row_to_f32: {e}"));
                let bytes = &data[row * rb..(row + 1) * rb];
                if let Err(e) = format.dequantize_row(bytes, out) {
                    panic!("row_to_f32: {e}");
                }
            }
            WeightRef::Packed(p) => p.dequantize_row(row, out),
        }
    }
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
/// If the slice lengths do not match `m`, `k`, `n` (or `k` is not a whole
/// number of the format's blocks).
pub fn matmul(x: &[f32], m: usize, k: usize, w: WeightRef<'_>, n: usize, out: &mut [f32]) {
    expect_len("out", out.len(), m, n);
    matmul_impl(MatmulOptions::default(), x, m, k, w, None, n, out, n);
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
    expect_len("out", out.len(), m, n);
    matmul_impl(MatmulOptions::default(), x, m, k, w, Some(bias), n, out, n);
}

/// `matmul` writing row `i` to `out[i·ldc..i·ldc + n]` (`ldc >= n`); the
/// other elements of `out` are left alone. Bit for bit the contiguous
/// result. For fused projections whose parts have different formats: call
/// it per part on `&mut fused[column_offset..]` with `ldc` the fused width.
///
/// # Panics
/// If `ldc < n`, `out` is shorter than `(m-1)·ldc + n`, or the other
/// lengths do not match.
#[allow(clippy::too_many_arguments)]
pub fn matmul_strided(
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    n: usize,
    out: &mut [f32],
    ldc: usize,
) {
    expect_strided(out.len(), m, n, ldc);
    matmul_impl(MatmulOptions::default(), x, m, k, w, None, n, out, ldc);
}

/// `matmul_bias` with a row stride, as `matmul_strided`.
///
/// # Panics
/// As for `matmul_strided`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_bias_strided(
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    bias: &[f32],
    n: usize,
    out: &mut [f32],
    ldc: usize,
) {
    expect_strided(out.len(), m, n, ldc);
    matmul_impl(
        MatmulOptions::default(),
        x,
        m,
        k,
        w,
        Some(bias),
        n,
        out,
        ldc,
    );
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
    expect_len("out", out.len(), m, n);
    matmul_impl(opts, x, m, k, w, None, n, out, n)
}

/// The general form: options, optional bias, row stride `ldc`; returns the
/// path that ran.
///
/// # Panics
/// As for `matmul_strided`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_ex(
    opts: MatmulOptions,
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    bias: Option<&[f32]>,
    n: usize,
    out: &mut [f32],
    ldc: usize,
) -> KernelPath {
    expect_strided(out.len(), m, n, ldc);
    matmul_impl(opts, x, m, k, w, bias, n, out, ldc)
}

fn expect_len(what: &str, len: usize, rows: usize, cols: usize) {
    let want = rows.checked_mul(cols);
    assert!(
        want == Some(len),
        "matmul: {what} has {len} values, expected {rows}×{cols}"
    );
}

fn expect_strided(len: usize, m: usize, n: usize, ldc: usize) {
    assert!(ldc >= n, "matmul: ldc {ldc} is below n {n}");
    let need = if m == 0 {
        Some(0)
    } else {
        (m - 1).checked_mul(ldc).and_then(|v| v.checked_add(n))
    };
    assert!(
        need.is_some_and(|need| len >= need),
        "matmul: out has {len} values, too few for {m} rows of {n} at stride {ldc}"
    );
}

/// Reads a float format's bytes as values (GGUF aligns tensor data, so
/// the bytes of a mapped file are aligned; anything else is copied).
fn float_view<'a, T: Copy>(
    data: &'a [u8],
    copy: &'a mut Vec<T>,
    from: fn([u8; 4]) -> T,
    width: usize,
) -> &'a [T] {
    let size = std::mem::size_of::<T>();
    debug_assert_eq!(size, width);
    if (data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
        && data.len().is_multiple_of(size)
    {
        // SAFETY: the pointer is aligned for T, the length is a whole number
        // of T, T is a plain number type (f32 / u16) valid for any bits, and
        // the result borrows `data`.
        return unsafe { std::slice::from_raw_parts(data.as_ptr() as *const T, data.len() / size) };
    }
    copy.clear();
    copy.extend(data.chunks_exact(width).map(|c| {
        let mut b = [0u8; 4];
        b[..width].copy_from_slice(c);
        from(b)
    }));
    copy
}

/// The bf16 GEMM of `p` on `path` (what `select_path` gave the bf16
/// family): AVX-512 first rounds the activations to bf16 rows padded for
/// `vdpbf16ps`, the other paths read `p.x` as it is.
fn matmul_bf16(path: KernelPath, p: &Problem<'_, f32, u16>, out: &mut [f32], threads: usize) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            let Problem {
                x,
                m,
                k,
                w,
                n,
                bias,
                ldc,
                ..
            } = *p;
            with_x_buffer(m * k.div_ceil(gemm_bf16::X_PAD) * gemm_bf16::X_PAD, |buf| {
                // SAFETY: `select_path` returned Avx512, so the CPU has
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
                    ldc,
                };
                // SAFETY: as above; the buffer rows are zero-padded.
                unsafe { gemm::run(&gemm_bf16::AVX512, &p, out, threads) };
            })
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `select_path` returned Avx2: AVX2 + FMA present.
        KernelPath::Avx2 => unsafe { gemm::run(&gemm_bf16::AVX2, p, out, threads) },
        // SAFETY: the portable kernel needs no CPU feature.
        _ => unsafe { gemm::run(&gemm_bf16::PORTABLE, p, out, threads) },
    }
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
    ldc: usize,
) -> KernelPath {
    expect_len("x", x.len(), m, k);
    if let Some(b) = bias {
        expect_len("bias", b.len(), 1, n);
    }
    let threads = opts.threads.unwrap_or_else(num_threads).max(1);
    let want = opts.path;
    match w {
        WeightRef::F32(w) => {
            expect_len("w", w.len(), n, k);
            let path = select_path(KernelFamily::F32, want);
            let p = Problem {
                x,
                ldx: k,
                m,
                k,
                w,
                n,
                bias,
                ldc,
            };
            // SAFETY: `select_path` only returns a path whose features this CPU
            // has.
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
        WeightRef::F16(w) => {
            expect_len("w", w.len(), n, k);
            let path = select_path(KernelFamily::F16, want);
            let p = Problem {
                x,
                ldx: k,
                m,
                k,
                w,
                n,
                bias,
                ldc,
            };
            // SAFETY: `select_path` only returns a path whose features this CPU
            // has.
            unsafe {
                match path {
                    #[cfg(target_arch = "x86_64")]
                    KernelPath::Avx512 => gemm::run(&gemm_f16::AVX512, &p, out, threads),
                    #[cfg(target_arch = "x86_64")]
                    KernelPath::Avx2 => gemm::run(&gemm_f16::AVX2, &p, out, threads),
                    _ => gemm::run(&gemm_f16::PORTABLE, &p, out, threads),
                }
            }
            path
        }
        WeightRef::Bf16(w) => {
            expect_len("w", w.len(), n, k);
            let path = select_path(KernelFamily::Bf16, want);
            let p = Problem {
                x,
                ldx: k,
                m,
                k,
                w,
                n,
                bias,
                ldc,
            };
            matmul_bf16(path, &p, out, threads);
            path
        }
        WeightRef::Quant { format, data } => match format {
            QuantFormat::F32 => {
                let mut copy = Vec::new();
                let v = float_view(data, &mut copy, f32::from_le_bytes, 4);
                matmul_impl(opts, x, m, k, WeightRef::F32(v), bias, n, out, ldc)
            }
            QuantFormat::F16 | QuantFormat::Bf16 => {
                let mut copy = Vec::new();
                let v = float_view(data, &mut copy, |b| u16::from_le_bytes([b[0], b[1]]), 2);
                let w = if format == QuantFormat::F16 {
                    WeightRef::F16(v)
                } else {
                    WeightRef::Bf16(v)
                };
                matmul_impl(opts, x, m, k, w, bias, n, out, ldc)
            }
            _ => {
                let rb = format
                    .row_bytes(k)
                    .unwrap_or_else(|e| panic!("matmul: {e}"));
                expect_len("w (bytes)", data.len(), n, rb);
                let path = select_path(KernelFamily::Quant, want);
                let ran = quant::matmul_quant(
                    path,
                    threads,
                    x,
                    k,
                    m,
                    k,
                    format,
                    quant::QuantSource::Rows(data),
                    n,
                    bias,
                    out,
                    ldc,
                );
                record_path(KernelFamily::Quant, ran);
                ran
            }
        },
        WeightRef::Packed(pw) => {
            assert!(
                pw.rows() == n && pw.cols() == k,
                "matmul: packed weight is {}×{}, expected {n}×{k}",
                pw.rows(),
                pw.cols()
            );
            let path = select_path(KernelFamily::Quant, want);
            let ran = quant::matmul_quant(
                path,
                threads,
                x,
                k,
                m,
                k,
                pw.format(),
                quant::QuantSource::Packed(pw),
                n,
                bias,
                out,
                ldc,
            );
            record_path(KernelFamily::Quant, ran);
            ran
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
/// reference for tests; quantized weights are dequantized first (each row
/// with `WeightRef::row_to_f32`), activations used as they are.
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
    let mut wr = vec![0.0f32; k];
    for j in 0..n {
        w.row_to_f32(j, k, &mut wr);
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            out[i * n + j] = xr.iter().zip(&wr).map(|(a, b)| a * b).sum();
        }
    }
}

/// Runs `f(i)` for every `i` in `0..n` on the kernel thread pool (the
/// calling thread included). Each index runs exactly once; the call returns
/// after all of them. A panic in `f` is re-raised here.
pub fn parallel_for(n: usize, f: impl Fn(usize) + Sync) {
    pool::run(num_threads(), n, &f);
}
