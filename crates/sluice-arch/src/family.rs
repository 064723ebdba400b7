//! The architecture table: which decoder family a config names (Hugging
//! Face `architectures` / `model_type`, GGUF `general.architecture`) and
//! what that family's config class assumes for a key the file leaves
//! out — today, `head_dim`.
//!
//! Promises: one answer per config, whoever asks. The model runner's
//! `config.json` parser and the shape readers of this crate both take
//! the default head_dim from [`Family::default_head_dim`], so
//! `sluice simulate`, `serve --executor simulated` and the real runner
//! size a config without `head_dim` the same way, and the way
//! transformers does (its config class's default, which vLLM reads).
//!
//! It also says which layers a config's `sliding_window` reaches when no
//! `layer_types` list says it layer by layer ([`SlidingRule`]): what KV
//! cache groups the model gets, hence how a pool of memory is sized.
//!
//! A family here is a shape fact, not a promise that the runner runs it:
//! mixture-of-experts, Gemma and gpt-oss families are listed so that
//! simulations of them read their configs right.

/// How a family's config class fills in an absent `head_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadDimDefault {
    /// `hidden_size ÷ num_attention_heads` (LlamaConfig, Qwen2Config,
    /// MistralConfig, MixtralConfig, ...; also any unknown family).
    HiddenOverHeads,
    /// A fixed width in the config class's signature (Qwen3Config: 128;
    /// GemmaConfig, Gemma2Config, Gemma3TextConfig: 256).
    Fixed(usize),
}

/// Which layers a config's `sliding_window` reaches, when the config has
/// no `layer_types` (which, when present, says it for every layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlidingRule {
    /// The window is not read: every layer is full attention.
    Ignored,
    /// Every layer slides when a window is given (MistralConfig).
    EveryLayer,
    /// Layers from `max_window_layers` (default 28) on slide, and only
    /// with `use_sliding_window` (Qwen2Config, Qwen3Config).
    FromMaxWindowLayers,
    /// Every layer slides but each `n`-th, layer `i` full when
    /// `(i + 1) % n == 0`; a config's `sliding_window_pattern` (or
    /// `_sliding_window_pattern`) gives another `n` (Gemma2Config: 2,
    /// Gemma3TextConfig: 6; llama.cpp's `swa_pattern` of the same
    /// architectures, which GGUF files do not store).
    AllButEvery(usize),
}

/// One decoder family: its names in the two config formats and its
/// config class's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// Class names in `config.json`'s `architectures` (the first is the
    /// canonical one).
    pub hf_architectures: &'static [&'static str],
    /// `model_type` values (consulted when `architectures` names none).
    pub hf_model_types: &'static [&'static str],
    /// GGUF `general.architecture` values (also the `{arch}.*` key prefix).
    pub gguf_architectures: &'static [&'static str],
    /// What an absent `head_dim` means.
    pub head_dim: HeadDimDefault,
    /// Which layers `sliding_window` reaches.
    pub sliding: SlidingRule,
}

const fn family(
    hf_architectures: &'static [&'static str],
    hf_model_types: &'static [&'static str],
    gguf_architectures: &'static [&'static str],
    head_dim: HeadDimDefault,
    sliding: SlidingRule,
) -> Family {
    Family {
        hf_architectures,
        hf_model_types,
        gguf_architectures,
        head_dim,
        sliding,
    }
}

use HeadDimDefault::{Fixed, HiddenOverHeads};
use SlidingRule::{AllButEvery, EveryLayer, FromMaxWindowLayers, Ignored};

/// Every family known, runnable by the CPU runner or not.
pub const FAMILIES: &[Family] = &[
    family(
        &["Qwen2ForCausalLM"],
        &["qwen2"],
        &["qwen2"],
        HiddenOverHeads,
        FromMaxWindowLayers,
    ),
    family(
        &["Qwen3ForCausalLM"],
        &["qwen3"],
        &["qwen3"],
        Fixed(128),
        FromMaxWindowLayers,
    ),
    family(
        &["LlamaForCausalLM", "MistralForCausalLM"],
        &["llama", "mistral"],
        &["llama"],
        HiddenOverHeads,
        EveryLayer,
    ),
    family(
        &["MixtralForCausalLM"],
        &["mixtral"],
        &[],
        HiddenOverHeads,
        EveryLayer,
    ),
    family(
        &["Qwen2MoeForCausalLM"],
        &["qwen2_moe"],
        &["qwen2moe"],
        HiddenOverHeads,
        FromMaxWindowLayers,
    ),
    family(
        &["GemmaForCausalLM"],
        &["gemma"],
        &["gemma"],
        Fixed(256),
        Ignored,
    ),
    family(
        &["Gemma2ForCausalLM"],
        &["gemma2"],
        &["gemma2"],
        Fixed(256),
        AllButEvery(2),
    ),
    family(
        &["Gemma3ForCausalLM"],
        &["gemma3_text"],
        &["gemma3"],
        Fixed(256),
        AllButEvery(6),
    ),
    // GptOssConfig: head_dim 64; its configs list `layer_types`, sliding
    // and full alternating from layer 0.
    family(
        &["GptOssForCausalLM"],
        &["gpt_oss"],
        &["gpt-oss"],
        Fixed(64),
        AllButEvery(2),
    ),
];

impl Family {
    /// The family of a `config.json`: the first entry of `architectures`
    /// that names one, or else (only when `architectures` is absent or
    /// empty) its `model_type`.
    pub fn from_hf(architectures: &[String], model_type: Option<&str>) -> Option<&'static Family> {
        let by_name = architectures.iter().find_map(|n| {
            FAMILIES
                .iter()
                .find(|f| f.hf_architectures.contains(&n.as_str()))
        });
        by_name.or_else(|| {
            let t = model_type.filter(|_| architectures.is_empty())?;
            FAMILIES.iter().find(|f| f.hf_model_types.contains(&t))
        })
    }

    /// The family of a GGUF `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<&'static Family> {
        FAMILIES
            .iter()
            .find(|f| f.gguf_architectures.contains(&name))
    }

    /// The family whose canonical Hugging Face class name is `name`.
    pub fn by_hf_name(name: &str) -> Option<&'static Family> {
        FAMILIES.iter().find(|f| f.hf_architectures.contains(&name))
    }

    /// head_dim when the config gives none; `None` when the family divides
    /// and `hidden_size` is not a multiple of `num_attention_heads`.
    pub fn default_head_dim(
        &self,
        hidden_size: usize,
        num_attention_heads: usize,
    ) -> Option<usize> {
        default_head_dim(Some(self), hidden_size, num_attention_heads)
    }
}

/// head_dim for a config without one, of `family` (`None`: an unknown
/// family, which divides like most config classes).
pub fn default_head_dim(
    family: Option<&Family>,
    hidden_size: usize,
    num_attention_heads: usize,
) -> Option<usize> {
    match family.map_or(HiddenOverHeads, |f| f.head_dim) {
        Fixed(d) => Some(d),
        HiddenOverHeads => (num_attention_heads > 0
            && hidden_size.is_multiple_of(num_attention_heads))
        .then(|| hidden_size / num_attention_heads),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_belongs_to_one_family() {
        let mut seen = std::collections::HashSet::new();
        for f in FAMILIES {
            for n in f.hf_architectures {
                assert!(seen.insert(("hf", *n)), "{n} listed twice");
            }
            for n in f.gguf_architectures {
                assert!(seen.insert(("gguf", *n)), "{n} listed twice");
            }
        }
    }

    #[test]
    fn architectures_win_over_model_type() {
        let names = vec!["Unknown".to_string(), "Qwen3ForCausalLM".to_string()];
        let f = Family::from_hf(&names, Some("llama")).unwrap();
        assert_eq!(f.hf_architectures[0], "Qwen3ForCausalLM");
        assert!(Family::from_hf(&["Unknown".to_string()], Some("llama")).is_none());
        let f = Family::from_hf(&[], Some("mistral")).unwrap();
        assert_eq!(f.hf_architectures[0], "LlamaForCausalLM");
    }
}
