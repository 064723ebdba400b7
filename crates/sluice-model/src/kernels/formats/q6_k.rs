//! Q6_K: super-blocks of 256 elements, 210 bytes: 128 bytes `ql` (low
//! nibbles), 64 bytes `qh` (two high bits each), 16 signed sub-block scales
//! `sc` (one per 16 elements), `d` (f16); value `(d · sc_s) · (q - 32)`.
//!
//! Element `e = 128h + 64n + u` (`u` in 0..64) takes nibble `n` of
//! `ql[64h + u]` and the two bits at `2·(2n + u/32)` of `qh[32h + u%32]`
//! (ggml's `dequantize_row_q6_K`).
//!
//! Matmul (activation partner Q8_K): for each super-block, in order,
//! `acc = fma(f32(ISC), f32(d) · dx, acc)` with the exact integer
//! `ISC = Σ_s sc_s · Σ_{e in s} (q_e - 32)·qx_e` (computed as
//! `Σ q·qx - 32·bsum_s` per sub-block of 16).
//!
//! Panel block (16 rows, 3360 bytes, the size of 16 ggml blocks): the 16
//! `d`; the scales, `sc_s` of row `r` at `32 + 16s + r`; the `ql` bytes
//! interleaved by 4-byte chunks (`h`, `c`: row `r`'s `ql[64h + 4c..+4]` at
//! `288 + 64·(16h + c) + 4r`); then for each chunk `c` 64 bytes of high
//! bits, byte `t` of row `r` holding at bits `2·(2h + n)` the two high
//! bits of element `128h + 64n + 4c + t`, so one load serves four nibble
//! vectors.

#![allow(clippy::needless_range_loop)]

use super::{f16_to_f32, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q6_K.block_size() as usize;
const BYTES: usize = GgmlType::Q6_K.type_size() as usize;
const PANEL_BLOCK: usize = 3360;
const SC: usize = 32;
const QL: usize = 288;
const QH: usize = 2336;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q6K,
    ggml: GgmlType::Q6_K,
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

/// The two high bits of element `e` (0..=3).
#[inline(always)]
fn high_bits(qh: &[u8], e: usize) -> u8 {
    let (h, n, u) = (e / 128, (e / 64) % 2, e % 64);
    (qh[32 * h + u % 32] >> (2 * (2 * n + u / 32))) & 3
}

/// The 256 six-bit values (0..=63) of a block.
#[inline]
fn values(blk: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&blk[..128], &blk[128..192]);
    std::array::from_fn(|e| {
        let (h, n, u) = (e / 128, (e / 64) % 2, e % 64);
        ((ql[64 * h + u] >> (4 * n)) & 0x0F) | (high_bits(qh, e) << 4)
    })
}

/// `(d · sc) · (q - 32)` (`Q6_K.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 208));
        let q = values(blk);
        for s in 0..16 {
            let ds = d * (blk[192 + s] as i8) as f32;
            for t in 0..16 {
                o[16 * s + t] = ds * (q[16 * s + t] as i32 - 32) as f32;
            }
        }
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
    for s in 0..16 {
        dst[SC + 16 * s + r] = blk[192 + s];
    }
    for h in 0..2 {
        for c in 0..16 {
            let at = QL + 64 * (16 * h + c) + 4 * r;
            dst[at..at + 4].copy_from_slice(&blk[64 * h + 4 * c..64 * h + 4 * c + 4]);
        }
    }
    let qh = &blk[128..192];
    for c in 0..16 {
        for t in 0..4 {
            let mut byte = 0u8;
            for h in 0..2 {
                for n in 0..2 {
                    byte |= high_bits(qh, 128 * h + 64 * n + 4 * c + t) << (2 * (2 * h + n));
                }
            }
            dst[QH + 64 * c + 4 * r + t] = byte;
        }
    }
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[208..210].copy_from_slice(&src[2 * r..2 * r + 2]);
    for s in 0..16 {
        dst[192 + s] = src[SC + 16 * s + r];
    }
    for h in 0..2 {
        for c in 0..16 {
            let at = QL + 64 * (16 * h + c) + 4 * r;
            dst[64 * h + 4 * c..64 * h + 4 * c + 4].copy_from_slice(&src[at..at + 4]);
        }
    }
    let qh = &mut dst[128..192];
    qh.fill(0);
    for c in 0..16 {
        for t in 0..4 {
            let byte = src[QH + 64 * c + 4 * r + t];
            for h in 0..2 {
                for n in 0..2 {
                    let bits = (byte >> (2 * (2 * h + n))) & 3;
                    let u = 4 * c + t;
                    qh[32 * h + u % 32] |= bits << (2 * (2 * n + u / 32));
                }
            }
        }
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let q = values(w);
    let mut isc = 0i32;
    for s in 0..16 {
        let is: i32 = (0..16)
            .map(|t| (q[16 * s + t] as i32 - 32) * a.qs[16 * s + t] as i32)
            .sum();
        isc += (w[192 + s] as i8) as i32 * is;
    }
    let d = f16_to_f32(le16(w, 208)) * a.d;
    (isc as f32).mul_add(d, acc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{PANEL_BLOCK, QH, QL, SC};
    use crate::kernels::quant::x86::{
        bcast256, bcast512, rows_1_to_8, rows_in_fours, store256, store512,
    };
    use crate::kernels::quant::QTile;
    use std::arch::x86_64::*;

    /// The high bits of nibble vector `(h, n)` moved to bits 4-5 of each
    /// byte (16-bit shifts: bits crossing into a neighbour byte land outside
    /// the mask).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn high512(hv: __m512i, p: usize) -> __m512i {
        let m = _mm512_set1_epi8(0x30);
        match p {
            0 => _mm512_and_si512(_mm512_slli_epi16::<4>(hv), m),
            1 => _mm512_and_si512(_mm512_slli_epi16::<2>(hv), m),
            2 => _mm512_and_si512(hv, m),
            _ => _mm512_and_si512(_mm512_srli_epi16::<2>(hv), m),
        }
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn high256(hv: __m256i, p: usize) -> __m256i {
        let m = _mm256_set1_epi8(0x30);
        match p {
            0 => _mm256_and_si256(_mm256_slli_epi16::<4>(hv), m),
            1 => _mm256_and_si256(_mm256_slli_epi16::<2>(hv), m),
            2 => _mm256_and_si256(hv, m),
            _ => _mm256_and_si256(_mm256_srli_epi16::<2>(hv), m),
        }
    }

    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_avx512(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_in_fours!(avx512, t) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn avx512<const MR: usize>(t: &QTile) {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); MR];
        for b in 0..t.nb {
            // SAFETY: (all reads below) the panel holds `nb` panel blocks;
            // activation row i has `nb` blocks of 256 quants and 16 sums
            // (see `QTile`).
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(pb as *const __m256i));
                let mut isc = [_mm512_setzero_si512(); MR];
                for h in 0..2 {
                    for c4 in 0..4 {
                        // Sub-blocks 8h + c4 (n = 0) and 8h + 4 + c4 (n = 1),
                        // started at -32·bsum so the sums are of (q - 32)·qx.
                        let mut i0: [__m512i; MR] = std::array::from_fn(|i| {
                            _mm512_set1_epi32(-32 * *t.sums.add(i * t.lds + 16 * b + 8 * h + c4))
                        });
                        let mut i1: [__m512i; MR] = std::array::from_fn(|i| {
                            _mm512_set1_epi32(
                                -32 * *t.sums.add(i * t.lds + 16 * b + 8 * h + 4 + c4),
                            )
                        });
                        for c in 4 * c4..4 * c4 + 4 {
                            let lp = pb.add(QL + 64 * (16 * h + c));
                            let v = _mm512_loadu_si512(lp as *const _);
                            let hv = _mm512_loadu_si512(pb.add(QH + 64 * c) as *const _);
                            let q0 = _mm512_or_si512(_mm512_and_si512(v, m4), high512(hv, 2 * h));
                            let q1 = _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
                                high512(hv, 2 * h + 1),
                            );
                            for i in 0..MR {
                                let xq = t.x.add(i * t.ldq + b * 256 + 128 * h + 4 * c);
                                i0[i] = _mm512_dpbusd_epi32(i0[i], q0, bcast512(xq));
                                i1[i] = _mm512_dpbusd_epi32(i1[i], q1, bcast512(xq.add(64)));
                            }
                        }
                        let s0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                            pb.add(SC + 16 * (8 * h + c4)) as *const __m128i,
                        ));
                        let s1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                            pb.add(SC + 16 * (8 * h + 4 + c4)) as *const __m128i,
                        ));
                        for i in 0..MR {
                            isc[i] = _mm512_add_epi32(
                                isc[i],
                                _mm512_add_epi32(
                                    _mm512_mullo_epi32(i0[i], s0),
                                    _mm512_mullo_epi32(i1[i], s1),
                                ),
                            );
                        }
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

    /// Sub-block `s`'s scales of half `hh`'s 8 columns, as i32.
    ///
    /// # Safety
    /// `pb` is a panel block.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scale8(pb: *const u8, s: usize, hh: usize) -> __m256i {
        // SAFETY: SC + 16s + 8hh + 8 <= the scales' end.
        unsafe {
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                pb.add(SC + 16 * s + 8 * hh) as *const __m128i
            ))
        }
    }

    /// The AVX2 kernel, 8 columns at a time. As in the Q4_K one, the
    /// `pmaddubsw` pair sums stay in i16 lanes — here over 2 chunks (4
    /// products of at most `63·127` per lane: 32,004) — and one `pmaddwd`
    /// by the sub-block's scale widens and scales them. The `-32·bsum`
    /// term is added once per super-block half, two sub-blocks per
    /// `pmaddwd` (the sums of 16 fit i16: at most `16·127`).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2<const MR: usize>(t: &QTile) {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for hh in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * hh) as *const __m128i));
                    let mut isc = [_mm256_setzero_si256(); MR];
                    // Sub-block s = 8h + 4n + c4: nibble n of the `ql`
                    // bytes of chunks 4c4..4c4 + 4 in half h.
                    for h in 0..2 {
                        for n in 0..2 {
                            for c4 in 0..4 {
                                let s = 8 * h + 4 * n + c4;
                                let sc = scale8(pb, s, hh);
                                let sc =
                                    _mm256_blend_epi16::<0xAA>(sc, _mm256_slli_epi32::<16>(sc));
                                for c0 in [4 * c4, 4 * c4 + 2] {
                                    let mut a16 = [_mm256_setzero_si256(); MR];
                                    for c in c0..c0 + 2 {
                                        let v = _mm256_loadu_si256(
                                            pb.add(QL + 64 * (16 * h + c) + 32 * hh)
                                                as *const __m256i,
                                        );
                                        let hv = _mm256_loadu_si256(
                                            pb.add(QH + 64 * c + 32 * hh) as *const __m256i
                                        );
                                        let lo = if n == 0 { v } else { _mm256_srli_epi16::<4>(v) };
                                        let q = _mm256_or_si256(
                                            _mm256_and_si256(lo, m4),
                                            high256(hv, 2 * h + n),
                                        );
                                        for i in 0..MR {
                                            let xq = t.x.add(
                                                i * t.ldq + b * 256 + 128 * h + 64 * n + 4 * c,
                                            );
                                            a16[i] = _mm256_add_epi16(
                                                a16[i],
                                                _mm256_maddubs_epi16(q, bcast256(xq)),
                                            );
                                        }
                                    }
                                    for i in 0..MR {
                                        isc[i] =
                                            _mm256_add_epi32(isc[i], _mm256_madd_epi16(a16[i], sc));
                                    }
                                }
                            }
                        }
                    }
                    // isc -= 32 · Σ_s sc_s · bsum_s.
                    let mut corr = [_mm256_setzero_si256(); MR];
                    for p in 0..8 {
                        let pair = _mm256_blend_epi16::<0xAA>(
                            scale8(pb, 2 * p, hh),
                            _mm256_slli_epi32::<16>(scale8(pb, 2 * p + 1, hh)),
                        );
                        for i in 0..MR {
                            let bs = t.sums.add(i * t.lds + 16 * b + 2 * p);
                            let bp = (*bs as u16 as u32 | ((*bs.add(1) as u32) << 16)) as i32;
                            corr[i] = _mm256_add_epi32(
                                corr[i],
                                _mm256_madd_epi16(pair, _mm256_set1_epi32(bp)),
                            );
                        }
                    }
                    for i in 0..MR {
                        let isc = _mm256_sub_epi32(isc[i], _mm256_slli_epi32::<5>(corr[i]));
                        let dx = _mm256_set1_ps(*t.d.add(i * t.ldd + b));
                        acc[i][hh] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isc),
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
