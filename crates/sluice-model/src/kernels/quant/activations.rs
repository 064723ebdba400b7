//! The activation partners of the quantized formats: each row of `x`
//! quantized per block to Q8_0 / Q8_1 / Q8_K, exactly as llama.cpp's x86
//! build does (the module docs of `quant` spell the rounding out).
//!
//! Owns: `ActKind`, the per-call buffers (`Acts`) and the one-block
//! quantizers. Promises: a warm call allocates nothing (buffers only grow).

// Tile loops index several arrays by the same (i, j); ranges read closer
// to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use crate::kernels::dispatch::KernelPath;
use crate::kernels::formats::{f16_to_f32, f32_to_f16, QuantFormat};
use crate::kernels::pool;
use crate::kernels::SyncPtr;

/// The activation format a weight format's integer kernels pair with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActKind {
    /// Elements per activation block.
    pub(crate) fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 32,
            ActKind::Q8K => 256,
        }
    }

    /// Integer sums kept per block: the block's Σq, or Q8_K's 16 sums of 16.
    pub(crate) fn sums_per_block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 1,
            ActKind::Q8K => 16,
        }
    }
}

/// One activation block, as the scalar steps read it.
pub(crate) struct ActBlock<'a> {
    pub qs: &'a [i8],
    /// The block scale: Q8_0/Q8_1's f16-rounded `d` widened, Q8_K's f32 `d`.
    pub d: f32,
    /// Q8_1: `f16(d · Σq)` widened; 0 otherwise.
    pub s: f32,
    /// Σq (Q8_0/Q8_1), or the 16 sums of 16 (Q8_K).
    pub sums: &'a [i32],
}

/// Activation rows quantized for one call.
#[derive(Default)]
pub(crate) struct Acts {
    pub kind: Option<ActKind>,
    pub m: usize,
    pub k: usize,
    /// Blocks per row.
    pub nb: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub sums: Vec<i32>,
}

impl Acts {
    /// Quantizes `x[m×k]` (rows `ldx` apart) for `kind`, reusing buffers,
    /// on the scalar path and the caller's thread (the reference).
    pub(crate) fn quantize(&mut self, kind: ActKind, x: &[f32], ldx: usize, m: usize, k: usize) {
        self.quantize_with(KernelPath::Portable, 1, kind, x, ldx, m, k);
    }

    /// As `quantize`, with `path`'s block quantizers (every path gives the
    /// same bytes) and, for prefill-sized inputs, rows split over up to
    /// `threads` threads of the pool: this runs before the matmul can
    /// start, so done serially it leaves the other threads waiting.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn quantize_with(
        &mut self,
        path: KernelPath,
        threads: usize,
        kind: ActKind,
        x: &[f32],
        ldx: usize,
        m: usize,
        k: usize,
    ) {
        let block = kind.block();
        debug_assert!(k.is_multiple_of(block));
        let nb = k / block;
        let spb = kind.sums_per_block();
        self.kind = Some(kind);
        self.m = m;
        self.k = k;
        self.nb = nb;
        // `resize` only grows the buffers: a warm step allocates nothing.
        fit(&mut self.qs, m * k, 0);
        fit(&mut self.d, m * nb, 0.0);
        fit(&mut self.s, m * nb, 0.0);
        fit(&mut self.sums, m * nb * spb, 0);
        let tasks = if m * k >= PARALLEL_MIN_ELEMENTS {
            threads.clamp(1, m)
        } else {
            1
        };
        // One task runs inline on the caller's thread (`pool::run`).
        let per = m.div_ceil(tasks).max(1);
        let (qs, d, s, sums) = (
            SyncPtr(self.qs.as_mut_ptr()),
            SyncPtr(self.d.as_mut_ptr()),
            SyncPtr(self.s.as_mut_ptr()),
            SyncPtr(self.sums.as_mut_ptr()),
        );
        pool::run(tasks, m.div_ceil(per), &|t| {
            let (i0, i1) = (t * per, ((t + 1) * per).min(m));
            let n = i1 - i0;
            // SAFETY: task `t` alone touches rows i0..i1 of each buffer
            // (the tasks' row ranges are disjoint), every buffer holds `m`
            // rows (`fit` above), and `pool::run` returns only after every
            // task finished, while `self` stays mutably borrowed.
            let out = unsafe {
                RowsOut {
                    qs: std::slice::from_raw_parts_mut(qs.get().add(i0 * k), n * k),
                    d: std::slice::from_raw_parts_mut(d.get().add(i0 * nb), n * nb),
                    s: std::slice::from_raw_parts_mut(s.get().add(i0 * nb), n * nb),
                    sums: std::slice::from_raw_parts_mut(
                        sums.get().add(i0 * nb * spb),
                        n * nb * spb,
                    ),
                }
            };
            quantize_rows(path, kind, x, ldx, k, i0..i1, out);
        });
    }

    /// Block `b` of row `i`.
    pub(crate) fn block(&self, i: usize, b: usize) -> ActBlock<'_> {
        let kind = self.kind.unwrap_or(ActKind::Q8_0);
        let block = kind.block();
        let spb = kind.sums_per_block();
        let at = i * self.nb + b;
        ActBlock {
            qs: &self.qs[i * self.k + b * block..i * self.k + (b + 1) * block],
            d: self.d[at],
            s: self.s[at],
            sums: &self.sums[at * spb..(at + 1) * spb],
        }
    }
}

fn fit<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}

/// Below this many elements (`m · k`) the activations are quantized on the
/// caller's thread: waking the pool costs more than it saves (a decode
/// batch's rows take a few microseconds).
const PARALLEL_MIN_ELEMENTS: usize = 32 * 1024;

/// The buffers of a run of rows (row 0 is the run's first).
struct RowsOut<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    sums: &'a mut [i32],
}

/// Quantizes rows `rows` of `x` into `out`.
fn quantize_rows(
    path: KernelPath,
    kind: ActKind,
    x: &[f32],
    ldx: usize,
    k: usize,
    rows: std::ops::Range<usize>,
    out: RowsOut<'_>,
) {
    let block = kind.block();
    let nb = k / block;
    let (q8_0, q8_k) = block_quantizers(path);
    for (r, i) in rows.enumerate() {
        let row = &x[i * ldx..i * ldx + k];
        for b in 0..nb {
            let src = &row[b * block..(b + 1) * block];
            let qs = &mut out.qs[r * k + b * block..r * k + (b + 1) * block];
            let at = r * nb + b;
            match kind {
                ActKind::Q8_0 | ActKind::Q8_1 => {
                    // SAFETY: `block_quantizers` gave what this CPU runs.
                    let (d, s, sum) = unsafe { q8_0(src, qs) };
                    out.d[at] = d;
                    out.s[at] = if kind == ActKind::Q8_1 { s } else { 0.0 };
                    out.sums[at] = sum;
                }
                ActKind::Q8K => {
                    let sums = &mut out.sums[at * 16..at * 16 + 16];
                    // SAFETY: as above.
                    out.d[at] = unsafe { q8_k(src, qs, sums) };
                    out.s[at] = 0.0;
                }
            }
        }
    }
}

type Q8_0Block = unsafe fn(&[f32], &mut [i8]) -> (f32, f32, i32);
type Q8KBlock = unsafe fn(&[f32], &mut [i8], &mut [i32]) -> f32;

/// `path`'s Q8_0 and Q8_K block quantizers (the scalar ones on the
/// portable path; the caller clamped `path` to this CPU, so calling the
/// SIMD ones is then sound).
fn block_quantizers(path: KernelPath) -> (Q8_0Block, Q8KBlock) {
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx512 {
        return (x86::quantize_q8_0_block, x86::quantize_q8_k_block);
    }
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx2 {
        return (
            x86::avx2::quantize_q8_0_block,
            x86::avx2::quantize_q8_k_block,
        );
    }
    let _ = path;
    (quantize_q8_0_block, quantize_q8_k_block)
}

/// `x.round_ties_even()` for the quantizers' `|x| <= 2²²` (scaled values
/// of at most 127 in magnitude; NaN stays NaN), by ggml's 1.5·2²³ trick:
/// adding it leaves no fraction bits, so the FPU's round-to-nearest-even
/// does the rounding. `round_ties_even` itself is a libm call (`rintf`)
/// on x86-64's baseline, which showed in prefill profiles.
#[inline(always)]
fn round_half_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    (x + MAGIC) - MAGIC
}

/// One Q8_0 / Q8_1 block as llama.cpp's AVX2 `quantize_row_q8_0/1` makes
/// it: returns `(f16(d) widened, f16(d·Σq) widened, Σq)`.
pub(crate) fn quantize_q8_0_block(x: &[f32], q: &mut [i8]) -> (f32, f32, i32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        // `_mm256_round_ps(_MM_ROUND_NEAREST)` then `cvtps_epi32`; the sum
        // is taken before the saturating packs (which never bind: |v·id|
        // <= 127 up to rounding).
        let r = round_half_even(v * id);
        let r = if r.is_nan() { 0 } else { r as i32 };
        // Wrapping: a denormal |max| makes the scale infinite and `r`
        // saturate (garbage in, but no overflow panic, and the same sum
        // in any order).
        sum = sum.wrapping_add(r);
        *o = r.clamp(-128, 127) as i8;
    }
    let dh = f16_to_f32(f32_to_f16(d));
    let s = f16_to_f32(f32_to_f16(d * sum as f32));
    (dh, s, sum)
}

/// One Q8_K block (ggml's `quantize_row_q8_K_ref`, what x86 runs): returns
/// `d`; writes the quants and the 16 sums of 16.
pub(crate) fn quantize_q8_k_block(x: &[f32], q: &mut [i8], sums: &mut [i32]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        sums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q.iter_mut().zip(x) {
        // ggml's `nearest_int` (the 1.5·2²³ trick) rounds half to even.
        let r = round_half_even(iscale * v);
        let r = if r.is_nan() { 0 } else { r as i32 };
        *o = r.clamp(-128, 127) as i8;
    }
    for (j, s) in sums.iter_mut().enumerate() {
        *s = q[j * 16..(j + 1) * 16].iter().map(|&v| v as i32).sum();
    }
    1.0 / iscale
}

/// The AVX-512 and AVX2 block quantizers: the same bytes as the scalar
/// ones (the same f32 products, round-half-even conversion, and NaN lanes
/// taken as 0 as the scalar code does), 16 or 8 lanes at a time. In a
/// prefill on AVX2 the scalar Q8_K quantizer took a fifth of the K types'
/// matmul time.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::kernels::formats::{f16_to_f32, f32_to_f16};
    use std::arch::x86_64::*;

    /// `|v|` of 16 lanes, and the running maximum of `|v|` that skips NaN
    /// lanes as `f32::max` does (`max_ps` returns its second operand when
    /// either is NaN, and `acc` never is).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn abs_max(v: __m512, acc: __m512) -> (__m512, __m512) {
        let a = _mm512_abs_ps(v);
        (a, _mm512_max_ps(a, acc))
    }

    /// `round_half_even(v · id) as i32`, as the scalar code computes it:
    /// `cvtps_epi32` rounds to nearest even under the default MXCSR; NaN
    /// lanes become 0 and out-of-range ones saturate, as Rust's `as` does
    /// (the hardware gives i32::MIN for both; the scale overflows to
    /// infinity when a block's |max| is a denormal).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn round_scaled(v: __m512, id: __m512) -> __m512i {
        let x = _mm512_mul_ps(v, id);
        let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x);
        let too_big = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(2_147_483_648.0));
        let r = _mm512_maskz_cvtps_epi32(ordered, x);
        _mm512_mask_mov_epi32(r, too_big, _mm512_set1_epi32(i32::MAX))
    }

    /// As `super::quantize_q8_0_block`.
    ///
    /// # Safety
    /// AVX-512F; `x` and `q` are 32 long.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize_q8_0_block(x: &[f32], q: &mut [i8]) -> (f32, f32, i32) {
        assert!(x.len() == 32 && q.len() == 32);
        // SAFETY: 32 floats in, 32 bytes out (asserted).
        unsafe {
            let v0 = _mm512_loadu_ps(x.as_ptr());
            let v1 = _mm512_loadu_ps(x.as_ptr().add(16));
            let (_, m) = abs_max(v0, _mm512_setzero_ps());
            let (_, m) = abs_max(v1, m);
            let amax = _mm512_reduce_max_ps(m);
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let r0 = round_scaled(v0, id);
            let r1 = round_scaled(v1, id);
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
            _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(r0));
            _mm_storeu_si128(q.as_mut_ptr().add(16).cast(), _mm512_cvtsepi32_epi8(r1));
            let dh = f16_to_f32(f32_to_f16(d));
            let s = f16_to_f32(f32_to_f16(d * sum as f32));
            (dh, s, sum)
        }
    }

    /// As `super::quantize_q8_k_block`.
    ///
    /// # Safety
    /// AVX-512F; `x` and `q` are 256 long, `sums` 16.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize_q8_k_block(x: &[f32], q: &mut [i8], sums: &mut [i32]) -> f32 {
        assert!(x.len() == 256 && q.len() == 256 && sums.len() == 16);
        // SAFETY: 256 floats in, 256 bytes and 16 sums out (asserted).
        unsafe {
            let mut m = _mm512_setzero_ps();
            for c in 0..16 {
                (_, m) = abs_max(_mm512_loadu_ps(x.as_ptr().add(16 * c)), m);
            }
            let amax = _mm512_reduce_max_ps(m);
            if amax == 0.0 {
                q.fill(0);
                sums.fill(0);
                return 0.0;
            }
            // The scalar code keeps the first value whose |v| is the
            // largest (a strict `>`), sign included.
            let target = _mm512_set1_ps(amax);
            let mut max = amax;
            for c in 0..16 {
                let v = _mm512_loadu_ps(x.as_ptr().add(16 * c));
                let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), target);
                if hit != 0 {
                    max = x[16 * c + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let id = _mm512_set1_ps(iscale);
            for c in 0..16 {
                let r = round_scaled(_mm512_loadu_ps(x.as_ptr().add(16 * c)), id);
                let b = _mm512_cvtsepi32_epi8(r);
                _mm_storeu_si128(q.as_mut_ptr().add(16 * c).cast(), b);
                // The sum of the stored (clamped) bytes, as the scalar code.
                sums[c] = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(b));
            }
            1.0 / iscale
        }
    }

    /// The AVX2 + F16C versions (no AVX-512 horizontal reductions or
    /// narrowing stores: saturating packs and shuffles instead).
    pub(super) mod avx2 {
        use crate::kernels::formats::{f16_to_f32, f32_to_f16};
        use std::arch::x86_64::*;

        /// `|v|` per lane (the sign bit cleared).
        #[inline]
        #[target_feature(enable = "avx2")]
        fn abs(v: __m256) -> __m256 {
            _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
        }

        /// The running maximum of `|v|` over 8 lanes, skipping NaN lanes
        /// (`max_ps` returns its second operand when either is NaN).
        #[inline]
        #[target_feature(enable = "avx2")]
        fn abs_max(v: __m256, acc: __m256) -> __m256 {
            _mm256_max_ps(abs(v), acc)
        }

        /// The largest lane of `m` (no NaN lanes).
        #[inline]
        #[target_feature(enable = "avx2")]
        fn hmax(m: __m256) -> f32 {
            let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_max_ss(h, _mm_movehdup_ps(h));
            _mm_cvtss_f32(h)
        }

        /// The wrapping sum of 8 i32 lanes.
        #[inline]
        #[target_feature(enable = "avx2")]
        fn hsum(v: __m256i) -> i32 {
            let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
            let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01>(h));
            _mm_cvtsi128_si32(h)
        }

        /// As the AVX-512 `round_scaled`, 8 lanes: NaN lanes 0, lanes at
        /// or above 2³¹ `i32::MAX` (`cvtps_epi32` gives `i32::MIN` for
        /// both, right only for the large negative ones).
        #[inline]
        #[target_feature(enable = "avx2")]
        fn round_scaled(v: __m256, id: __m256) -> __m256i {
            let x = _mm256_mul_ps(v, id);
            let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(x, x));
            let too_big = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(
                x,
                _mm256_set1_ps(2_147_483_648.0),
            ));
            let r = _mm256_and_si256(_mm256_cvtps_epi32(x), ordered);
            _mm256_blendv_epi8(r, _mm256_set1_epi32(i32::MAX), too_big)
        }

        /// 32 lanes (`r[0..4]`, in order) saturated to i8, in order.
        #[inline]
        #[target_feature(enable = "avx2")]
        fn narrow(r: [__m256i; 4]) -> __m256i {
            // The packs work within 128-bit halves; the permute restores
            // element order.
            let a = _mm256_packs_epi32(r[0], r[1]);
            let b = _mm256_packs_epi32(r[2], r[3]);
            let p = _mm256_packs_epi16(a, b);
            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        }

        /// The sums of bytes 0..16 and 16..32 of `b` (signed).
        #[inline]
        #[target_feature(enable = "avx2")]
        fn sums_of_16(b: __m256i) -> (i32, i32) {
            // Σ(b + 128) per 8 bytes by `psadbw`, less 16·128 per 16.
            let s = _mm256_sad_epu8(
                _mm256_xor_si256(b, _mm256_set1_epi8(-128)),
                _mm256_setzero_si256(),
            );
            let lo = _mm256_extract_epi64::<0>(s) + _mm256_extract_epi64::<1>(s);
            let hi = _mm256_extract_epi64::<2>(s) + _mm256_extract_epi64::<3>(s);
            (lo as i32 - 2048, hi as i32 - 2048)
        }

        /// As `super::super::quantize_q8_0_block`.
        ///
        /// # Safety
        /// AVX2 + F16C; `x` and `q` are 32 long.
        #[target_feature(enable = "avx2,f16c")]
        pub(in super::super) unsafe fn quantize_q8_0_block(
            x: &[f32],
            q: &mut [i8],
        ) -> (f32, f32, i32) {
            assert!(x.len() == 32 && q.len() == 32);
            // SAFETY: 32 floats in, 32 bytes out (asserted).
            unsafe {
                let v: [__m256; 4] =
                    std::array::from_fn(|c| _mm256_loadu_ps(x.as_ptr().add(8 * c)));
                let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| abs_max(v, m));
                let amax = hmax(m);
                let d = amax / 127.0;
                let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                let r: [__m256i; 4] = std::array::from_fn(|c| round_scaled(v[c], id));
                let sum = hsum(_mm256_add_epi32(
                    _mm256_add_epi32(r[0], r[1]),
                    _mm256_add_epi32(r[2], r[3]),
                ));
                _mm256_storeu_si256(q.as_mut_ptr().cast(), narrow(r));
                let dh = f16_to_f32(f32_to_f16(d));
                let s = f16_to_f32(f32_to_f16(d * sum as f32));
                (dh, s, sum)
            }
        }

        /// As `super::super::quantize_q8_k_block`.
        ///
        /// # Safety
        /// AVX2; `x` and `q` are 256 long, `sums` 16.
        #[target_feature(enable = "avx2")]
        pub(in super::super) unsafe fn quantize_q8_k_block(
            x: &[f32],
            q: &mut [i8],
            sums: &mut [i32],
        ) -> f32 {
            assert!(x.len() == 256 && q.len() == 256 && sums.len() == 16);
            // SAFETY: 256 floats in, 256 bytes and 16 sums out (asserted).
            unsafe {
                let mut m = _mm256_setzero_ps();
                for c in 0..32 {
                    m = abs_max(_mm256_loadu_ps(x.as_ptr().add(8 * c)), m);
                }
                let amax = hmax(m);
                if amax == 0.0 {
                    q.fill(0);
                    sums.fill(0);
                    return 0.0;
                }
                // The scalar code keeps the first value whose |v| is the
                // largest (a strict `>`), sign included.
                let target = _mm256_set1_ps(amax);
                let mut max = amax;
                for c in 0..32 {
                    let v = _mm256_loadu_ps(x.as_ptr().add(8 * c));
                    let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(v), target));
                    if hit != 0 {
                        max = x[8 * c + hit.trailing_zeros() as usize];
                        break;
                    }
                }
                let iscale = -127.0 / max;
                let id = _mm256_set1_ps(iscale);
                for c in 0..8 {
                    let r: [__m256i; 4] = std::array::from_fn(|j| {
                        round_scaled(_mm256_loadu_ps(x.as_ptr().add(32 * c + 8 * j)), id)
                    });
                    let b = narrow(r);
                    _mm256_storeu_si256(q.as_mut_ptr().add(32 * c).cast(), b);
                    // The sums of the stored (clamped) bytes, as the scalar
                    // code.
                    (sums[2 * c], sums[2 * c + 1]) = sums_of_16(b);
                }
                1.0 / iscale
            }
        }
    }
}

/// The values the kernels actually multiply for activation row `x`: each
/// element dequantized from its partner block (`d · q`), for tolerance
/// arguments in tests.
pub fn quantized_activations(format: QuantFormat, x: &[f32]) -> Vec<f32> {
    let Some(kern) = format.info().kernels else {
        return x.to_vec();
    };
    let k = x.len();
    let mut acts = Acts::default();
    acts.quantize(kern.act, x, k, 1, k);
    let mut out = Vec::with_capacity(k);
    for b in 0..acts.nb {
        let a = acts.block(0, b);
        out.extend(a.qs.iter().map(|&q| a.d * q as f32));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{round_half_even, ActKind, Acts};
    use crate::kernels::dispatch::{cpu_features, KernelFamily, KernelPath};

    /// Rows with what breaks quantizers: zeros, ties of |max| with both
    /// signs, halves that round to even, NaN and infinities, denormals.
    fn awkward_rows(k: usize, m: usize) -> Vec<f32> {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let mut x: Vec<f32> = (0..m * k).map(|_| next() * 3.0).collect();
        for (r, row) in x.chunks_mut(k).enumerate() {
            match r % 6 {
                0 => row[..k / 2].fill(0.0),
                1 => {
                    row[5] = -4.0;
                    row[7] = 4.0;
                    row[40] = -4.0;
                }
                2 => {
                    // v · 127/amax lands on halves: amax 127 gives v itself.
                    row[0] = 127.0;
                    for (j, v) in row.iter_mut().enumerate().skip(1) {
                        *v = (j % 9) as f32 - 4.5;
                    }
                }
                3 => {
                    row[3] = f32::NAN;
                    row[300 % k] = f32::NAN;
                }
                4 => {
                    row[9] = f32::INFINITY;
                    row[33 % k] = f32::NEG_INFINITY;
                }
                _ => row.iter_mut().for_each(|v| *v *= 1e-39),
            }
        }
        x
    }

    #[test]
    fn every_path_and_thread_count_quantizes_to_the_same_bytes() {
        let best = cpu_features().best(KernelFamily::Quant);
        for kind in [ActKind::Q8_0, ActKind::Q8_1, ActKind::Q8K] {
            // m · k above and below the parallel threshold.
            for (m, k) in [(3, 512), (70, 768), (12, 4096)] {
                let ldx = k + 8;
                let x = awkward_rows(ldx, m);
                let mut want = Acts::default();
                want.quantize(kind, &x, ldx, m, k);
                for path in KernelPath::ALL.into_iter().filter(|&p| p <= best) {
                    for threads in [1, 2, 3] {
                        let mut got = Acts::default();
                        got.quantize_with(path, threads, kind, &x, ldx, m, k);
                        let what = format!("{kind:?} {m}x{k} {path:?} {threads} threads");
                        assert_eq!(got.qs[..m * k], want.qs[..m * k], "{what}");
                        let nb = m * k / kind.block();
                        let bits =
                            |v: &[f32]| v[..nb].iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got.d), bits(&want.d), "{what}");
                        assert_eq!(bits(&got.s), bits(&want.s), "{what}");
                        let ns = nb * kind.sums_per_block();
                        assert_eq!(got.sums[..ns], want.sums[..ns], "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_rounding_trick_is_round_ties_even_in_range() {
        // Every multiple of 1/8 in [-200, 200] (halves included), and
        // awkward values near them.
        let mut xs: Vec<f32> = (-1600..=1600).map(|i| i as f32 / 8.0).collect();
        xs.extend([
            0.49999997,
            -0.49999997,
            126.5,
            -127.5,
            1e-30,
            -0.0,
            4_194_303.5,
        ]);
        for x in xs {
            assert_eq!(
                round_half_even(x).to_bits() & !(1 << 31),
                x.round_ties_even().to_bits() & !(1 << 31),
                "{x}"
            );
        }
        assert!(round_half_even(f32::NAN).is_nan());
    }
}
