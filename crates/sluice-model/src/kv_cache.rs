//! The paged KV cache: per-layer K and V storage addressed by the
//! scheduler's block ids, sized from a memory budget.
//!
//! Layout, per layer, f32:
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
//! Why f32 even for bf16 models: K and V come out of f32 activations and
//! are consumed by f32 attention; keeping them in f32 adds no rounding on top
//! of the weights' and needs no conversion in the attention loop. The cost
//! is memory, and at the sizes this runner targets the KV traffic of a
//! decode step is a few percent of the weight traffic (Qwen2.5-0.5B, 32
//! requests × 256 tokens: ~100 MB of KV against 773 MB of bf16 weights), so
//! halving it would buy little speed. The budget decides how many tokens fit.
//!
//! Promises: block 0 (the scheduler's null block) is allocated but never
//! written through a valid block table; `write` only touches the slots it is
//! given; storage pages are only committed when first written (the buffers
//! are zero-initialised lazily by the allocator).

use crate::config::ModelConfig;
use anyhow::{bail, Result};

/// How many blocks of how many tokens the cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Tokens per block; must equal the scheduler's `block_size`.
    pub block_size: usize,
    /// Blocks in the pool, null block included (the scheduler's
    /// `num_gpu_blocks`).
    pub num_blocks: usize,
}

impl KvCacheConfig {
    pub fn new(block_size: usize, num_blocks: usize) -> Self {
        KvCacheConfig {
            block_size,
            num_blocks,
        }
    }

    /// Bytes one block takes across all layers, K and V.
    pub fn bytes_per_block(model: &ModelConfig, block_size: usize) -> usize {
        2 * model.num_hidden_layers
            * block_size
            * model.num_key_value_heads
            * model.head_dim
            * std::mem::size_of::<f32>()
    }

    /// As many blocks as fit in `budget_bytes` (a `--kv-cache-memory` style
    /// setting). Fails when fewer than two blocks fit (block 0 is reserved).
    pub fn from_memory_budget(
        model: &ModelConfig,
        block_size: usize,
        budget_bytes: usize,
    ) -> Result<Self> {
        if block_size == 0 {
            bail!("block_size must be at least 1");
        }
        let per_block = Self::bytes_per_block(model, block_size);
        let num_blocks = budget_bytes / per_block;
        if num_blocks < 2 {
            bail!(
                "KV cache memory budget of {budget_bytes} bytes holds {num_blocks} block(s) of \
                 {per_block} bytes; at least 2 are needed (block 0 is reserved)"
            );
        }
        Ok(KvCacheConfig {
            block_size,
            num_blocks,
        })
    }

    pub fn size_in_bytes(&self, model: &ModelConfig) -> usize {
        self.num_blocks * Self::bytes_per_block(model, self.block_size)
    }
}

/// K and V of one layer.
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The cache itself: one `LayerKv` per decoder layer.
pub struct KvCache {
    block_size: usize,
    num_blocks: usize,
    num_kv_heads: usize,
    head_dim: usize,
    layers: Vec<LayerKv>,
}

impl KvCache {
    pub fn new(model: &ModelConfig, config: KvCacheConfig) -> Result<Self> {
        if config.block_size == 0 {
            bail!("block_size must be at least 1");
        }
        if config.num_blocks < 2 {
            bail!(
                "the KV cache needs at least 2 blocks (block 0 is reserved), got {}",
                config.num_blocks
            );
        }
        let per_layer = config
            .num_blocks
            .checked_mul(config.block_size)
            .and_then(|x| x.checked_mul(model.num_key_value_heads * model.head_dim));
        let Some(per_layer) = per_layer.filter(|&n| n.checked_mul(4).is_some()) else {
            bail!(
                "KV cache of {} blocks × {} tokens is too large to address",
                config.num_blocks,
                config.block_size
            );
        };
        let mut layers = Vec::with_capacity(model.num_hidden_layers);
        for _ in 0..model.num_hidden_layers {
            layers.push(LayerKv {
                k: vec![0.0; per_layer],
                v: vec![0.0; per_layer],
            });
        }
        Ok(KvCache {
            block_size: config.block_size,
            num_blocks: config.num_blocks,
            num_kv_heads: model.num_key_value_heads,
            head_dim: model.head_dim,
            layers,
        })
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

    pub fn layer(&self, layer: usize) -> &LayerKv {
        &self.layers[layer]
    }

    /// Offset of the `block_size × head_dim` run of `head` in `block` (in
    /// both K and V).
    #[inline]
    pub fn block_offset(&self, block: usize, head: usize) -> usize {
        (block * self.num_kv_heads + head) * self.block_size * self.head_dim
    }

    /// The key of `head` at `slot`, gathered from its transposed run.
    pub fn key(&self, layer: usize, slot: usize, head: usize) -> Vec<f32> {
        let (bs, hd) = (self.block_size, self.head_dim);
        let base = self.block_offset(slot / bs, head);
        let k = &self.layers[layer].k;
        (0..hd).map(|d| k[base + d * bs + slot % bs]).collect()
    }

    /// The value of `head` at `slot`.
    pub fn value(&self, layer: usize, slot: usize, head: usize) -> &[f32] {
        let (bs, hd) = (self.block_size, self.head_dim);
        let at = self.block_offset(slot / bs, head) + (slot % bs) * hd;
        &self.layers[layer].v[at..at + hd]
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
        let LayerKv { k, v } = &mut self.layers[layer];
        for (t, &slot) in slot_mapping.iter().enumerate() {
            debug_assert!(slot / bs < self.num_blocks, "slot {slot} outside the cache");
            let (block, offset) = (slot / bs, slot % bs);
            let row = &qkv[t * row_stride..(t + 1) * row_stride];
            for h in 0..nkv {
                let run = (block * nkv + h) * bs * hd;
                let k_src = &row[k_offset + h * hd..k_offset + (h + 1) * hd];
                for (d, &x) in k_src.iter().enumerate() {
                    k[run + d * bs + offset] = x;
                }
                let dst = run + offset * hd;
                v[dst..dst + hd].copy_from_slice(&row[v_offset + h * hd..v_offset + (h + 1) * hd]);
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
        assert_eq!(kv.layer(0).k.iter().filter(|&&x| x != 0.0).count(), 0);
        assert_eq!(
            kv.layer(1).k.iter().filter(|&&x| x != 0.0).count(),
            nkv * hd
        );
    }
}
