//! IQ4_NL: blocks of 32 elements, 18 bytes, laid out as Q4_0's (`d` (f16),
//! then 16 bytes of nibbles: byte `j` holds element `j` low, `j + 16`
//! high); value `d · KVALUES[q]`, a non-linear table of 16 signed levels
//! (denser near zero, where weights are).
//!
//! Matmul (activation partner Q8_0): for each block, in order,
//! `acc = fma(f32(Σ KVALUES[q]·qx), f32(d) · dx, acc)`, the integer sum
//! exact. The SIMD paths look the levels up with a byte shuffle. AVX-512
//! VNNI takes them offset by 128 as unsigned bytes and subtracts
//! `128·Σqx` (its sums are 32-bit); AVX2, whose pair sums are 16-bit,
//! multiplies `|level|` by `qx` carrying the level's sign, which keeps each
//! pair within i16.
//!
//! Panel block (16 rows, 288 bytes): Q4_0's.

#![allow(clippy::needless_range_loop)]

use super::q4_0::{nibbles, pack, unpack};
use super::{f16_to_f32, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels, PANEL};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::IQ4_NL.block_size() as usize;
const BYTES: usize = GgmlType::IQ4_NL.type_size() as usize;
const PANEL_BLOCK: usize = PANEL * BYTES;

/// ggml's `kvalues_iq4nl` (gguf-py's `IQ4_NL.kvalues`).
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::IQ4NL,
    ggml: GgmlType::IQ4_NL,
    dequantize,
    quantize: None,
    kernels: Some(&KERNELS),
};

static KERNELS: QuantKernels = QuantKernels {
    act: ActKind::Q8_0,
    block: BLOCK,
    block_bytes: BYTES,
    panel_block_bytes: PANEL_BLOCK,
    pack,
    unpack,
    step,
    #[cfg(target_arch = "x86_64")]
    avx2: Some(x86::tile_avx2),
    #[cfg(target_arch = "x86_64")]
    avx512: Some(x86::tile_avx512),
    #[cfg(not(target_arch = "x86_64"))]
    avx2: None,
    #[cfg(not(target_arch = "x86_64"))]
    avx512: None,
};

/// `d · KVALUES[q]` (`IQ4_NL.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let q = nibbles(&blk[2..]);
        for j in 0..BLOCK {
            o[j] = d * KVALUES[q[j] as usize] as f32;
        }
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let q = nibbles(&w[2..]);
    let mut isum = 0i32;
    for j in 0..BLOCK {
        isum += KVALUES[q[j] as usize] as i32 * a.qs[j] as i32;
    }
    let scale = f16_to_f32(le16(w, 0)) * a.d;
    (isum as f32).mul_add(scale, acc)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{KVALUES, PANEL_BLOCK};
    use crate::kernels::quant::x86::{
        bcast256, bcast512, dpbusd256, rows_1_to_8, store256, store512,
    };
    use crate::kernels::quant::QTile;
    use std::arch::x86_64::*;

    /// The levels offset by 128, as unsigned bytes (1..=241).
    const UNSIGNED: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = (KVALUES[i] as i16 + 128) as u8;
            i += 1;
        }
        t
    };

    // The level lookups IQ4_NL's and IQ4_XS's kernels share.

    /// The levels offset by 128 in every 128-bit lane (AVX-512's table).
    #[target_feature(enable = "avx512f")]
    pub(crate) fn unsigned_levels512() -> __m512i {
        // SAFETY: a 16-byte constant.
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(UNSIGNED.as_ptr() as *const __m128i) })
    }

    /// The signed levels in both 128-bit lanes (AVX2's table).
    #[target_feature(enable = "avx2")]
    pub(crate) fn signed_levels256() -> __m256i {
        // SAFETY: a 16-byte constant.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(KVALUES.as_ptr() as *const __m128i) })
    }

    /// The levels of `v`'s low and high nibbles, looked up in `table`.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    pub(crate) fn lookup512(table: __m512i, v: __m512i) -> (__m512i, __m512i) {
        let m4 = _mm512_set1_epi8(0x0F);
        (
            _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4)),
            _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4)),
        )
    }

    /// The levels of `v`'s low and high nibbles, looked up in `table`.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn lookup256(table: __m256i, v: __m256i) -> (__m256i, __m256i) {
        let m4 = _mm256_set1_epi8(0x0F);
        (
            _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4)),
            _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4)),
        )
    }

    /// `acc` plus the dot products of `levels` (their magnitudes in
    /// `abs`) with the activation bytes `x`, four pairs per 32-bit lane:
    /// `|level|` against `x` carrying the level's sign (no level is 0), so
    /// the AVX2 pair sums stay within i16.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn signed_dot256(
        acc: __m256i,
        abs: __m256i,
        levels: __m256i,
        x: __m256i,
    ) -> __m256i {
        dpbusd256(acc, abs, _mm256_sign_epi8(x, levels))
    }

    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_avx512(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_1_to_8!(avx512, t) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn avx512<const MR: usize>(t: &QTile) {
        let table = unsigned_levels512();
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                // Σ (level + 128)·qx - 128·Σqx: the chains start at the
                // offset's share, two per row (exact in any order).
                let mut i0: [__m512i; MR] =
                    std::array::from_fn(|i| _mm512_set1_epi32(-128 * *t.sums.add(i * t.lds + b)));
                let mut i1 = [_mm512_setzero_si512(); MR];
                for c in 0..4 {
                    let v = _mm512_loadu_si512(pb.add(32 + 64 * c) as *const _);
                    let (lo, hi) = lookup512(table, v);
                    for i in 0..MR {
                        let xq = t.x.add(i * t.ldq + b * 32);
                        i0[i] = _mm512_dpbusd_epi32(i0[i], lo, bcast512(xq.add(4 * c)));
                        i1[i] = _mm512_dpbusd_epi32(i1[i], hi, bcast512(xq.add(16 + 4 * c)));
                    }
                }
                for i in 0..MR {
                    let isum = _mm512_add_epi32(i0[i], i1[i]);
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*t.d.add(i * t.ldd + b)));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i]);
                }
            }
        }
        for i in 0..MR {
            // SAFETY: the tile's out/bias extents.
            unsafe { store512(t, i, acc[i]) };
        }
    }

    /// # Safety
    /// As for `QKernel`; AVX2 + FMA + F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_avx2(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_1_to_8!(avx2, t) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2<const MR: usize>(t: &QTile) {
        let table = signed_levels256();
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for h in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * h) as *const __m128i));
                    let mut isum = [_mm256_setzero_si256(); MR];
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(pb.add(32 + 64 * c + 32 * h) as *const __m256i);
                        let (lo, hi) = lookup256(table, v);
                        let (ulo, uhi) = (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi));
                        for i in 0..MR {
                            let xq = t.x.add(i * t.ldq + b * 32);
                            isum[i] = signed_dot256(isum[i], ulo, lo, bcast256(xq.add(4 * c)));
                            isum[i] = signed_dot256(isum[i], uhi, hi, bcast256(xq.add(16 + 4 * c)));
                        }
                    }
                    for i in 0..MR {
                        let dx = *t.d.add(i * t.ldd + b);
                        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
                        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), scale, acc[i][h]);
                    }
                }
            }
        }
        for i in 0..MR {
            // SAFETY: the tile's out/bias extents.
            unsafe { store256(t, i, acc[i]) };
        }
    }
}
