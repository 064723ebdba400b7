use super::*;
use crate::kernels::{cpu_features, thread_cap, KernelFamily, KernelPath};
use crate::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use crate::model::ForwardBatch;

/// `paged_attention` of `batch` into a new output of `out_len` floats.
fn attend(
    shape: &AttentionShape,
    queries: Queries<'_>,
    kv: &KvCache,
    batch: &ForwardBatch,
    out_len: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; out_len];
    paged_attention(
        shape,
        queries,
        kv.layer(0),
        &batch.seqs,
        &batch.block_tables[0],
        &mut out,
        &mut Vec::new(),
    );
    out
}

/// The attention kernels this CPU runs (each the path it is asked for).
fn runnable_paths() -> Vec<KernelPath> {
    KernelPath::ALL
        .into_iter()
        .filter(|&p| cpu_features().clamp(KernelFamily::Attention, p) == p)
        .collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }
}

/// A mixed batch (decodes, a fresh prefill, a chunk continuing a cached
/// context) over shuffled blocks, checked against a float64 softmax
/// attention computed from the K/V written for each position.
fn check_against_naive(num_heads: usize, num_kv_heads: usize, head_dim: usize, block_size: usize) {
    check_against_naive_capped(num_heads, num_kv_heads, head_dim, block_size, None);
}

fn check_against_naive_capped(
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    softcap: Option<f32>,
) {
    check_against_naive_windowed(
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        softcap,
        AttentionKind::Full,
        KvDtype::F32,
    );
}

/// The first key position `p` sees under `kind`, from the definition.
fn naive_window_start(kind: AttentionKind, p: usize) -> usize {
    match kind {
        AttentionKind::Full => 0,
        AttentionKind::SlidingWindow { window } => (p + 1).saturating_sub(window),
        AttentionKind::ChunkedLocal { chunk } => (p / chunk) * chunk,
    }
}

/// The unnormalised softmax weights of query `q` over the keys at
/// `positions` (`key(p)`), in f64 from the definition, and their sum.
fn naive_weights<'a>(
    q: &[f32],
    key: impl Fn(usize) -> &'a [f32],
    positions: std::ops::RangeInclusive<usize>,
    scale: f32,
    softcap: Option<f32>,
) -> (Vec<f64>, f64) {
    let scores: Vec<f64> = positions
        .map(|p| {
            let dot: f64 = q
                .iter()
                .zip(key(p))
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            dot * scale as f64
        })
        .map(|s| match softcap {
            Some(cap) => (s / cap as f64).tanh() * cap as f64,
            None => s,
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total = w.iter().sum();
    (w, total)
}

/// The fast and portable kernels against attention computed in f64 from
/// the definition, with the logits soft-capped at `softcap` if given, each
/// query seeing the keys `kind` gives it. With a window, the table entries
/// of blocks wholly before a sequence's first query's window are what the
/// scheduler leaves there — the null block, here filled with NaN for the
/// fast kernel (whose result must not change) and an id outside the cache
/// for the portable one (which would panic reading it). With a cache
/// that rounds (`dtype` not f32), the reference takes the K and V the cache
/// holds, decoded (`KvCache::key` / `value`): the kernels are checked on
/// what they read, the rounding by `kv_cache`'s own tests.
fn check_against_naive_windowed(
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    softcap: Option<f32>,
    kind: AttentionKind,
    dtype: KvDtype,
) {
    let mut model = crate::builtin::config("tiny").unwrap().0;
    model.num_hidden_layers = 1;
    model.num_attention_heads = num_heads;
    model.num_key_value_heads = num_kv_heads;
    model.head_dim = head_dim;
    // (cached tokens before the step, tokens in the step)
    let seqs = [
        (0usize, 1usize),
        (0, 37),
        (20, 1),
        (45, 19),
        (3, 16),
        (70, 1),
        (50, 30),
    ];
    let num_blocks = 1 + seqs
        .iter()
        .map(|(c, n)| (c + n).div_ceil(block_size))
        .sum::<usize>();
    let config = KvCacheConfig::new(block_size, num_blocks).with_dtype(dtype);
    let mut kv = KvCache::new(&model, config).unwrap();
    let width = (num_heads + 2 * num_kv_heads) * head_dim;
    let (k_off, v_off) = (num_heads * head_dim, (num_heads + num_kv_heads) * head_dim);
    let mut rng = Rng(head_dim as u64 * 31 + block_size as u64);
    // Blocks handed out in a scrambled order.
    let mut free: Vec<u32> = (1..num_blocks as u32).collect();
    free.reverse();
    free.swap(0, 3);
    let mut batch = ForwardBatch::default();
    let mut outside = ForwardBatch::default();
    let mut rows_of_seq = Vec::new(); // every position's full q/k/v row
    for &(cached, n) in &seqs {
        let blocks: Vec<u32> = (0..(cached + n).div_ceil(block_size))
            .map(|_| free.pop().unwrap())
            .collect();
        // Blocks no query of the step reads.
        let dead = naive_window_start(kind, cached) / block_size;
        let nulled: Vec<u32> = (0..blocks.len())
            .map(|j| if j < dead { 0 } else { blocks[j] })
            .collect();
        let wild: Vec<u32> = (0..blocks.len())
            .map(|j| if j < dead { u32::MAX } else { blocks[j] })
            .collect();
        outside
            .push_seq(&vec![0; n], cached, &wild, block_size)
            .unwrap();
        let mut rows: Vec<Vec<f32>> = (0..cached + n)
            .map(|_| (0..width).map(|_| rng.next()).collect())
            .collect();
        batch
            .push_seq(&vec![0; n], cached, &nulled, block_size)
            .unwrap();
        // Cached positions and this step's both go in (the runner writes
        // the step's K/V before attention).
        for (p, row) in rows.iter_mut().enumerate() {
            let slot = blocks[p / block_size] as usize * block_size + p % block_size;
            kv.write(0, &[slot], row, width, k_off, v_off);
            // The reference sees what the cache holds.
            for g in 0..num_kv_heads {
                let (k, v) = (k_off + g * head_dim, v_off + g * head_dim);
                row[k..k + head_dim].copy_from_slice(&kv.key(0, slot, g));
                row[v..v + head_dim].copy_from_slice(&kv.value(0, slot, g));
            }
        }
        rows_of_seq.push(rows);
    }
    // The null block holds garbage: NaN everywhere.
    let nan_row = vec![f32::NAN; width];
    for slot in 0..block_size {
        kv.write(0, &[slot], &nan_row, width, k_off, v_off);
    }
    let mut q = vec![0f32; batch.num_tokens() * width];
    for (s, &(cached, n)) in seqs.iter().enumerate() {
        let start = batch.seqs[s].query_start;
        for i in 0..n {
            q[(start + i) * width..(start + i + 1) * width]
                .copy_from_slice(&rows_of_seq[s][cached + i]);
        }
    }
    let shape = AttentionShape {
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        scale: 1.0 / (head_dim as f32).sqrt(),
        logit_softcap: softcap,
        kind,
    };
    let queries = Queries {
        data: &q,
        row_stride: width,
    };
    let out_len = batch.num_tokens() * num_heads * head_dim;
    // Every kernel this CPU can run (the dispatch picks it in the calling
    // thread, which `thread_cap` caps).
    let paths: Vec<Vec<f32>> = runnable_paths()
        .into_iter()
        .map(|path| thread_cap::with(path, || attend(&shape, queries, &kv, &batch, out_len)))
        .collect();
    let mut portable = vec![0f32; out_len];
    paged_attention_portable(
        &shape,
        queries,
        kv.layer(0),
        &outside.seqs,
        &outside.block_tables[0],
        &mut portable,
    );

    let group = num_heads / num_kv_heads;
    let mut worst = 0f64;
    for (s, &(cached, n)) in seqs.iter().enumerate() {
        let rows = &rows_of_seq[s];
        for i in 0..n {
            let pos = cached + i;
            let token = batch.seqs[s].query_start + i;
            for h in 0..num_heads {
                let g = h / group;
                let qh = &rows[pos][h * head_dim..(h + 1) * head_dim];
                let lo = naive_window_start(kind, pos);
                let k = |p: usize| &rows[p][k_off + g * head_dim..k_off + (g + 1) * head_dim];
                let (w, total) = naive_weights(qh, k, lo..=pos, shape.scale, softcap);
                for d in 0..head_dim {
                    let want: f64 = (lo..=pos)
                        .map(|p| w[p - lo] * rows[p][v_off + g * head_dim + d] as f64)
                        .sum::<f64>()
                        / total;
                    let at = token * num_heads * head_dim + h * head_dim + d;
                    for got in paths.iter().map(|o| o[at]).chain([portable[at]]) {
                        worst = worst.max((got as f64 - want).abs());
                    }
                }
            }
        }
    }
    assert!(
        worst < 2e-5,
        "heads {num_heads}/{num_kv_heads} dim {head_dim} block {block_size} {kind:?} \
         {dtype:?}: max error {worst}"
    );
}

#[test]
fn windowed_attention_matches_naive_and_skips_blocks_outside_the_window() {
    let sliding = |window| AttentionKind::SlidingWindow { window };
    // Windows not multiples of the block size, one of exactly a block, one
    // of a single token, one longer than every context; chunks.
    for (kind, bs) in [
        (sliding(7), 16),
        (sliding(16), 16),
        (sliding(1), 16),
        (sliding(24), 5),
        (sliding(500), 16),
        (AttentionKind::ChunkedLocal { chunk: 24 }, 8),
        (AttentionKind::ChunkedLocal { chunk: 16 }, 16),
    ] {
        check_against_naive_windowed(8, 2, 64, bs, None, kind, KvDtype::F32);
        check_against_naive_windowed(4, 4, 72, bs, None, kind, KvDtype::F32);
    }
    check_against_naive_windowed(14, 2, 64, 16, Some(0.5), sliding(20), KvDtype::F32);
}

/// Every cache element type, on the shapes that take each decoding path:
/// whole 16-key chunks (the AVX-512 decoders), a block size below 16 (the
/// portable decoder), heads not a multiple of 16 (the portable V decoder),
/// several chunks per block, and a window.
#[test]
fn every_kv_dtype_matches_naive_attention_on_what_it_stores() {
    for dtype in [KvDtype::Bf16, KvDtype::F16, KvDtype::Q8_0] {
        let full = AttentionKind::Full;
        check_against_naive_windowed(14, 2, 64, 16, None, full, dtype);
        check_against_naive_windowed(8, 4, 32, 8, None, full, dtype);
        check_against_naive_windowed(6, 2, 32, 48, Some(0.5), full, dtype);
        let window = AttentionKind::SlidingWindow { window: 20 };
        check_against_naive_windowed(8, 2, 128, 16, None, window, dtype);
        if dtype != KvDtype::Q8_0 {
            check_against_naive_windowed(4, 4, 72, 5, None, full, dtype);
            check_against_naive_windowed(4, 2, 40, 16, None, full, dtype);
        }
    }
}

#[test]
fn matches_naive_attention_on_a_mixed_batch() {
    check_against_naive(14, 2, 64, 16); // the benchmark shape
    check_against_naive(8, 4, 8, 16); // tiny-llama
    check_against_naive(4, 4, 72, 5); // odd block size, dims not a multiple of 16
    check_against_naive(6, 2, 32, 48); // several key chunks per block
    check_against_naive(4, 2, 20, 16); // heads not a multiple of 8 (no AVX2 kernel)
}

#[test]
fn soft_capped_logits_match_naive_attention() {
    // A cap small enough that tanh bends most scores.
    check_against_naive_capped(14, 2, 64, 16, Some(0.05));
    check_against_naive_capped(4, 4, 72, 5, Some(0.5));
}

/// A row's result does not depend on how its sequence's queries are cut
/// into steps (chunked prefill) or on what else is in the batch, with a
/// sliding window (under full attention it is the same loop with a lower
/// bound of 0).
#[test]
fn results_do_not_depend_on_chunking() {
    let (mut model, _) = crate::builtin::config("qwen2.5-0.5b").unwrap();
    model.num_hidden_layers = 1;
    let (nh, nkv, hd, bs) = (14, 2, 64, 16);
    let width = (nh + 2 * nkv) * hd;
    let mut kv = KvCache::new(&model, KvCacheConfig::new(bs, 8)).unwrap();
    let mut rng = Rng(7);
    let n = 70;
    let rows: Vec<f32> = (0..n * width).map(|_| rng.next()).collect();
    let table: Vec<u32> = (1..6).collect();
    let slots: Vec<usize> = (0..n)
        .map(|p| table[p / bs] as usize * bs + p % bs)
        .collect();
    kv.write(0, &slots, &rows, width, nh * hd, (nh + nkv) * hd);
    for kind in [
        AttentionKind::Full,
        AttentionKind::SlidingWindow { window: 21 },
    ] {
        let shape = AttentionShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            scale: 0.125,
            logit_softcap: None,
            kind,
        };
        check_chunking(&shape, &kv, &rows, &table, n);
    }
}

fn check_chunking(shape: &AttentionShape, kv: &KvCache, rows: &[f32], table: &[u32], n: usize) {
    let (nh, nkv, hd, bs) = (
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    let width = (nh + 2 * nkv) * hd;
    let run = |cached: usize, len: usize| -> Vec<f32> {
        let mut batch = ForwardBatch::default();
        batch.push_seq(&vec![0; len], cached, table, bs).unwrap();
        let q = Queries {
            data: &rows[cached * width..(cached + len) * width],
            row_stride: width,
        };
        attend(shape, q, kv, &batch, len * nh * hd)
    };
    let row = nh * hd;
    for path in runnable_paths() {
        thread_cap::with(path, || {
            let whole = run(0, n);
            for chunk in [1, 3, 16, 23] {
                let mut start = 0;
                while start < n {
                    let len = chunk.min(n - start);
                    assert_eq!(
                        run(start, len),
                        whole[start * row..(start + len) * row],
                        "chunk {chunk} at {start}, {:?}, {path:?}",
                        shape.kind
                    );
                    start += len;
                }
            }
        });
    }
}
