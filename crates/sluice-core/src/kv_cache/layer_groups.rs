//! From a model's layers to its KV cache groups, as vLLM 0.33 forms them
//! (`_get_kv_cache_groups_uniform_page_size`): what the engine hands the
//! scheduler (`SchedulerConfig::kv_cache_groups`), what the runner gives
//! each layer (its group's block table), and how many layer pages one
//! block id stands for (what a block costs in memory).
//!
//! The rule: layers are bucketed by what their cache must keep (their
//! [`AttentionKind`]), in order of first appearance. With one bucket the
//! model has one group holding every layer. With several, every group has
//! the same number of layers, `group_size`: the smallest bucket's size (the
//! "1" of an n:1 pattern), or the largest's when that is under 1.5 times the
//! smallest (gpt-oss + a drafter: 12 sliding + 13 full become two groups of
//! 13, not 12 + 24). A bucket of `n` layers becomes `ceil(n / group_size)`
//! groups, group `i` taking every `num_groups`-th layer from the `i`-th (so
//! a pipeline stage's layers spread over all groups), the last padded with
//! empty slots. Gemma 3 270M's 15 sliding layers and 3 full ones are five
//! sliding groups of 3 layers then one full group.
//!
//! Memory: block ids are unique across groups, so the `j`-th layer of every
//! group can share one storage tensor (vLLM's `KVCacheTensor` shared by one
//! layer per group): a block id stands for `group_size` layer pages, and a
//! pool of `N` blocks costs `N × group_size` pages, not `N × num_layers`.
//!
//! Without the hybrid manager (`--disable-hybrid-kv-cache-manager`), and for
//! a model with chunked-local layers unless they are asked for (vLLM turns
//! the hybrid manager off for them unless
//! `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE` is set, sliding
//! layers included), windowed layers keep every token as full attention
//! does: one full group.
//! The layers still attend only inside their window; only the cache keeps
//! more.

use super::group::{AttentionKind, KvCacheGroupSpec};

/// Which windowed kinds get their own groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupingPolicy {
    /// Sliding-window (and chunked-local) layers get groups of their own;
    /// `false` is vLLM's `--disable-hybrid-kv-cache-manager`.
    pub hybrid: bool,
    /// Chunked-local layers get groups of their own (off by default, as in
    /// vLLM, where a model with such layers then has no hybrid groups at
    /// all).
    pub chunked_local: bool,
}

impl Default for GroupingPolicy {
    fn default() -> Self {
        GroupingPolicy {
            hybrid: true,
            chunked_local: false,
        }
    }
}

/// A model's layers in KV cache groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGroups {
    /// The groups, in the scheduler's order.
    pub specs: Vec<KvCacheGroupSpec>,
    /// For each group, its layers in slot order: `group_size` entries each,
    /// `None` for a padding slot.
    pub layers: Vec<Vec<Option<usize>>>,
}

impl LayerGroups {
    /// The groups of a model whose layer `i` attends as `kinds[i]`. A model
    /// without layers has one empty full group.
    pub fn of_layers(kinds: &[AttentionKind], policy: GroupingPolicy) -> LayerGroups {
        // vLLM turns the whole hybrid manager off for a model with
        // chunked-local layers unless they are allowed their own groups
        // (`VllmConfig.__post_init__`), so its sliding layers are full too.
        let chunked = kinds
            .iter()
            .any(|k| matches!(k, AttentionKind::ChunkedLocal { .. }));
        // A model whose layers all attend alike is not hybrid: vLLM keeps
        // its one kind with the hybrid manager off too
        // (`_promote_local_kv_cache_specs` leaves uniform specs alone), so
        // an all-sliding Mistral still frees out-of-window blocks.
        let uniform = kinds.windows(2).all(|w| w[0] == w[1]);
        let hybrid = uniform || (policy.hybrid && (policy.chunked_local || !chunked));
        let kept = |k: AttentionKind| match k {
            AttentionKind::SlidingWindow { .. } if hybrid => k,
            AttentionKind::ChunkedLocal { .. } if hybrid => k,
            _ => AttentionKind::Full,
        };
        let mut buckets: Vec<(AttentionKind, Vec<usize>)> = Vec::new();
        for (layer, &kind) in kinds.iter().enumerate() {
            let kind = kept(kind);
            match buckets.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, layers)) => layers.push(layer),
                None => buckets.push((kind, vec![layer])),
            }
        }
        if buckets.is_empty() {
            return LayerGroups {
                specs: vec![KvCacheGroupSpec::FULL],
                layers: vec![Vec::new()],
            };
        }
        let min = buckets.iter().map(|(_, l)| l.len()).min().unwrap_or(1);
        let max = buckets.iter().map(|(_, l)| l.len()).max().unwrap_or(1);
        // vLLM's heuristic, in integers: max < 1.5 · min.
        let group_size = if 2 * max < 3 * min { max } else { min };
        let mut specs = Vec::new();
        let mut layers = Vec::new();
        for (kind, members) in &buckets {
            let num_groups = members.len().div_ceil(group_size);
            for i in 0..num_groups {
                let mut slots: Vec<Option<usize>> = members
                    .iter()
                    .skip(i)
                    .step_by(num_groups)
                    .map(|&l| Some(l))
                    .collect();
                slots.resize(group_size, None);
                specs.push(KvCacheGroupSpec {
                    kind: *kind,
                    block_size: None,
                });
                layers.push(slots);
            }
        }
        LayerGroups { specs, layers }
    }

    /// Layer pages one block id stands for (layers per group, padding
    /// included): the number of storage tensors the pool needs.
    pub fn group_size(&self) -> usize {
        self.layers.first().map_or(0, Vec::len)
    }

    /// Layer `layer`'s `(group, slot)`: the group whose block table it
    /// reads and the storage tensor it shares with that slot of every other
    /// group. `None` for a layer the groups do not hold.
    pub fn position_of(&self, layer: usize) -> Option<(usize, usize)> {
        self.layers.iter().enumerate().find_map(|(g, slots)| {
            slots
                .iter()
                .position(|&l| l == Some(layer))
                .map(|slot| (g, slot))
        })
    }

    /// Whether there is more than one group.
    pub fn is_hybrid(&self) -> bool {
        self.specs.len() > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SW: AttentionKind = AttentionKind::SlidingWindow { window: 512 };
    const FULL: AttentionKind = AttentionKind::Full;

    fn ids(g: &[Option<usize>]) -> Vec<usize> {
        g.iter().flatten().copied().collect()
    }

    #[test]
    fn gemma3_270m_is_five_sliding_groups_then_one_full() {
        // Full attention at layers 5, 11, 17 of 18.
        let kinds: Vec<_> = (0..18)
            .map(|l| if l % 6 == 5 { FULL } else { SW })
            .collect();
        let g = LayerGroups::of_layers(&kinds, GroupingPolicy::default());
        assert_eq!(g.specs.len(), 6);
        assert!(g.specs[..5].iter().all(|s| s.kind == SW));
        assert_eq!(g.specs[5].kind, FULL);
        assert_eq!(g.group_size(), 3);
        // The 15 sliding layers [0..4, 6..10, 12..16], every fifth from i.
        assert_eq!(ids(&g.layers[0]), vec![0, 6, 12]);
        assert_eq!(ids(&g.layers[1]), vec![1, 7, 13]);
        assert_eq!(ids(&g.layers[4]), vec![4, 10, 16]);
        assert_eq!(ids(&g.layers[5]), vec![5, 11, 17]);
        assert_eq!(g.position_of(13), Some((1, 2)));
        assert_eq!(g.position_of(17), Some((5, 2)));
        assert_eq!(g.position_of(18), None);
    }

    #[test]
    fn gpt_oss_with_a_drafter_layer_pads_instead_of_splitting() {
        // 12 sliding + 13 full: 13 < 1.5 × 12, so two groups of 13, the
        // sliding one padded.
        let mut kinds: Vec<_> = (0..24)
            .map(|l| if l % 2 == 0 { SW } else { FULL })
            .collect();
        kinds.push(FULL);
        let g = LayerGroups::of_layers(&kinds, GroupingPolicy::default());
        assert_eq!(g.specs.len(), 2);
        assert_eq!(g.group_size(), 13);
        assert_eq!(g.layers[0].iter().filter(|l| l.is_none()).count(), 1);
        assert_eq!(ids(&g.layers[1]).len(), 13);
    }

    #[test]
    fn one_kind_is_one_group_and_without_hybrid_everything_is_full() {
        let g = LayerGroups::of_layers(&[FULL; 4], GroupingPolicy::default());
        assert_eq!(g.specs, vec![KvCacheGroupSpec::FULL]);
        assert_eq!(ids(&g.layers[0]), vec![0, 1, 2, 3]);
        // All sliding: one sliding group.
        let g = LayerGroups::of_layers(&[SW; 3], GroupingPolicy::default());
        assert_eq!(g.specs, vec![KvCacheGroupSpec::sliding_window(512)]);
        let off = GroupingPolicy {
            hybrid: false,
            chunked_local: false,
        };
        let g = LayerGroups::of_layers(&[SW, SW, FULL], off);
        assert_eq!(g.specs, vec![KvCacheGroupSpec::FULL]);
        assert_eq!(g.group_size(), 3);
        assert!(!g.is_hybrid());
        // Uniform sliding layers stay sliding without the hybrid manager
        // (vLLM promotes them only beside full layers).
        let g = LayerGroups::of_layers(&[SW; 3], off);
        assert_eq!(g.specs, vec![KvCacheGroupSpec::sliding_window(512)]);
    }

    #[test]
    fn chunked_local_layers_are_full_unless_asked_for() {
        let local = AttentionKind::ChunkedLocal { chunk: 8192 };
        let kinds = [local, local, local, FULL];
        let g = LayerGroups::of_layers(&kinds, GroupingPolicy::default());
        assert_eq!(g.specs, vec![KvCacheGroupSpec::FULL]);
        let on = GroupingPolicy {
            hybrid: true,
            chunked_local: true,
        };
        let g = LayerGroups::of_layers(&kinds, on);
        assert_eq!(g.specs.len(), 4);
        assert_eq!(g.specs[3], KvCacheGroupSpec::FULL);
        assert_eq!(g.group_size(), 1);
        // Chunked-local layers not allowed groups turn the hybrid manager
        // off: a sliding layer beside them is full attention too.
        let g = LayerGroups::of_layers(&[local, SW, FULL], GroupingPolicy::default());
        assert_eq!(g.specs, vec![KvCacheGroupSpec::FULL]);
        assert_eq!(g.group_size(), 3);
    }

    #[test]
    fn windows_of_different_sizes_are_different_groups() {
        let w2 = AttentionKind::SlidingWindow { window: 128 };
        let g = LayerGroups::of_layers(&[SW, w2, FULL], GroupingPolicy::default());
        assert_eq!(g.specs.len(), 3);
        assert_eq!(g.group_size(), 1);
        let g = LayerGroups::of_layers(&[], GroupingPolicy::default());
        assert_eq!(g.specs, vec![KvCacheGroupSpec::FULL]);
        assert_eq!(g.group_size(), 0);
    }
}
