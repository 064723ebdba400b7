//! The portable path of quantized matmul and the scalar definition every
//! path is held to: each panel block unpacked back to its ggml blocks and
//! the format's scalar step run per output element, blocks in order.
//!
//! Owns: `portable_tile` and `dot_row_reference`. Promises: the same bits
//! as every SIMD path (see `quant`'s module docs).

// Tile loops index several arrays by the same (i, j); ranges read closer
// to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::activations::Acts;
use super::{QTile, QuantKernels, MR_MAX, PANEL};
use crate::kernels::formats::QuantFormat;

/// The portable path: unpacks each panel block back to ggml blocks and
/// runs the format's scalar step per element.
pub(super) fn portable_tile(kern: &QuantKernels, acts: &Acts, row0: usize, t: &QTile) {
    let mut acc = [[0.0f32; PANEL]; MR_MAX];
    let mut blk = [0u8; 256];
    let blk = &mut blk[..kern.block_bytes];
    for b in 0..t.nb {
        // SAFETY: the panel holds `nb` panel blocks (see `QTile::w`).
        let src = unsafe {
            std::slice::from_raw_parts(t.w.add(b * kern.panel_block_bytes), kern.panel_block_bytes)
        };
        for r in 0..t.cols {
            (kern.unpack)(src, r, blk);
            for i in 0..t.mr {
                acc[i][r] = (kern.step)(acc[i][r], blk, &acts.block(row0 + i, b));
            }
        }
    }
    for i in 0..t.mr {
        for r in 0..t.cols {
            let v = if t.bias.is_null() {
                acc[i][r]
            } else {
                // SAFETY: `bias` holds `cols` values when not null.
                acc[i][r] + unsafe { *t.bias.add(r) }
            };
            // SAFETY: the tile's out rectangle is writable (see `QTile`).
            unsafe { *t.out.add(i * t.ldo + r) = v };
        }
    }
}

/// The scalar definition of one output element: `w_row` (ggml layout, `k`
/// elements) against activation row `x` quantized to the format's partner.
/// Every path's result equals this bit for bit.
///
/// # Panics
/// If `format` is a float format or the lengths do not fit.
pub fn dot_row_reference(format: QuantFormat, w_row: &[u8], x: &[f32]) -> f32 {
    let kern = format
        .info()
        .kernels
        .expect("dot_row_reference: an integer format");
    let k = x.len();
    assert_eq!(
        format.row_bytes(k).ok(),
        Some(w_row.len()),
        "dot_row_reference: lengths"
    );
    let mut acts = Acts::default();
    acts.quantize(kern.act, x, k, 1, k);
    let mut acc = 0.0f32;
    for b in 0..acts.nb {
        let w = &w_row[b * kern.block_bytes..(b + 1) * kern.block_bytes];
        acc = (kern.step)(acc, w, &acts.block(0, b));
    }
    acc
}
