//! The 16-row panel layout of quantized weights (see `quant`'s module
//! docs): `PackedWeight`, repacked once at load, and `pack_panel`, which
//! the driver also runs per call for weights left in ggml's layout.
//!
//! Owns: the repacking and its inverse (`dequantize_row`). Promises: a
//! packed matrix gives bit for bit the results of its ggml bytes.

use super::{QuantKernels, PANEL};
use crate::kernels::formats::QuantFormat;

/// A quantized `[n×k]` matrix repacked into 16-row panels for the integer
/// kernels (see the module docs); made once at load by `PackedWeight::new`.
/// Gives bit for bit the results of the same bytes in ggml's layout, and
/// `dequantize_row` still recovers every row.
#[derive(Clone)]
pub struct PackedWeight {
    format: QuantFormat,
    n: usize,
    k: usize,
    pub(super) data: Vec<u8>,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedWeight")
            .field("format", &self.format)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl PackedWeight {
    /// Repacks `data` (`n` rows of `k` elements in ggml's layout). `None`
    /// for the float formats (nothing to repack) or when the sizes do not
    /// match.
    pub fn new(format: QuantFormat, data: &[u8], n: usize, k: usize) -> Option<PackedWeight> {
        let kern = format.info().kernels?;
        let row_bytes = format.row_bytes(k).ok()?;
        if data.len() != row_bytes.checked_mul(n)? {
            return None;
        }
        let nb = k / kern.block;
        let panel_bytes = nb * kern.panel_block_bytes;
        let panels = n.div_ceil(PANEL);
        let mut out = vec![0u8; panels.checked_mul(panel_bytes)?];
        for (p, dst) in out.chunks_exact_mut(panel_bytes.max(1)).enumerate() {
            pack_panel(kern, data, row_bytes, n, p, nb, dst);
        }
        Some(PackedWeight {
            format,
            n,
            k,
            data: out,
        })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes held (what a decode step streams).
    pub fn size_in_bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `row` as f32, bit for bit `format.dequantize_row` of the
    /// original bytes.
    ///
    /// # Panics
    /// If `row >= rows()` or `out.len() != cols()`.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.n && out.len() == self.k,
            "PackedWeight::dequantize_row: bad row or length"
        );
        let Some(kern) = self.format.info().kernels else {
            return;
        };
        let nb = self.k / kern.block;
        let panel = &self.data[row / PANEL * nb * kern.panel_block_bytes..];
        let mut blk = [0u8; 256];
        let blk = &mut blk[..kern.block_bytes];
        for b in 0..nb {
            let src = &panel[b * kern.panel_block_bytes..(b + 1) * kern.panel_block_bytes];
            (kern.unpack)(src, row % PANEL, blk);
            (self.format.info().dequantize)(blk, &mut out[b * kern.block..(b + 1) * kern.block]);
        }
    }
}

/// Packs panel `p` (rows `16p..16p+16` of `data`) into `dst` (zeroed
/// first). Row by row, so the reads are one sequential stream at a time
/// and the writes stay in the (L1-sized) panel.
pub(super) fn pack_panel(
    kern: &QuantKernels,
    data: &[u8],
    row_bytes: usize,
    n: usize,
    p: usize,
    nb: usize,
    dst: &mut [u8],
) {
    dst.fill(0);
    let r0 = p * PANEL;
    let rows = PANEL.min(n - r0);
    for r in 0..rows {
        let row = &data[(r0 + r) * row_bytes..(r0 + r + 1) * row_bytes];
        for (blk, pb) in row
            .chunks_exact(kern.block_bytes)
            .zip(dst.chunks_exact_mut(kern.panel_block_bytes))
            .take(nb)
        {
            (kern.pack)(blk, r, pb);
        }
    }
}
