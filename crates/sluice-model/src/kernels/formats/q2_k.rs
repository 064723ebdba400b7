//! Q2_K: super-blocks of 256 elements, 84 bytes: 16 scale bytes (sub-block
//! `s` of 16 elements: scale `sc_s` in the low nibble, min `mn_s` in the
//! high one), 64 bytes of 2-bit quants (element `128h + 32j + l` in bits
//! `2j` of byte `32h + l`), then `d` and `dmin` (f16); value
//! `(d · sc_s) · q - (dmin · mn_s)` with `q` in 0..=3.
//!
//! Matmul (activation partner Q8_K, whose sums of 16 are exactly the
//! sub-blocks'): for each super-block, in order, with `I_s = Σ q·qx` over
//! sub-block `s`, `ISC = Σ_s sc_s · I_s` and `IMN = Σ_s mn_s · bsum_s`
//! (exact integers): `acc = fma(f32(ISC), f32(d) · dx, acc)` then
//! `acc = fma(-f32(IMN), f32(dmin) · dx, acc)`.
//!
//! Panel block (16 rows, 1344 bytes: 16 ggml blocks): the 16 `d`, the 16
//! `dmin`, the scale bytes as stored (sub-block `s` of row `r` at
//! `64 + 16s + r`), then for each half `h` and 4-byte chunk `c` of its 32
//! quant bytes, 64 bytes holding row `r`'s bytes `32h + 4c..+4` at `4r`
//! (bits `2j` of them: elements `128h + 32j + 4c..+4`).

#![allow(clippy::needless_range_loop)]

use super::q4_k::{pack_qs, unpack_qs};
use super::{f16_to_f32, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q2_K.block_size() as usize;
const BYTES: usize = GgmlType::Q2_K.type_size() as usize;
pub(crate) const PANEL_BLOCK: usize = 1344;
const SCALES: usize = 64;
const QS: usize = 320;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q2K,
    ggml: GgmlType::Q2_K,
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

/// The 256 two-bit values of a block's quant bytes, in element order.
pub(crate) fn crumbs(qs: &[u8]) -> [u8; 256] {
    std::array::from_fn(|e| {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        (qs[32 * h + l] >> (2 * j)) & 3
    })
}

/// `(d · sc) · q - (dmin · mn)` (`Q2_K.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 80));
        let dmin = f16_to_f32(le16(blk, 82));
        let q = crumbs(&blk[16..80]);
        for s in 0..16 {
            let dl = d * (blk[s] & 0x0F) as f32;
            let ml = dmin * (blk[s] >> 4) as f32;
            for t in 0..16 {
                o[16 * s + t] = dl * q[16 * s + t] as f32 - ml;
            }
        }
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[80..82]);
    dst[32 + 2 * r..34 + 2 * r].copy_from_slice(&blk[82..84]);
    for s in 0..16 {
        dst[SCALES + 16 * s + r] = blk[s];
    }
    pack_qs(&blk[16..80], r, dst, QS);
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[80..82].copy_from_slice(&src[2 * r..2 * r + 2]);
    dst[82..84].copy_from_slice(&src[32 + 2 * r..34 + 2 * r]);
    for s in 0..16 {
        dst[s] = src[SCALES + 16 * s + r];
    }
    unpack_qs(src, r, QS, &mut dst[16..80]);
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let q = crumbs(&w[16..80]);
    let (mut isc, mut imn) = (0i32, 0i32);
    for s in 0..16 {
        let is: i32 = (0..16)
            .map(|t| q[16 * s + t] as i32 * a.qs[16 * s + t] as i32)
            .sum();
        isc += (w[s] & 0x0F) as i32 * is;
        imn += (w[s] >> 4) as i32 * a.sums[s];
    }
    let d = f16_to_f32(le16(w, 80)) * a.d;
    let dmin = f16_to_f32(le16(w, 82)) * a.d;
    let acc = (isc as f32).mul_add(d, acc);
    (-(imn as f32)).mul_add(dmin, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{PANEL_BLOCK, QS, SCALES};
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
        let m4 = _mm512_set1_epi32(0x0F);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks of 256 quants and 16 sums
            // (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(pb.add(32) as *const __m256i));
                let mut isc = [_mm512_setzero_si512(); MR];
                let mut imn = [_mm512_setzero_si512(); MR];
                for s in 0..16 {
                    // Sub-block s: half h, shift j, chunks 4·(s%2)..+4.
                    let (h, j, half) = (s / 8, (s % 8) / 2, s % 2);
                    let mut is = [_mm512_setzero_si512(); MR];
                    for c in 0..4 {
                        let chunk = 4 * half + c;
                        let v = _mm512_loadu_si512(pb.add(QS + 64 * (8 * h + chunk)) as *const _);
                        let q = _mm512_and_si512(
                            _mm512_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)),
                            m2,
                        );
                        for i in 0..MR {
                            let xq = t.x.add(i * t.ldq + b * 256 + 128 * h + 32 * j + 4 * chunk);
                            is[i] = _mm512_dpbusd_epi32(is[i], q, bcast512(xq));
                        }
                    }
                    let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        pb.add(SCALES + 16 * s) as *const __m128i
                    ));
                    let sc = _mm512_and_si512(raw, m4);
                    let mn = _mm512_srli_epi32::<4>(raw);
                    for i in 0..MR {
                        isc[i] = _mm512_add_epi32(isc[i], _mm512_mullo_epi32(is[i], sc));
                        let bsum = _mm512_set1_epi32(*t.sums.add(i * t.lds + 16 * b + s));
                        imn[i] = _mm512_add_epi32(imn[i], _mm512_mullo_epi32(mn, bsum));
                    }
                }
                for i in 0..MR {
                    let dx = _mm512_set1_ps(*t.d.add(i * t.ldd + b));
                    let a =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isc[i]), _mm512_mul_ps(dw, dx), acc[i]);
                    acc[i] =
                        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imn[i]), _mm512_mul_ps(dmw, dx), a);
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
        let m4 = _mm256_set1_epi32(0x0F);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for hh in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * hh) as *const __m128i));
                    let dmw =
                        _mm256_cvtph_ps(_mm_loadu_si128(pb.add(32 + 16 * hh) as *const __m128i));
                    let mut isc = [_mm256_setzero_si256(); MR];
                    let mut imn = [_mm256_setzero_si256(); MR];
                    for s in 0..16 {
                        let (h, j, half) = (s / 8, (s % 8) / 2, s % 2);
                        let mut is = [_mm256_setzero_si256(); MR];
                        for c in 0..4 {
                            let chunk = 4 * half + c;
                            let at = QS + 64 * (8 * h + chunk) + 32 * hh;
                            let v = _mm256_loadu_si256(pb.add(at) as *const __m256i);
                            let q = _mm256_and_si256(
                                _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)),
                                m2,
                            );
                            for i in 0..MR {
                                let xq =
                                    t.x.add(i * t.ldq + b * 256 + 128 * h + 32 * j + 4 * chunk);
                                is[i] = dpbusd256(is[i], q, bcast256(xq));
                            }
                        }
                        let raw = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            pb.add(SCALES + 16 * s + 8 * hh) as *const __m128i,
                        ));
                        let sc = _mm256_and_si256(raw, m4);
                        let mn = _mm256_srli_epi32::<4>(raw);
                        for i in 0..MR {
                            isc[i] = _mm256_add_epi32(isc[i], _mm256_mullo_epi32(is[i], sc));
                            let bsum = _mm256_set1_epi32(*t.sums.add(i * t.lds + 16 * b + s));
                            imn[i] = _mm256_add_epi32(imn[i], _mm256_mullo_epi32(mn, bsum));
                        }
                    }
                    for i in 0..MR {
                        let dx = _mm256_set1_ps(*t.d.add(i * t.ldd + b));
                        let a = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isc[i]),
                            _mm256_mul_ps(dw, dx),
                            acc[i][hh],
                        );
                        acc[i][hh] =
                            _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imn[i]), _mm256_mul_ps(dmw, dx), a);
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
