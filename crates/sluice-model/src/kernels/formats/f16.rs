//! F16: one little-endian IEEE half per element. Runs on the f16 GEMM
//! (`gemm_f16.rs`: widened exactly to f32, f32 FMAs).

use super::{f16_to_f32, f32_to_f16, le16, FormatInfo, QuantFormat};
use sluice_gguf::GgmlType;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::F16,
    ggml: GgmlType::F16,
    dequantize,
    quantize: Some(quantize),
    kernels: None,
};

fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f16_to_f32(le16(blocks, 2 * i));
    }
}

/// Round to nearest, ties to even (`astype(np.float16)`).
fn quantize(x: &[f32], out: &mut [u8]) {
    super::for_each_value(x, out, 2, |v, o| {
        o.copy_from_slice(&f32_to_f16(v).to_le_bytes())
    });
}
