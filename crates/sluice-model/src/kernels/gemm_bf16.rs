//! Microkernels for bf16 weights (`w` as raw bf16 bits, row-major `[n×k]`).
//!
//! Owns: the three bf16 paths and the per-element reduction order of each.
//! Promises, for output element `(i, j)` of a given `k` (lanes numbered
//! from 0, trees as in `reduce.rs`):
//! - AVX-512 BF16: `x` is first rounded to bf16 (round-to-nearest-even,
//!   `vcvtneps2bf16`) into a buffer whose rows are zero-padded to a multiple
//!   of 32. Lane `l` accumulates, for `s = 0, 1, ...`, one `vdpbf16ps` step
//!   over the pair `(32s + 2l, 32s + 2l + 1)`, starting from +0.0; weight
//!   elements past `k` read as zero. Then `tree16`.
//! - AVX2: lane `l` accumulates `fma(x[8s + l], w[8s + l], acc)` over `s`
//!   (x in f32, w widened exactly), elements past `k` as zero. Then `tree8`.
//! - Portable: lane `l` accumulates `acc + x[16s + l] * w[16s + l]` (two
//!   roundings) over `s`, then `tree16`.
//!
//! None of these depends on the tile shape, `m` or the thread count.

// Tile and lane loops index several arrays by the same (i, j, l); ranges
// read closer to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::gemm::{Micro, Tile};
use super::reduce::tree16;

/// Reads bf16 bits as the f32 they encode (exact).
#[inline(always)]
fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Expands to a `match (t.mr, t.nr)` calling `$f::<MR, NR>(t)` (or
/// `$f::<MR, NR, EXTRA>(t)`) for each supported shape.
macro_rules! tile_shapes {
    ($f:ident, $t:expr; $($mr:literal => [$($nr:literal),*]);* $(;)?) => {
        match ($t.mr, $t.nr) {
            $($( ($mr, $nr) => $f::<$mr, $nr>($t), )*)*
            (mr, nr) => unreachable!("no {mr}×{nr} tile"),
        }
    };
    ($f:ident, $t:expr, $extra:expr; $($mr:literal => [$($nr:literal),*]);* $(;)?) => {
        match ($t.mr, $t.nr) {
            $($( ($mr, $nr) => $f::<$mr, $nr, $extra>($t), )*)*
            (mr, nr) => unreachable!("no {mr}×{nr} tile"),
        }
    };
}
pub(crate) use tile_shapes;

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
            let mut wv = [0.0f32; 16];
            for (l, v) in wv.iter_mut().enumerate() {
                *v = widen(ws[j][off + l]);
            }
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
pub(crate) use x86::{convert_x_avx512, AVX2, AVX512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::gemm::{Micro, Tile};
    use super::super::reduce::x86::{store_tile16, store_tile8};
    use std::arch::x86_64::*;
    use std::mem::transmute;

    /// Rows of the bf16 activation buffer are padded to this many elements.
    pub(crate) const X_PAD: usize = 32;

    pub(crate) const AVX512: Micro<u16, u16> = Micro {
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

    /// Rounds `x[m×k]` to bf16 into `dst`, rows `ldx = k` rounded up to
    /// `X_PAD`, padding zeroed. Returns `ldx`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F/BW/VL and AVX-512 BF16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(crate) unsafe fn convert_x_avx512(x: &[f32], m: usize, k: usize, dst: &mut [u16]) -> usize {
        let ldx = k.div_ceil(X_PAD) * X_PAD;
        assert!(x.len() >= m * k && dst.len() >= m * ldx);
        for i in 0..m {
            let src = &x[i * k..(i + 1) * k];
            let row = &mut dst[i * ldx..(i + 1) * ldx];
            for c in (0..ldx).step_by(16) {
                let valid = k.saturating_sub(c).min(16);
                let mask: __mmask16 = ((1u32 << valid) - 1) as __mmask16;
                // SAFETY: the mask only enables elements c..c+valid, all
                // inside `src`; masked-off lanes are not accessed. `row` has
                // room for 16 values at c since ldx is a multiple of 32.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().wrapping_add(c));
                    let b = _mm512_cvtneps_pbh(v);
                    _mm256_storeu_si256(
                        row.as_mut_ptr().add(c) as *mut __m256i,
                        transmute::<__m256bh, __m256i>(b),
                    );
                }
            }
        }
        ldx
    }

    /// # Safety
    /// As for `Micro::tile`; needs AVX-512F/BW/VL + BF16; `x` rows padded to
    /// `X_PAD` with zeros.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn tile_avx512(t: &Tile<u16, u16>) {
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn tile_avx512_stream(t: &Tile<u16, u16>) {
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
    /// sequence of `vdpbf16ps` either way.
    ///
    /// # Safety
    /// As for `tile_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn avx512_impl<const MR: usize, const NR: usize, const STREAM: bool>(
        t: &Tile<u16, u16>,
    ) {
        let k = t.k;
        let steps = k / 32;
        let rem = k % 32;
        let tail = steps * 32;
        let mask: __mmask32 = ((1u64 << rem) - 1) as __mmask32;
        let xp: [*const u16; MR] = std::array::from_fn(|i| t.x.wrapping_add(i * t.ldx));
        let wp: [*const u16; NR] = std::array::from_fn(|j| t.w.wrapping_add(j * k));
        // SAFETY (all loads below): elements off..off+32 for off < tail lie
        // inside every x and w row; at `tail`, x rows are padded to a
        // multiple of 32 with zeros so the full load stays in the buffer,
        // and w loads are masked to the row's last `rem` elements.
        let ld =
            // SAFETY: as above: the bounds stated for these loads hold for this one.
            |p: *const u16| -> __m512bh { unsafe { transmute(_mm512_loadu_si512(p as *const _)) } };
        let ld_tail = |p: *const u16| -> __m512bh {
            // SAFETY: as above; the mask limits the load to the row's last `rem` elements.
            unsafe { transmute(_mm512_maskz_loadu_epi16(mask, p as *const i16)) }
        };
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        if STREAM {
            for j in 0..NR {
                let mut a = [_mm512_setzero_ps(); MR];
                for s in 0..steps {
                    let off = s * 32;
                    let wv = ld(wp[j].wrapping_add(off));
                    for i in 0..MR {
                        a[i] = _mm512_dpbf16_ps(a[i], ld(xp[i].wrapping_add(off)), wv);
                    }
                }
                if rem != 0 {
                    let wv = ld_tail(wp[j].wrapping_add(tail));
                    for i in 0..MR {
                        a[i] = _mm512_dpbf16_ps(a[i], ld(xp[i].wrapping_add(tail)), wv);
                    }
                }
                for i in 0..MR {
                    acc[i][j] = a[i];
                }
            }
        } else {
            for s in 0..steps {
                let off = s * 32;
                if t.prefetch {
                    for j in 0..NR {
                        // A hint: never faults, even past the end of `w`.
                        _mm_prefetch::<_MM_HINT_T0>(wp[j].wrapping_add(NR * k + off) as *const i8);
                    }
                }
                let xv: [__m512bh; MR] = std::array::from_fn(|i| ld(xp[i].wrapping_add(off)));
                for j in 0..NR {
                    let wv = ld(wp[j].wrapping_add(off));
                    for i in 0..MR {
                        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
                    }
                }
            }
            if rem != 0 {
                let xv: [__m512bh; MR] = std::array::from_fn(|i| ld(xp[i].wrapping_add(tail)));
                for j in 0..NR {
                    let wv = ld_tail(wp[j].wrapping_add(tail));
                    for i in 0..MR {
                        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
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
    #[target_feature(enable = "avx2,fma")]
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

    /// Widens 8 bf16 values to f32 exactly.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn widen8(v: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    }

    /// One tile, loop nest chosen by `STREAM` as in `avx512_impl`.
    ///
    /// # Safety
    /// As for `tile_avx2`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_impl<const MR: usize, const NR: usize, const STREAM: bool>(t: &Tile<f32, u16>) {
        let k = t.k;
        let steps = k / 8;
        let rem = k % 8;
        let tail = steps * 8;
        // The tail goes through zeroed stack copies: AVX2 has no 16-bit
        // masked load, and zeros leave the sums unchanged.
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
            unsafe { widen8(_mm_loadu_si128(t.w.add(j * k + off) as *const __m128i)) }
        };
        // SAFETY: the tail reads an 8-element stack copy.
        let ldx_tail = |i: usize| -> __m256 { unsafe { _mm256_loadu_ps(xb[i].as_ptr()) } };
        let ldw_tail = |j: usize| -> __m256 {
            // SAFETY: the tail reads an 8-element stack copy.
            unsafe { widen8(_mm_loadu_si128(wb[j].as_ptr() as *const __m128i)) }
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

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::X_PAD;
