//! Microkernels for f32 weights (row-major `[n×k]`).
//!
//! Owns: the three f32 paths and the per-element reduction order of each.
//! Promises, for output element `(i, j)` of a given `k` (trees as in
//! `reduce.rs`):
//! - AVX-512F: lane `l` accumulates `fma(x[16s + l], w[16s + l], acc)` over
//!   `s`, from +0.0, elements past `k` read as zero (masked loads); then
//!   `tree16`.
//! - AVX2: the same with 8 lanes and `tree8`.
//! - Portable: lane `l` accumulates `acc + x[16s + l] * w[16s + l]` (two
//!   roundings) over `s`, then `tree16`.
//!
//! None of these depends on the tile shape, `m` or the thread count.

// Tile and lane loops index several arrays by the same (i, j, l); ranges
// read closer to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::gemm::{Micro, Tile};
use super::gemm_bf16::tile_shapes;
use super::reduce::tree16;

// ---------------------------------------------------------------- portable

pub(crate) const PORTABLE: Micro<f32, f32> = Micro {
    mr: 2,
    nr: 4,
    mr_stream: 2,
    nr_stream: 4,
    tile: tile_portable,
    tile_stream: tile_portable,
};

/// # Safety
/// The pointers in `t` must be valid for the extents it gives.
unsafe fn tile_portable(t: &Tile<f32, f32>) {
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
unsafe fn portable_impl<const MR: usize, const NR: usize>(t: &Tile<f32, f32>) {
    let k = t.k;
    // SAFETY: the driver passes MR rows of x (ldx apart, k valid each) and
    // NR rows of w (k apart).
    let xs: [&[f32]; MR] =
        std::array::from_fn(|i| unsafe { std::slice::from_raw_parts(t.x.add(i * t.ldx), k) });
    let ws: [&[f32]; NR] =
        // SAFETY: as above: row j of w holds k values.
        std::array::from_fn(|j| unsafe { std::slice::from_raw_parts(t.w.add(j * k), k) });
    let mut acc = [[[0.0f32; 16]; NR]; MR];
    let full = k / 16 * 16;
    for off in (0..full).step_by(16) {
        for j in 0..NR {
            let wv = &ws[j][off..off + 16];
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
                    acc[i][j][l] += xs[i][full + l] * ws[j][full + l];
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

    pub(crate) const AVX512: Micro<f32, f32> = Micro {
        mr: 4,
        nr: 6,
        mr_stream: 8,
        nr_stream: 8,
        tile: tile_avx512,
        tile_stream: tile_avx512_stream,
    };
    pub(crate) const AVX2: Micro<f32, f32> = Micro {
        mr: 3,
        nr: 4,
        mr_stream: 3,
        nr_stream: 8,
        tile: tile_avx2,
        tile_stream: tile_avx2_stream,
    };

    /// # Safety
    /// As for `Micro::tile`; needs AVX-512F (+ AVX2/FMA for the reduction).
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tile_avx512(t: &Tile<f32, f32>) {
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
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tile_avx512_stream(t: &Tile<f32, f32>) {
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

    /// One tile; `STREAM` picks the loop nest (weight rows one after the
    /// other, or all rows per k-step). Each accumulator sees the same
    /// sequence of FMAs either way.
    ///
    /// # Safety
    /// As for `tile_avx512`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn avx512_impl<const MR: usize, const NR: usize, const STREAM: bool>(
        t: &Tile<f32, f32>,
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
        let ldw = |j: usize, off: usize| unsafe { _mm512_loadu_ps(t.w.add(j * k + off)) };
        let ldx_tail =
            // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
            |i: usize| unsafe { _mm512_maskz_loadu_ps(mask, t.x.wrapping_add(i * t.ldx + tail)) };
        let ldw_tail =
            // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
            |j: usize| unsafe { _mm512_maskz_loadu_ps(mask, t.w.wrapping_add(j * k + tail)) };
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
            let wp: [*const f32; NR] = std::array::from_fn(|j| t.w.wrapping_add(j * k));
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
    /// As for `Micro::tile`; needs AVX2 + FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2(t: &Tile<f32, f32>) {
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
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2_stream(t: &Tile<f32, f32>) {
        // SAFETY: forwarded.
        unsafe {
            tile_shapes!(avx2_impl, t, true;
                1 => [1, 2, 3, 4, 5, 6, 7, 8];
                2 => [1, 2, 3, 4, 5, 6, 7, 8];
                3 => [1, 2, 3, 4, 5, 6, 7, 8];
            )
        }
    }

    /// `_mm256_maskload_ps` mask enabling the first `rem` lanes.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn first_lanes(rem: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32), idx)
    }

    /// One tile, loop nest chosen by `STREAM` as in `avx512_impl`.
    ///
    /// # Safety
    /// As for `tile_avx2`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_impl<const MR: usize, const NR: usize, const STREAM: bool>(t: &Tile<f32, f32>) {
        let k = t.k;
        let steps = k / 8;
        let rem = k % 8;
        let tail = steps * 8;
        let mask = first_lanes(rem);
        // SAFETY: (all loads below) off + 8 <= tail <= k inside every row;
        // at `tail` the masked loads touch only the last `rem` elements
        // (masked-off lanes never fault).
        let ldx = |i: usize, off: usize| unsafe { _mm256_loadu_ps(t.x.add(i * t.ldx + off)) };
        // SAFETY: as above: the bounds stated for these loads hold for this one.
        let ldw = |j: usize, off: usize| unsafe { _mm256_loadu_ps(t.w.add(j * k + off)) };
        let ldx_tail =
            // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
            |i: usize| unsafe { _mm256_maskload_ps(t.x.wrapping_add(i * t.ldx + tail), mask) };
        let ldw_tail =
            // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
            |j: usize| unsafe { _mm256_maskload_ps(t.w.wrapping_add(j * k + tail), mask) };
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
