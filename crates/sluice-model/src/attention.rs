//! Paged attention over a flattened batch that mixes prefill chunks and
//! decodes.
//!
//! Contract: for every sequence of the batch, query token `i` (of
//! `query_len`) sits at position `context_len - query_len + i` and attends
//! to every key at positions `0..=` its own, read through the sequence's
//! block table — its cached context in full and its own new tokens
//! causally. The step's K/V must already be in the cache (`KvCache::write`
//! runs first), so new and cached keys are read the same way.
//!
//! How: work is split into items of (sequence, KV head, chunk of up to
//! `QUERY_CHUNK` query tokens), run with `kernels::parallel_for`. An item
//! keeps every query head of its KV head's group together, so each cached K
//! and V block is loaded once and reused from L1 by all of them (GQA). Keys
//! are visited block by block with an online (streaming) softmax, so memory
//! stays bounded at any context length. The result of a query row depends
//! only on its own query and keys, never on how the batch or the chunks are
//! cut: batched, chunked and single-request runs give identical numbers.
//!
//! SIMD: the item loop is compiled three times (AVX-512F, AVX2+FMA,
//! portable) from the same source and picked at run time; the inner loops
//! (dot products with 16 independent lanes, a polynomial `exp`, axpy) are
//! written so the compiler vectorises them for whichever target is enabled.

use crate::kernels::parallel_for;
use crate::kv_cache::LayerKv;
use crate::model::{SeqSlice, SyncPtr};
use std::cell::RefCell;

/// Query tokens of one sequence handled by one work item.
const QUERY_CHUNK: usize = 16;

/// Geometry of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Softmax scale, `1 / sqrt(head_dim)`.
    pub scale: f32,
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
    let AttentionShape {
        num_heads,
        num_kv_heads,
        head_dim,
        ..
    } = *shape;
    let out_stride = num_heads * head_dim;
    items.clear();
    for (s, seq) in seqs.iter().enumerate() {
        debug_assert!(seq.query_len <= seq.context_len);
        for kv_head in 0..num_kv_heads {
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
    let kernel = select_kernel();
    let items: &[WorkItem] = items;
    parallel_for(items.len(), |i| {
        let item = items[i];
        let seq = &seqs[item.seq as usize];
        let table = &block_tables[seq.block_table.clone()];
        // SAFETY: each item writes only the output rows of its own
        // (sequence, query tokens, query heads of its KV head), which no
        // other item touches; `out` outlives `parallel_for`.
        let out = unsafe { std::slice::from_raw_parts_mut(out_ptr.get(), out_len) };
        // SAFETY: `kernel` was chosen by `select_kernel` for a CPU that has
        // the target features it was compiled for.
        unsafe { kernel(shape, q, kv, seq, table, item, out, out_stride) };
    });
}

type Kernel = unsafe fn(
    &AttentionShape,
    Queries<'_>,
    &LayerKv,
    &SeqSlice,
    &[u32],
    WorkItem,
    &mut [f32],
    usize,
);

fn select_kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return attend_avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return attend_avx2;
        }
    }
    attend_portable
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx512(
    shape: &AttentionShape,
    q: Queries<'_>,
    kv: &LayerKv,
    seq: &SeqSlice,
    table: &[u32],
    item: WorkItem,
    out: &mut [f32],
    out_stride: usize,
) {
    attend::<true>(shape, q, kv, seq, table, item, out, out_stride)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2(
    shape: &AttentionShape,
    q: Queries<'_>,
    kv: &LayerKv,
    seq: &SeqSlice,
    table: &[u32],
    item: WorkItem,
    out: &mut [f32],
    out_stride: usize,
) {
    attend::<true>(shape, q, kv, seq, table, item, out, out_stride)
}

#[allow(clippy::too_many_arguments)]
unsafe fn attend_portable(
    shape: &AttentionShape,
    q: Queries<'_>,
    kv: &LayerKv,
    seq: &SeqSlice,
    table: &[u32],
    item: WorkItem,
    out: &mut [f32],
    out_stride: usize,
) {
    attend::<false>(shape, q, kv, seq, table, item, out, out_stride)
}

/// Per-thread scratch: accumulators, running max and sum per query row, and
/// one block of scores.
#[derive(Default)]
struct Scratch {
    acc: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    scores: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// One work item: query tokens `q_begin..q_end` of `seq`, every query head
/// of `kv_head`. Rows are ordered (token, head in group).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend<const FMA: bool>(
    shape: &AttentionShape,
    q: Queries<'_>,
    kv: &LayerKv,
    seq: &SeqSlice,
    table: &[u32],
    item: WorkItem,
    out: &mut [f32],
    out_stride: usize,
) {
    let hd = shape.head_dim;
    let bs = shape.block_size;
    let group = shape.num_heads / shape.num_kv_heads;
    let kv_head = item.kv_head as usize;
    let (q_begin, q_end) = (item.q_begin as usize, item.q_end as usize);
    let num_rows = (q_end - q_begin) * group;
    // Position of query token i is first_pos + i.
    let first_pos = seq.context_len - seq.query_len;
    let last_visible = first_pos + q_end; // keys 0..last_visible are needed
    let num_kv_blocks = last_visible.div_ceil(bs);
    let head_run = bs * hd;

    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let Scratch {
            acc,
            max,
            sum,
            scores,
        } = &mut *scratch;
        acc.clear();
        acc.resize(num_rows * hd, 0.0);
        max.clear();
        max.resize(num_rows, f32::NEG_INFINITY);
        sum.clear();
        sum.resize(num_rows, 0.0);
        scores.resize(bs, 0.0);

        for (b, &block) in table[..num_kv_blocks].iter().enumerate() {
            let block = block as usize;
            let base = (block * shape.num_kv_heads + kv_head) * head_run;
            let k_block = &kv.k[base..base + head_run];
            let v_block = &kv.v[base..base + head_run];
            let block_start = b * bs;
            for i in q_begin..q_end {
                // Keys visible to token i in this block.
                let visible = (first_pos + i + 1).saturating_sub(block_start).min(bs);
                if visible == 0 {
                    continue;
                }
                let token = seq.query_start + i;
                for g in 0..group {
                    let h = kv_head * group + g;
                    let row = (i - q_begin) * group + g;
                    let q_off = token * q.row_stride + h * hd;
                    let q_row = &q.data[q_off..q_off + hd];
                    let s = &mut scores[..visible];
                    let mut block_max = f32::NEG_INFINITY;
                    for (j, s_j) in s.iter_mut().enumerate() {
                        *s_j = dot::<FMA>(q_row, &k_block[j * hd..(j + 1) * hd]) * shape.scale;
                        block_max = block_max.max(*s_j);
                    }
                    let m_old = max[row];
                    let m_new = m_old.max(block_max);
                    let acc_row = &mut acc[row * hd..(row + 1) * hd];
                    if m_new > m_old {
                        // Rescale what was accumulated under the old max
                        // (a no-op on the first block, where it is zero).
                        let alpha = exp_f32(m_old - m_new);
                        sum[row] *= alpha;
                        for a in acc_row.iter_mut() {
                            *a *= alpha;
                        }
                        max[row] = m_new;
                    }
                    let mut block_sum = 0.0;
                    for s_j in s.iter_mut() {
                        *s_j = exp_f32(*s_j - m_new);
                        block_sum += *s_j;
                    }
                    sum[row] += block_sum;
                    for (j, &p) in s.iter().enumerate() {
                        axpy::<FMA>(acc_row, p, &v_block[j * hd..(j + 1) * hd]);
                    }
                }
            }
        }

        for i in q_begin..q_end {
            let token = seq.query_start + i;
            for g in 0..group {
                let h = kv_head * group + g;
                let row = (i - q_begin) * group + g;
                let inv = 1.0 / sum[row];
                let dst = &mut out[token * out_stride + h * hd..token * out_stride + (h + 1) * hd];
                for (d, &a) in dst.iter_mut().zip(&acc[row * hd..(row + 1) * hd]) {
                    *d = a * inv;
                }
            }
        }
    });
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Dot product with 16 independent partial sums (one AVX-512 register, two
/// AVX2 ones), reduced pairwise.
#[inline(always)]
pub(crate) fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let mut ca = a.chunks_exact(L);
    let mut cb = b.chunks_exact(L);
    for (xa, xb) in (&mut ca).zip(&mut cb) {
        for l in 0..L {
            acc[l] = madd::<FMA>(xa[l], xb[l], acc[l]);
        }
    }
    let mut tail = 0.0;
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        tail = madd::<FMA>(x, y, tail);
    }
    let mut width = L / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0] + tail
}

/// `y += a · x`.
#[inline(always)]
fn axpy<const FMA: bool>(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = madd::<FMA>(a, xi, *yi);
    }
}

/// `e^x` within ~2 ulp of `f32::exp`, in plain arithmetic so that loops
/// over it vectorise. The argument is clamped to [-87, 88]: below, `e^x`
/// would be subnormal and comes out as about 1e-38 instead (no softmax or
/// sigmoid can tell); above, it would overflow.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a high part exact in f32 and a low correction.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer kept in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let k = x * LOG2E + MAGIC;
    let n_bits = k.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let n = k - MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf).
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let er = p * r * r + r + 1.0;
    f32::from_bits((er.to_bits() as i32).wrapping_add(n_bits << 23) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (a, b) = (exp_f32(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) < 1e-37);
    }

    #[test]
    fn dot_handles_tails() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b = vec![2.0; 37];
        let want: f32 = a.iter().sum::<f32>() * 2.0;
        assert_eq!(dot::<false>(&a, &b), want);
        assert_eq!(dot::<true>(&a, &b), want);
    }
}
