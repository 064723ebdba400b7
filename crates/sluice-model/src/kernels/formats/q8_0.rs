//! Q8_0: blocks of 32 elements, 34 bytes: `d` (f16), then 32 signed bytes
//! `q`; value `d · q`.
//!
//! Matmul (activation partner Q8_0, see `quant/`): for each block, in
//! order, `acc = fma(f32(Σ q·qx), f32(d) · dx, acc)` with the integer sum
//! exact.
//!
//! Panel block (16 rows, 544 bytes): the 16 `d` (32 bytes), then for each
//! 4-element chunk `c` of the block, 64 bytes holding row `r`'s elements
//! `4c..4c+4` at `4r`, stored as `q + 128` (unsigned): the VNNI kernel
//! takes them as `vpdpbusd`'s unsigned operand and starts each block's sum
//! at `-128 · Σqx`; the AVX2 kernel flips them back to signed.

#![allow(clippy::needless_range_loop)]

use super::{f16_to_f32, f32_to_f16, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels, PANEL};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q8_0.block_size() as usize;
const BYTES: usize = GgmlType::Q8_0.type_size() as usize;
const PANEL_BLOCK: usize = PANEL * BYTES;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q8_0,
    ggml: GgmlType::Q8_0,
    dequantize,
    quantize: Some(quantize),
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

/// `q · d` per element (`Q8_0.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        for j in 0..BLOCK {
            o[j] = (blk[2 + j] as i8) as f32 * d;
        }
    }
}

/// `gguf.quants.quantize` for Q8_0 (= ggml's `quantize_row_q8_0_ref`):
/// `d = amax / 127`, `q = round_half_away(x · (1/d))`, `d` stored as f16.
fn quantize(x: &[f32], out: &mut [u8]) {
    for (src, blk) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BYTES)) {
        let amax = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = super::inverse_or_zero(d);
        blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..BLOCK {
            // `np_roundf` rounds half away from zero: `f32::round`.
            blk[2 + j] = ((src[j] * id).round() as i8) as u8;
        }
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
    for c in 0..8 {
        // Four quants at a time, flipped to q + 128.
        let v = super::le32(blk, 2 + 4 * c) ^ 0x8080_8080;
        dst[32 + 64 * c + 4 * r..36 + 64 * c + 4 * r].copy_from_slice(&v.to_le_bytes());
    }
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    for c in 0..8 {
        let v = super::le32(src, 32 + 64 * c + 4 * r) ^ 0x8080_8080;
        dst[2 + 4 * c..6 + 4 * c].copy_from_slice(&v.to_le_bytes());
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let mut isum = 0i32;
    for j in 0..BLOCK {
        isum += (w[2 + j] as i8) as i32 * a.qs[j] as i32;
    }
    let scale = f16_to_f32(le16(w, 0)) * a.d;
    (isum as f32).mul_add(scale, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PANEL_BLOCK;
    use crate::kernels::quant::x86::{bcast256, bcast512, rows_1_to_8, store256, store512};
    use crate::kernels::quant::QTile;
    use std::arch::x86_64::*;

    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_avx512(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_1_to_8!(avx512, t) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn avx512<const MR: usize>(t: &QTile) {
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks of 32 quants, `nb` scales and
            // sums (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                // Weights are q + 128: start at -128·Σqx. Two chains per row
                // for latency (integer sums are exact in any order); chunks
                // outside, rows inside, so 8 rows fit the registers.
                let mut i0: [__m512i; MR] =
                    std::array::from_fn(|i| _mm512_set1_epi32(-128 * *t.sums.add(i * t.lds + b)));
                let mut i1 = [_mm512_setzero_si512(); MR];
                for c in 0..4 {
                    let v0 = _mm512_loadu_si512(pb.add(32 + 128 * c) as *const _);
                    let v1 = _mm512_loadu_si512(pb.add(96 + 128 * c) as *const _);
                    for i in 0..MR {
                        let xq = t.x.add(i * t.ldq + b * 32 + 8 * c);
                        i0[i] = _mm512_dpbusd_epi32(i0[i], v0, bcast512(xq));
                        i1[i] = _mm512_dpbusd_epi32(i1[i], v1, bcast512(xq.add(4)));
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
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let flip = _mm256_set1_epi8(-128);
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for h in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * h) as *const __m128i));
                    let mut isum = [_mm256_setzero_si256(); MR];
                    for c in 0..8 {
                        let w = _mm256_xor_si256(
                            _mm256_loadu_si256(pb.add(32 + 64 * c + 32 * h) as *const __m256i),
                            flip,
                        );
                        let aw = _mm256_sign_epi8(w, w);
                        for i in 0..MR {
                            let xv = bcast256(t.x.add(i * t.ldq + b * 32 + 4 * c));
                            // |w| · (x signed like w): pair sums within
                            // 2·128·127, no saturation.
                            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w));
                            isum[i] = _mm256_add_epi32(
                                isum[i],
                                _mm256_madd_epi16(p, _mm256_set1_epi16(1)),
                            );
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
