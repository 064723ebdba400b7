//! Paged attention over a flattened batch that mixes prefill chunks and
//! decodes.
//!
//! Contract: for every sequence of the batch, query token `i` (of
//! `query_len`) sits at position `p = context_len - query_len + i` and
//! attends to the keys at positions `lo(p)..=p`, read through the
//! sequence's block table — its cached context and its own new tokens
//! causally. `lo(p)` is 0 for full attention, `p + 1 - W` for a sliding
//! window of `W` tokens (its own included) and the start of `p`'s chunk for
//! chunked-local attention (`AttentionShape::kind`). Blocks that lie wholly
//! before an item's first `lo` are never touched: a sliding-window group's
//! table holds the null block there, or a block since given to another
//! request (the scheduler frees them). The step's K/V must already be in the
//! cache (`KvCache::write` runs first), so new and cached keys are read the
//! same way.
//!
//! How: work is split into items of (sequence, KV head, chunk of up to
//! `QUERY_CHUNK` query tokens), run with `kernels::parallel_for`. An item
//! keeps every query head of its KV head's group together, so each cached K
//! and V block is loaded once and reused from L1 by all of them (GQA). Keys
//! are visited in chunks of 16 with an online (streaming) softmax, so memory
//! stays bounded at any context length. The cache stores K transposed
//! within a block (`[head_dim, block_size]`, see `kv_cache`), so 16 scores
//! come out of one vector accumulator with no horizontal sums: `s[j] += q[d]
//! · K[d][j]` over `d`.
//!
//! The result of a query row depends only on its own query and keys, never
//! on how the batch or the chunks are cut (every row takes the same
//! sequence of operations whatever else is in its item): batched, chunked
//! and single-request runs give bitwise identical numbers.
//!
//! Kernels: an AVX-512F one and an AVX2+FMA one written with `std::arch`
//! intrinsics (the same algorithm on 512- and 256-bit vectors), and a
//! portable one compiled twice (with AVX2+FMA enabled, for heads the AVX2
//! kernel does not take, and plain), picked at run time by the kernels' one
//! dispatch (`KernelFamily::Attention`).
//!
//! Cache element types: an f32 cache is read in place; a bf16, f16 or
//! q8_0 one is decoded a chunk of 16 keys at a time into two small f32
//! tiles (K `[head_dim, 16]`, V `[16, head_dim]`, 8 KiB at head_dim 64)
//! that stay in L1 while every row of the item uses them, so the scoring
//! and accumulation loops are the f32 ones and the decoding is paid once
//! per chunk and item, not per query head. Decoding is exact
//! (`kv_cache::KvTensor`), so the bitwise promise above holds for every
//! type.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;

use crate::kernels::parallel_for;
use crate::kernels::SyncPtr;
use crate::kv_cache::{LayerKv, KEY_TILE};
use crate::model::SeqSlice;
use sluice_core::kv_cache::AttentionKind;
use std::cell::RefCell;

/// Query tokens of one sequence handled by one work item.
const QUERY_CHUNK: usize = 16;
/// Keys scored together (one AVX-512 vector of scores), the decoded
/// tiles' width.
const KEY_CHUNK: usize = KEY_TILE;

/// Geometry of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Softmax scale: the layer's (`1 / sqrt(head_dim)` unless its
    /// architecture configures another).
    pub scale: f32,
    /// Gemma 2's attention-logit soft-cap: scaled scores become
    /// `tanh(s / cap) · cap` before the softmax. `None` leaves them as
    /// they are (and runs exactly the uncapped operations).
    pub logit_softcap: Option<f32>,
    /// Which earlier keys a query sees: all of them, a sliding window or its
    /// chunk.
    pub kind: AttentionKind,
}

/// The queries of a step: token `t`'s head `h` starts at
/// `t * row_stride + h * head_dim` (the q part of the fused q/k/v rows).
#[derive(Clone, Copy)]
pub struct Queries<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
}

/// One unit of parallel work.
#[derive(Clone, Copy, Debug)]
pub struct WorkItem {
    seq: u32,
    kv_head: u32,
    /// First query token of the chunk, relative to the sequence.
    q_begin: u32,
    q_end: u32,
}

/// Everything a kernel needs for one work item. Rows are the item's
/// (query token, query head) pairs, ordered token-major.
struct Item<'a> {
    shape: AttentionShape,
    q: Queries<'a>,
    kv: &'a LayerKv,
    table: &'a [u32],
    kv_head: usize,
    /// Batch row of the sequence's first query token.
    query_start: usize,
    /// Position of the sequence's first query token.
    first_pos: usize,
    q_begin: usize,
    q_end: usize,
}

impl Item<'_> {
    fn group(&self) -> usize {
        self.shape.num_heads / self.shape.num_kv_heads
    }

    fn num_rows(&self) -> usize {
        (self.q_end - self.q_begin) * self.group()
    }

    /// Keys `0..last_visible` are needed by some row of the item.
    fn last_visible(&self) -> usize {
        self.first_pos + self.q_end
    }

    /// The first key query token `i` sees.
    #[inline]
    fn window_start(&self, i: usize) -> usize {
        let p = self.first_pos + i;
        match self.shape.kind {
            AttentionKind::Full => 0,
            AttentionKind::SlidingWindow { window } => (p + 1).saturating_sub(window),
            AttentionKind::ChunkedLocal { chunk } => p - p % chunk,
        }
    }

    /// The first block some row of the item reads (rows are in position
    /// order and `window_start` never decreases with the position).
    fn first_block(&self) -> usize {
        self.window_start(self.q_begin) / self.shape.block_size
    }

    /// Keys at positions `chunk_start..` visible to query token `i`, at most
    /// `width`: those at offsets `skip..end` of the chunk, as `(skip, end)`
    /// (`skip == end` when none).
    #[inline]
    fn visible(&self, i: usize, chunk_start: usize, width: usize) -> (usize, usize) {
        let end = (self.first_pos + i + 1)
            .saturating_sub(chunk_start)
            .min(width);
        let skip = self.window_start(i).saturating_sub(chunk_start).min(end);
        (skip, end)
    }

    /// Offset of row `row`'s query in `q.data`.
    fn q_offset(&self, row: usize) -> usize {
        let group = self.group();
        let token = self.query_start + self.q_begin + row / group;
        let head = self.kv_head * group + row % group;
        token * self.q.row_stride + head * self.shape.head_dim
    }

    /// Offset of row `row`'s output in the `[tokens × heads·head_dim]` out.
    fn out_offset(&self, row: usize) -> usize {
        let group = self.group();
        let token = self.query_start + self.q_begin + row / group;
        let head = self.kv_head * group + row % group;
        token * self.shape.num_heads * self.shape.head_dim + head * self.shape.head_dim
    }

    /// Start of the (block, KV head) run in the layer's K and V storage.
    fn block_base(&self, block: u32) -> usize {
        let s = &self.shape;
        (block as usize * s.num_kv_heads + self.kv_head) * s.block_size * s.head_dim
    }
}

/// A chunk of at most `KEY_CHUNK` keys of one block: the unit every
/// kernel scores and accumulates.
#[derive(Clone, Copy)]
struct KeyChunk {
    /// Start of its block's (block, KV head) run (`Item::block_base`).
    base: usize,
    /// Its first key's offset within the block.
    offset: usize,
    /// Its first key's position.
    start: usize,
    /// Its keys: `KEY_CHUNK`, or the block's remainder.
    width: usize,
}

impl Item<'_> {
    /// The chunks of keys some row of the item sees, in position order:
    /// every block from the first one read, cut into `KEY_CHUNK` keys,
    /// up to `last_visible`.
    fn key_chunks(&self) -> impl Iterator<Item = KeyChunk> + '_ {
        let bs = self.shape.block_size;
        let last_visible = self.last_visible();
        let first_block = self.first_block();
        let blocks = &self.table[first_block..last_visible.div_ceil(bs)];
        (first_block..).zip(blocks).flat_map(move |(b, &block)| {
            let base = self.block_base(block);
            (0..bs)
                .step_by(KEY_CHUNK)
                .take_while(move |&c0| b * bs + c0 < last_visible)
                .map(move |c0| KeyChunk {
                    base,
                    offset: c0,
                    start: b * bs + c0,
                    width: KEY_CHUNK.min(bs - c0),
                })
        })
    }
}

/// Per-thread scratch: output accumulators, running max and sum per row,
/// and the decoded K and V tiles of a chunk (for a cache not in f32).
#[derive(Default)]
struct Scratch {
    acc: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    k_tile: Vec<f32>,
    v_tile: Vec<f32>,
}

impl Scratch {
    fn reset(&mut self, rows: usize, head_dim: usize) {
        self.acc.clear();
        self.acc.resize(rows * head_dim, 0.0);
        self.max.clear();
        self.max.resize(rows, f32::NEG_INFINITY);
        self.sum.clear();
        self.sum.resize(rows, 0.0);
        // Zeros, so that lanes past a short chunk's keys are finite.
        self.k_tile.clear();
        self.k_tile.resize(head_dim * KEY_CHUNK, 0.0);
        self.v_tile.clear();
        self.v_tile.resize(KEY_CHUNK * head_dim, 0.0);
    }
}

impl Item<'_> {
    /// Writes each row's accumulated `p · V` divided by its softmax sum to
    /// its place in `out`: the last step of every kernel.
    fn write_rows(&self, out: &mut [f32], scratch: &Scratch) {
        let hd = self.shape.head_dim;
        for row in 0..self.num_rows() {
            let inv = 1.0 / scratch.sum[row];
            let o = self.out_offset(row);
            for (d, &a) in out[o..o + hd]
                .iter_mut()
                .zip(&scratch.acc[row * hd..(row + 1) * hd])
            {
                *d = a * inv;
            }
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Computes attention for every token of the batch into `out`
/// (`[num_tokens × num_heads·head_dim]`). `items` is scratch reused across
/// calls.
pub fn paged_attention(
    shape: &AttentionShape,
    q: Queries<'_>,
    kv: &LayerKv,
    seqs: &[SeqSlice],
    block_tables: &[u32],
    out: &mut [f32],
    items: &mut Vec<WorkItem>,
) {
    items.clear();
    for (s, seq) in seqs.iter().enumerate() {
        debug_assert!(seq.query_len <= seq.context_len);
        for kv_head in 0..shape.num_kv_heads {
            let mut q_begin = 0;
            while q_begin < seq.query_len {
                let q_end = (q_begin + QUERY_CHUNK).min(seq.query_len);
                items.push(WorkItem {
                    seq: s as u32,
                    kv_head: kv_head as u32,
                    q_begin: q_begin as u32,
                    q_end: q_end as u32,
                });
                q_begin = q_end;
            }
        }
    }
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let out_len = out.len();
    let kernel = select_kernel(shape.head_dim);
    let items: &[WorkItem] = items;
    parallel_for(items.len(), |i| {
        let w = items[i];
        let seq = &seqs[w.seq as usize];
        let item = Item {
            shape: *shape,
            q,
            kv,
            table: &block_tables[seq.block_table.clone()],
            kv_head: w.kv_head as usize,
            query_start: seq.query_start,
            first_pos: seq.context_len - seq.query_len,
            q_begin: w.q_begin as usize,
            q_end: w.q_end as usize,
        };
        // SAFETY: each item writes only the output rows of its own
        // (query tokens, query heads of its KV head), which no other item
        // touches; `out` outlives `parallel_for`.
        let out = unsafe { std::slice::from_raw_parts_mut(out_ptr.get(), out_len) };
        SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            // SAFETY: `kernel` was chosen by `select_kernel` for a CPU that
            // has the target features it was compiled for.
            unsafe { kernel(&item, out, scratch) };
        });
    });
}

type Kernel = unsafe fn(&Item<'_>, &mut [f32], &mut Scratch);

/// The attention kernel of the path the kernels' one dispatch gives the
/// attention family (so `SLUICE_KERNEL` / `set_kernel_path` steer it like
/// every other kernel).
fn select_kernel(head_dim: usize) -> Kernel {
    use crate::kernels::{select_path, KernelFamily, KernelPath};
    match select_path(KernelFamily::Attention, None) {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => avx512::attend,
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 if avx2::supports(head_dim) => avx2::attend,
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => portable::attend_avx2,
        _ => portable::attend_plain,
    }
}

/// The portable kernel, whatever the CPU (for tests comparing paths).
pub fn paged_attention_portable(
    shape: &AttentionShape,
    q: Queries<'_>,
    kv: &LayerKv,
    seqs: &[SeqSlice],
    block_tables: &[u32],
    out: &mut [f32],
) {
    let mut scratch = Scratch::default();
    for seq in seqs {
        for kv_head in 0..shape.num_kv_heads {
            let item = Item {
                shape: *shape,
                q,
                kv,
                table: &block_tables[seq.block_table.clone()],
                kv_head,
                query_start: seq.query_start,
                first_pos: seq.context_len - seq.query_len,
                q_begin: 0,
                q_end: seq.query_len,
            };
            // SAFETY: the plain kernel needs no target feature.
            unsafe { portable::attend_plain(&item, out, &mut scratch) };
        }
    }
}

#[cfg(test)]
mod tests;
