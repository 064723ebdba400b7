//! Microkernels for f16 weights (`w` as raw IEEE half bits, row-major
//! `[n×k]`), f32 activations.
//!
//! Owns: the three f16 paths and the per-element order of each. Weights
//! are widened to f32 exactly (F16C / AVX-512F `vcvtph2ps`, or `half` on
//! the portable path), so each path is the f32 kernel's arithmetic on the
//! widened values. For output element `(i, j)` of a given `k`:
//! - AVX-512: lane `l` accumulates `fma(x[16s + l], w[16s + l], acc)` over
//!   `s` from +0.0, elements past `k` read as zero; then `tree16`.
//! - AVX2: the same with 8 lanes and `tree8`.
//! - Portable: lane `l` accumulates `acc + x[16s + l] * w[16s + l]` (two
//!   roundings) over `s`, then `tree16`.
//!
//! None of these depends on the tile shape, `m` or the thread count.

#![allow(clippy::needless_range_loop)]

use super::gemm::{Micro, Tile};
use super::gemm_bf16::tile_shapes;
use super::reduce::tree16;

#[inline(always)]
fn widen(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

// ---------------------------------------------------------------- portable

pub(crate) const PORTABLE: Micro<f32, u16> = Micro {
    mr: 2,
    nr: 4,
    mr_stream: 2,
    nr_stream: 4,
    tile: tile_portable,
    tile_stream: tile_portable,
};

/// # Safety
/// The pointers in `t` must be valid for the extents it gives.
unsafe fn tile_portable(t: &Tile<f32, u16>) {
    // SAFETY: forwarded.
    unsafe {
        tile_shapes!(portable_impl, t;
            1 => [1, 2, 3, 4];
            2 => [1, 2, 3, 4];
        )
    }
}

/// # Safety
/// As for `tile_portable`.
unsafe fn portable_impl<const MR: usize, const NR: usize>(t: &Tile<f32, u16>) {
    let k = t.k;
    // SAFETY: the driver passes MR rows of x (ldx apart, k valid each) and
    // NR rows of w (k apart).
    let xs: [&[f32]; MR] =
        std::array::from_fn(|i| unsafe { std::slice::from_raw_parts(t.x.add(i * t.ldx), k) });
    let ws: [&[u16]; NR] =
        // SAFETY: as above: row j of w holds k values.
        std::array::from_fn(|j| unsafe { std::slice::from_raw_parts(t.w.add(j * k), k) });
    let mut acc = [[[0.0f32; 16]; NR]; MR];
    let full = k / 16 * 16;
    for off in (0..full).step_by(16) {
        for j in 0..NR {
            let wv: [f32; 16] = std::array::from_fn(|l| widen(ws[j][off + l]));
            for i in 0..MR {
                let xv = &xs[i][off..off + 16];
                for l in 0..16 {
                    acc[i][j][l] += xv[l] * wv[l];
                }
            }
        }
    }
    if full < k {
        for j in 0..NR {
            for i in 0..MR {
                for l in 0..k - full {
                    acc[i][j][l] += xs[i][full + l] * widen(ws[j][full + l]);
                }
            }
        }
    }
    for i in 0..MR {
        for j in 0..NR {
            let s = tree16(&acc[i][j]);
            // SAFETY: out is writable at i*ldo + j; bias holds NR values.
            unsafe {
                *t.out.add(i * t.ldo + j) = if t.bias.is_null() {
                    s
                } else {
                    s + *t.bias.add(j)
                };
            }
        }
    }
}

// -------------------------------------------------------------------- x86

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{AVX2, AVX512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::gemm::{Micro, Tile};
    use super::super::reduce::x86::{store_tile16, store_tile8};
    use super::tile_shapes;
    use std::arch::x86_64::*;

    pub(crate) const AVX512: Micro<f32, u16> = Micro {
        mr: 4,
        nr: 6,
        mr_stream: 8,
        nr_stream: 8,
        tile: tile_avx512,
        tile_stream: tile_avx512_stream,
    };
    pub(crate) const AVX2: Micro<f32, u16> = Micro {
        mr: 3,
        nr: 4,
        mr_stream: 3,
        nr_stream: 8,
        tile: tile_avx2,
        tile_stream: tile_avx2_stream,
    };

    /// # Safety
    /// As for `Micro::tile`; needs AVX-512F/BW/VL (+ AVX2/FMA for the
    /// reduction).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn tile_avx512(t: &Tile<f32, u16>) {
        // SAFETY: forwarded.
        unsafe {
            tile_shapes!(avx512_impl, t, false;
                1 => [1, 2, 3, 4, 5, 6];
                2 => [1, 2, 3, 4, 5, 6];
                3 => [1, 2, 3, 4, 5, 6];
                4 => [1, 2, 3, 4, 5, 6];
            )
        }
    }

    /// # Safety
    /// As for `tile_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn tile_avx512_stream(t: &Tile<f32, u16>) {
        // SAFETY: forwarded.
        unsafe {
            tile_shapes!(avx512_impl, t, true;
                1 => [1, 2, 3, 4, 5, 6, 7, 8];
                2 => [1, 2, 3, 4, 5, 6, 7, 8];
                3 => [1, 2, 3, 4, 5, 6, 7, 8];
                4 => [1, 2, 3, 4, 5, 6, 7, 8];
                5 => [1, 2, 3, 4];
                6 => [1, 2, 3, 4];
                7 => [1, 2, 3, 4];
                8 => [1, 2, 3, 4];
            )
        }
    }

    /// One tile; `STREAM` picks the loop nest as in `gemm_f32`. Each
    /// accumulator sees the same sequence of FMAs either way.
    ///
    /// # Safety
    /// As for `tile_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn avx512_impl<const MR: usize, const NR: usize, const STREAM: bool>(
        t: &Tile<f32, u16>,
    ) {
        let k = t.k;
        let steps = k / 16;
        let rem = k % 16;
        let tail = steps * 16;
        let mask: __mmask16 = ((1u32 << rem) - 1) as __mmask16;
        // SAFETY: (all loads below) elements off..off+16 for off < tail lie
        // inside every row; at `tail` the masked loads touch only the row's
        // last `rem` elements.
        let ldx = |i: usize, off: usize| unsafe { _mm512_loadu_ps(t.x.add(i * t.ldx + off)) };
        // SAFETY: as above: the bounds stated for these loads hold for this one.
        let ldw = |j: usize, off: usize| unsafe {
            _mm512_cvtph_ps(_mm256_loadu_si256(t.w.add(j * k + off) as *const __m256i))
        };
        let ldx_tail =
            // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
            |i: usize| unsafe { _mm512_maskz_loadu_ps(mask, t.x.wrapping_add(i * t.ldx + tail)) };
        // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
        let ldw_tail = |j: usize| unsafe {
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                mask,
                t.w.wrapping_add(j * k + tail) as *const i16,
            ))
        };
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        if STREAM {
            for j in 0..NR {
                let mut a = [_mm512_setzero_ps(); MR];
                for s in 0..steps {
                    let wv = ldw(j, s * 16);
                    for i in 0..MR {
                        a[i] = _mm512_fmadd_ps(ldx(i, s * 16), wv, a[i]);
                    }
                }
                if rem != 0 {
                    let wv = ldw_tail(j);
                    for i in 0..MR {
                        a[i] = _mm512_fmadd_ps(ldx_tail(i), wv, a[i]);
                    }
                }
                for i in 0..MR {
                    acc[i][j] = a[i];
                }
            }
        } else {
            let wp: [*const u16; NR] = std::array::from_fn(|j| t.w.wrapping_add(j * k));
            for s in 0..steps {
                if t.prefetch {
                    for j in 0..NR {
                        // A hint: never faults, even past the end of `w`.
                        _mm_prefetch::<_MM_HINT_T0>(
                            wp[j].wrapping_add(NR * k + s * 16) as *const i8
                        );
                    }
                }
                let xv: [__m512; MR] = std::array::from_fn(|i| ldx(i, s * 16));
                for j in 0..NR {
                    let wv = ldw(j, s * 16);
                    for i in 0..MR {
                        acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
            }
            if rem != 0 {
                let xv: [__m512; MR] = std::array::from_fn(ldx_tail);
                for j in 0..NR {
                    let wv = ldw_tail(j);
                    for i in 0..MR {
                        acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
            }
        }
        // SAFETY: out/bias extents guaranteed by the driver.
        unsafe { store_tile16::<MR, NR>(&acc, t.out, t.ldo, t.bias) };
    }

    /// # Safety
    /// As for `Micro::tile`; needs AVX2 + FMA + F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_avx2(t: &Tile<f32, u16>) {
        // SAFETY: forwarded.
        unsafe {
            tile_shapes!(avx2_impl, t, false;
                1 => [1, 2, 3, 4];
                2 => [1, 2, 3, 4];
                3 => [1, 2, 3, 4];
            )
        }
    }

    /// # Safety
    /// As for `tile_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_avx2_stream(t: &Tile<f32, u16>) {
        // SAFETY: forwarded.
        unsafe {
            tile_shapes!(avx2_impl, t, true;
                1 => [1, 2, 3, 4, 5, 6, 7, 8];
                2 => [1, 2, 3, 4, 5, 6, 7, 8];
                3 => [1, 2, 3, 4, 5, 6, 7, 8];
            )
        }
    }

    /// One tile, loop nest chosen by `STREAM`.
    ///
    /// # Safety
    /// As for `tile_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2_impl<const MR: usize, const NR: usize, const STREAM: bool>(t: &Tile<f32, u16>) {
        let k = t.k;
        let steps = k / 8;
        let rem = k % 8;
        let tail = steps * 8;
        // The tail goes through zeroed stack copies (no 16-bit masked load
        // in AVX2; zeros leave the sums unchanged).
        let mut xb = [[0.0f32; 8]; MR];
        let mut wb = [[0u16; 8]; NR];
        for i in 0..MR {
            // SAFETY: tail + rem == k: the end of row i.
            xb[i][..rem].copy_from_slice(unsafe {
                std::slice::from_raw_parts(t.x.add(i * t.ldx + tail), rem)
            });
        }
        for j in 0..NR {
            // SAFETY: as above, for w row j.
            wb[j][..rem]
                .copy_from_slice(unsafe { std::slice::from_raw_parts(t.w.add(j * k + tail), rem) });
        }
        // SAFETY (loads): off + 8 <= tail <= k inside every row; the tail
        // reads the 8-element stack copies.
        let ldx = |i: usize, off: usize| -> __m256 {
            // SAFETY: as above: the bounds stated for these loads hold for this one.
            unsafe { _mm256_loadu_ps(t.x.add(i * t.ldx + off)) }
        };
        let ldw = |j: usize, off: usize| -> __m256 {
            // SAFETY: as above: the bounds stated for these loads hold for this one.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(t.w.add(j * k + off) as *const __m128i)) }
        };
        // SAFETY: the tail reads an 8-element stack copy.
        let ldx_tail = |i: usize| -> __m256 { unsafe { _mm256_loadu_ps(xb[i].as_ptr()) } };
        let ldw_tail = |j: usize| -> __m256 {
            // SAFETY: the tail reads an 8-element stack copy.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(wb[j].as_ptr() as *const __m128i)) }
        };
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        if STREAM {
            for j in 0..NR {
                let mut a = [_mm256_setzero_ps(); MR];
                for s in 0..steps {
                    let wv = ldw(j, s * 8);
                    for i in 0..MR {
                        a[i] = _mm256_fmadd_ps(ldx(i, s * 8), wv, a[i]);
                    }
                }
                if rem != 0 {
                    let wv = ldw_tail(j);
                    for i in 0..MR {
                        a[i] = _mm256_fmadd_ps(ldx_tail(i), wv, a[i]);
                    }
                }
                for i in 0..MR {
                    acc[i][j] = a[i];
                }
            }
        } else {
            for s in 0..steps {
                let xv: [__m256; MR] = std::array::from_fn(|i| ldx(i, s * 8));
                for j in 0..NR {
                    let wv = ldw(j, s * 8);
                    for i in 0..MR {
                        acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
            }
            if rem != 0 {
                let xv: [__m256; MR] = std::array::from_fn(ldx_tail);
                for j in 0..NR {
                    let wv = ldw_tail(j);
                    for i in 0..MR {
                        acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
            }
        }
        // SAFETY: out/bias extents guaranteed by the driver.
        unsafe { store_tile8::<MR, NR>(&acc, t.out, t.ldo, t.bias) };
    }
}
