//! Q4_0: blocks of 32 elements, 18 bytes: `d` (f16), then 16 bytes of
//! nibbles (byte `j`: element `j` low, element `j + 16` high); value
//! `d · (q - 8)`.
//!
//! Matmul (activation partner Q8_0): for each block, in order,
//! `acc = fma(f32(Σ (q - 8)·qx), f32(d) · dx, acc)`, the integer sum exact
//! (computed as `Σ q·qx - 8·Σqx`).
//!
//! Panel block (16 rows, 288 bytes): the 16 `d`, then for each 4-byte
//! chunk `c` of the nibbles, 64 bytes holding row `r`'s bytes `4c..4c+4`
//! at `4r`: their low nibbles are elements `4c..4c+4`, the high ones
//! `16 + 4c..`. (IQ4_NL's panel block is the same.)

#![allow(clippy::needless_range_loop)]

use super::{f16_to_f32, f32_to_f16, le16, pack_nibbles, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels, PANEL};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q4_0.block_size() as usize;
const BYTES: usize = GgmlType::Q4_0.type_size() as usize;
const PANEL_BLOCK: usize = PANEL * BYTES;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q4_0,
    ggml: GgmlType::Q4_0,
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

/// The 32 values 0..=15 of a block, in element order.
#[inline]
pub(crate) fn nibbles(qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
    q
}

/// `d · (q - 8)` (`Q4_0.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let q = nibbles(&blk[2..]);
        for j in 0..BLOCK {
            o[j] = d * (q[j] as i32 - 8) as f32;
        }
    }
}

/// `gguf.quants.quantize` for Q4_0: `d = max / -8` (max: the signed value of
/// largest magnitude), `q = min(15, trunc(x · (1/d) + 8.5))`.
fn quantize(x: &[f32], out: &mut [u8]) {
    for (src, blk) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BYTES)) {
        let d = super::signed_absmax(src) / -8.0;
        let id = super::inverse_or_zero(d);
        let mut q = [0u8; 32];
        for j in 0..BLOCK {
            // `trunc(...).astype(uint8).clip(0, 15)`; `as u8` saturates
            // the (impossible) negatives to 0.
            q[j] = ((src[j] * id + 8.5).trunc() as u8).min(15);
        }
        blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        pack_nibbles(&q, &mut blk[2..]);
    }
}

pub(crate) fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
    for c in 0..4 {
        dst[32 + 64 * c + 4 * r..32 + 64 * c + 4 * r + 4]
            .copy_from_slice(&blk[2 + 4 * c..6 + 4 * c]);
    }
}

pub(crate) fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    for c in 0..4 {
        dst[2 + 4 * c..6 + 4 * c].copy_from_slice(&src[32 + 64 * c + 4 * r..36 + 64 * c + 4 * r]);
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let q = nibbles(&w[2..]);
    let mut isum = 0i32;
    for j in 0..BLOCK {
        isum += (q[j] as i32 - 8) * a.qs[j] as i32;
    }
    let scale = f16_to_f32(le16(w, 0)) * a.d;
    (isum as f32).mul_add(scale, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PANEL_BLOCK;
    use crate::kernels::quant::x86::{
        bcast256, bcast512, dpbusd256, rows_1_to_8, store256, store512,
    };
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
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                // Chunks outside, rows inside: two unpacked vectors live at
                // a time, so 8 rows of accumulators fit the registers. Two
                // integer chains per row (exact in any order).
                let mut i0: [__m512i; MR] =
                    std::array::from_fn(|i| _mm512_set1_epi32(-8 * *t.sums.add(i * t.lds + b)));
                let mut i1 = [_mm512_setzero_si512(); MR];
                for c in 0..4 {
                    let v = _mm512_loadu_si512(pb.add(32 + 64 * c) as *const _);
                    let lo = _mm512_and_si512(v, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
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
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for h in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * h) as *const __m128i));
                    let mut isum: [__m256i; MR] =
                        std::array::from_fn(|i| _mm256_set1_epi32(-8 * *t.sums.add(i * t.lds + b)));
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(pb.add(32 + 64 * c + 32 * h) as *const __m256i);
                        let lo = _mm256_and_si256(v, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                        for i in 0..MR {
                            let xq = t.x.add(i * t.ldq + b * 32);
                            isum[i] = dpbusd256(isum[i], lo, bcast256(xq.add(4 * c)));
                            isum[i] = dpbusd256(isum[i], hi, bcast256(xq.add(16 + 4 * c)));
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
