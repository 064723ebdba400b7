//! Paged attention cost at the benchmark model's shape (Qwen2.5-0.5B: 14
//! query heads, 2 KV heads, head_dim 64, block size 16), one layer:
//! - decode of 32 requests at 192 cached tokens (mid-run of the 128 → 128
//!   benchmark),
//! - decode of 1 request at 256 tokens,
//! - prefill of one 128-token prompt.
//!
//! Multiply by 24 layers to compare with a step's time.

use criterion::{criterion_group, criterion_main, Criterion};
use sluice_model::attention::{paged_attention, paged_attention_portable, AttentionShape, Queries};
use sluice_model::builtin;
use sluice_model::kv_cache::{KvCache, KvCacheConfig};
use sluice_model::model::ForwardBatch;

fn setup(
    num_seqs: usize,
    query_len: usize,
    context_len: usize,
) -> (KvCache, ForwardBatch, Vec<f32>) {
    let (mut config, _) = builtin::config("qwen2.5-0.5b").unwrap();
    config.num_hidden_layers = 1;
    let bs = 16;
    let blocks_per_seq = context_len.div_ceil(bs);
    let mut kv = KvCache::new(
        &config,
        KvCacheConfig::new(bs, num_seqs * blocks_per_seq + 1),
    )
    .unwrap();
    let mut batch = ForwardBatch::default();
    for s in 0..num_seqs {
        let table: Vec<u32> = (0..blocks_per_seq)
            .map(|b| (1 + s * blocks_per_seq + b) as u32)
            .collect();
        let tokens = vec![0u32; query_len];
        batch
            .push_seq(&tokens, context_len - query_len, &table, bs)
            .unwrap();
    }
    // Fill every slot of every sequence with pseudo-random K/V.
    let width = (14 + 2 * 2) * 64;
    let mut rows = vec![0f32; width];
    let mut x = 1u32;
    let mut slots = Vec::new();
    for s in 0..num_seqs {
        for p in 0..context_len {
            let b = 1 + s * blocks_per_seq + p / bs;
            slots.push(b * bs + p % bs);
        }
    }
    for &slot in &slots {
        for r in rows.iter_mut() {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *r = (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
        }
        kv.write(0, &[slot], &rows, width, 14 * 64, 16 * 64);
    }
    let q: Vec<f32> = (0..batch.num_tokens() * width)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    (kv, batch, q)
}

fn bench(c: &mut Criterion) {
    let shape = AttentionShape {
        num_heads: 14,
        num_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        scale: 0.125,
        logit_softcap: None,
        kind: sluice_core::kv_cache::AttentionKind::Full,
    };
    for threads in [1, 2] {
        sluice_model::kernels::set_num_threads(threads);
        for (name, seqs, qlen, ctx) in [
            ("decode_32x192", 32, 1, 192),
            ("decode_1x256", 1, 1, 256),
            ("prefill_128", 1, 128, 128),
        ] {
            let (kv, batch, q) = setup(seqs, qlen, ctx);
            let mut out = vec![0f32; batch.num_tokens() * 14 * 64];
            let mut items = Vec::new();
            c.bench_function(&format!("attention_{name}_t{threads}"), |b| {
                b.iter(|| {
                    paged_attention(
                        &shape,
                        Queries {
                            data: &q,
                            row_stride: 18 * 64,
                        },
                        kv.layer(0),
                        &batch.seqs,
                        &batch.block_tables[0],
                        &mut out,
                        &mut items,
                    )
                })
            });
        }
    }
}

/// The portable kernel (one thread), to show what the AVX-512 one buys.
fn bench_portable(c: &mut Criterion) {
    let shape = AttentionShape {
        num_heads: 14,
        num_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        scale: 0.125,
        logit_softcap: None,
        kind: sluice_core::kv_cache::AttentionKind::Full,
    };
    for (name, seqs, qlen, ctx) in [("decode_32x192", 32, 1, 192), ("prefill_128", 1, 128, 128)] {
        let (kv, batch, q) = setup(seqs, qlen, ctx);
        let mut out = vec![0f32; batch.num_tokens() * 14 * 64];
        c.bench_function(&format!("attention_portable_{name}_t1"), |b| {
            b.iter(|| {
                paged_attention_portable(
                    &shape,
                    Queries {
                        data: &q,
                        row_stride: 18 * 64,
                    },
                    kv.layer(0),
                    &batch.seqs,
                    &batch.block_tables[0],
                    &mut out,
                )
            })
        });
    }
}

criterion_group!(benches, bench, bench_portable);
criterion_main!(benches);
