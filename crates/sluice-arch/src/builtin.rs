//! Built-in shapes: the published `config.json` of a few common models,
//! by a short name or the Hugging Face ids they are read from, so a
//! simulation needs no download.

use crate::{LayerPattern, LayeredShape, ModelShape};

impl ModelShape {
    pub(crate) const fn dense(
        hidden: usize,
        layers: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        intermediate: usize,
        vocab: usize,
    ) -> ModelShape {
        ModelShape {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            bytes_per_param: 2,
            num_experts: 0,
            experts_per_token: 0,
            tie_word_embeddings: false,
            stored_weight_bytes: None,
            kv_cache_dtype: crate::KvCacheDtype::Auto,
        }
    }

    /// `Qwen/Qwen2.5-0.5B-Instruct` config.json (tied embeddings).
    pub const QWEN2_5_0_5B: ModelShape = ModelShape {
        tie_word_embeddings: true,
        ..ModelShape::dense(896, 24, 14, 2, 64, 4864, 151_936)
    };
    /// `Qwen/Qwen2.5-7B-Instruct` config.json.
    pub const QWEN2_5_7B: ModelShape = ModelShape::dense(3584, 28, 28, 4, 128, 18_944, 152_064);
    /// `Qwen/Qwen2.5-72B-Instruct` config.json.
    pub const QWEN2_5_72B: ModelShape = ModelShape::dense(8192, 80, 64, 8, 128, 29_568, 152_064);
    /// `meta-llama/Llama-3.1-8B-Instruct` config.json.
    pub const LLAMA_3_1_8B: ModelShape = ModelShape::dense(4096, 32, 32, 8, 128, 14_336, 128_256);
    /// `meta-llama/Llama-3.1-70B-Instruct` config.json.
    pub const LLAMA_3_1_70B: ModelShape = ModelShape::dense(8192, 80, 64, 8, 128, 28_672, 128_256);
    /// `Qwen/Qwen3-8B` config.json.
    pub const QWEN3_8B: ModelShape = ModelShape::dense(4096, 36, 32, 8, 128, 12_288, 151_936);
    /// `Qwen/Qwen3-32B` config.json (its `head_dim` 128 × 64 heads is
    /// wider than `hidden`, which is why projections use heads·head_dim).
    pub const QWEN3_32B: ModelShape = ModelShape::dense(5120, 64, 64, 8, 128, 25_600, 151_936);
    /// `mistralai/Mixtral-8x7B-Instruct-v0.1` config.json: 8 experts of
    /// intermediate 14336, top-2 (`num_local_experts`,
    /// `num_experts_per_tok`).
    pub const MIXTRAL_8X7B: ModelShape = ModelShape {
        num_experts: 8,
        experts_per_token: 2,
        ..ModelShape::dense(4096, 32, 32, 8, 128, 14_336, 32_000)
    };

    /// `google/gemma-3-270m` config.json (Gemma3TextConfig, tied
    /// embeddings): sliding window 512, every 6th layer full.
    pub const GEMMA3_270M: ModelShape = ModelShape {
        tie_word_embeddings: true,
        ..ModelShape::dense(640, 18, 4, 1, 256, 2048, 262_144)
    };
    /// `google/gemma-3-1b-it` config.json: window 512.
    pub const GEMMA3_1B: ModelShape = ModelShape {
        tie_word_embeddings: true,
        ..ModelShape::dense(1152, 26, 4, 1, 256, 6912, 262_144)
    };
    /// `google/gemma-3-4b-it`'s `text_config` (the widths the multimodal
    /// config leaves to Gemma3TextConfig's defaults, vocabulary 262208
    /// included): window 1024.
    pub const GEMMA3_4B: ModelShape = ModelShape {
        tie_word_embeddings: true,
        ..ModelShape::dense(2560, 34, 8, 4, 256, 10_240, 262_208)
    };
    /// `google/gemma-3-12b-it`'s `text_config`: window 1024.
    pub const GEMMA3_12B: ModelShape = ModelShape {
        tie_word_embeddings: true,
        ..ModelShape::dense(3840, 48, 16, 8, 256, 15_360, 262_208)
    };
    /// `google/gemma-3-27b-it`'s `text_config` (head_dim 128): window 1024.
    pub const GEMMA3_27B: ModelShape = ModelShape {
        tie_word_embeddings: true,
        ..ModelShape::dense(5376, 62, 32, 16, 128, 21_504, 262_208)
    };
    /// `openai/gpt-oss-20b` config.json: 32 experts of intermediate 2880,
    /// top-4, sliding window 128 on even layers. Weights counted at 2
    /// bytes: the checkpoint's MXFP4 experts are not modelled.
    pub const GPT_OSS_20B: ModelShape = ModelShape {
        num_experts: 32,
        experts_per_token: 4,
        ..ModelShape::dense(2880, 24, 64, 8, 64, 2880, 201_088)
    };

    /// The built-in shapes: canonical name, the layers' pattern, then the
    /// Hugging Face ids they are read from.
    const BUILTINS: &'static [(
        &'static str,
        ModelShape,
        LayerPattern,
        &'static [&'static str],
    )] = &[
        (
            "qwen2.5-0.5b",
            Self::QWEN2_5_0_5B,
            LayerPattern::AllFull,
            &["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B"],
        ),
        (
            "qwen2.5-7b",
            Self::QWEN2_5_7B,
            LayerPattern::AllFull,
            &["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"],
        ),
        (
            "qwen2.5-72b",
            Self::QWEN2_5_72B,
            LayerPattern::AllFull,
            &["Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B"],
        ),
        (
            "llama-3.1-8b",
            Self::LLAMA_3_1_8B,
            LayerPattern::AllFull,
            &[
                "meta-llama/Llama-3.1-8B-Instruct",
                "meta-llama/Llama-3.1-8B",
                "meta-llama/Meta-Llama-3.1-8B-Instruct",
                "meta-llama/Meta-Llama-3.1-8B",
            ],
        ),
        (
            "llama-3.1-70b",
            Self::LLAMA_3_1_70B,
            LayerPattern::AllFull,
            &[
                "meta-llama/Llama-3.1-70B-Instruct",
                "meta-llama/Llama-3.1-70B",
                "meta-llama/Meta-Llama-3.1-70B-Instruct",
                "meta-llama/Meta-Llama-3.1-70B",
            ],
        ),
        (
            "qwen3-8b",
            Self::QWEN3_8B,
            LayerPattern::AllFull,
            &["Qwen/Qwen3-8B"],
        ),
        (
            "qwen3-32b",
            Self::QWEN3_32B,
            LayerPattern::AllFull,
            &["Qwen/Qwen3-32B"],
        ),
        (
            "mixtral-8x7b",
            Self::MIXTRAL_8X7B,
            LayerPattern::AllFull,
            &[
                "mistralai/Mixtral-8x7B-Instruct-v0.1",
                "mistralai/Mixtral-8x7B-v0.1",
            ],
        ),
        (
            "gemma-3-270m",
            Self::GEMMA3_270M,
            LayerPattern::SlidingExceptEvery {
                window: 512,
                full_every: 6,
            },
            &["google/gemma-3-270m", "google/gemma-3-270m-it"],
        ),
        (
            "gemma-3-1b",
            Self::GEMMA3_1B,
            LayerPattern::SlidingExceptEvery {
                window: 512,
                full_every: 6,
            },
            &["google/gemma-3-1b-it", "google/gemma-3-1b-pt"],
        ),
        (
            "gemma-3-4b",
            Self::GEMMA3_4B,
            LayerPattern::SlidingExceptEvery {
                window: 1024,
                full_every: 6,
            },
            &["google/gemma-3-4b-it", "google/gemma-3-4b-pt"],
        ),
        (
            "gemma-3-12b",
            Self::GEMMA3_12B,
            LayerPattern::SlidingExceptEvery {
                window: 1024,
                full_every: 6,
            },
            &["google/gemma-3-12b-it", "google/gemma-3-12b-pt"],
        ),
        (
            "gemma-3-27b",
            Self::GEMMA3_27B,
            LayerPattern::SlidingExceptEvery {
                window: 1024,
                full_every: 6,
            },
            &["google/gemma-3-27b-it", "google/gemma-3-27b-pt"],
        ),
        (
            "gpt-oss-20b",
            Self::GPT_OSS_20B,
            LayerPattern::SlidingExceptEvery {
                window: 128,
                full_every: 2,
            },
            &["openai/gpt-oss-20b"],
        ),
    ];

    /// A built-in shape by its short name (`qwen2.5-7b`) or a Hugging Face
    /// id it is read from (`Qwen/Qwen2.5-7B-Instruct`), case-insensitive.
    pub fn builtin(name: &str) -> Option<ModelShape> {
        LayeredShape::builtin(name).map(|l| l.shape)
    }

    /// The built-in shapes' short names, for help texts and errors.
    pub fn builtin_names() -> Vec<&'static str> {
        Self::BUILTINS.iter().map(|(n, _, _, _)| *n).collect()
    }
}

impl LayeredShape {
    /// [`ModelShape::builtin`] with its layers' attention kinds.
    pub fn builtin(name: &str) -> Option<LayeredShape> {
        let name = name.trim();
        ModelShape::BUILTINS
            .iter()
            .find_map(|(short, shape, pattern, ids)| {
                (short.eq_ignore_ascii_case(name)
                    || ids.iter().any(|id| id.eq_ignore_ascii_case(name)))
                .then(|| LayeredShape::with_pattern(*shape, *pattern))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_counts_match_the_published_sizes() {
        // Llama 3.1 8B: 8.03 B; Mixtral 8x7B: 46.7 B; Qwen2.5-0.5B (tied,
        // biases left out): 0.494 B.
        let b = |m: ModelShape| m.param_count() as f64 / 1e9;
        assert!((b(ModelShape::LLAMA_3_1_8B) - 8.03).abs() < 0.01);
        assert!((b(ModelShape::MIXTRAL_8X7B) - 46.70).abs() < 0.05);
        assert!((b(ModelShape::QWEN2_5_0_5B) - 0.494).abs() < 0.001);
        assert_eq!(
            ModelShape::LLAMA_3_1_8B.weight_bytes(),
            2 * ModelShape::LLAMA_3_1_8B.param_count()
        );
        // 32 layers × K and V × 8 heads × 128 × 2 bytes = 128 KiB.
        assert_eq!(ModelShape::LLAMA_3_1_8B.kv_bytes_per_token(), 131_072);
        assert_eq!(
            ModelShape::LLAMA_3_1_8B.kv_bytes_per_token_per_gpu(4),
            32_768
        );
        // Beyond 8 KV heads they replicate: one per GPU.
        assert_eq!(
            ModelShape::LLAMA_3_1_8B.kv_bytes_per_token_per_gpu(16),
            16_384
        );
    }

    #[test]
    fn builtin_names_take_hf_ids_in_any_case() {
        assert_eq!(
            ModelShape::builtin("Qwen/Qwen2.5-7B-Instruct"),
            Some(ModelShape::QWEN2_5_7B)
        );
        assert_eq!(
            ModelShape::builtin("QWEN2.5-7B"),
            Some(ModelShape::QWEN2_5_7B)
        );
        assert_eq!(
            ModelShape::builtin("mistralai/mixtral-8x7b-instruct-v0.1"),
            Some(ModelShape::MIXTRAL_8X7B)
        );
        assert_eq!(ModelShape::builtin("qwen2.5-7b-base"), None);
        for name in ModelShape::builtin_names() {
            assert!(ModelShape::builtin(name).is_some(), "{name}");
            assert_eq!(
                ModelShape::builtin(name).map(|m| m.validate()),
                Some(Ok(()))
            );
        }
    }

    #[test]
    fn hybrid_builtins_have_their_configs_groups() {
        use sluice_core::kv_cache::{GroupingPolicy, KvCacheGroupSpec};
        // Gemma 3 270M: 15 sliding layers, full at 5, 11, 17: five sliding
        // groups of 3 and one full group (vLLM's group size: the smaller
        // bucket, 3).
        let g = LayeredShape::builtin("google/gemma-3-270m")
            .unwrap()
            .kv_layer_groups(GroupingPolicy::default());
        let sliding = KvCacheGroupSpec::sliding_window(512);
        assert_eq!(
            g.specs,
            [vec![sliding; 5], vec![KvCacheGroupSpec::FULL]].concat()
        );
        assert_eq!(g.layers[5], vec![Some(5), Some(11), Some(17)]);
        // gpt-oss-20b: layer 0 slides, so the sliding group comes first (vLLM
        // buckets in order of first appearance); 12 layers each.
        let g = LayeredShape::builtin("gpt-oss-20b")
            .unwrap()
            .kv_layer_groups(GroupingPolicy::default());
        assert_eq!(
            g.specs,
            vec![
                KvCacheGroupSpec::sliding_window(128),
                KvCacheGroupSpec::FULL
            ]
        );
        let evens: Vec<_> = (0..24).step_by(2).map(Some).collect();
        let odds: Vec<_> = (1..24).step_by(2).map(Some).collect();
        assert_eq!(g.layers, vec![evens, odds]);
        // The 1B's 26 layers: 22 sliding, 4 full (5, 11, 17, 23), groups of
        // 4, the last sliding group padded by 2.
        let g = LayeredShape::builtin("gemma-3-1b")
            .unwrap()
            .kv_layer_groups(GroupingPolicy::default());
        assert_eq!((g.specs.len(), g.group_size()), (7, 4));
        assert_eq!(g.layers[6], vec![Some(5), Some(11), Some(17), Some(23)]);
        for name in ModelShape::builtin_names() {
            let l = LayeredShape::builtin(name).unwrap();
            assert_eq!(l.validate(), Ok(()), "{name}");
        }
    }
}
