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

use super::gemm::{Micro, Tile};
use super::reduce::tree16;

/// Reads bf16 bits as the f32 they encode (exact).
#[inline(always)]
fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Expands to a `match (t.mr, t.nr)` calling `$f::<MR, NR>(t)` for each
/// supported shape.
macro_rules! tile_shapes {
    ($f:ident, $t:expr; $($mr:literal => [$($nr:literal),*]);* $(;)?) => {
        match ($t.mr, $t.nr) {
            $($( ($mr, $nr) => $f::<$mr, $nr>($t), )*)*
            (mr, nr) => unreachable!("no {mr}×{nr} tile"),
        }
    };
}
pub(crate) use tile_shapes;

// ---------------------------------------------------------------- portable

pub(crate) const PORTABLE: Micro<f32, u16> = Micro {
    mr: 2,
    nr: 4,
    nr_m1: 4,
    tile: tile_portable,
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
        nr_m1: 8,
        tile: tile_avx512,
    };
    pub(crate) const AVX2: Micro<f32, u16> = Micro {
        mr: 3,
        nr: 4,
        nr_m1: 8,
        tile: tile_avx2,
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
            tile_shapes!(avx512_impl, t;
                1 => [1, 2, 3, 4, 5, 6, 7, 8];
                2 => [1, 2, 3, 4, 5, 6];
                3 => [1, 2, 3, 4, 5, 6];
                4 => [1, 2, 3, 4, 5, 6];
            )
        }
    }

    /// # Safety
    /// As for `tile_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn avx512_impl<const MR: usize, const NR: usize>(t: &Tile<u16, u16>) {
        let k = t.k;
        let steps = k / 32;
        let rem = k % 32;
        let xp: [*const u16; MR] = std::array::from_fn(|i| t.x.wrapping_add(i * t.ldx));
        let wp: [*const u16; NR] = std::array::from_fn(|j| t.w.wrapping_add(j * k));
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        for s in 0..steps {
            let off = s * 32;
            // SAFETY: element off..off+32 lies inside every x and w row.
            unsafe {
                let xv: [__m512bh; MR] = std::array::from_fn(|i| {
                    transmute(_mm512_loadu_si512(xp[i].add(off) as *const _))
                });
                for j in 0..NR {
                    let wv: __m512bh = transmute(_mm512_loadu_si512(wp[j].add(off) as *const _));
                    for i in 0..MR {
                        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
                    }
                }
            }
        }
        if rem != 0 {
            let off = steps * 32;
            let mask: __mmask32 = (1u32 << rem) - 1;
            // SAFETY: x rows are padded to a multiple of 32 so the full load
            // stays inside the buffer (padding is zero); w loads are masked
            // to the row's last `rem` elements.
            unsafe {
                let xv: [__m512bh; MR] = std::array::from_fn(|i| {
                    transmute(_mm512_loadu_si512(xp[i].add(off) as *const _))
                });
                for j in 0..NR {
                    let wv: __m512bh =
                        transmute(_mm512_maskz_loadu_epi16(mask, wp[j].add(off) as *const i16));
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
            tile_shapes!(avx2_impl, t;
                1 => [1, 2, 3, 4, 5, 6, 7, 8];
                2 => [1, 2, 3, 4];
                3 => [1, 2, 3, 4];
            )
        }
    }

    /// Widens 8 bf16 values to f32 exactly.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn widen8(v: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
    }

    /// # Safety
    /// As for `tile_avx2`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_impl<const MR: usize, const NR: usize>(t: &Tile<f32, u16>) {
        let k = t.k;
        let steps = k / 8;
        let rem = k % 8;
        let xp: [*const f32; MR] = std::array::from_fn(|i| t.x.wrapping_add(i * t.ldx));
        let wp: [*const u16; NR] = std::array::from_fn(|j| t.w.wrapping_add(j * k));
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        for s in 0..steps {
            let off = s * 8;
            // SAFETY: element off..off+8 lies inside every x and w row.
            unsafe {
                let xv: [__m256; MR] = std::array::from_fn(|i| _mm256_loadu_ps(xp[i].add(off)));
                for j in 0..NR {
                    let wv = widen8(_mm_loadu_si128(wp[j].add(off) as *const __m128i));
                    for i in 0..MR {
                        acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
            }
        }
        if rem != 0 {
            let off = steps * 8;
            // The tail goes through zeroed stack copies: AVX2 has no 16-bit
            // masked load, and zeros leave the sums unchanged.
            let mut xb = [[0.0f32; 8]; MR];
            let mut wb = [[0u16; 8]; NR];
            for i in 0..MR {
                // SAFETY: off + rem == k, inside row i.
                xb[i][..rem]
                    .copy_from_slice(unsafe { std::slice::from_raw_parts(xp[i].add(off), rem) });
            }
            for j in 0..NR {
                // SAFETY: as above, for w row j.
                wb[j][..rem]
                    .copy_from_slice(unsafe { std::slice::from_raw_parts(wp[j].add(off), rem) });
            }
            // SAFETY: loads from the local 8-element buffers.
            unsafe {
                let xv: [__m256; MR] = std::array::from_fn(|i| _mm256_loadu_ps(xb[i].as_ptr()));
                for j in 0..NR {
                    let wv = widen8(_mm_loadu_si128(wb[j].as_ptr() as *const __m128i));
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
