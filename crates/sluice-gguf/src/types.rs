//! The GGML tensor types: every type id llama.cpp defines, with its name,
//! block size (elements per block) and type size (bytes per block).
//!
//! The table is ggml's `type_traits` as mirrored by the `gguf` Python
//! package (`GGMLQuantizationType` and `GGML_QUANT_SIZES` in
//! `gguf/constants.py`, gguf 0.19.0); `tests/python_fixture.rs` checks it
//! against a copy of that table written by `tests/data/make_fixture.py`.
//! Ids llama.cpp has retired (4, 5: Q4_2/Q4_3; 31-33 and 36-38: the
//! repacked `_4_4`-style types) are unknown here, as they are to
//! llama.cpp's loader, which gives them block size 0 and refuses them.
//!
//! This table only says how many bytes a tensor of a type occupies; which
//! types a model can compute with is the kernels' business.

use std::fmt;

/// A GGML tensor type (the `ggml_type` id stored in each tensor info).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 32 4-bit weights and an f16 scale.
    Q4_0,
    /// 32 4-bit weights, an f16 scale and an f16 minimum.
    Q4_1,
    /// 32 5-bit weights and an f16 scale.
    Q5_0,
    /// 32 5-bit weights, an f16 scale and an f16 minimum.
    Q5_1,
    /// 32 8-bit weights and an f16 scale.
    Q8_0,
    /// 32 8-bit weights, an f32 scale and an f32 block sum.
    Q8_1,
    /// K-quant, 2 bits, super-blocks of 256.
    Q2_K,
    /// K-quant, 3 bits.
    Q3_K,
    /// K-quant, 4 bits.
    Q4_K,
    /// K-quant, 5 bits.
    Q5_K,
    /// K-quant, 6 bits.
    Q6_K,
    /// K-quant, 8 bits (an activation type: f32 scale and block sums).
    Q8_K,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS,
    /// i-quant, 1.56 bits per weight.
    IQ1_S,
    /// i-quant, 4.5 bits per weight, blocks of 32.
    IQ4_NL,
    /// i-quant, 3.44 bits per weight.
    IQ3_S,
    /// i-quant, 2.5 bits per weight.
    IQ2_S,
    /// i-quant, 4.25 bits per weight.
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// i-quant, 1.75 bits per weight.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, 1.69 bits per weight.
    TQ1_0,
    /// Ternary, 2.06 bits per weight.
    TQ2_0,
    /// Microscaling FP4 (OCP MX), blocks of 32 with an e8m0 scale.
    MXFP4,
    /// NVIDIA FP4, blocks of 64.
    NVFP4,
    /// 1-bit weights, blocks of 128.
    Q1_0,
}

/// `(type, id, name, block size, type size)`, in id order.
const TABLE: [(GgmlType, u32, &str, u32, u32); 34] = {
    use GgmlType::*;
    // QK_K = 256: the K-quant and i-quant super-block.
    const K: u32 = 256;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 2 + 16),
        (Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
        (Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
        (Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
        (Q8_0, 8, "Q8_0", 32, 2 + 32),
        (Q8_1, 9, "Q8_1", 32, 4 + 4 + 32),
        (Q2_K, 10, "Q2_K", K, 2 + 2 + K / 16 + K / 4),
        (Q3_K, 11, "Q3_K", K, 2 + K / 4 + K / 8 + 12),
        (Q4_K, 12, "Q4_K", K, 2 + 2 + K / 2 + 12),
        (Q5_K, 13, "Q5_K", K, 2 + 2 + K / 2 + K / 8 + 12),
        (Q6_K, 14, "Q6_K", K, 2 + K / 2 + K / 4 + K / 16),
        (Q8_K, 15, "Q8_K", K, 4 + K + K / 8),
        (IQ2_XXS, 16, "IQ2_XXS", K, 2 + K / 4),
        (IQ2_XS, 17, "IQ2_XS", K, 2 + K / 4 + K / 32),
        (IQ3_XXS, 18, "IQ3_XXS", K, 2 + K / 4 + K / 8),
        (IQ1_S, 19, "IQ1_S", K, 2 + K / 8 + K / 16),
        (IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
        (IQ3_S, 21, "IQ3_S", K, 2 + K / 4 + K / 8 + K / 32 + 4),
        (IQ2_S, 22, "IQ2_S", K, 2 + K / 4 + K / 16),
        (IQ4_XS, 23, "IQ4_XS", K, 2 + 2 + K / 2 + K / 64),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", K, K / 8 + K / 16 + K / 32),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", K, 2 + 4 * 13),
        (TQ2_0, 35, "TQ2_0", K, 2 + 64),
        (MXFP4, 39, "MXFP4", 32, 1 + 16),
        (NVFP4, 40, "NVFP4", 64, 4 + 32),
        (Q1_0, 41, "Q1_0", 128, 2 + 16),
    ]
};

impl GgmlType {
    /// Every known type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|e| e.0)
    }

    /// The type with this id, `None` for an id llama.cpp does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The type named `name` as the `gguf` package and llama.cpp spell it
    /// (`Q4_K`, `BF16`), compared case-insensitively.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|e| e.2.eq_ignore_ascii_case(name))
            .map(|e| e.0)
    }

    /// A `const fn` (a linear scan: `==` is not const), so the kernels'
    /// format table takes its block geometry from here at compile time.
    const fn entry(self) -> &'static (GgmlType, u32, &'static str, u32, u32) {
        // Every variant has exactly one row (checked by a unit test); the
        // fallback row is never reached and keeps this free of panics.
        let mut i = 0;
        while i < TABLE.len() {
            if TABLE[i].0 as u32 == self as u32 {
                return &TABLE[i];
            }
            i += 1;
        }
        &TABLE[0]
    }

    /// The id stored in the file.
    pub const fn id(self) -> u32 {
        self.entry().1
    }

    /// The name, as llama.cpp and the `gguf` package spell it (`Q4_K`).
    pub const fn name(self) -> &'static str {
        self.entry().2
    }

    /// Elements per block (1 for the plain float and integer types).
    pub const fn block_size(self) -> u32 {
        self.entry().3
    }

    /// Bytes per block.
    pub const fn type_size(self) -> u32 {
        self.entry().4
    }

    /// Whether the type is a block-quantized one (block size above 1).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n_elements` elements, `None` when `n_elements` is
    /// not a multiple of the block size or the size overflows a `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let block = u64::from(self.block_size());
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(u64::from(self.type_size()))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_its_own_entry() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.0.entry().1, row.1, "row {i}");
            assert_eq!(GgmlType::from_id(row.1), Some(row.0));
            assert_eq!(GgmlType::from_name(row.2), Some(row.0));
            assert!(row.3 >= 1 && row.4 >= 1);
        }
        let mut ids: Vec<u32> = TABLE.iter().map(|r| r.1).collect();
        ids.dedup();
        assert_eq!(ids.len(), TABLE.len(), "ids sorted and unique");
    }

    #[test]
    fn retired_ids_are_unknown() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
        assert_eq!(GgmlType::Q4_K.to_string(), "Q4_K");
    }
}
