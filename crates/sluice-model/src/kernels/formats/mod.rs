//! The weight-format table: every GGUF tensor type the kernels take
//! directly, one file each.
//!
//! Owns: for each format, its ggml row layout (the block geometry —
//! elements and bytes per block — and the name and id are those of its
//! `sluice_gguf::GgmlType`, written once there), `dequantize_row` (bytes
//! → f32, equal bit for bit to the `gguf` Python package's
//! `gguf.quants.dequantize`), the
//! quantizers that exist (`quantize_row`, equal bit for bit to
//! `gguf.quants.quantize`), and — for the block-quantized integer formats —
//! the matmul kernels (`QuantKernels`: the activation partner, the 16-row
//! panel repacking and a microkernel per CPU path).
//!
//! Adding a GGUF type: one file here defining `INFO: FormatInfo` (and
//! `KERNELS` for an integer format), a `QuantFormat` variant, and its line
//! in `FORMATS`. Nothing else in the crate matches on formats except the
//! float ones (F32 / F16 / BF16), which run on the float GEMM kernels.
//!
//! Conversions of f16 scales (`d`, `dmin`, `m`) to f32 are exact, so the
//! only roundings in a dequantized value are the f32 products and sums that
//! `gguf.quants` performs, done here in the same order (Rust never fuses a
//! multiply and an add on its own).

// Block loops index several arrays by the same position; ranges read
// closer to ggml's layout descriptions than zipped iterators.
#![allow(clippy::needless_range_loop)]

pub(crate) mod bf16;
pub(crate) mod f16;
pub(crate) mod f32;
pub(crate) mod iq4_nl;
pub(crate) mod iq4_xs;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;

use super::quant::QuantKernels;
use sluice_gguf::GgmlType;
use std::fmt;

/// A weight format, by its GGUF / ggml name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantFormat {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    IQ4XS,
    Q2K,
    Q3K,
}

/// Encodes f32 values (whole blocks) into `blocks`.
pub(crate) type QuantizeFn = fn(x: &[f32], blocks: &mut [u8]);

/// One row of the table.
pub(crate) struct FormatInfo {
    pub format: QuantFormat,
    /// The file's type: its name, id and block geometry (elements and bytes
    /// per block) are `GgmlType`'s, written once there.
    pub ggml: GgmlType,
    /// `blocks.len() == out.len() / block_size * block_bytes`, checked by
    /// the caller.
    pub dequantize: fn(blocks: &[u8], out: &mut [f32]),
    /// Present where `gguf.quants.quantize` implements the type.
    pub quantize: Option<QuantizeFn>,
    /// Integer matmul kernels (block-quantized formats only; the float
    /// formats run on the float GEMM).
    pub kernels: Option<&'static QuantKernels>,
}

/// The table, in `QuantFormat` order.
static FORMATS: [&FormatInfo; 15] = [
    &f32::INFO,
    &f16::INFO,
    &bf16::INFO,
    &q8_0::INFO,
    &q4_0::INFO,
    &q4_1::INFO,
    &q5_0::INFO,
    &q5_1::INFO,
    &q4_k::INFO,
    &q5_k::INFO,
    &q6_k::INFO,
    &iq4_nl::INFO,
    &iq4_xs::INFO,
    &q2_k::INFO,
    &q3_k::INFO,
];

/// Errors of the row functions: a shape that does not fit the format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{format}: a row of {len} elements is not a whole number of {block}-element blocks")]
    RowLength {
        format: QuantFormat,
        len: usize,
        block: usize,
    },
    #[error("{format}: {got} bytes for {elements} elements, expected {want}")]
    ByteLength {
        format: QuantFormat,
        elements: usize,
        got: usize,
        want: usize,
    },
    #[error("{format}: no quantizer (only dequantization is supported)")]
    NoQuantizer { format: QuantFormat },
}

impl QuantFormat {
    /// Every format, in table order.
    pub const ALL: [QuantFormat; 15] = [
        QuantFormat::F32,
        QuantFormat::F16,
        QuantFormat::Bf16,
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
        QuantFormat::IQ4NL,
        QuantFormat::IQ4XS,
        QuantFormat::Q2K,
        QuantFormat::Q3K,
    ];

    pub(crate) fn info(self) -> &'static FormatInfo {
        let info = FORMATS[self as usize];
        debug_assert_eq!(info.format, self, "FORMATS is in QuantFormat order");
        info
    }

    /// ggml's name: `F32`, `F16`, `BF16`, `Q8_0`, ..., `Q6_K`, `IQ4_NL`, `IQ4_XS`, `Q2_K`, `Q3_K`.
    pub fn name(self) -> &'static str {
        self.info().ggml.name()
    }

    /// The format of a ggml type id (a GGUF tensor's `type`), if supported.
    pub fn from_ggml_type(id: u32) -> Option<QuantFormat> {
        Self::ALL.into_iter().find(|f| f.info().ggml.id() == id)
    }

    /// The format of a ggml name, case-insensitively (`q4_k`, `Q8_0`, `bf16`).
    pub fn from_name(name: &str) -> Option<QuantFormat> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name.trim()))
    }

    /// ggml's type id.
    pub fn ggml_type(self) -> u32 {
        self.info().ggml.id()
    }

    /// The file's type of this format.
    pub fn ggml(self) -> GgmlType {
        self.info().ggml
    }

    /// Elements per block (1 for the float formats).
    pub fn block_size(self) -> usize {
        self.info().ggml.block_size() as usize
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.info().ggml.type_size() as usize
    }

    /// Whether the format is one of F32 / F16 / BF16.
    pub fn is_float(self) -> bool {
        self.info().kernels.is_none()
    }

    /// Bytes of a row of `elements`, or an error if the row is not a whole
    /// number of blocks.
    pub fn row_bytes(self, elements: usize) -> Result<usize, FormatError> {
        let block = self.block_size();
        if !elements.is_multiple_of(block) {
            return Err(FormatError::RowLength {
                format: self,
                len: elements,
                block,
            });
        }
        Ok(elements / block * self.block_bytes())
    }

    /// Bytes of a `[rows × cols]` tensor (`None` on overflow or a partial
    /// block).
    pub fn tensor_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        self.row_bytes(cols).ok()?.checked_mul(rows)
    }

    /// Whether `quantize_row` exists for this format.
    pub fn can_quantize(self) -> bool {
        self.info().quantize.is_some()
    }

    fn check(self, elements: usize, bytes: usize) -> Result<(), FormatError> {
        let want = self.row_bytes(elements)?;
        if want != bytes {
            return Err(FormatError::ByteLength {
                format: self,
                elements,
                got: bytes,
                want,
            });
        }
        Ok(())
    }

    /// Decodes `bytes` (whole blocks in ggml's layout) into `out`, one value
    /// per element, exactly as `gguf.quants.dequantize` does.
    pub fn dequantize_row(self, bytes: &[u8], out: &mut [f32]) -> Result<(), FormatError> {
        self.check(out.len(), bytes.len())?;
        (self.info().dequantize)(bytes, out);
        Ok(())
    }

    /// Encodes `x` into `out` (whole blocks), exactly as
    /// `gguf.quants.quantize` does. Formats without a quantizer (the K
    /// types) give `FormatError::NoQuantizer`.
    pub fn quantize_row(self, x: &[f32], out: &mut [u8]) -> Result<(), FormatError> {
        let Some(q) = self.info().quantize else {
            return Err(FormatError::NoQuantizer { format: self });
        };
        self.check(x.len(), out.len())?;
        q(x, out);
        Ok(())
    }

    /// `quantize_row` over a `[rows × cols]` matrix into a new buffer.
    pub fn quantize(self, x: &[f32], cols: usize) -> Result<Vec<u8>, FormatError> {
        let row_bytes = self.row_bytes(cols)?;
        if cols == 0 {
            return Ok(Vec::new());
        }
        if !x.len().is_multiple_of(cols) {
            return Err(FormatError::RowLength {
                format: self,
                len: x.len(),
                block: cols,
            });
        }
        let mut out = vec![0u8; x.len() / cols * row_bytes];
        for (src, dst) in x.chunks_exact(cols).zip(out.chunks_exact_mut(row_bytes)) {
            self.quantize_row(src, dst)?;
        }
        Ok(out)
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// ------------------------------------------------------------ shared bits

/// An f16 bit pattern as f32 (exact; what numpy's `astype(np.float32)`
/// gives for every non-NaN value).
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 → nearest f16 (ties to even), numpy's `astype(np.float16)`.
#[inline(always)]
pub(crate) fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// The little-endian u16 at `b[at..at + 2]`.
#[inline(always)]
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian u32 at `b[at..at + 4]`.
#[inline(always)]
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The element of a 32-block with the largest magnitude, sign kept (the
/// first one on ties), as numpy's `argmax(abs(blocks))` picks it.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        // `>` keeps the first maximum, as argmax does.
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// `1 / d`, or 0 where `d == 0` (`np.where(d == 0, 0, 1 / d)`).
#[inline(always)]
pub(crate) fn inverse_or_zero(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Packs 32 values of 0..=15 the way ggml stores a 4-bit block: byte `j`
/// holds element `j` in its low nibble and element `j + 16` in its high one.
#[inline]
pub(crate) fn pack_nibbles(q: &[u8; 32], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = (q[j] & 0x0F) | (q[j + 16] << 4);
    }
}

/// The sub-block scales and mins of a Q4_K / Q5_K block: 8 six-bit values
/// each, packed in 12 bytes (ggml's `get_scale_min_k4`).
#[inline]
pub(crate) fn k_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Quantizes a float-format row in place of a block format (`F32`, `F16`,
/// `BF16` have one-element blocks); shared by their `quantize`.
pub(crate) fn for_each_value(x: &[f32], out: &mut [u8], width: usize, f: impl Fn(f32, &mut [u8])) {
    for (v, o) in x.iter().zip(out.chunks_exact_mut(width)) {
        f(*v, o);
    }
}
