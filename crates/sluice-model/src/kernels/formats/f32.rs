//! F32: one little-endian IEEE single per element. Runs on the f32 GEMM.

use super::{FormatInfo, QuantFormat};
use sluice_gguf::GgmlType;

pub(crate) const INFO: FormatInfo = FormatInfo {
    format: QuantFormat::F32,
    ggml: GgmlType::F32,
    dequantize,
    quantize: Some(quantize),
    kernels: None,
};

fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(blocks.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

fn quantize(x: &[f32], out: &mut [u8]) {
    super::for_each_value(x, out, 4, |v, o| o.copy_from_slice(&v.to_le_bytes()));
}
