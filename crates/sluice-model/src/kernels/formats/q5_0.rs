//! Q5_0: blocks of 32 elements, 22 bytes: `d` (f16), `qh` (u32: bit `e` is
//! element `e`'s fifth bit), then 16 bytes of nibbles (as Q4_0); value
//! `d · (q - 16)`.
//!
//! Matmul (activation partner Q8_0): for each block, in order,
//! `acc = fma(f32(Σ (q - 16)·qx), f32(d) · dx, acc)`, the integer sum exact.
//!
//! Panel block (16 rows, 352 bytes): the 16 `d`; 8 bit masks (u64) of the
//! fifth bits, mask `2c + h` holding at bit `4r + t` the bit of row `r`'s
//! element `16h + 4c + t` (so `vpmovm`-style byte masks line up with the
//! nibble vectors); then the nibbles interleaved by 4-byte chunks as in
//! Q4_0.

#![allow(clippy::needless_range_loop)]

use super::q4_0::nibbles;
use super::{f16_to_f32, f32_to_f16, le16, le32, pack_nibbles, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels, PANEL};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q5_0.block_size() as usize;
const BYTES: usize = GgmlType::Q5_0.type_size() as usize;
const PANEL_BLOCK: usize = PANEL * BYTES;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q5_0,
    ggml: GgmlType::Q5_0,
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

/// The 32 five-bit values of a block whose `qh` word and nibbles are given.
#[inline]
pub(crate) fn values5(qh: u32, qs: &[u8]) -> [u8; 32] {
    let mut q = nibbles(qs);
    for (e, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> e) & 1) as u8) << 4;
    }
    q
}

/// Packs 32 values of 0..=31 as ggml does: the nibbles, and `qh` bit `e` =
/// bit 4 of element `e` (`np.packbits(..., bitorder="little")`).
pub(crate) fn pack5(q: &[u8; 32], qh: &mut [u8], qs: &mut [u8]) {
    let mut bits = 0u32;
    for (e, &v) in q.iter().enumerate() {
        bits |= ((v >> 4) as u32 & 1) << e;
    }
    qh.copy_from_slice(&bits.to_le_bytes());
    pack_nibbles(q, qs);
}

/// `d · (q - 16)` (`Q5_0.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let q = values5(le32(blk, 2), &blk[6..]);
        for j in 0..BLOCK {
            o[j] = d * (q[j] as i32 - 16) as f32;
        }
    }
}

/// `gguf.quants.quantize` for Q5_0: `d = max / -16`,
/// `q = min(31, trunc(x · (1/d) + 16.5))`.
fn quantize(x: &[f32], out: &mut [u8]) {
    for (src, blk) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BYTES)) {
        let d = super::signed_absmax(src) / -16.0;
        let id = super::inverse_or_zero(d);
        let mut q = [0u8; 32];
        for j in 0..BLOCK {
            q[j] = ((src[j] * id + 16.5).trunc() as u8).min(31);
        }
        blk[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let (qh, qs) = blk[2..].split_at_mut(4);
        pack5(&q, qh, qs);
    }
}

/// ORs row `r`'s fifth bits (`qh`) into the panel's masks (see the module
/// docs).
pub(crate) fn pack_masks(qh: u32, r: usize, dst: &mut [u8]) {
    for c in 0..4 {
        for h in 0..2 {
            let at = 8 * (2 * c + h);
            let mut mask = u64::from_le_bytes(dst[at..at + 8].try_into().unwrap_or([0; 8]));
            // The 4 bits of elements 16h + 4c.. land at 4r..4r+4.
            mask |= (((qh >> (16 * h + 4 * c)) & 0xF) as u64) << (4 * r);
            dst[at..at + 8].copy_from_slice(&mask.to_le_bytes());
        }
    }
}

/// Row `r`'s `qh` word from the panel's masks.
pub(crate) fn unpack_masks(src: &[u8], r: usize) -> u32 {
    let mut qh = 0u32;
    for c in 0..4 {
        for h in 0..2 {
            let at = 8 * (2 * c + h);
            let mask = u64::from_le_bytes(src[at..at + 8].try_into().unwrap_or([0; 8]));
            for t in 0..4 {
                qh |= (((mask >> (4 * r + t)) & 1) as u32) << (16 * h + 4 * c + t);
            }
        }
    }
    qh
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
    pack_masks(le32(blk, 2), r, &mut dst[32..96]);
    for c in 0..4 {
        dst[96 + 64 * c + 4 * r..100 + 64 * c + 4 * r].copy_from_slice(&blk[6 + 4 * c..10 + 4 * c]);
    }
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    dst[2..6].copy_from_slice(&unpack_masks(&src[32..96], r).to_le_bytes());
    for c in 0..4 {
        dst[6 + 4 * c..10 + 4 * c].copy_from_slice(&src[96 + 64 * c + 4 * r..100 + 64 * c + 4 * r]);
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let q = values5(le32(w, 2), &w[6..]);
    let mut isum = 0i32;
    for j in 0..BLOCK {
        isum += (q[j] as i32 - 16) * a.qs[j] as i32;
    }
    let scale = f16_to_f32(le16(w, 0)) * a.d;
    (isum as f32).mul_add(scale, acc)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::PANEL_BLOCK;
    use crate::kernels::quant::x86::{
        bcast256, bcast512, bytes_from_bits32, rows_1_to_8, store256, store512,
    };
    use crate::kernels::quant::QTile;
    use std::arch::x86_64::*;

    /// The mask at `p` (8 bytes, unaligned).
    ///
    /// # Safety
    /// `p` valid for 8 bytes.
    #[inline(always)]
    pub(crate) unsafe fn mask_at(p: *const u8) -> u64 {
        // SAFETY: forwarded.
        unsafe { (p as *const u64).read_unaligned() }
    }

    /// The fifth bits of half `h` of one chunk as bytes (0x10 where set),
    /// from the chunk's 64-bit mask at `mask` (bit `p` for byte `p`; Q5_0,
    /// Q5_1 and Q5_K panels keep them so).
    ///
    /// # Safety
    /// AVX2; `mask` valid for 8 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn avx2_fifth_bits(mask: *const u8, h: usize) -> __m256i {
        // SAFETY: forwarded.
        let m = unsafe { (mask_at(mask) >> (32 * h)) as u32 };
        _mm256_and_si256(bytes_from_bits32(m), _mm256_set1_epi8(0x10))
    }

    /// The 5-bit values of one chunk's 8 columns of half `h` (Q5_0 and
    /// Q5_1 panels): the low and high nibbles of `v`, with the fifth bits
    /// from the chunk's two masks at `masks` (low) and `masks + 8` (high).
    ///
    /// # Safety
    /// AVX2; `masks` valid for 16 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn avx2_values(v: __m256i, masks: *const u8, h: usize) -> [__m256i; 2] {
        let m4 = _mm256_set1_epi8(0x0F);
        // SAFETY: forwarded.
        let (fl, fh) = unsafe { (avx2_fifth_bits(masks, h), avx2_fifth_bits(masks.add(8), h)) };
        [
            _mm256_or_si256(_mm256_and_si256(v, m4), fl),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), fh),
        ]
    }

    /// `init` plus, per row, the integer dot products of one panel block's
    /// 5-bit values (half `h`; the 4 chunks' nibbles at `values`, their
    /// masks at `masks`, as Q5_0 and Q5_1 panels lay them out) with
    /// activation block `b`. The `pmaddubsw` pair sums of 2 chunks (lo and
    /// hi) stay in i16 lanes (8 products of at most 31·127 per lane:
    /// 31,496) before one `pmaddwd` widens them: a third fewer multiplies
    /// than a `vpdpbusd` stand-in per chunk.
    ///
    /// # Safety
    /// AVX2 (inlined into the AVX2 kernels, whose registers it keeps);
    /// `values` valid for 256 bytes, `masks` for 64; the tile's activation
    /// rows hold block `b`.
    #[inline(always)]
    pub(crate) unsafe fn avx2_sums<const MR: usize>(
        t: &QTile,
        b: usize,
        values: *const u8,
        masks: *const u8,
        h: usize,
        mut isum: [__m256i; MR],
    ) -> [__m256i; MR] {
        let ones = _mm256_set1_epi16(1);
        for c0 in [0, 2] {
            let mut a16 = [_mm256_setzero_si256(); MR];
            for c in c0..c0 + 2 {
                // SAFETY: forwarded (chunk c of 4, row i of the tile's).
                unsafe {
                    let v = _mm256_loadu_si256(values.add(64 * c + 32 * h) as *const __m256i);
                    let [lo, hi] = avx2_values(v, masks.add(16 * c), h);
                    for i in 0..MR {
                        let xq = t.x.add(i * t.ldq + b * 32);
                        let pl = _mm256_maddubs_epi16(lo, bcast256(xq.add(4 * c)));
                        let ph = _mm256_maddubs_epi16(hi, bcast256(xq.add(16 + 4 * c)));
                        a16[i] = _mm256_add_epi16(a16[i], _mm256_add_epi16(pl, ph));
                    }
                }
            }
            for i in 0..MR {
                isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(a16[i], ones));
            }
        }
        isum
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
        let m4 = _mm512_set1_epi8(0x0F);
        let b4 = _mm512_set1_epi8(0x10);
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
                    std::array::from_fn(|i| _mm512_set1_epi32(-16 * *t.sums.add(i * t.lds + b)));
                let mut i1 = [_mm512_setzero_si512(); MR];
                for c in 0..4 {
                    let v = _mm512_loadu_si512(pb.add(96 + 64 * c) as *const _);
                    let l = _mm512_and_si512(v, m4);
                    let h = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    let lo = _mm512_mask_add_epi8(l, mask_at(pb.add(32 + 16 * c)), l, b4);
                    let hi = _mm512_mask_add_epi8(h, mask_at(pb.add(40 + 16 * c)), h, b4);
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
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..t.nb {
            // SAFETY: as in the AVX-512 kernel.
            unsafe {
                let pb = t.w.add(b * PANEL_BLOCK);
                for h in 0..2 {
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(16 * h) as *const __m128i));
                    let init: [__m256i; MR] = std::array::from_fn(|i| {
                        _mm256_set1_epi32(-16 * *t.sums.add(i * t.lds + b))
                    });
                    let isum = avx2_sums(t, b, pb.add(96), pb.add(32), h, init);
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
