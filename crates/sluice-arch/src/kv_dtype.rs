//! [`KvCacheDtype`]: what `--kv-cache-dtype` names — the element type of
//! the KV cache — and the bytes one head's K (or V) row takes in it.
//!
//! vLLM's flag and names (`auto`, `bfloat16`, `float16`, `fp8`,
//! `fp8_e4m3`, `fp8_e5m2`) plus the CPU runner's own: `float32` (exact,
//! for tests) and `q8_0` (llama.cpp's block format: 32 signed bytes and
//! one f16 scale per 32 elements, 34 bytes). What `auto` means is the
//! reader's: for the simulator, as in vLLM, the model's serving dtype; for
//! the CPU runner f16, llama.cpp's default
//! (`sluice_model::kv_cache::KvDtype::resolve` says why). Which types a reader can
//! store is its own business too: the CPU runner refuses fp8.
//!
//! One owner of the sizes: the runner's pool, the simulator's roofline and
//! its KV budget all take a row's bytes from [`KvCacheDtype::row_bytes`].

use serde::{Deserialize, Serialize};
use std::fmt;

/// Elements per q8_0 block, and the block's bytes (ggml's `block_q8_0`).
pub const Q8_0_BLOCK: usize = 32;
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// The element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvCacheDtype {
    /// The reader's default (see the module docs).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "float32")]
    Float32,
    #[serde(rename = "bfloat16")]
    Bfloat16,
    #[serde(rename = "float16")]
    Float16,
    #[serde(rename = "q8_0")]
    Q8_0,
    /// vLLM's `fp8` (E4M3 on the GPUs it names so).
    #[serde(rename = "fp8")]
    Fp8,
    #[serde(rename = "fp8_e4m3")]
    Fp8E4m3,
    #[serde(rename = "fp8_e5m2")]
    Fp8E5m2,
}

impl KvCacheDtype {
    /// Every value, in the order `--help` lists them.
    pub const ALL: [KvCacheDtype; 8] = [
        KvCacheDtype::Auto,
        KvCacheDtype::Float32,
        KvCacheDtype::Bfloat16,
        KvCacheDtype::Float16,
        KvCacheDtype::Q8_0,
        KvCacheDtype::Fp8,
        KvCacheDtype::Fp8E4m3,
        KvCacheDtype::Fp8E5m2,
    ];

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Float32 => "float32",
            KvCacheDtype::Bfloat16 => "bfloat16",
            KvCacheDtype::Float16 => "float16",
            KvCacheDtype::Q8_0 => "q8_0",
            KvCacheDtype::Fp8 => "fp8",
            KvCacheDtype::Fp8E4m3 => "fp8_e4m3",
            KvCacheDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }

    pub fn is_auto(&self) -> bool {
        *self == KvCacheDtype::Auto
    }

    /// Bytes of one head's row of `head_dim` elements (K or V of one
    /// token); `auto_bytes` is what one element of `auto` takes. A q8_0 row
    /// whose length is not a multiple of 32 is counted in whole blocks
    /// (the CPU runner refuses such a head size).
    pub fn row_bytes(self, head_dim: usize, auto_bytes: usize) -> usize {
        match self {
            KvCacheDtype::Auto => head_dim * auto_bytes,
            KvCacheDtype::Float32 => head_dim * 4,
            KvCacheDtype::Bfloat16 | KvCacheDtype::Float16 => head_dim * 2,
            KvCacheDtype::Q8_0 => head_dim.div_ceil(Q8_0_BLOCK) * Q8_0_BLOCK_BYTES,
            KvCacheDtype::Fp8 | KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E5m2 => head_dim,
        }
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        KvCacheDtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = KvCacheDtype::ALL.iter().map(|d| d.name()).collect();
                format!(
                    "unknown KV cache dtype {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_the_flag_and_json() {
        for d in KvCacheDtype::ALL {
            assert_eq!(d.name().parse::<KvCacheDtype>(), Ok(d));
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.name()));
            assert_eq!(serde_json::from_str::<KvCacheDtype>(&json).unwrap(), d);
        }
        let e = "fp16".parse::<KvCacheDtype>().unwrap_err();
        assert!(
            e.contains("\"fp16\"") && e.contains("bfloat16, float16, q8_0"),
            "{e}"
        );
    }

    #[test]
    fn row_bytes_are_the_formats_sizes() {
        // 64 elements: f32 256, 16-bit 128, two q8_0 blocks of 34, fp8 64.
        let bytes: Vec<usize> = KvCacheDtype::ALL
            .iter()
            .map(|d| d.row_bytes(64, 2))
            .collect();
        assert_eq!(bytes, [128, 256, 128, 128, 68, 64, 64, 64]);
        assert_eq!(KvCacheDtype::Q8_0.row_bytes(40, 2), 68);
    }
}
