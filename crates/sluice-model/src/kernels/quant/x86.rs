//! Helpers shared by the formats' x86 microkernels (in `formats/`):
//! activation broadcasts, masked output stores, the row-count dispatch
//! macros, and the AVX2 stand-ins for VNNI instructions.
//!
//! Owns: nothing but these helpers. Promises: each is exact (integer sums
//! that cannot overflow, stores limited to the tile's columns).

// Tile loops index several arrays by the same (i, j); ranges read closer
// to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::QTile;
use std::arch::x86_64::*;

/// The 4 activation bytes at `p`, broadcast to every 32-bit lane (the
/// signed operand of `vpdpbusd` / `pmaddubsw`).
///
/// # Safety
/// `p` valid for 4 bytes.
#[inline(always)]
pub(crate) unsafe fn bcast512(p: *const i8) -> __m512i {
    // SAFETY: forwarded; unaligned reads are fine.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// As `bcast512`, 256 bits.
///
/// # Safety
/// `p` valid for 4 bytes.
#[inline(always)]
pub(crate) unsafe fn bcast256(p: *const i8) -> __m256i {
    // SAFETY: forwarded.
    _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// Stores 16 accumulated columns of row `i` (+ bias), masked to
/// `t.cols`.
///
/// # Safety
/// AVX-512F; the tile's out and bias extents (see `QTile`).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store512(t: &QTile, i: usize, acc: __m512) {
    let mask: __mmask16 = ((1u32 << t.cols) - 1) as __mmask16;
    // SAFETY: masked lanes stay within `cols` outputs and biases.
    unsafe {
        let v = if t.bias.is_null() {
            acc
        } else {
            _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, t.bias))
        };
        _mm512_mask_storeu_ps(t.out.add(i * t.ldo), mask, v);
    }
}

/// Stores two 8-column halves of row `i` (+ bias), `t.cols` of them.
///
/// # Safety
/// AVX; the tile's out and bias extents.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn store256(t: &QTile, i: usize, acc: [__m256; 2]) {
    if t.cols == 16 {
        // Whole panels (all but a matrix's last): two vector stores, the
        // bias added lane by lane as the scalar tail below adds it.
        // SAFETY: 16 outputs and biases are inside the tile's extents.
        unsafe {
            let o = t.out.add(i * t.ldo);
            let (lo, hi) = if t.bias.is_null() {
                (acc[0], acc[1])
            } else {
                (
                    _mm256_add_ps(acc[0], _mm256_loadu_ps(t.bias)),
                    _mm256_add_ps(acc[1], _mm256_loadu_ps(t.bias.add(8))),
                )
            };
            _mm256_storeu_ps(o, lo);
            _mm256_storeu_ps(o.add(8), hi);
        }
        return;
    }
    let mut v = [0.0f32; 16];
    // SAFETY: `v` has room for 16 floats.
    unsafe {
        _mm256_storeu_ps(v.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(v.as_mut_ptr().add(8), acc[1]);
    }
    for r in 0..t.cols {
        // SAFETY: r < cols: inside the out row and the biases.
        unsafe {
            let x = if t.bias.is_null() {
                v[r]
            } else {
                v[r] + *t.bias.add(r)
            };
            *t.out.add(i * t.ldo + r) = x;
        }
    }
}

/// Expands to a `match t.mr` calling `$f::<MR>(t)` (after any leading
/// const arguments given as `$f::<A, B>`) for MR in 1..=8. The AVX2
/// kernels take all 8 rows in one pass although their accumulators then
/// outgrow the 16 vector registers: decoding a weight chunk costs as much
/// as multiplying it into 4 rows, and sharing it over 8 rows outweighs
/// the spills (measured on Zen 3 in prefill: Q5_0's kernel 1.3-1.4×
/// faster than two passes of 4 rows, the K kernels about even).
macro_rules! rows_1_to_8 {
    ($f:ident $(::<$($g:tt),*>)?, $t:expr) => {
        match $t.mr {
            1 => $f::<$($({ $g },)*)? 1>($t),
            2 => $f::<$($({ $g },)*)? 2>($t),
            3 => $f::<$($({ $g },)*)? 3>($t),
            4 => $f::<$($({ $g },)*)? 4>($t),
            5 => $f::<$($({ $g },)*)? 5>($t),
            6 => $f::<$($({ $g },)*)? 6>($t),
            7 => $f::<$($({ $g },)*)? 7>($t),
            8 => $f::<$($({ $g },)*)? 8>($t),
            mr => unreachable!("no {mr}-row quant tile"),
        }
    };
}
pub(crate) use rows_1_to_8;

/// Runs `$f::<MR>` over the tile's rows in chunks of at most 4 (for the
/// AVX-512 kernels with several accumulators per row: the K kernels hold
/// 4-6 per row), advancing the tile's row pointers between chunks.
macro_rules! rows_in_fours {
    ($f:ident $(::<$($g:tt),*>)?, $t:expr) => {{
        let t: &QTile = $t;
        let mut done = 0;
        while done < t.mr {
            let mr = (t.mr - done).min(4);
            let sub = QTile {
                x: t.x.wrapping_add(done * t.ldq),
                d: t.d.wrapping_add(done * t.ldd),
                s: t.s.wrapping_add(done * t.ldd),
                sums: t.sums.wrapping_add(done * t.lds),
                out: t.out.wrapping_add(done * t.ldo),
                mr,
                ..*t
            };
            match mr {
                1 => $f::<$($({ $g },)*)? 1>(&sub),
                2 => $f::<$($({ $g },)*)? 2>(&sub),
                3 => $f::<$($({ $g },)*)? 3>(&sub),
                _ => $f::<$($({ $g },)*)? 4>(&sub),
            }
            done += mr;
        }
    }};
}
pub(crate) use rows_in_fours;

/// Bytes `0xFF` where bit `j` of `bits` is set (byte `j`), for 32 bits
/// (llama.cpp's `bytes_from_bits_32`).
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn bytes_from_bits32(bits: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

/// `Σ` of 4 u8×i8 products per 32-bit lane, added to `acc` (the AVX2
/// stand-in for `vpdpbusd`; exact while each pair sum fits i16, which
/// every format's value range guarantees).
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn dpbusd256(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(u, s);
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}
