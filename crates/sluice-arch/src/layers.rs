//! [`LayeredShape`]: a [`ModelShape`] with what each layer's KV cache
//! keeps (full attention, a sliding window, a local chunk), the fact that
//! decides a hybrid model's KV cache groups and so how many blocks a
//! memory budget holds.
//!
//! Kept beside the shape rather than in it: the widths are `Copy` numbers
//! every consumer passes around, the layer kinds a list only KV sizing and
//! the scheduler's groups need.
//!
//! Sizing, as vLLM 0.33 does it (`v1/core/kv_cache_planning.py`): the
//! groups are `sluice_core::kv_cache::LayerGroups` (vLLM's
//! `_get_kv_cache_groups_uniform_page_size`), every layer's page is
//! `block_size × 2 × kv_heads × head_dim × dtype bytes` (one page size for
//! all layers: the widths are the model's), and one block of the shared
//! pool costs the largest group's pages (`_get_kv_cache_bytes_per_block`:
//! the sum of its layers' pages, padding slots excluded), which is
//! `group_size` pages. `num_blocks = available ÷ that`
//! (`get_kv_cache_config_from_groups`). A plain decoder is one group of
//! every layer; Gemma 3 270M's 18 layers are six groups of 3, so a block
//! costs 3 pages instead of 18 and the same memory holds six times the
//! blocks (the sliding groups then give theirs back outside the window).

use crate::ModelShape;
use sluice_core::kv_cache::{AttentionKind, GroupingPolicy, LayerGroups};

/// A built-in model's layer pattern (a `Copy` value for the built-in
/// table; [`LayerPattern::kinds`] spells it out per layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerPattern {
    /// Every layer attends to every earlier token.
    AllFull,
    /// Every layer slides over `window` tokens but each `full_every`-th,
    /// layer `i` full when `(i + 1) % full_every == 0` (Gemma 3: 6;
    /// gpt-oss: 2, starting with a sliding layer).
    SlidingExceptEvery { window: usize, full_every: usize },
}

impl LayerPattern {
    /// The attention kind of each of `layers` layers.
    pub fn kinds(self, layers: usize) -> Vec<AttentionKind> {
        (0..layers)
            .map(|i| match self {
                LayerPattern::AllFull => AttentionKind::Full,
                LayerPattern::SlidingExceptEvery { window, full_every } => {
                    if (i + 1) % full_every.max(1) == 0 {
                        AttentionKind::Full
                    } else {
                        AttentionKind::SlidingWindow { window }
                    }
                }
            })
            .collect()
    }
}

/// A model's widths and, per layer, what its KV cache keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct LayeredShape {
    pub shape: ModelShape,
    /// One per layer, in layer order.
    pub layer_kinds: Vec<AttentionKind>,
}

impl LayeredShape {
    /// `shape` with every layer full attention (a plain decoder).
    pub fn all_full(shape: ModelShape) -> LayeredShape {
        LayeredShape::with_pattern(shape, LayerPattern::AllFull)
    }

    /// `shape` with its layers attending as `pattern` says.
    pub fn with_pattern(shape: ModelShape, pattern: LayerPattern) -> LayeredShape {
        LayeredShape {
            layer_kinds: pattern.kinds(shape.layers),
            shape,
        }
    }

    /// The layers in KV cache groups, as the scheduler and the model
    /// runner form them under `policy`.
    pub fn kv_layer_groups(&self, policy: GroupingPolicy) -> LayerGroups {
        LayerGroups::of_layers(&self.layer_kinds, policy)
    }

    /// Bytes one block of the shared pool takes on one GPU at tensor
    /// parallelism `tp`, the layers grouped under `policy`: a page of
    /// `block_size` tokens of each layer slot of a group.
    pub fn kv_bytes_per_block_per_gpu(
        &self,
        policy: GroupingPolicy,
        block_size: usize,
        tp: usize,
    ) -> u64 {
        let slots = self.kv_layer_groups(policy).group_size();
        self.shape.kv_bytes_per_block_per_gpu(slots, block_size, tp)
    }

    /// Whether any layer keeps less than every token.
    pub fn has_windowed_layers(&self) -> bool {
        self.layer_kinds.iter().any(|k| *k != AttentionKind::Full)
    }

    /// The shape is usable ([`ModelShape::validate`]) and has one kind per
    /// layer, no window or chunk of 0 tokens. Errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        self.shape.validate()?;
        if self.layer_kinds.len() != self.shape.layers {
            return Err(format!(
                "{} layer attention kinds for {} layers",
                self.layer_kinds.len(),
                self.shape.layers
            ));
        }
        for (i, kind) in self.layer_kinds.iter().enumerate() {
            match *kind {
                AttentionKind::SlidingWindow { window: 0 } => {
                    return Err(format!("layer {i}: `sliding_window` is 0"))
                }
                AttentionKind::ChunkedLocal { chunk: 0 } => {
                    return Err(format!("layer {i}: `attention_chunk_size` is 0"))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_put_full_layers_where_the_configs_do() {
        // Gemma 3 270M: full at 5, 11, 17 (transformers' layer_types with
        // `sliding_window_pattern` 6).
        let kinds = LayerPattern::SlidingExceptEvery {
            window: 512,
            full_every: 6,
        }
        .kinds(18);
        let full: Vec<usize> = (0..18)
            .filter(|&i| kinds[i] == AttentionKind::Full)
            .collect();
        assert_eq!(full, vec![5, 11, 17]);
        // gpt-oss: sliding at even layers, full at odd ones.
        let kinds = LayerPattern::SlidingExceptEvery {
            window: 128,
            full_every: 2,
        }
        .kinds(4);
        assert_eq!(
            kinds,
            vec![
                AttentionKind::SlidingWindow { window: 128 },
                AttentionKind::Full,
                AttentionKind::SlidingWindow { window: 128 },
                AttentionKind::Full
            ]
        );
    }
}
