//! BF16: the top half of an f32, little-endian. Runs on the bf16 GEMM.

use super::{le16, FormatInfo, QuantFormat};
use sluice_gguf::GgmlType;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::Bf16,
    ggml: GgmlType::BF16,
    dequantize,
    quantize: Some(quantize),
    kernels: None,
};

fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = crate::kernels::bf16_to_f32(le16(blocks, 2 * i));
    }
}

/// Round to nearest even; a NaN stays a (quiet) NaN, as gguf-py's
/// `BF16.quantize_blocks` and ggml's `ggml_compute_fp32_to_bf16` do.
fn quantize(x: &[f32], out: &mut [u8]) {
    super::for_each_value(x, out, 2, |v, o| {
        let b = v.to_bits();
        let h = if b & 0x7fff_ffff > 0x7f80_0000 {
            ((b >> 16) | 64) as u16
        } else {
            ((b as u64 + (0x7fff + ((b >> 16) & 1)) as u64) >> 16) as u16
        };
        o.copy_from_slice(&h.to_le_bytes());
    });
}
