//! The paged KV cache: K and V storage addressed by the scheduler's block
//! ids, sized from a memory budget, shared by the model's KV cache groups.
//!
//! Groups: the model's layers fall into KV cache groups by what they keep
//! (`sluice_core::kv_cache::LayerGroups`, vLLM's rule: one full group for a
//! plain decoder; for Gemma 3, five sliding-window groups and one full
//! group of three layers each). Every group has the same number of layer
//! slots, and block ids are unique across groups, so slot `j` of every
//! group shares one storage tensor: the pool has `group_size` tensors (one
//! per layer for a plain decoder) and a block id stands for `group_size`
//! layer pages. A layer reads and writes its slot's tensor through its
//! group's block table.
//!
//! Layout, per tensor, in elements of the cache's type (`dtype`):
//! - V: `[num_blocks, num_kv_heads, block_size, head_dim]`;
//! - K: `[num_blocks, num_kv_heads, head_dim, block_size]` — transposed
//!   within the block.
//!
//! Why heads before positions (vLLM's CPU layout puts positions first): the
//! attention kernel works on one (request, KV head) at a time, so one block
//! of one head is a single contiguous `block_size × head_dim` run (4 KiB at
//! 16 × 64 in f32) that it streams linearly. Why K transposed: the kernel
//! scores 16 keys at once as `s[j] += q[d] · K[d][j]` over `d`, one vector
//! fused multiply-add per `d` and no horizontal sums, which needs the 16
//! keys' `d`-th components side by side (vLLM's CUDA K cache is split along
//! `head_dim` for the same reason). V is consumed row by row (`acc += p_j ·
//! V[j]`), so it stays position-major. The price is a strided write — one
//! scattered store per (head, dim) per new token — negligible next to the
//! reads.
//!
//! Element types (`dtype`, `--kv-cache-dtype`): f32, bf16, f16 or q8_0
//! (`dtype.rs`). The CLI's default is f16 (llama.cpp's default KV type;
//! half of f32's bytes): the budget holds twice the tokens and a long
//! context's attention reads half the bytes. Library callers
//! get f32 unless they ask, which adds no rounding on top of the weights'
//! and is what exactness tests compare against.
//!
//! Promises: block 0 (the scheduler's null block) is allocated but never
//! written through a valid block table; `write` only touches the slots it is
//! given; storage pages are only committed when first written (the buffers
//! are zero-initialised lazily by the allocator).
//!
//! Sizes come from the command line (`--kv-cache-memory`,
//! `--num-gpu-blocks-override`), so a cache that cannot exist is an error,
//! never an abort: its size is computed with checked arithmetic, compared
//! with the memory available (`memory::available_bytes`; with overcommit a
//! huge allocation would otherwise "succeed" and the process be killed when
//! a step writes it) and with the scheduler's block limit, and the buffers
//! are allocated fallibly.

use crate::config::ModelConfig;
use crate::memory::{available_bytes, format_bytes};
use anyhow::{anyhow, bail, Result};
use sluice_core::config::MAX_NUM_GPU_BLOCKS;
use sluice_core::kv_cache::{GroupingPolicy, KvCacheGroupSpec, LayerGroups};

mod dtype;
pub use dtype::{KvDtype, KvTensor, KEY_TILE};
pub use sluice_arch::KvCacheDtype;

/// How many blocks of how many tokens the cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Tokens per block; must equal the scheduler's `block_size`.
    pub block_size: usize,
    /// Blocks in the pool, null block included (the scheduler's
    /// `num_gpu_blocks`).
    pub num_blocks: usize,
    /// Which windowed layers get KV cache groups of their own
    /// (`--disable-hybrid-kv-cache-manager` turns `hybrid` off).
    pub grouping: GroupingPolicy,
    /// How each element is stored (`--kv-cache-dtype`).
    pub dtype: KvDtype,
}

impl KvCacheConfig {
    pub fn new(block_size: usize, num_blocks: usize) -> Self {
        KvCacheConfig {
            block_size,
            num_blocks,
            grouping: GroupingPolicy::default(),
            dtype: KvDtype::F32,
        }
    }

    /// The same pool storing `dtype`.
    pub fn with_dtype(self, dtype: KvDtype) -> Self {
        KvCacheConfig { dtype, ..self }
    }

    /// The same pool with `grouping`.
    pub fn with_grouping(self, grouping: GroupingPolicy) -> Self {
        KvCacheConfig { grouping, ..self }
    }

    /// Bytes one block id takes, K and V of every layer slot of a group
    /// (all layers for a plain decoder; `LayerGroups::group_size` of them
    /// for a hybrid one), with the default grouping and f32; `usize::MAX`
    /// when that does not fit a `usize` (an absurd `block_size`).
    pub fn bytes_per_block(model: &ModelConfig, block_size: usize) -> usize {
        Self::new(block_size, 0).block_bytes(model)
    }

    /// [`bytes_per_block`](Self::bytes_per_block) with this config's
    /// grouping and block size.
    pub fn block_bytes(&self, model: &ModelConfig) -> usize {
        let slots = model.kv_layer_groups(self.grouping).group_size();
        [2, model.num_key_value_heads, self.block_size, slots]
            .into_iter()
            .try_fold(self.dtype.row_bytes(model.head_dim), usize::checked_mul)
            .unwrap_or(usize::MAX)
    }

    /// As many blocks as fit in `budget_bytes` (a `--kv-cache-memory` style
    /// setting). Fails when fewer than two blocks fit (block 0 is reserved).
    /// Memory is checked when the cache is allocated (`KvCache::new`).
    pub fn from_memory_budget(
        model: &ModelConfig,
        block_size: usize,
        budget_bytes: usize,
    ) -> Result<Self> {
        if block_size == 0 {
            bail!("block_size must be at least 1");
        }
        Self::new(block_size, 0).with_memory_budget(model, budget_bytes)
    }

    /// This config with as many blocks as fit in `budget_bytes`.
    pub fn with_memory_budget(self, model: &ModelConfig, budget_bytes: usize) -> Result<Self> {
        if self.block_size == 0 {
            bail!("block_size must be at least 1");
        }
        let per_block = self.block_bytes(model).max(1);
        let num_blocks = budget_bytes / per_block;
        if num_blocks < 2 {
            bail!(
                "KV cache memory budget of {budget_bytes} bytes holds {num_blocks} block(s) of \
                 {per_block} bytes; at least 2 are needed (block 0 is reserved)"
            );
        }
        Ok(KvCacheConfig { num_blocks, ..self })
    }

    /// What `KvCache::new` checks before allocating, for callers that
    /// can check before costlier work (loading weights): at least 2 blocks
    /// of at least 1 token, a size that can be addressed, no more than the
    /// memory available (`memory::available_bytes`) and no more blocks than
    /// the scheduler takes (`MAX_NUM_GPU_BLOCKS`). Errors say how much was
    /// requested; the caller names the flag that asked for it.
    pub fn check(&self, model: &ModelConfig) -> Result<()> {
        let slots = model.kv_layer_groups(self.grouping).group_size();
        self.sizes(model, slots).map(|_| ())
    }

    /// `check`, returning the elements of one tensor's K (and of its V)
    /// and the bytes of the whole cache.
    fn sizes(&self, model: &ModelConfig, slots: usize) -> Result<(usize, u64)> {
        if self.block_size == 0 {
            bail!("block_size must be at least 1");
        }
        if self.num_blocks < 2 {
            bail!(
                "the KV cache needs at least 2 blocks (block 0 is reserved), got {}",
                self.num_blocks
            );
        }
        // Checked: the sizes come from flags.
        let per_layer = [self.block_size, model.num_key_value_heads, model.head_dim]
            .into_iter()
            .try_fold(self.num_blocks, usize::checked_mul);
        let total = per_layer
            .and_then(|n| self.dtype.bytes_of(n))
            .and_then(|n| n.checked_mul(2 * slots))
            .and_then(|n| u64::try_from(n).ok());
        let (Some(per_layer), Some(total)) = (per_layer, total) else {
            bail!(
                "a KV cache of {} blocks × {} tokens is too large to address",
                self.num_blocks,
                self.block_size
            );
        };
        // Memory first: for a huge `--kv-cache-memory` it is the figure
        // that explains the refusal.
        check_fits(total, available_bytes())?;
        if self.num_blocks > MAX_NUM_GPU_BLOCKS {
            bail!(
                "{} requested for the KV cache is {} blocks of {}, more than the scheduler's \
                 limit of {MAX_NUM_GPU_BLOCKS} blocks",
                format_bytes(total),
                self.num_blocks,
                format_bytes(total / self.num_blocks as u64)
            );
        }
        Ok((per_layer, total))
    }

    /// Bytes of the whole cache; `usize::MAX` when that does not fit.
    pub fn size_in_bytes(&self, model: &ModelConfig) -> usize {
        self.num_blocks.saturating_mul(self.block_bytes(model))
    }
}

/// Refuses `requested` bytes of KV cache when `available` (the system's
/// estimate, if any) is smaller.
fn check_fits(requested: u64, available: Option<u64>) -> Result<()> {
    match available {
        Some(available) if requested > available => bail!(
            "{} requested for the KV cache, but only {} of memory is available",
            format_bytes(requested),
            format_bytes(available)
        ),
        _ => Ok(()),
    }
}

/// K and V of one storage tensor: one layer slot of every group.
pub struct LayerKv {
    pub k: KvTensor,
    pub v: KvTensor,
}

/// The cache itself: one `LayerKv` per layer slot of a group, shared by
/// that slot's layer of every group.
pub struct KvCache {
    block_size: usize,
    num_blocks: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype: KvDtype,
    groups: LayerGroups,
    /// Per decoder layer: its (group, storage tensor).
    layer_at: Vec<(usize, usize)>,
    tensors: Vec<LayerKv>,
}

impl KvCache {
    /// The cache for `config`, zeroed. Refused (an error, nothing
    /// allocated) as `KvCacheConfig::check` says; an allocation that fails
    /// anyway is an error too.
    pub fn new(model: &ModelConfig, config: KvCacheConfig) -> Result<Self> {
        let groups = model.kv_layer_groups(config.grouping);
        let (per_tensor, total) = config.sizes(model, groups.group_size())?;
        let layer_at = (0..model.num_hidden_layers)
            .map(|l| {
                groups
                    .position_of(l)
                    .ok_or_else(|| anyhow!("layer {l} is in no KV cache group"))
            })
            .collect::<Result<Vec<_>>>()?;
        let alloc_failed = || {
            anyhow!(
                "{} requested for the KV cache, but allocating it failed",
                format_bytes(total)
            )
        };
        let mut tensors = Vec::new();
        tensors
            .try_reserve_exact(groups.group_size())
            .map_err(|_| alloc_failed())?;
        for _ in 0..groups.group_size() {
            let zeroed = || KvTensor::zeroed(config.dtype, per_tensor).ok_or_else(alloc_failed);
            tensors.push(LayerKv {
                k: zeroed()?,
                v: zeroed()?,
            });
        }
        Ok(KvCache {
            block_size: config.block_size,
            num_blocks: config.num_blocks,
            num_kv_heads: model.num_key_value_heads,
            head_dim: model.head_dim,
            dtype: config.dtype,
            groups,
            layer_at,
            tensors,
        })
    }

    /// How the cache stores its elements.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// The KV cache groups, in the scheduler's order.
    pub fn group_specs(&self) -> &[KvCacheGroupSpec] {
        &self.groups.specs
    }

    /// The layers of every group (`LayerGroups`).
    pub fn layer_groups(&self) -> &LayerGroups {
        &self.groups
    }

    /// The group whose block table layer `layer` reads.
    pub fn group_of(&self, layer: usize) -> usize {
        self.layer_at[layer].0
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The storage layer `layer` reads and writes.
    pub fn layer(&self, layer: usize) -> &LayerKv {
        &self.tensors[self.layer_at[layer].1]
    }

    /// Offset of the `block_size × head_dim` run of `head` in `block` (in
    /// both K and V).
    #[inline]
    pub fn block_offset(&self, block: usize, head: usize) -> usize {
        (block * self.num_kv_heads + head) * self.block_size * self.head_dim
    }

    /// The key of `head` at `slot`, gathered from its transposed run and
    /// decoded.
    pub fn key(&self, layer: usize, slot: usize, head: usize) -> Vec<f32> {
        let (bs, hd) = (self.block_size, self.head_dim);
        let run = self.block_offset(slot / bs, head);
        self.layer(layer).k.k_row(run, bs, hd, slot % bs)
    }

    /// The value of `head` at `slot`, decoded.
    pub fn value(&self, layer: usize, slot: usize, head: usize) -> Vec<f32> {
        let (bs, hd) = (self.block_size, self.head_dim);
        let run = self.block_offset(slot / bs, head);
        self.layer(layer).v.v_row(run, hd, slot % bs)
    }

    /// Stores the K and V of every token of a step at its slot.
    ///
    /// `qkv` holds one row of `row_stride` floats per token; the token's K
    /// heads start at `k_offset` and its V heads at `v_offset` in that row
    /// (the fused q/k/v projection output). `slot_mapping[t]` is token `t`'s
    /// slot, `block_id * block_size + offset`.
    pub fn write(
        &mut self,
        layer: usize,
        slot_mapping: &[usize],
        qkv: &[f32],
        row_stride: usize,
        k_offset: usize,
        v_offset: usize,
    ) {
        let (bs, hd, nkv) = (self.block_size, self.head_dim, self.num_kv_heads);
        let LayerKv { k, v } = &mut self.tensors[self.layer_at[layer].1];
        for (t, &slot) in slot_mapping.iter().enumerate() {
            debug_assert!(slot / bs < self.num_blocks, "slot {slot} outside the cache");
            let (block, offset) = (slot / bs, slot % bs);
            let row = &qkv[t * row_stride..(t + 1) * row_stride];
            for h in 0..nkv {
                let run = (block * nkv + h) * bs * hd;
                k.write_k_row(
                    run,
                    bs,
                    offset,
                    &row[k_offset + h * hd..k_offset + (h + 1) * hd],
                );
                v.write_v_row(
                    run,
                    offset,
                    &row[v_offset + h * hd..v_offset + (h + 1) * hd],
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_gives_whole_blocks() {
        let (model, _) = crate::builtin::config("tiny").unwrap();
        // 2 layers × 2 (K,V) × 16 tokens × 2 heads × 32 dims × 4 bytes.
        assert_eq!(KvCacheConfig::bytes_per_block(&model, 16), 16384);
        let c = KvCacheConfig::from_memory_budget(&model, 16, 16384 * 10 + 5).unwrap();
        assert_eq!(c.num_blocks, 10);
        let e = KvCacheConfig::from_memory_budget(&model, 16, 16384).unwrap_err();
        assert!(e.to_string().contains("at least 2"), "{e}");
    }

    #[test]
    fn a_cache_larger_than_memory_is_an_error_not_an_abort() {
        let (model, _) = crate::builtin::config("tiny").unwrap();
        // 2^24 blocks of 1024 tokens × 1 KiB per token: 16 TiB, more than
        // any machine running this test has (and refused without the
        // pre-check by the fallible allocation).
        let e = KvCache::new(&model, KvCacheConfig::new(1024, 1 << 24))
            .err()
            .expect("16 TiB cannot be allocated");
        let msg = e.to_string();
        assert!(
            msg.starts_with("16 TiB requested for the KV cache"),
            "{msg}"
        );
        // Past what a usize can address.
        let e = KvCache::new(&model, KvCacheConfig::new(1 << 40, 1 << 40))
            .err()
            .unwrap();
        assert!(e.to_string().contains("too large to address"), "{e}");
        // A budget with an absurd block size holds no block; no overflow.
        let e = KvCacheConfig::from_memory_budget(&model, usize::MAX, 1 << 30).unwrap_err();
        assert!(e.to_string().contains("at least 2"), "{e}");
    }

    #[test]
    fn the_memory_check_names_both_sizes() {
        check_fits(1 << 30, None).unwrap();
        check_fits(1 << 30, Some(1 << 30)).unwrap();
        let e = check_fits(100 << 30, Some(22_870_000_000)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "100 GiB requested for the KV cache, but only 21.3 GiB of memory is available"
        );
    }

    #[test]
    fn more_blocks_than_the_scheduler_takes_are_refused() {
        let (model, _) = crate::builtin::config("tiny").unwrap();
        // One token (1 KiB) per block: 16 GiB, which passes the memory check
        // on a large machine and fails it on a small one. Either way it is
        // refused before anything is allocated.
        let e = KvCache::new(&model, KvCacheConfig::new(1, MAX_NUM_GPU_BLOCKS + 1))
            .err()
            .expect("refused");
        let msg = e.to_string();
        assert!(
            msg.contains("more than the scheduler's limit of 16777216 blocks")
                || msg.contains("of memory is available"),
            "{msg}"
        );
    }

    #[test]
    fn zeroed_buffers_are_zero_and_huge_ones_fail() {
        for dtype in KvDtype::ALL {
            let t = KvTensor::zeroed(dtype, 64).unwrap();
            assert_eq!(t.dtype(), dtype);
            assert_eq!(t.count_nonzero(), 0);
            assert_eq!(t.v_row(0, 64, 0), vec![0.0; 64]);
            assert!(KvTensor::zeroed(dtype, usize::MAX / 2).is_none());
        }
        assert!(KvTensor::zeroed(KvDtype::F32, 0).is_some());
    }

    #[test]
    fn the_budget_and_the_allocation_follow_the_dtype() {
        let (model, _) = crate::builtin::config("tiny").unwrap();
        // 2 layers × 2 (K,V) × 16 tokens × 2 heads × one 32-dim row.
        for (dtype, row) in [
            (KvDtype::F32, 128),
            (KvDtype::Bf16, 64),
            (KvDtype::F16, 64),
            (KvDtype::Q8_0, 34),
        ] {
            let c = KvCacheConfig::new(16, 0).with_dtype(dtype);
            assert_eq!(c.block_bytes(&model), 2 * 2 * 16 * 2 * row, "{dtype:?}");
            let c = c
                .with_memory_budget(&model, 10 * c.block_bytes(&model))
                .unwrap();
            assert_eq!(c.num_blocks, 10);
            assert_eq!(c.size_in_bytes(&model), 10 * c.block_bytes(&model));
            let kv = KvCache::new(&model, c).unwrap();
            assert_eq!(kv.dtype(), dtype);
            assert_eq!(kv.layer(0).k.dtype(), dtype);
        }
    }

    #[test]
    fn write_lands_at_the_slot() {
        let (model, _) = crate::builtin::config("tiny").unwrap();
        let mut kv = KvCache::new(&model, KvCacheConfig::new(4, 3)).unwrap();
        let (nkv, hd) = (2, 32);
        // One token row: [k heads | v heads], k = 1.0 + head, v = -1.0 - head.
        let mut row = vec![0.0; 2 * nkv * hd];
        for h in 0..nkv {
            row[h * hd..(h + 1) * hd].fill(1.0 + h as f32);
            row[(nkv + h) * hd..(nkv + h + 1) * hd].fill(-1.0 - h as f32);
        }
        // Slot 9 = block 2, offset 1.
        kv.write(1, &[9], &row, row.len(), 0, nkv * hd);
        assert_eq!(kv.key(1, 9, 1), vec![2.0; hd]);
        assert_eq!(kv.value(1, 9, 1), vec![-2.0; hd]);
        assert_eq!(kv.key(1, 9, 0), vec![1.0; hd]);
        assert_eq!(kv.key(1, 8, 0), vec![0.0; hd]);
        assert_eq!(kv.layer(0).k.count_nonzero(), 0);
        assert_eq!(kv.layer(1).k.count_nonzero(), nkv * hd);
    }
}
