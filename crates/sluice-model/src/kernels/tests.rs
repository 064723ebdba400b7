//! Tests of the kernel contract: every path against an f64 reference on
//! awkward shapes, batch / thread invariance bit for bit, the reduction
//! trees, the bf16 rounding, and the thread pool.
//!
//! Tolerances: each path's result is compared with the exact (f64) product
//! of the values it actually multiplies — for the AVX-512 BF16 path that is
//! `x` rounded to bf16 first, since `vdpbf16ps` consumes bf16 activations —
//! and must lie within `(k/8 + 8)·2⁻²³·Σ|xᵢwᵢ|` of it: the longest chain of
//! f32 additions any path performs per element, times the unit roundoff.

// Tile and lane loops index several arrays by the same (i, j, l); ranges
// read closer to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::*;
use proptest::prelude::*;

/// A small deterministic generator (xorshift64*), values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.unit()).collect()
    }
    fn bf16_vec(&mut self, len: usize) -> Vec<u16> {
        (0..len).map(|_| f32_to_bf16(self.unit())).collect()
    }
}

struct Weights {
    f32: Vec<f32>,
    bf16: Vec<u16>,
}

impl Weights {
    fn new(rng: &mut Rng, n: usize, k: usize) -> Weights {
        let bf16 = rng.bf16_vec(n * k);
        let f32 = rng.vec(n * k);
        Weights { f32, bf16 }
    }
    fn get(&self, d: QuantFormat) -> WeightRef<'_> {
        match d {
            QuantFormat::F32 => WeightRef::F32(&self.f32),
            QuantFormat::Bf16 => WeightRef::Bf16(&self.bf16),
            other => unreachable!("the float-GEMM tests cover F32 and BF16, not {other}"),
        }
    }
}

/// The paths this CPU really runs for `d` (requests it cannot honour are
/// lowered, so duplicates are dropped).
fn paths(d: QuantFormat) -> Vec<KernelPath> {
    let cpu = cpu_features();
    let mut v: Vec<KernelPath> = KernelPath::ALL
        .iter()
        .map(|&p| match d {
            QuantFormat::F32 => cpu.clamp_f32(p),
            QuantFormat::Bf16 => cpu.clamp_bf16(p),
            other => unreachable!("the float-GEMM tests cover F32 and BF16, not {other}"),
        })
        .collect();
    v.dedup();
    v
}

fn run(
    path: KernelPath,
    threads: usize,
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    n: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * n];
    let opts = MatmulOptions {
        path: Some(path),
        threads: Some(threads),
    };
    let ran = matmul_with(opts, x, m, k, w, n, &mut out);
    assert_eq!(ran, path, "paths() only lists paths the CPU runs");
    out
}

/// Checks `got` against the exact product of what `path` multiplies.
#[allow(clippy::too_many_arguments)]
fn check_close(
    path: KernelPath,
    d: QuantFormat,
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    n: usize,
    got: &[f32],
) {
    let rounds_x = d == QuantFormat::Bf16 && path == KernelPath::Avx512;
    let xr: Vec<f64> = x
        .iter()
        .map(|&v| if rounds_x { bf16_to_f32(f32_to_bf16(v)) } else { v } as f64)
        .collect();
    let wv = |idx: usize| -> f64 {
        match w {
            WeightRef::F32(w) => w[idx] as f64,
            WeightRef::Bf16(w) => bf16_to_f32(w[idx]) as f64,
            _ => unreachable!("float weights only"),
        }
    };
    let unit = (k / 8 + 8) as f64 * 2f64.powi(-23);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut mag) = (0.0f64, 0.0f64);
            for t in 0..k {
                let p = xr[i * k + t] * wv(j * k + t);
                exact += p;
                mag += p.abs();
            }
            let g = got[i * n + j] as f64;
            assert!(
                (g - exact).abs() <= unit * mag + 1e-30,
                "{path:?} {d:?} m={m} k={k} n={n} at ({i},{j}): got {g}, exact {exact}, Σ|xw| {mag}"
            );
        }
    }
}

#[test]
fn every_path_matches_the_reference_on_awkward_shapes() {
    let mut rng = Rng::new(1);
    for &k in &[1usize, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257] {
        for &n in &[1usize, 2, 5, 6, 7, 8, 9, 13, 31] {
            let w = Weights::new(&mut rng, n, k);
            for &m in &[1usize, 2, 3, 4, 5, 17] {
                let x = rng.vec(m * k);
                for d in [QuantFormat::F32, QuantFormat::Bf16] {
                    for path in paths(d) {
                        for threads in [1, 2] {
                            let got = run(path, threads, &x, m, k, w.get(d), n);
                            check_close(path, d, &x, m, k, w.get(d), n, &got);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_path_matches_the_reference_on_model_shapes() {
    // Qwen2.5-0.5B widths, cut down in n to keep the f64 reference quick;
    // m = 70 crosses the prefill blocking (several row blocks at k = 4864).
    let mut rng = Rng::new(2);
    for &(m, k, n) in &[
        (1usize, 896usize, 70usize),
        (8, 896, 33),
        (70, 4864, 19),
        (130, 896, 13),
    ] {
        let w = Weights::new(&mut rng, n, k);
        let x = rng.vec(m * k);
        for d in [QuantFormat::F32, QuantFormat::Bf16] {
            for path in paths(d) {
                let got = run(path, 2, &x, m, k, w.get(d), n);
                check_close(path, d, &x, m, k, w.get(d), n, &got);
            }
        }
    }
}

#[test]
fn default_matmul_is_close_to_matmul_reference() {
    let mut rng = Rng::new(3);
    let (m, k, n) = (5, 300, 21);
    let w = Weights::new(&mut rng, n, k);
    let x = rng.vec(m * k);
    for d in [QuantFormat::F32, QuantFormat::Bf16] {
        let (mut got, mut want) = (vec![0.0; m * n], vec![0.0; m * n]);
        matmul(&x, m, k, w.get(d), n, &mut got);
        matmul_reference(&x, m, k, w.get(d), n, &mut want);
        for (g, r) in got.iter().zip(&want) {
            // bf16 activations cost ~3 significant digits on the bf16 path.
            let tol = if d == QuantFormat::Bf16 { 0.05 } else { 1e-4 };
            assert!((g - r).abs() <= tol, "{d:?}: {g} vs {r}");
        }
    }
}

/// Row `i` of a batched call equals a single-row call on row `i`, bit for
/// bit, for every thread count.
fn assert_batch_invariant(seed: u64, m: usize, k: usize, n: usize, threads: usize) {
    let mut rng = Rng::new(seed);
    let w = Weights::new(&mut rng, n, k);
    let x = rng.vec(m * k);
    for d in [QuantFormat::F32, QuantFormat::Bf16] {
        for path in paths(d) {
            let batched = run(path, threads, &x, m, k, w.get(d), n);
            for i in 0..m {
                let single = run(path, 1, &x[i * k..(i + 1) * k], 1, k, w.get(d), n);
                let row = &batched[i * n..(i + 1) * n];
                let same = row
                    .iter()
                    .zip(&single)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{path:?} {d:?} m={m} k={k} n={n} threads={threads}: row {i} differs"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn batched_rows_equal_single_rows_bit_for_bit(
        seed in any::<u64>(),
        m in 1usize..40,
        k in 1usize..300,
        n in 1usize..48,
        threads in 1usize..4,
    ) {
        assert_batch_invariant(seed, m, k, n, threads);
    }
}

#[test]
fn batch_invariance_at_model_shapes() {
    assert_batch_invariant(7, 33, 896, 40, 2);
    // Prefill-sized: several row blocks and column chunks.
    assert_batch_invariant(8, 80, 4864, 14, 2);
}

#[test]
fn rows_ignore_the_other_rows_even_nan() {
    let mut rng = Rng::new(9);
    let (m, k, n) = (6, 130, 17);
    let w = Weights::new(&mut rng, n, k);
    let x = rng.vec(m * k);
    let mut poisoned = x.clone();
    for (i, v) in poisoned.iter_mut().enumerate() {
        if i / k != 2 {
            *v = if i % 3 == 0 { f32::NAN } else { 1e30 };
        }
    }
    for d in [QuantFormat::F32, QuantFormat::Bf16] {
        for path in paths(d) {
            let a = run(path, 2, &x, m, k, w.get(d), n);
            let b = run(path, 2, &poisoned, m, k, w.get(d), n);
            for j in 0..n {
                assert_eq!(
                    a[2 * n + j].to_bits(),
                    b[2 * n + j].to_bits(),
                    "{path:?} {d:?}"
                );
            }
        }
    }
}

#[test]
fn thread_counts_give_identical_bits() {
    let mut rng = Rng::new(10);
    let (m, k, n) = (37, 200, 61);
    let w = Weights::new(&mut rng, n, k);
    let x = rng.vec(m * k);
    for d in [QuantFormat::F32, QuantFormat::Bf16] {
        for path in paths(d) {
            let one = run(path, 1, &x, m, k, w.get(d), n);
            for threads in [2, 3, 5] {
                let many = run(path, threads, &x, m, k, w.get(d), n);
                assert!(
                    one.iter()
                        .zip(&many)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{path:?} {d:?} {threads}"
                );
            }
        }
    }
}

/// Adds `bias` to every row of `x`: the separate add `matmul_bias` must
/// equal.
pub(super) fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

#[test]
fn matmul_bias_equals_matmul_then_add() {
    let mut rng = Rng::new(11);
    let (m, k, n) = (9, 77, 23);
    let w = Weights::new(&mut rng, n, k);
    let x = rng.vec(m * k);
    let bias = rng.vec(n);
    for d in [QuantFormat::F32, QuantFormat::Bf16] {
        let (mut a, mut b) = (vec![0.0; m * n], vec![0.0; m * n]);
        matmul_bias(&x, m, k, w.get(d), &bias, n, &mut a);
        matmul(&x, m, k, w.get(d), n, &mut b);
        add_bias(&mut b, &bias);
        assert!(
            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{d:?}"
        );
    }
}

#[test]
fn degenerate_shapes() {
    let w = Weights {
        f32: vec![],
        bf16: vec![],
    };
    for d in [QuantFormat::F32, QuantFormat::Bf16] {
        // k = 0: an empty sum is zero (plus the bias).
        let mut out = vec![f32::NAN; 6];
        matmul(&[], 2, 0, w.get(d), 3, &mut out);
        assert!(out.iter().all(|&v| v == 0.0));
        matmul_bias(&[], 2, 0, w.get(d), &[1.0, 2.0, 3.0], 3, &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        // m = 0 and n = 0 do nothing.
        matmul(&[], 0, 0, w.get(d), 3, &mut []);
        matmul(&[1.0, 2.0], 1, 2, w.get(d), 0, &mut []);
    }
}

#[test]
#[should_panic(expected = "matmul: w has")]
fn wrong_weight_shape_panics_with_a_message() {
    let mut out = vec![0.0; 2];
    matmul(&[1.0; 4], 1, 4, WeightRef::F32(&[0.0; 7]), 2, &mut out);
}

#[test]
fn f32_to_bf16_rounds_to_nearest_even() {
    let mut rng = Rng::new(12);
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        1.0e-40,
        65504.0,
    ];
    let randoms = (0..10_000)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .filter(|v| v.is_finite());
    for v in specials.into_iter().chain(randoms) {
        assert_eq!(f32_to_bf16(v), half::bf16::from_f32(v).to_bits(), "{v:e}");
    }
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::reduce::x86::{hsum16x16, hsum8x8};
    use super::super::reduce::{tree16, tree8};
    use super::*;
    use std::arch::x86_64::*;

    #[test]
    fn simd_reductions_follow_the_scalar_trees() {
        let cpu = cpu_features();
        let mut rng = Rng::new(13);
        for _ in 0..200 {
            // Mixed magnitudes make every association visible.
            let vals: Vec<f32> = (0..256)
                .map(|_| rng.unit() * 10f32.powi((rng.next_u64() % 16) as i32 - 8))
                .collect();
            if cpu.has_avx512_f32() {
                let mut out = [0.0f32; 16];
                // SAFETY: AVX-512F checked above; loads from `vals`.
                unsafe {
                    let v: [__m512; 16] =
                        std::array::from_fn(|j| _mm512_loadu_ps(vals[16 * j..].as_ptr()));
                    _mm512_storeu_ps(out.as_mut_ptr(), hsum16x16(&v));
                }
                for (j, o) in out.iter().enumerate() {
                    let lanes: &[f32; 16] =
                        vals[16 * j..16 * j + 16].try_into().expect("16 values");
                    assert_eq!(o.to_bits(), tree16(lanes).to_bits());
                }
            }
            if cpu.has_avx2() {
                let mut out = [0.0f32; 8];
                // SAFETY: AVX2 checked above; loads from `vals`.
                unsafe {
                    let v: [__m256; 8] =
                        std::array::from_fn(|j| _mm256_loadu_ps(vals[8 * j..].as_ptr()));
                    _mm256_storeu_ps(out.as_mut_ptr(), hsum8x8(&v));
                }
                for (j, o) in out.iter().enumerate() {
                    let lanes: &[f32; 8] = vals[8 * j..8 * j + 8].try_into().expect("8 values");
                    assert_eq!(o.to_bits(), tree8(lanes).to_bits());
                }
            }
        }
    }

    #[test]
    fn hardware_bf16_conversion_matches_f32_to_bf16() {
        if !cpu_features().has_avx512_bf16() {
            return;
        }
        let mut rng = Rng::new(14);
        // Normal numbers only: the instruction flushes subnormals to zero.
        let x: Vec<f32> = (0..3 * 45).map(|_| rng.unit() * 1000.0).collect();
        let mut buf = vec![0xffffu16; 3 * 64];
        // SAFETY: AVX-512 BF16 checked above.
        let ldx = unsafe { super::super::gemm_bf16::convert_x_avx512(&x, 3, 45, &mut buf) };
        assert_eq!(ldx, 64);
        for i in 0..3 {
            for t in 0..64 {
                let want = if t < 45 {
                    f32_to_bf16(x[i * 45 + t])
                } else {
                    0
                };
                assert_eq!(buf[i * 64 + t], want);
            }
        }
    }
}

#[test]
fn kernel_path_names_parse() {
    assert_eq!(KernelPath::parse("AVX512"), Ok(Some(KernelPath::Avx512)));
    assert_eq!(KernelPath::parse(" avx2 "), Ok(Some(KernelPath::Avx2)));
    assert_eq!(
        KernelPath::parse("portable"),
        Ok(Some(KernelPath::Portable))
    );
    assert_eq!(KernelPath::parse("auto"), Ok(None));
    assert!(KernelPath::parse("neon").is_err());
    for p in KernelPath::ALL {
        assert_eq!(KernelPath::parse(p.name()), Ok(Some(p)));
    }
    let cpu = cpu_features();
    assert!(cpu.clamp_bf16(KernelPath::Avx512) <= cpu.best_bf16());
    assert!(!format!("{cpu}").is_empty());
}

// ------------------------------------------------------------------ pool

mod pool_tests {
    use super::super::pool;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn parallel_for_runs_each_index_exactly_once() {
        for threads in [1, 2, 3, 8] {
            for n in [0usize, 1, 2, 3, 100, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool::run(threads, n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "threads={threads} n={n}"
                );
            }
        }
    }

    #[test]
    fn nested_parallel_for_completes() {
        let total = AtomicUsize::new(0);
        pool::run(2, 8, &|_| {
            pool::run(2, 8, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn concurrent_callers_all_complete() {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let sum = AtomicUsize::new(0);
                    for _ in 0..200 {
                        pool::run(2, 50, &|i| {
                            sum.fetch_add(i + t, Ordering::Relaxed);
                        });
                    }
                    sum.load(Ordering::Relaxed)
                })
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().ok(), Some(200 * (49 * 50 / 2 + 50 * t)));
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_survives() {
        let r = std::panic::catch_unwind(|| {
            pool::run(2, 64, &|i| {
                if i == 40 {
                    panic!("task 40 fails");
                }
            });
        });
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool::run(2, 64, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn thread_count_setting() {
        let before = super::num_threads();
        assert!(before >= 1);
        super::set_num_threads(1);
        assert_eq!(super::num_threads(), 1);
        let count = AtomicUsize::new(0);
        super::parallel_for(10, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
        super::set_num_threads(before);
        assert_eq!(super::num_threads(), before);
    }
}
