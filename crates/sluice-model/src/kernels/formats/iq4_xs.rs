//! IQ4_XS: super-blocks of 256 elements, 136 bytes: `d` (f16), `scales_h`
//! (u16: two high bits per sub-block), `scales_l` (4 bytes: a low nibble
//! per sub-block), then for each 32-element sub-block 16 bytes of nibbles
//! (byte `t`: element `t` low, `t + 16` high). Sub-block `s`'s scale is
//! `ls_s - 32`, `ls_s = (scales_l[s/2] >> 4(s%2)) & 15 | ((scales_h >> 2s)
//! & 3) << 4`; value `(d · (ls_s - 32)) · KVALUES[q]` (IQ4_NL's levels).
//!
//! Matmul (activation partner Q8_K): for each super-block, in order, with
//! `I_s = Σ KVALUES[q]·qx` over sub-block `s` and `ISC = Σ_s (ls_s - 32) ·
//! I_s` (exact integers): `acc = fma(f32(ISC), f32(d) · dx, acc)`. The
//! SIMD paths look the levels up by byte shuffle, as IQ4_NL's: AVX-512
//! VNNI offset by 128 (less `128·(bsum_{2s} + bsum_{2s+1})`), AVX2 with
//! the level's sign carried to `qx`.
//!
//! Panel block (16 rows, 2208 bytes): the 16 `d`; the scales decoded
//! (`ls_s - 32` as i8) of row `r` at `32 + 16s + r`; then for each
//! sub-block `s` and 4-byte chunk `c`, 64 bytes holding row `r`'s nibble
//! bytes `16s + 4c..+4` at `4r`.

#![allow(clippy::needless_range_loop)]

use super::iq4_nl::KVALUES;
use super::q4_k::{pack_qs, unpack_qs};
use super::{f16_to_f32, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::IQ4_XS.block_size() as usize;
const BYTES: usize = GgmlType::IQ4_XS.type_size() as usize;
pub(crate) const PANEL_BLOCK: usize = 2208;
/// Where the decoded scales and the interleaved nibbles start.
const SCALES: usize = 32;
const QS: usize = 160;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::IQ4XS,
    ggml: GgmlType::IQ4_XS,
    dequantize,
    quantize: None,
    kernels: Some(&KERNELS),
};

static KERNELS: QuantKernels = QuantKernels {
    act: ActKind::Q8K,
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

/// The eight sub-block scales `ls_s - 32` of a block.
fn scales(blk: &[u8]) -> [i8; 8] {
    let high = le16(blk, 2);
    std::array::from_fn(|s| {
        let low = (blk[4 + s / 2] >> (4 * (s % 2))) & 0x0F;
        let ls = low | ((((high >> (2 * s)) & 3) as u8) << 4);
        ls as i8 - 32
    })
}

/// Sub-block `s`'s 32 level indices.
fn sub_nibbles(blk: &[u8], s: usize) -> [u8; 32] {
    let qs = &blk[8 + 16 * s..24 + 16 * s];
    std::array::from_fn(|t| {
        if t < 16 {
            qs[t] & 0x0F
        } else {
            qs[t - 16] >> 4
        }
    })
}

/// `(d · (ls - 32)) · KVALUES[q]` (`IQ4_XS.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let sc = scales(blk);
        for s in 0..8 {
            let dl = d * sc[s] as f32;
            let q = sub_nibbles(blk, s);
            for t in 0..32 {
                o[32 * s + t] = dl * KVALUES[q[t] as usize] as f32;
            }
        }
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
    let sc = scales(blk);
    for s in 0..8 {
        dst[SCALES + 16 * s + r] = sc[s] as u8;
    }
    pack_qs(&blk[8..136], r, dst, QS);
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    // Re-encode the scales: `ls = scale + 32` in six bits.
    let mut high = 0u16;
    for s in 0..8 {
        let ls = (src[SCALES + 16 * s + r] as i8 as i16 + 32) as u16;
        high |= (ls >> 4) << (2 * s);
        let low = (ls & 0x0F) as u8;
        if s % 2 == 0 {
            dst[4 + s / 2] = low;
        } else {
            dst[4 + s / 2] |= low << 4;
        }
    }
    dst[2..4].copy_from_slice(&high.to_le_bytes());
    unpack_qs(src, r, QS, &mut dst[8..136]);
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let sc = scales(w);
    let mut isc = 0i32;
    for s in 0..8 {
        let q = sub_nibbles(w, s);
        let is: i32 = (0..32)
            .map(|t| KVALUES[q[t] as usize] as i32 * a.qs[32 * s + t] as i32)
            .sum();
        isc += sc[s] as i32 * is;
    }
    let d = f16_to_f32(le16(w, 0)) * a.d;
    (isc as f32).mul_add(d, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::iq4_nl::x86::{
        lookup256, lookup512, signed_dot256, signed_levels256, unsigned_levels512,
    };
    use super::{PANEL_BLOCK, QS, SCALES};
    use crate::kernels::quant::x86::{
        bcast256, bcast512, rows_1_to_8, rows_in_fours, store256, store512,
    };
    use crate::kernels::quant::QTile;
    use std::arch::x86_64::*;

    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_avx512(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_in_fours!(avx512, t) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn avx512<const MR: usize>(t: &QTile) {
        let table = unsigned_levels512();
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks of 256 quants and 16 sums
            // (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                let mut isc = [_mm512_setzero_si512(); MR];
                for s in 0..8 {
                    // Σ (level + 128)·qx - 128·Σqx over the sub-block.
                    let mut is: [__m512i; MR] = std::array::from_fn(|i| {
                        let sums = t.sums.add(i * t.lds + 16 * b + 2 * s);
                        _mm512_set1_epi32(-128 * (*sums + *sums.add(1)))
                    });
                    for c in 0..4 {
                        let v = _mm512_loadu_si512(pb.add(QS + 64 * (4 * s + c)) as *const _);
                        let (lo, hi) = lookup512(table, v);
                        for i in 0..MR {
                            let xq = t.x.add(i * t.ldq + b * 256 + 32 * s + 4 * c);
                            is[i] = _mm512_dpbusd_epi32(is[i], lo, bcast512(xq));
                            is[i] = _mm512_dpbusd_epi32(is[i], hi, bcast512(xq.add(16)));
                        }
                    }
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        pb.add(SCALES + 16 * s) as *const __m128i
                    ));
                    for i in 0..MR {
                        isc[i] = _mm512_add_epi32(isc[i], _mm512_mullo_epi32(is[i], sc));
                    }
                }
                for i in 0..MR {
                    let dx = _mm512_set1_ps(*t.d.add(i * t.ldd + b));
                    acc[i] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isc[i]), _mm512_mul_ps(dw, dx), acc[i]);
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
                    let mut isc = [_mm256_setzero_si256(); MR];
                    for s in 0..8 {
                        let mut is = [_mm256_setzero_si256(); MR];
                        for c in 0..4 {
                            let chunk = pb.add(QS + 64 * (4 * s + c) + 32 * h);
                            let v = _mm256_loadu_si256(chunk as *const __m256i);
                            let (lo, hi) = lookup256(table, v);
                            let (ulo, uhi) = (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi));
                            for i in 0..MR {
                                let xq = t.x.add(i * t.ldq + b * 256 + 32 * s + 4 * c);
                                is[i] = signed_dot256(is[i], ulo, lo, bcast256(xq));
                                is[i] = signed_dot256(is[i], uhi, hi, bcast256(xq.add(16)));
                            }
                        }
                        let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            pb.add(SCALES + 16 * s + 8 * h) as *const __m128i,
                        ));
                        for i in 0..MR {
                            isc[i] = _mm256_add_epi32(isc[i], _mm256_mullo_epi32(is[i], sc));
                        }
                    }
                    for i in 0..MR {
                        let dx = _mm256_set1_ps(*t.d.add(i * t.ldd + b));
                        acc[i][h] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isc[i]),
                            _mm256_mul_ps(dw, dx),
                            acc[i][h],
                        );
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
