//! Q5_K: super-blocks of 256 elements, 176 bytes: `d`, `dmin` (f16), 12
//! bytes of scales and mins (as Q4_K), 32 bytes `qh` (bit `s` of byte `t`:
//! the fifth bit of sub-block `s`'s element `t`), then 128 bytes of nibbles
//! (as Q4_K); value `(d · sc_s) · q - (dmin · mn_s)` with `q` in 0..=31.
//!
//! Matmul: as Q4_K (partner Q8_K, the same integer sums and the same two
//! FMAs per super-block), with five-bit `q`.
//!
//! Panel block (16 rows, 2880 bytes): Q4_K's first 320 bytes (`d`, `dmin`,
//! decoded scales and mins); 64 bit masks (u64) of the fifth bits, mask
//! `8s + c` holding at bit `4r + t` the bit of row `r`'s element
//! `32s + 4c + t`; then the interleaved nibbles as in Q4_K.

#![allow(clippy::needless_range_loop)]

use super::q4_k::{finish, min_sum, pack_head, pack_qs, sub_nibbles, unpack_head, unpack_qs};
use super::{f16_to_f32, k_scales_mins, le16, FormatInfo, QuantFormat};
use crate::kernels::quant::{ActBlock, ActKind, QuantKernels};
use sluice_gguf::GgmlType;

// The geometry is ggml's, from `GgmlType`'s table.
const BLOCK: usize = GgmlType::Q5_K.block_size() as usize;
const BYTES: usize = GgmlType::Q5_K.type_size() as usize;
pub(crate) const PANEL_BLOCK: usize = 2880;
const MASKS: usize = 320;
const QS: usize = 832;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Q5K,
    ggml: GgmlType::Q5_K,
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

/// Sub-block `s`'s 32 five-bit values.
#[inline]
fn sub_values(blk: &[u8], s: usize) -> [u8; 32] {
    let mut q = sub_nibbles(&blk[48..], s);
    for t in 0..32 {
        q[t] |= ((blk[16 + t] >> s) & 1) << 4;
    }
    q
}

/// `(d · sc) · q - (dmin · mn)` (`Q5_K.dequantize_blocks`).
fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (blk, o) in blocks.chunks_exact(BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_to_f32(le16(blk, 0));
        let dmin = f16_to_f32(le16(blk, 2));
        let (sc, mn) = k_scales_mins(&blk[4..16]);
        for s in 0..8 {
            let ds = d * sc[s] as f32;
            let dm = dmin * mn[s] as f32;
            let q = sub_values(blk, s);
            for t in 0..32 {
                o[32 * s + t] = ds * q[t] as f32 - dm;
            }
        }
    }
}

fn pack(blk: &[u8], r: usize, dst: &mut [u8]) {
    pack_head(blk, r, dst);
    pack_qs(&blk[48..176], r, dst, QS);
    for s in 0..8 {
        for c in 0..8 {
            let at = MASKS + 8 * (8 * s + c);
            let mut mask = u64::from_le_bytes(dst[at..at + 8].try_into().unwrap_or([0; 8]));
            for t in 0..4 {
                mask |= (((blk[16 + 4 * c + t] >> s) & 1) as u64) << (4 * r + t);
            }
            dst[at..at + 8].copy_from_slice(&mask.to_le_bytes());
        }
    }
}

fn unpack(src: &[u8], r: usize, dst: &mut [u8]) {
    unpack_head(src, r, dst);
    unpack_qs(src, r, QS, &mut dst[48..176]);
    let qh = &mut dst[16..48];
    qh.fill(0);
    for s in 0..8 {
        for c in 0..8 {
            let at = MASKS + 8 * (8 * s + c);
            let mask = u64::from_le_bytes(src[at..at + 8].try_into().unwrap_or([0; 8]));
            for t in 0..4 {
                qh[4 * c + t] |= (((mask >> (4 * r + t)) & 1) as u8) << s;
            }
        }
    }
}

fn step(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32 {
    let (sc, mn) = k_scales_mins(&w[4..16]);
    let mut isc = 0i32;
    for s in 0..8 {
        let q = sub_values(w, s);
        let is: i32 = (0..32).map(|t| q[t] as i32 * a.qs[32 * s + t] as i32).sum();
        isc += sc[s] as i32 * is;
    }
    finish(acc, isc, min_sum(&mn, a.sums), w, a)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::q4_k::x86::{avx2, avx512};
    use crate::kernels::quant::x86::{rows_1_to_8, rows_in_fours};
    use crate::kernels::quant::QTile;

    /// # Safety
    /// As for `QKernel`; AVX-512F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile_avx512(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_in_fours!(avx512::<true>, t) }
    }

    /// # Safety
    /// As for `QKernel`; AVX2 + FMA + F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_avx2(t: &QTile) {
        // SAFETY: forwarded.
        unsafe { rows_1_to_8!(avx2::<true>, t) }
    }
}
