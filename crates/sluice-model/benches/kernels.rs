//! Criterion benchmarks of the matmul kernels on the Qwen2.5-0.5B shapes.
//!
//! Run: `cargo bench -p sluice-model --bench kernels` (a filter narrows it,
//! e.g. `-- decode/`). Groups and what their throughput means:
//! - `bandwidth`: a plain streaming read (the machine's read bandwidth, the
//!   bound for m = 1); bytes/s.
//! - `decode`: m = 1, weight bytes/s; weights rotate through copies larger
//!   than L3 so every call streams from DRAM as in a real forward pass.
//! - `batch`: m = 8 / 32 decode batches, weight bytes/s (≈ decode's when
//!   the weights stream once for all rows).
//! - `prefill`: m = 128 / 512; "elements"/s are FLOP/s (2·m·n·k per call).
//! - `candle`: candle 0.11's CPU matmul on the same shapes, for comparison.
//! - `model`: every linear layer of the 24-layer model plus the lm_head;
//!   "elements"/s are tokens/s of the matmuls alone.
//! - `dispatch`: the cost of one empty `parallel_for` (vs rayon's join).
//! - `quant`: the quantized formats at the Qwen2.5-0.5B shapes (k = 896,
//!   n = 1152 (fused q/k/v) / 896 / 128 / 4864 / 9728 (fused gate/up);
//!   k = 4864, n = 896; the 151936-row vocabulary head) and the
//!   SmolLM2-135M shapes (k = 576, n = 576 / 192 / 1536; k = 1536, n = 576;
//!   the 49152-row head), m = 1 / 8 / 32 / 128, 2 threads, weights repacked
//!   (`PackedWeight`, what the loader keeps) and for m = 1 also in ggml's
//!   row layout; throughput in weight bytes/s (tokens/s = m / time). The
//!   formats run are `SLUICE_BENCH_QUANT` (comma-separated, default
//!   `Q8_0,Q4_0,Q4_K,Q6_K`; `all` for every integer format).
//! - `quant_model`: every matmul of one forward pass (24 layers of
//!   Qwen2.5-0.5B with `--builtin qwen2.5-0.5b`'s 32000-token head, as Q8_0
//!   and as llama-quantize's Q4_K_M for it — Q5_0 where k = 896, Q6_K /
//!   Q4_K down_proj, Q8_0 head; 30 layers of SmolLM2-135M as shipped, Q4_1
//!   with a Q8_0 head), the head on the last row only; "elements"/s are
//!   tokens/s of the matmuls alone (decode: one step of m sequences).
//!
//! The kernel path can be capped with `SLUICE_KERNEL=portable|avx2|avx512`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sluice_model::kernels::{self, MatmulOptions, PackedWeight, QuantFormat, WeightRef};
use std::hint::black_box;
use std::time::Duration;

/// (name, k = in_features, n = out_features) of the 0.5B model's linears.
const SHAPES: [(&str, usize, usize); 5] = [
    ("qkv_896x1152", 896, 1152),
    ("o_896x896", 896, 896),
    ("gate_up_896x9728", 896, 9728),
    ("down_4864x896", 4864, 896),
    ("lm_head_896x32000", 896, 32000),
];
const LAYERS: usize = 24;
/// Bytes of weights a decode benchmark cycles through (> the 32 MiB L3).
const ROTATE_BYTES: usize = 160 << 20;

/// The float formats' name in a benchmark id (`f32`, `bf16`): lower case,
/// as the ids have always been spelled, so baselines stay comparable.
fn id(format: QuantFormat) -> String {
    format.name().to_ascii_lowercase()
}

/// Bytes per element of a float format (its blocks hold one element).
fn elem_bytes(format: QuantFormat) -> usize {
    debug_assert_eq!(format.block_size(), 1, "{format} is a float format");
    format.block_bytes()
}

/// A weight matrix in one dtype.
enum W {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl W {
    fn random(dt: QuantFormat, len: usize, seed: u64) -> W {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        };
        match dt {
            QuantFormat::F32 => W::F32((0..len).map(|_| next()).collect()),
            QuantFormat::Bf16 => W::Bf16((0..len).map(|_| kernels::f32_to_bf16(next())).collect()),
            other => unreachable!("the float benchmarks run F32 and BF16, not {other}"),
        }
    }
    fn r(&self) -> WeightRef<'_> {
        match self {
            W::F32(v) => WeightRef::F32(v),
            W::Bf16(v) => WeightRef::Bf16(v),
        }
    }
}

fn xs(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2)
        .collect()
}

fn opts(threads: usize) -> MatmulOptions {
    MatmulOptions {
        path: None,
        threads: Some(threads),
    }
}

fn configure(c: &mut Criterion) -> &mut Criterion {
    eprintln!("{}", kernels::cpu_features());
    c
}

fn bandwidth(c: &mut Criterion) {
    let bytes = 512usize << 20;
    let buf: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut g = configure(c).benchmark_group("bandwidth");
    g.throughput(Throughput::Bytes(bytes as u64));
    for threads in [1, 2] {
        g.bench_function(format!("read/{threads}t"), |b| {
            b.iter(|| black_box(stream_read(&buf, threads)))
        });
    }
    g.finish();
}

/// Reads every byte of `buf` once, on `threads` threads.
fn stream_read(buf: &[u64], threads: usize) -> u64 {
    const CHUNK: usize = 1 << 17; // 1 MiB of u64
    let chunks = buf.len().div_ceil(CHUNK);
    let total = std::sync::atomic::AtomicU64::new(0);
    let f = |c: usize| {
        let part = &buf[c * CHUNK..((c + 1) * CHUNK).min(buf.len())];
        total.fetch_add(xor_fold(part), std::sync::atomic::Ordering::Relaxed);
    };
    if threads == 1 {
        (0..chunks).for_each(f);
    } else {
        let before = kernels::num_threads();
        kernels::set_num_threads(threads);
        kernels::parallel_for(chunks, f);
        kernels::set_num_threads(before);
    }
    total.into_inner()
}

/// XOR of all words, with 8 independent lanes so loads, not the fold, bound
/// it (the compiler vectorises this).
fn xor_fold(v: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = v.chunks_exact(8);
    for c in &mut it {
        for l in 0..8 {
            acc[l] ^= c[l];
        }
    }
    it.remainder()
        .iter()
        .fold(acc.iter().fold(0, |a, b| a ^ b), |a, b| a ^ b)
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    for (name, k, n) in SHAPES {
        for dt in [QuantFormat::Bf16, QuantFormat::F32] {
            let bytes = n * k * elem_bytes(dt);
            let copies = ROTATE_BYTES.div_ceil(bytes).max(2);
            let ws: Vec<W> = (0..copies)
                .map(|s| W::random(dt, n * k, s as u64))
                .collect();
            let x = xs(k);
            let mut out = vec![0.0f32; n];
            g.throughput(Throughput::Bytes(bytes as u64));
            for threads in [1, 2] {
                let mut i = 0;
                g.bench_function(format!("{name}/{}/{threads}t", id(dt)), |b| {
                    b.iter(|| {
                        i = (i + 1) % copies;
                        kernels::matmul_with(opts(threads), &x, 1, k, ws[i].r(), n, &mut out);
                    })
                });
            }
        }
    }
    g.finish();
}

fn batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch");
    for (name, k, n) in SHAPES {
        let dt = QuantFormat::Bf16;
        let bytes = n * k * elem_bytes(dt);
        let copies = ROTATE_BYTES.div_ceil(bytes).max(2);
        let ws: Vec<W> = (0..copies)
            .map(|s| W::random(dt, n * k, s as u64))
            .collect();
        g.throughput(Throughput::Bytes(bytes as u64));
        for m in [8, 32] {
            let x = xs(m * k);
            let mut out = vec![0.0f32; m * n];
            let mut i = 0;
            g.bench_function(format!("{name}/{}/m{m}/2t", id(dt)), |b| {
                b.iter(|| {
                    i = (i + 1) % copies;
                    kernels::matmul_with(opts(2), &x, m, k, ws[i].r(), n, &mut out);
                })
            });
        }
    }
    g.finish();
}

fn prefill(c: &mut Criterion) {
    let mut g = c.benchmark_group("prefill");
    for (name, k, n) in SHAPES {
        for dt in [QuantFormat::Bf16, QuantFormat::F32] {
            let w = W::random(dt, n * k, 1);
            for m in [128, 512] {
                let x = xs(m * k);
                let mut out = vec![0.0f32; m * n];
                g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                for threads in [1, 2] {
                    g.bench_function(format!("{name}/{}/m{m}/{threads}t", id(dt)), |b| {
                        b.iter(|| kernels::matmul_with(opts(threads), &x, m, k, w.r(), n, &mut out))
                    });
                }
            }
        }
    }
    g.finish();
}

fn candle(c: &mut Criterion) {
    use candle_core::{DType, Device, Tensor};
    let dev = Device::Cpu;
    let mut g = c.benchmark_group("candle");
    for (name, k, n) in SHAPES {
        for (dt, cdt) in [
            (QuantFormat::F32, DType::F32),
            (QuantFormat::Bf16, DType::BF16),
        ] {
            let Ok(w) = Tensor::randn(0f32, 0.05, (n, k), &dev).and_then(|t| t.to_dtype(cdt))
            else {
                eprintln!("candle: cannot build weights");
                return;
            };
            for m in [1, 128, 512] {
                let Ok(x) = Tensor::randn(0f32, 0.1, (m, k), &dev).and_then(|t| t.to_dtype(cdt))
                else {
                    return;
                };
                if m == 1 {
                    g.throughput(Throughput::Bytes((n * k * elem_bytes(dt)) as u64));
                } else {
                    g.throughput(Throughput::Elements((2 * m * n * k) as u64));
                }
                g.bench_function(format!("{name}/{}/m{m}", id(dt)), |b| {
                    b.iter(|| black_box(x.matmul(&w.t().expect("2-d")).expect("shapes agree")))
                });
            }
        }
    }
    g.finish();
}

/// The model's linear layers, one set per layer.
struct Model {
    layers: Vec<[W; 4]>,
    lm_head: W,
}

const HIDDEN: usize = 896;
const INTER: usize = 4864;
const VOCAB: usize = 32000;

impl Model {
    fn new(dt: QuantFormat) -> Model {
        let layers = (0..LAYERS)
            .map(|l| {
                let s = 10 * l as u64;
                [
                    W::random(dt, 1152 * HIDDEN, s),
                    W::random(dt, HIDDEN * HIDDEN, s + 1),
                    W::random(dt, 2 * INTER * HIDDEN, s + 2),
                    W::random(dt, HIDDEN * INTER, s + 3),
                ]
            })
            .collect();
        Model {
            layers,
            lm_head: W::random(dt, VOCAB * HIDDEN, 999),
        }
    }

    /// All matmuls of one forward pass over `m` tokens (activations are not
    /// chained: only the matmul cost is measured). The lm_head runs on the
    /// last row only, as in generation.
    fn step(&self, m: usize, threads: usize, bufs: &mut Bufs) {
        let o = opts(threads);
        for [qkv, op, gu, down] in &self.layers {
            kernels::matmul_with(o, &bufs.h, m, HIDDEN, qkv.r(), 1152, &mut bufs.qkv);
            kernels::matmul_with(o, &bufs.h, m, HIDDEN, op.r(), HIDDEN, &mut bufs.o);
            kernels::matmul_with(o, &bufs.h, m, HIDDEN, gu.r(), 2 * INTER, &mut bufs.gu);
            kernels::matmul_with(o, &bufs.act, m, INTER, down.r(), HIDDEN, &mut bufs.o);
        }
        let last = &bufs.h[(m - 1) * HIDDEN..m * HIDDEN];
        kernels::matmul_with(
            o,
            last,
            1,
            HIDDEN,
            self.lm_head.r(),
            VOCAB,
            &mut bufs.logits,
        );
    }
}

struct Bufs {
    h: Vec<f32>,
    act: Vec<f32>,
    qkv: Vec<f32>,
    o: Vec<f32>,
    gu: Vec<f32>,
    logits: Vec<f32>,
}

impl Bufs {
    fn new(m: usize) -> Bufs {
        Bufs {
            h: xs(m * HIDDEN),
            act: xs(m * INTER),
            qkv: vec![0.0; m * 1152],
            o: vec![0.0; m * HIDDEN],
            gu: vec![0.0; m * 2 * INTER],
            logits: vec![0.0; VOCAB],
        }
    }
}

fn model(c: &mut Criterion) {
    let mut g = c.benchmark_group("model");
    for dt in [QuantFormat::Bf16, QuantFormat::F32] {
        let model = Model::new(dt);
        for (m, threads) in [(1, 1), (1, 2), (8, 2), (32, 2), (128, 2)] {
            let mut bufs = Bufs::new(m);
            g.throughput(Throughput::Elements(m as u64));
            let what = if m <= 32 { "decode" } else { "prefill" };
            g.bench_function(format!("{what}/{}/m{m}/{threads}t", id(dt)), |b| {
                b.iter(|| model.step(m, threads, &mut bufs))
            });
        }
    }
    g.finish();
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    kernels::set_num_threads(2);
    g.bench_function("parallel_for_noop/2t", |b| {
        b.iter(|| {
            kernels::parallel_for(2, |i| {
                black_box(i);
            })
        })
    });
    g.bench_function("rayon_join_noop", |b| {
        b.iter(|| rayon::join(|| black_box(1), || black_box(2)))
    });
    let w = W::random(QuantFormat::Bf16, 64 * 64, 3);
    let x = xs(64);
    let mut out = vec![0.0; 64];
    g.bench_function("matmul_64x64_m1/2t", |b| {
        b.iter(|| kernels::matmul_with(opts(2), &x, 1, 64, w.r(), 64, &mut out))
    });
    g.finish();
}

/// Random `[n×k]` weights in `f`'s ggml layout: quantized from random
/// values where the format has a quantizer, else random block bytes with
/// small finite f16 scales.
fn quant_bytes(f: QuantFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let rb = f.row_bytes(k).expect("whole blocks");
    let mut out = vec![0u8; n * rb];
    if f.can_quantize() {
        let x: Vec<f32> = (0..k)
            .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1)
            .collect();
        for row in out.chunks_exact_mut(rb) {
            f.quantize_row(&x, row).expect("quantizes");
            // Vary rows cheaply: flip a few quant bytes.
            let at = (next() as usize) % rb;
            row[at] ^= 0x11;
        }
        return out;
    }
    for b in out.iter_mut() {
        *b = next() as u8;
    }
    let scales: &[usize] = match f {
        QuantFormat::Q6K => &[208],
        _ => &[0, 2],
    };
    for blk in out.chunks_exact_mut(f.block_bytes()) {
        for &at in scales {
            let v = half::f16::from_f32(((next() >> 40) as f32 / (1u64 << 24) as f32) * 0.01);
            blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    out
}

fn bench_formats() -> Vec<QuantFormat> {
    let v = std::env::var("SLUICE_BENCH_QUANT").unwrap_or_else(|_| "Q8_0,Q4_0,Q4_K,Q6_K".into());
    if v.trim().eq_ignore_ascii_case("all") {
        return QuantFormat::ALL
            .into_iter()
            .filter(|f| !f.is_float())
            .collect();
    }
    v.split(',')
        .filter_map(|n| {
            let f = QuantFormat::from_name(n);
            if f.is_none() {
                eprintln!("SLUICE_BENCH_QUANT: unknown format {n:?}");
            }
            f
        })
        .collect()
}

/// (name, k, n) of the quantized benchmarks.
const QUANT_SHAPES: [(&str, usize, usize); 11] = [
    ("qwen_qkv_896x1152", 896, 1152),
    ("qwen_o_896x896", 896, 896),
    ("qwen_kv_896x128", 896, 128),
    ("qwen_up_896x4864", 896, 4864),
    ("qwen_down_4864x896", 4864, 896),
    ("qwen_head_896x151936", 896, 151936),
    ("smol_qkv_576x960", 576, 960),
    ("smol_kv_576x192", 576, 192),
    ("smol_up_576x1536", 576, 1536),
    ("smol_down_1536x576", 1536, 576),
    ("smol_head_576x49152", 576, 49152),
];

fn quant(c: &mut Criterion) {
    let mut g = configure(c).benchmark_group("quant");
    for f in bench_formats() {
        for (name, k, n) in QUANT_SHAPES {
            if !k.is_multiple_of(f.block_size()) {
                continue;
            }
            let bytes = f.tensor_bytes(n, k).expect("fits");
            let copies = ROTATE_BYTES.div_ceil(bytes).clamp(1, 64);
            let raw: Vec<Vec<u8>> = (0..copies)
                .map(|s| quant_bytes(f, n, k, s as u64))
                .collect();
            let packed: Vec<PackedWeight> = raw
                .iter()
                .map(|r| PackedWeight::new(f, r, n, k).expect("packs"))
                .collect();
            g.throughput(Throughput::Bytes(bytes as u64));
            for m in [1usize, 8, 32, 128] {
                let x = xs(m * k);
                let mut out = vec![0.0f32; m * n];
                let mut i = 0;
                g.bench_function(format!("{name}/{f}/packed/m{m}/2t"), |b| {
                    b.iter(|| {
                        i = (i + 1) % copies;
                        let w = WeightRef::Packed(&packed[i]);
                        kernels::matmul_with(opts(2), &x, m, k, w, n, &mut out);
                    })
                });
                g.bench_function(format!("{name}/{f}/packed/m{m}/1t"), |b| {
                    b.iter(|| {
                        i = (i + 1) % copies;
                        let w = WeightRef::Packed(&packed[i]);
                        kernels::matmul_with(opts(1), &x, m, k, w, n, &mut out);
                    })
                });
                if m == 1 {
                    g.bench_function(format!("{name}/{f}/rows/m{m}/2t"), |b| {
                        b.iter(|| {
                            i = (i + 1) % copies;
                            let w = WeightRef::Quant {
                                format: f,
                                data: &raw[i],
                            };
                            kernels::matmul_with(opts(2), &x, m, k, w, n, &mut out);
                        })
                    });
                }
            }
        }
    }
    g.finish();
}

/// One model's linears: per layer (k, n, format) of each matmul, and the
/// head.
struct QuantModel {
    name: &'static str,
    layers: Vec<Vec<(usize, usize, PackedWeight)>>,
    head: (usize, usize, PackedWeight),
}

impl QuantModel {
    fn new(
        name: &'static str,
        layers: Vec<Vec<(usize, usize, QuantFormat)>>,
        head: (usize, usize, QuantFormat),
    ) -> QuantModel {
        let pack = |k: usize, n: usize, f: QuantFormat, seed: u64| {
            PackedWeight::new(f, &quant_bytes(f, n, k, seed), n, k).expect("packs")
        };
        QuantModel {
            name,
            layers: layers
                .iter()
                .enumerate()
                .map(|(l, shapes)| {
                    shapes
                        .iter()
                        .enumerate()
                        .map(|(i, &(k, n, f))| (k, n, pack(k, n, f, (10 * l + i) as u64)))
                        .collect()
                })
                .collect(),
            head: (head.0, head.1, pack(head.0, head.1, head.2, 999)),
        }
    }

    fn bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .flatten()
            .map(|(_, _, w)| w.size_in_bytes())
            .sum();
        l + self.head.2.size_in_bytes()
    }

    fn step(&self, m: usize, threads: usize, x: &[f32], out: &mut [f32]) {
        let o = opts(threads);
        for layer in &self.layers {
            for (k, n, w) in layer {
                kernels::matmul_with(
                    o,
                    &x[..m * k],
                    m,
                    *k,
                    WeightRef::Packed(w),
                    *n,
                    &mut out[..m * n],
                );
            }
        }
        let (k, n, w) = &self.head;
        kernels::matmul_with(o, &x[..*k], 1, *k, WeightRef::Packed(w), *n, &mut out[..*n]);
    }
}

fn quant_model(c: &mut Criterion) {
    use QuantFormat::{Q4K, Q4_1, Q5_0, Q6K, Q8_0};
    let mut g = c.benchmark_group("quant_model");
    // Qwen2.5-0.5B: fused qkv, o, fused gate/up, down; the tied head with
    // the 32000-token vocabulary the `model` group (and the v32000 GGUFs)
    // use.
    // Its k = 896 is not a multiple of 256, so llama-quantize's Q4_K_M
    // stores those matrices as Q5_0 (its fallback) and the head as Q8_0;
    // down_proj (k = 4864) alternates Q6_K and Q4_K by layer.
    let layers = |f: QuantFormat, down: &dyn Fn(usize) -> QuantFormat, count: usize| {
        (0..count)
            .map(|l| {
                vec![
                    (896, 1152, f),
                    (896, 896, f),
                    (896, 9728, f),
                    (4864, 896, down(l)),
                ]
            })
            .collect::<Vec<_>>()
    };
    let models = [
        QuantModel::new(
            "qwen2.5-0.5b/Q8_0",
            layers(Q8_0, &|_| Q8_0, 24),
            (896, VOCAB, Q8_0),
        ),
        QuantModel::new(
            "qwen2.5-0.5b/Q4_K_M",
            layers(Q5_0, &|l| if l % 2 == 0 { Q6K } else { Q4K }, 24),
            (896, VOCAB, Q8_0),
        ),
        QuantModel::new(
            "smollm2-135m/Q4_1",
            (0..30)
                .map(|_| {
                    vec![
                        (576, 960, Q4_1),
                        (576, 576, Q4_1),
                        (576, 3072, Q4_1),
                        (1536, 576, Q4_1),
                    ]
                })
                .collect(),
            (576, 49152, Q8_0),
        ),
    ];
    for model in &models {
        eprintln!(
            "{}: {:.1} MB of packed weights",
            model.name,
            model.bytes() as f64 / 1e6
        );
        for (m, threads) in [(1, 1), (1, 2), (8, 2), (32, 2), (128, 2)] {
            let x = xs(m * 4864);
            let mut out = vec![0.0f32; (m * 9728).max(49152)];
            g.throughput(Throughput::Elements(m as u64));
            let what = if m <= 32 { "decode" } else { "prefill" };
            g.bench_function(format!("{}/{what}/m{m}/{threads}t", model.name), |b| {
                b.iter(|| model.step(m, threads, &x, &mut out))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500));
    targets = bandwidth, decode, batch, prefill, candle, model, dispatch, quant, quant_model
}
criterion_main!(benches);
