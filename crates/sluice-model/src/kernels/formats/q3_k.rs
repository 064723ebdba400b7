//! Q3_K: super-blocks of 256 elements, 110 bytes: 32 bytes `hmask` (the
//! high bit of element `32k + l` in bit `k` of byte `l`), 64 bytes of low
//! 2-bit quants (as Q2_K's: element `128h + 32j + l` in bits `2j` of byte
//! `32h + l`), 12 bytes of sixteen 6-bit scales, then `d` (f16). Sub-block
//! `s` (16 elements) has scale `sc_s - 32` and values
//! `(d · (sc_s - 32)) · q`, `q = low - 4` where the high bit is clear and
//! `low` where it is set (in -4..=3).
//!
//! Matmul (activation partner Q8_K): for each super-block, in order, with
//! `I_s = Σ q·qx` over sub-block `s` and `ISC = Σ_s (sc_s - 32) · I_s`
//! (exact integers): `acc = fma(f32(ISC), f32(d) · dx, acc)`. The SIMD
//! paths take `q + 4` (0..=7) as unsigned bytes and subtract
//! `4·bsum_s`.
//!
//! Panel block (16 rows, 1824 bytes): the 16 `d`; the scales decoded
//! (`sc_s - 32` as i8) of row `r` at `32 + 16s + r`; then for each 4-byte
//! chunk `c` of `hmask`, 64 bytes holding row `r`'s bytes `4c..+4` at
//! `4r`; then the low quants interleaved as Q2_K's.

#![allow(clippy::needless_range_loop)]

use super::q2_k::crumbs;
use super::q4_k::{pack_qs, unpack_qs};
use super::{f16_to_f32, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q3_K.block_size() as usize;
const BYTES: usize = GgmlType::Q3_K.type_size() as usize;
pub(crate) const PANEL_BLOCK: usize = 1824;
const SCALES: usize = 32;
const HMASK: usize = 288;
const QS: usize = 800;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q3K,
    ggml: GgmlType::Q3_K,
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

/// The sixteen scales `sc_s - 32` from their 12 bytes.
fn scales(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// The inverse of `scales`.
fn encode_scales(sc: &[i8; 16], dst: &mut [u8]) {
    dst[..12].fill(0);
    for i in 0..16 {
        let v = (sc[i] as i16 + 32) as u8;
        if i < 8 {
            dst[i] |= v & 0x0F;
        } else {
            dst[i - 8] |= (v & 0x0F) << 4;
        }
        dst[8 + i % 4] |= (v >> 4) << (2 * (i / 4));
    }
}

/// The 256 values `q + 4` (0..=7) of a block, in element order.
fn values(blk: &[u8]) -> [u8; 256] {
    let low = crumbs(&blk[32..96]);
    std::array::from_fn(|e| low[e] | (((blk[e % 32] >> (e / 32)) & 1) << 2))
}

/// `(d · (sc - 32)) · q` (`Q3_K.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 108));
        let sc = scales(&blk[96..108]);
        let u = values(blk);
        for s in 0..16 {
            let dl = d * sc[s] as f32;
            for t in 0..16 {
                o[16 * s + t] = dl * (u[16 * s + t] as i32 - 4) as f32;
            }
        }
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[108..110]);
    let sc = scales(&blk[96..108]);
    for s in 0..16 {
        dst[SCALES + 16 * s + r] = sc[s] as u8;
    }
    pack_qs(&blk[..32], r, dst, HMASK);
    pack_qs(&blk[32..96], r, dst, QS);
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[108..110].copy_from_slice(&src[2 * r..2 * r + 2]);
    let sc: [i8; 16] = std::array::from_fn(|s| src[SCALES + 16 * s + r] as i8);
    encode_scales(&sc, &mut dst[96..108]);
    unpack_qs(src, r, HMASK, &mut dst[..32]);
    unpack_qs(src, r, QS, &mut dst[32..96]);
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let sc = scales(&w[96..108]);
    let u = values(w);
    let mut isc = 0i32;
    for s in 0..16 {
        let is: i32 = (0..16)
            .map(|t| (u[16 * s + t] as i32 - 4) * a.qs[16 * s + t] as i32)
            .sum();
        isc += sc[s] as i32 * is;
    }
    let d = f16_to_f32(le16(w, 108)) * a.d;
    (isc as f32).mul_add(d, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{HMASK, PANEL_BLOCK, QS, SCALES};
    use crate::kernels::quant::x86::{
        bcast256, bcast512, dpbusd256, rows_1_to_8, rows_in_fours, store256, store512,
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
        let m2 = _mm512_set1_epi8(3);
        let one = _mm512_set1_epi8(1);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks of 256 quants and 16 sums
            // (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                let mut isc = [_mm512_setzero_si512(); MR];
                for s in 0..16 {
                    // Sub-block s: half h, shift j, chunks 4·(s%2)..+4;
                    // its high bits are bit 4h + j of the hmask bytes.
                    let (h, j, half) = (s / 8, (s % 8) / 2, s % 2);
                    let (low_shift, high_shift) = (
                        _mm_cvtsi32_si128(2 * j as i32),
                        _mm_cvtsi32_si128((4 * h + j) as i32),
                    );
                    let mut is: [__m512i; MR] = std::array::from_fn(|i| {
                        _mm512_set1_epi32(-4 * *t.sums.add(i * t.lds + 16 * b + s))
                    });
                    for c in 0..4 {
                        let chunk = 4 * half + c;
                        let v = _mm512_loadu_si512(pb.add(QS + 64 * (8 * h + chunk)) as *const _);
                        let hm = _mm512_loadu_si512(pb.add(HMASK + 64 * chunk) as *const _);
                        let low = _mm512_and_si512(_mm512_srl_epi16(v, low_shift), m2);
                        let high = _mm512_and_si512(_mm512_srl_epi16(hm, high_shift), one);
                        let u = _mm512_or_si512(low, _mm512_slli_epi16::<2>(high));
                        for i in 0..MR {
                            let xq = t.x.add(i * t.ldq + b * 256 + 128 * h + 32 * j + 4 * chunk);
                            is[i] = _mm512_dpbusd_epi32(is[i], u, bcast512(xq));
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
        let m2 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for hh in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * hh) as *const __m128i));
                    let mut isc = [_mm256_setzero_si256(); MR];
                    for s in 0..16 {
                        let (h, j, half) = (s / 8, (s % 8) / 2, s % 2);
                        let (low_shift, high_shift) = (
                            _mm_cvtsi32_si128(2 * j as i32),
                            _mm_cvtsi32_si128((4 * h + j) as i32),
                        );
                        let mut is: [__m256i; MR] = std::array::from_fn(|i| {
                            _mm256_set1_epi32(-4 * *t.sums.add(i * t.lds + 16 * b + s))
                        });
                        for c in 0..4 {
                            let chunk = 4 * half + c;
                            let at = QS + 64 * (8 * h + chunk) + 32 * hh;
                            let v = _mm256_loadu_si256(pb.add(at) as *const __m256i);
                            let hm = _mm256_loadu_si256(
                                pb.add(HMASK + 64 * chunk + 32 * hh) as *const __m256i
                            );
                            let low = _mm256_and_si256(_mm256_srl_epi16(v, low_shift), m2);
                            let high = _mm256_and_si256(_mm256_srl_epi16(hm, high_shift), one);
                            let u = _mm256_or_si256(low, _mm256_slli_epi16::<2>(high));
                            for i in 0..MR {
                                let xq =
                                    t.x.add(i * t.ldq + b * 256 + 128 * h + 32 * j + 4 * chunk);
                                is[i] = dpbusd256(is[i], u, bcast256(xq));
                            }
                        }
                        let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            pb.add(SCALES + 16 * s + 8 * hh) as *const __m128i,
                        ));
                        for i in 0..MR {
                            isc[i] = _mm256_add_epi32(isc[i], _mm256_mullo_epi32(is[i], sc));
                        }
                    }
                    for i in 0..MR {
                        let dx = _mm256_set1_ps(*t.d.add(i * t.ldd + b));
                        acc[i][hh] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isc[i]),
                            _mm256_mul_ps(dw, dx),
                            acc[i][hh],
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
