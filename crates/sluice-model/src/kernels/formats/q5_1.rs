//! Q5_1: blocks of 32 elements, 24 bytes: `d`, `m` (f16), `qh` (u32, as
//! Q5_0), then 16 bytes of nibbles; value `d · q + m`.
//!
//! Matmul (activation partner Q8_1): for each block, in order,
//! `acc = fma(f32(Σ q·qx), f32(d) · dx, acc)` then
//! `acc = fma(f32(m), sx, acc)`, the integer sum exact.
//!
//! Panel block (16 rows, 384 bytes): the 16 `d`, the 16 `m`, the fifth-bit
//! masks as in Q5_0, then the interleaved nibbles.

#![allow(clippy::needless_range_loop)]

use super::q5_0::{pack5, pack_masks, unpack_masks, values5};
use super::{f16_to_f32, f32_to_f16, le16, le32, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels, PANEL};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q5_1.block_size() as usize;
const BYTES: usize = GgmlType::Q5_1.type_size() as usize;
const PANEL_BLOCK: usize = PANEL * BYTES;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q5_1,
    ggml: GgmlType::Q5_1,
    dequantize,
    quantize: Some(quantize),
    kernels: Some(&KERNELS),
};

static KERNELS: QuantKernels = QuantKernels {
    act: ActKind::Q8_1,
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

/// `(d · q) + m` (`Q5_1.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let m = f16_to_f32(le16(blk, 2));
        let q = values5(le32(blk, 4), &blk[8..]);
        for j in 0..BLOCK {
            o[j] = d * q[j] as f32 + m;
        }
    }
}

/// `gguf.quants.quantize` for Q5_1: `d = (max - min) / 31`,
/// `q = min(31, trunc((x - min) · (1/d) + 0.5))`, `m = min`.
fn quantize(x: &[f32], out: &mut [u8]) {
    for (src, blk) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BYTES)) {
        let max = src.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = src.iter().copied().fold(f32::INFINITY, f32::min);
        let d = (max - min) / 31.0;
        let id = super::inverse_or_zero(d);
        let mut q = [0u8; 32];
        for j in 0..BLOCK {
            q[j] = (((src[j] - min) * id + 0.5).trunc() as u8).min(31);
        }
        blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        let (qh, qs) = blk[4..].split_at_mut(4);
        pack5(&q, qh, qs);
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
    dst[32 + 2 * r..34 + 2 * r].copy_from_slice(&blk[2..4]);
    pack_masks(le32(blk, 4), r, &mut dst[64..128]);
    for c in 0..4 {
        dst[128 + 64 * c + 4 * r..132 + 64 * c + 4 * r]
            .copy_from_slice(&blk[8 + 4 * c..12 + 4 * c]);
    }
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    dst[2..4].copy_from_slice(&src[32 + 2 * r..34 + 2 * r]);
    dst[4..8].copy_from_slice(&unpack_masks(&src[64..128], r).to_le_bytes());
    for c in 0..4 {
        dst[8 + 4 * c..12 + 4 * c]
            .copy_from_slice(&src[128 + 64 * c + 4 * r..132 + 64 * c + 4 * r]);
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let q = values5(le32(w, 4), &w[8..]);
    let mut isum = 0i32;
    for j in 0..BLOCK {
        isum += q[j] as i32 * a.qs[j] as i32;
    }
    let scale = f16_to_f32(le16(w, 0)) * a.d;
    let acc = (isum as f32).mul_add(scale, acc);
    f16_to_f32(le16(w, 2)).mul_add(a.s, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::q5_0::x86::{avx2_sums, mask_at};
    use super::PANEL_BLOCK;
    use crate::kernels::quant::x86::{bcast512, rows_1_to_8, store256, store512};
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
        let m4 = _mm512_set1_epi8(0x0F);
        let b4 = _mm512_set1_epi8(0x10);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(pb.add(32) as *const __m256i));
                // Chunks outside, rows inside: two unpacked vectors live at
                // a time, so 8 rows of accumulators fit the registers. Two
                // integer chains per row (exact in any order).
                let mut i0 = [_mm512_setzero_si512(); MR];
                let mut i1 = [_mm512_setzero_si512(); MR];
                for c in 0..4 {
                    let v = _mm512_loadu_si512(pb.add(128 + 64 * c) as *const _);
                    let l = _mm512_and_si512(v, m4);
                    let h = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    let lo = _mm512_mask_add_epi8(l, mask_at(pb.add(64 + 16 * c)), l, b4);
                    let hi = _mm512_mask_add_epi8(h, mask_at(pb.add(72 + 16 * c)), h, b4);
                    for i in 0..MR {
                        let xq = t.x.add(i * t.ldq + b * 32);
                        i0[i] = _mm512_dpbusd_epi32(i0[i], lo, bcast512(xq.add(4 * c)));
                        i1[i] = _mm512_dpbusd_epi32(i1[i], hi, bcast512(xq.add(16 + 4 * c)));
                    }
                }
                for i in 0..MR {
                    let isum = _mm512_add_epi32(i0[i], i1[i]);
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*t.d.add(i * t.ldd + b)));
                    let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i]);
                    acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*t.s.add(i * t.ldd + b)), a);
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
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for h in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * h) as *const __m128i));
                    let mw =
                        _mm256_cvtph_ps(_mm_loadu_si128(pb.add(32 + 16 * h) as *const __m128i));
                    let zero = [_mm256_setzero_si256(); MR];
                    let isum = avx2_sums(t, b, pb.add(128), pb.add(64), h, zero);
                    for i in 0..MR {
                        let dx = *t.d.add(i * t.ldd + b);
                        let sx = *t.s.add(i * t.ldd + b);
                        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
                        let a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), scale, acc[i][h]);
                        acc[i][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), a);
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
