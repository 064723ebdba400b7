//! Q4_K: super-blocks of 256 elements, 144 bytes: `d`, `dmin` (f16), 12
//! bytes of eight 6-bit sub-block scales `sc` and mins `mn`, then 128
//! bytes of nibbles (for each 64 elements, 32 bytes: the low nibbles are
//! sub-block `2G`, the high ones `2G + 1`); value of sub-block `s`'s
//! element: `(d · sc_s) · q - (dmin · mn_s)`.
//!
//! Matmul (activation partner Q8_K): for each super-block, in order, with
//! `I_s = Σ q·qx` over sub-block `s`, `ISC = Σ_s sc_s · I_s`, `IMN = Σ_s
//! mn_s · (bsum_{2s} + bsum_{2s+1})` (all exact integers):
//! `acc = fma(f32(ISC), f32(d) · dx, acc)` then
//! `acc = fma(-f32(IMN), f32(dmin) · dx, acc)`.
//!
//! Panel block (16 rows, 2368 bytes): the 16 `d`, the 16 `dmin`; the
//! scales decoded, `sc_s` of row `r` at `64 + 16s + r`; the mins decoded in
//! pairs, `mn_s` of row `r` at `192 + 32·(s/2) + 2r + s%2` (the i16 pairs
//! `vpdpwssd` takes against the activation sums); then for each 64-element
//! group `G` and 4-byte chunk `c`, 64 bytes holding row `r`'s nibble bytes
//! `32G + 4c..+4` at `4r`.

#![allow(clippy::needless_range_loop)]

use super::{f16_to_f32, k_scales_mins, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q4_K.block_size() as usize;
const BYTES: usize = GgmlType::Q4_K.type_size() as usize;
pub(crate) const PANEL_BLOCK: usize = 2368;
/// Where the interleaved nibbles start in a panel block.
const QS: usize = 320;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q4K,
    ggml: GgmlType::Q4_K,
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

/// Sub-block `s`'s 32 nibbles from the 128 nibble bytes.
#[inline]
pub(crate) fn sub_nibbles(qs: &[u8], s: usize) -> [u8; 32] {
    let g = &qs[32 * (s / 2)..32 * (s / 2) + 32];
    let shift = 4 * (s % 2);
    std::array::from_fn(|t| (g[t] >> shift) & 0x0F)
}

/// `(d · sc) · q - (dmin · mn)` (`Q4_K.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let dmin = f16_to_f32(le16(blk, 2));
        let (sc, mn) = k_scales_mins(&blk[4..16]);
        for s in 0..8 {
            let ds = d * sc[s] as f32;
            let dm = dmin * mn[s] as f32;
            let q = sub_nibbles(&blk[16..], s);
            for t in 0..32 {
                o[32 * s + t] = ds * q[t] as f32 - dm;
            }
        }
    }
}

/// Re-encodes decoded scales and mins into ggml's 12 bytes (the exact
/// inverse of `k_scales_mins`: the 96 bits are the 16 six-bit values).
pub(crate) fn encode_scales_mins(sc: &[u8; 8], mn: &[u8; 8], dst: &mut [u8]) {
    for j in 0..4 {
        dst[j] = (sc[j] & 0x3F) | ((sc[j + 4] >> 4) << 6);
        dst[j + 4] = (mn[j] & 0x3F) | ((mn[j + 4] >> 4) << 6);
        dst[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
}

/// Writes `d`, `dmin` and the decoded scales / mins of row `r` (panel
/// bytes 0..320), from the row's first 16 ggml bytes.
pub(crate) fn pack_head(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
    dst[32 + 2 * r..34 + 2 * r].copy_from_slice(&blk[2..4]);
    let (sc, mn) = k_scales_mins(&blk[4..16]);
    for s in 0..8 {
        dst[64 + 16 * s + r] = sc[s];
        dst[192 + 32 * (s / 2) + 2 * r + s % 2] = mn[s];
    }
}

/// The inverse of `pack_head`.
pub(crate) fn unpack_head(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    dst[2..4].copy_from_slice(&src[32 + 2 * r..34 + 2 * r]);
    let sc: [u8; 8] = std::array::from_fn(|s| src[64 + 16 * s + r]);
    let mn: [u8; 8] = std::array::from_fn(|s| src[192 + 32 * (s / 2) + 2 * r + s % 2]);
    encode_scales_mins(&sc, &mn, &mut dst[4..16]);
}

/// Interleaves row `r`'s quant bytes `qs` into the panel at `at`: its
/// 4-byte chunk `c` at `at + 64c + 4r` (the K and IQ4_XS panels' layout).
pub(crate) fn pack_qs(qs: &[u8], r: usize, dst: &mut [u8], at: usize) {
    for chunk in 0..qs.len() / 4 {
        let o = at + 64 * chunk + 4 * r;
        dst[o..o + 4].copy_from_slice(&qs[4 * chunk..4 * chunk + 4]);
    }
}

/// The inverse of `pack_qs` (`qs.len()` bytes).
pub(crate) fn unpack_qs(src: &[u8], r: usize, at: usize, qs: &mut [u8]) {
    for chunk in 0..qs.len() / 4 {
        let o = at + 64 * chunk + 4 * r;
        qs[4 * chunk..4 * chunk + 4].copy_from_slice(&src[o..o + 4]);
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    pack_head(blk, r, dst);
    pack_qs(&blk[16..144], r, dst, QS);
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    unpack_head(src, r, dst);
    unpack_qs(src, r, QS, &mut dst[16..144]);
}

/// The min term's integer: `Σ_s mn_s · (bsum_{2s} + bsum_{2s+1})`.
#[inline]
pub(crate) fn min_sum(mn: &[u8; 8], sums: &[i32]) -> i32 {
    (0..8)
        .map(|s| mn[s] as i32 * (sums[2 * s] + sums[2 * s + 1]))
        .sum()
}

/// Finishes a K super-block from its integers (shared with Q5_K).
#[inline]
pub(crate) fn finish(acc: f32, isc: i32, imn: i32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let d = f16_to_f32(le16(w, 0)) * a.d;
    let dmin = f16_to_f32(le16(w, 2)) * a.d;
    let acc = (isc as f32).mul_add(d, acc);
    (-(imn as f32)).mul_add(dmin, acc)
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let (sc, mn) = k_scales_mins(&w[4..16]);
    let mut isc = 0i32;
    for s in 0..8 {
        let q = sub_nibbles(&w[16..], s);
        let is: i32 = (0..32).map(|t| q[t] as i32 * a.qs[32 * s + t] as i32).sum();
        isc += sc[s] as i32 * is;
    }
    finish(acc, isc, min_sum(&mn, a.sums), w, a)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{PANEL_BLOCK, QS};
    use crate::kernels::quant::x86::{
        bcast256, bcast512, rows_1_to_8, rows_in_fours, store256, store512,
    };
    use crate::kernels::quant::QTile;
    use std::arch::x86_64::*;

    /// The mins' `vpdpwssd` operand of pair `p` for row `i`: the 32-element
    /// activation sums of sub-blocks `2p` and `2p + 1` as two i16.
    ///
    /// # Safety
    /// `sums` valid for 16 values.
    #[inline(always)]
    pub(crate) unsafe fn min_pair(sums: *const i32, p: usize) -> i32 {
        // SAFETY: 4p + 3 < 16.
        unsafe {
            let lo = *sums.add(4 * p) + *sums.add(4 * p + 1);
            let hi = *sums.add(4 * p + 2) + *sums.add(4 * p + 3);
            (lo as u16 as u32 | ((hi as u32) << 16)) as i32
        }
    }

    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_avx512(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_in_fours!(avx512::<false>, t) }
    }

    /// The Q4_K / Q5_K kernel (`FIVE`: the fifth bits from the masks at
    /// panel bytes 320..832, nibbles after them).
    ///
    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn avx512<const FIVE: bool, const MR: usize>(t: &QTile) {
        let panel_block = if FIVE {
            super::super::q5_k::PANEL_BLOCK
        } else {
            PANEL_BLOCK
        };
        let qs_at = if FIVE { QS + 512 } else { QS };
        let m4 = _mm512_set1_epi8(0x0F);
        let b4 = _mm512_set1_epi8(0x10);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks of 256 quants and 16 sums
            // (see `QTile`).
            unsafe {
                let pb = t.w.add(b * panel_block);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(pb.add(32) as *const __m256i));
                let mut isc = [_mm512_setzero_si512(); MR];
                for g in 0..4 {
                    let mut il = [_mm512_setzero_si512(); MR];
                    let mut ih = [_mm512_setzero_si512(); MR];
                    for c in 0..8 {
                        let chunk = pb.add(qs_at + 64 * (8 * g + c));
                        let v = _mm512_loadu_si512(chunk as *const _);
                        let mut lo = _mm512_and_si512(v, m4);
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                        if FIVE {
                            let ml =
                                (pb.add(QS + 8 * (8 * (2 * g) + c)) as *const u64).read_unaligned();
                            let mh = (pb.add(QS + 8 * (8 * (2 * g + 1) + c)) as *const u64)
                                .read_unaligned();
                            lo = _mm512_mask_add_epi8(lo, ml, lo, b4);
                            hi = _mm512_mask_add_epi8(hi, mh, hi, b4);
                        }
                        for i in 0..MR {
                            let xq = t.x.add(i * t.ldq + b * 256 + 64 * g + 4 * c);
                            il[i] = _mm512_dpbusd_epi32(il[i], lo, bcast512(xq));
                            ih[i] = _mm512_dpbusd_epi32(ih[i], hi, bcast512(xq.add(32)));
                        }
                    }
                    let scl = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        pb.add(64 + 32 * g) as *const __m128i
                    ));
                    let sch = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        pb.add(80 + 32 * g) as *const __m128i
                    ));
                    for i in 0..MR {
                        isc[i] = _mm512_add_epi32(
                            isc[i],
                            _mm512_add_epi32(
                                _mm512_mullo_epi32(il[i], scl),
                                _mm512_mullo_epi32(ih[i], sch),
                            ),
                        );
                    }
                }
                let mut imn = [_mm512_setzero_si512(); MR];
                for p in 0..4 {
                    let mnp = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        pb.add(192 + 32 * p) as *const __m256i
                    ));
                    for i in 0..MR {
                        let pair = min_pair(t.sums.add(i * t.lds + 16 * b), p);
                        imn[i] = _mm512_dpwssd_epi32(imn[i], mnp, _mm512_set1_epi32(pair));
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
        unsafe { rows_1_to_8!(avx2::<false>, t) }
    }

    /// The AVX2 Q4_K / Q5_K kernel, 8 columns at a time.
    ///
    /// AVX2 has no `vpdpbusd`, and its stand-in (`pmaddubsw` then
    /// `pmaddwd` by ones) spends two multiplies per 4 products. Here the
    /// `pmaddubsw` pair sums of one sub-block stay in i16 lanes across
    /// `SPAN` chunks, and one `pmaddwd` by the sub-block's scale (in both
    /// halves of each lane) widens them and applies the scale at once, as
    /// llama.cpp's AVX2 K kernels do: half the multiplies. The sums are
    /// exact: an i16 lane takes `2·SPAN` products of at most `15·127`
    /// (Q4_K, `SPAN` 8: 30,480) or `31·127` (Q5_K, `SPAN` 4: 31,496).
    ///
    /// # Safety
    /// As for `QKernel`; AVX2 + FMA + F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn avx2<const FIVE: bool, const MR: usize>(t: &QTile) {
        use crate::kernels::formats::q5_0::x86::avx2_fifth_bits;
        let panel_block = if FIVE {
            super::super::q5_k::PANEL_BLOCK
        } else {
            PANEL_BLOCK
        };
        let qs_at = if FIVE { QS + 512 } else { QS };
        let span = if FIVE { 4 } else { 8 };
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * panel_block);
                for h in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * h) as *const __m128i));
                    let dmw =
                        _mm256_cvtph_ps(_mm_loadu_si128(pb.add(32 + 16 * h) as *const __m128i));
                    let mut isc = [_mm256_setzero_si256(); MR];
                    // Sub-block s = 2g + n: the low (n = 0) or high nibbles
                    // of group g's bytes.
                    for s in 0..8 {
                        let (g, n) = (s / 2, s % 2);
                        let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            pb.add(64 + 16 * s + 8 * h) as *const __m128i
                        ));
                        let sc = _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc));
                        for c0 in (0..8).step_by(span) {
                            let mut a16 = [_mm256_setzero_si256(); MR];
                            for c in c0..c0 + span {
                                let v = _mm256_loadu_si256(
                                    pb.add(qs_at + 64 * (8 * g + c) + 32 * h) as *const __m256i,
                                );
                                let mut q = if n == 0 {
                                    _mm256_and_si256(v, m4)
                                } else {
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4)
                                };
                                if FIVE {
                                    let f = avx2_fifth_bits(pb.add(QS + 8 * (8 * s + c)), h);
                                    q = _mm256_or_si256(q, f);
                                }
                                for i in 0..MR {
                                    let xq = t.x.add(i * t.ldq + b * 256 + 32 * s + 4 * c);
                                    a16[i] = _mm256_add_epi16(
                                        a16[i],
                                        _mm256_maddubs_epi16(q, bcast256(xq)),
                                    );
                                }
                            }
                            for i in 0..MR {
                                isc[i] = _mm256_add_epi32(isc[i], _mm256_madd_epi16(a16[i], sc));
                            }
                        }
                    }
                    let mut imn = [_mm256_setzero_si256(); MR];
                    for p in 0..4 {
                        let mnp = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                            pb.add(192 + 32 * p + 16 * h) as *const __m128i,
                        ));
                        for i in 0..MR {
                            let pair = min_pair(t.sums.add(i * t.lds + 16 * b), p);
                            imn[i] = _mm256_add_epi32(
                                imn[i],
                                _mm256_madd_epi16(mnp, _mm256_set1_epi32(pair)),
                            );
                        }
                    }
                    for i in 0..MR {
                        let dx = _mm256_set1_ps(*t.d.add(i * t.ldd + b));
                        let a = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isc[i]),
                            _mm256_mul_ps(dw, dx),
                            acc[i][h],
                        );
                        acc[i][h] =
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
