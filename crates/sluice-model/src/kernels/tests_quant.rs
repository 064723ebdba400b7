//! Tests of the quantized matmul contract: every path (AVX-512 VNNI, AVX2,
//! portable — those this CPU runs), both weight layouts (ggml rows and
//! `PackedWeight`), every thread count, batch sizes 1..=40 and 128, strided
//! output — all bit for bit equal to the scalar definition
//! `dot_row_reference`, and close to the dequantize-then-f32
//! `matmul_reference` within a tolerance derived from the activation
//! quantization error:
//!
//! The kernels multiply the dequantized weights `w` by the activations as
//! quantized to the format's partner, `x̂ = d·q`. Per element, `|x̂ - x|` is
//! at most half a step plus the f16 rounding of the scale applied to
//! `|q| <= 127`: `e_b = (0.5 + 127·2⁻¹¹)·amax_b/127` for Q8_0 / Q8_1 blocks
//! (`d` stored as f16), `e_b = 0.5·amax_b/127·(1 + 2⁻²⁰)` for Q8_K (`d` in
//! f32). Q8_1's block sum `s` is also rounded to f16 (relative 2⁻¹¹, plus
//! the 2⁻¹¹ of `d`), which moves the min term `m·s` by at most
//! `|m|·2⁻¹⁰·Σ|x̂|`. On top, f32 rounding: at most `k + 2·nb + 16` roundings
//! of unit 2⁻²⁴ on magnitudes bounded by `Σ|w|·(|x| + e)` (the reference's
//! own sum included). So
//! `|got - reference| <= Σ_k |w_k|·e_b(k) + [Q4_1/Q5_1] Σ_b |m_b|·2⁻¹⁰·Σ_{k∈b}|x̂_k|
//!  + (k + 2·nb + 16)·2⁻²³·Σ_k |w_k|·(|x_k| + e_b(k))`.

#![allow(clippy::needless_range_loop)]

use super::formats::f16_to_f32;
use super::tests::add_bias;
use super::*;
use proptest::prelude::*;

/// xorshift64*, values in [-1, 1).
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
}

/// The integer formats.
const QUANT: [QuantFormat; 12] = [
    QuantFormat::Q8_0,
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q4K,
    QuantFormat::Q5K,
    QuantFormat::Q6K,
    QuantFormat::IQ4NL,
    QuantFormat::IQ4XS,
    QuantFormat::Q2K,
    QuantFormat::Q3K,
];

/// Byte offsets of a block's f16 scale fields.
fn f16_fields(f: QuantFormat) -> &'static [usize] {
    match f {
        QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
        QuantFormat::Q6K => &[208],
        QuantFormat::Q2K => &[80, 82],
        QuantFormat::Q3K => &[108],
        _ => &[0],
    }
}

/// Random `[n×k]` weights in ggml's layout: random block bytes (every bit
/// pattern of the quants, scales and mins, Q8_0's -128 and Q6_K's -128
/// scale included) with finite f16 scales of varied size and sign; for the
/// formats with a quantizer, every other row is quantized from random
/// values instead.
fn random_weights(f: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = f.row_bytes(k).expect("whole blocks");
    let mut w = vec![0u8; n * rb];
    for (r, row) in w.chunks_exact_mut(rb).enumerate() {
        if f.can_quantize() && r % 2 == 1 {
            let x: Vec<f32> = rng.vec(k).iter().map(|v| v * 0.5).collect();
            f.quantize_row(&x, row).expect("quantizes");
            continue;
        }
        for b in row.iter_mut() {
            *b = rng.next_u64() as u8;
        }
        for blk in row.chunks_exact_mut(f.block_bytes()) {
            for &at in f16_fields(f) {
                let v = rng.unit()
                    * 0.02
                    * if rng.next_u64().is_multiple_of(8) {
                        40.0
                    } else {
                        1.0
                    };
                blk[at..at + 2].copy_from_slice(&formats::f32_to_f16(v).to_le_bytes());
            }
        }
    }
    w
}

/// The paths this CPU really runs for quantized weights.
fn paths() -> Vec<KernelPath> {
    let cpu = cpu_features();
    let mut v: Vec<KernelPath> = KernelPath::ALL
        .iter()
        .map(|&p| cpu.clamp(KernelFamily::Quant, p))
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
    let ran = matmul_with(opts, &x[..m * k], m, k, w, n, &mut out);
    assert_eq!(ran, path, "paths() only lists paths the CPU runs");
    out
}

/// `dot_row_reference` for every (row of x, row of w).
fn reference(f: QuantFormat, x: &[f32], m: usize, k: usize, w: &[u8], n: usize) -> Vec<f32> {
    let rb = f.row_bytes(k).expect("whole blocks");
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = dot_row_reference(f, &w[j * rb..(j + 1) * rb], &x[i * k..(i + 1) * k]);
        }
    }
    out
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    for (idx, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {idx}: {g:e} vs the reference {w:e}"
        );
    }
}

/// Every path, both layouts, m = 1..=40 and 128, threads 1, 2, 3: equal to
/// the scalar definition bit for bit.
fn check_format_exact(f: QuantFormat, k: usize, n: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let w = random_weights(f, n, k, &mut rng);
    let packed = PackedWeight::new(f, &w, n, k).expect("packs");
    let m_max = 128;
    let x = rng.vec(m_max * k);
    let want = reference(f, &x, m_max, k, &w, n);
    let rows = WeightRef::Quant {
        format: f,
        data: &w,
    };
    let pack = WeightRef::Packed(&packed);
    for path in paths() {
        for m in (1..=40).chain([128]) {
            let got = run(path, 2, &x, m, k, pack, n);
            assert_bits(&got, &want[..m * n], &format!("{f} {path} packed m={m}"));
        }
        for m in [1, 3, 9, 40, 128] {
            for threads in [1, 2, 3] {
                for (layout, wr) in [("rows", rows), ("packed", pack)] {
                    let got = run(path, threads, &x, m, k, wr, n);
                    assert_bits(
                        &got,
                        &want[..m * n],
                        &format!("{f} {path} {layout} m={m} threads={threads}"),
                    );
                }
            }
        }
    }
}

/// Block lengths used in the exact tests: 3 blocks of 32, or 2 of 256.
fn test_k(f: QuantFormat) -> usize {
    if f.block_size() == 256 {
        512
    } else {
        96
    }
}

#[test]
fn q8_0_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q8_0, 96, 37, 1);
}

#[test]
fn q4_0_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q4_0, 96, 37, 2);
}

#[test]
fn q4_1_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q4_1, 96, 37, 3);
}

#[test]
fn q5_0_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q5_0, 96, 37, 4);
}

#[test]
fn q5_1_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q5_1, 96, 37, 5);
}

#[test]
fn q4_k_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q4K, 512, 21, 6);
}

#[test]
fn q5_k_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q5K, 512, 21, 7);
}

#[test]
fn q6_k_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q6K, 512, 21, 8);
}

#[test]
fn iq4_nl_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::IQ4NL, 96, 37, 9);
}

#[test]
fn iq4_xs_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::IQ4XS, 512, 21, 10);
}

#[test]
fn q2_k_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q2K, 512, 21, 11);
}

#[test]
fn q3_k_every_path_layout_batch_and_thread_count_is_exact() {
    check_format_exact(QuantFormat::Q3K, 512, 21, 12);
}

/// The largest integer sums the kernels can meet: every quant at its
/// extreme (all bytes `0xFF`, so every nibble, high bit and 6-bit scale at
/// its maximum; also `0x00`, `0x88` and `0xEE` rows) against activations
/// that quantize to ±127 everywhere. The SIMD paths keep partial sums in
/// i16 lanes where the formats' ranges allow; an overflow would show here
/// and not with random bytes.
#[test]
fn saturated_quants_against_full_scale_activations_are_exact() {
    for &f in &QUANT {
        let (k, n) = (test_k(f), 19);
        let rb = f.row_bytes(k).expect("whole blocks");
        let mut w = vec![0u8; n * rb];
        for (r, row) in w.chunks_exact_mut(rb).enumerate() {
            row.fill([0xFF, 0x00, 0x88, 0xEE][r % 4]);
            for blk in row.chunks_exact_mut(f.block_bytes()) {
                for &at in f16_fields(f) {
                    let v = if r % 3 == 2 { -0.01 } else { 0.01 };
                    blk[at..at + 2].copy_from_slice(&formats::f32_to_f16(v).to_le_bytes());
                }
            }
        }
        let m = 6;
        let x: Vec<f32> = (0..m * k)
            .map(|e| match e / k {
                0 | 3 => 1.0,
                1 | 4 => -1.0,
                _ => (if e % 2 == 0 { 1.0 } else { -1.0 }) * ((e % 7) as f32 + 1.0),
            })
            .collect();
        let want = reference(f, &x, m, k, &w, n);
        let packed = PackedWeight::new(f, &w, n, k).expect("packs");
        for path in paths() {
            for mm in [1, m] {
                let got = run(path, 1, &x, mm, k, WeightRef::Packed(&packed), n);
                assert_bits(
                    &got,
                    &want[..mm * n],
                    &format!("{f} {path} saturated m={mm}"),
                );
            }
        }
    }
}

/// `got` against the dequantize-then-f32 reference, within the tolerance
/// of the module docs.
#[allow(clippy::too_many_arguments)]
fn check_close(
    f: QuantFormat,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[u8],
    n: usize,
    got: &[f32],
    what: &str,
) {
    let mut want = vec![0.0; m * n];
    matmul_reference(
        x,
        m,
        k,
        WeightRef::Quant { format: f, data: w },
        n,
        &mut want,
    );
    let block = f.block_size();
    let nb = k / block;
    let rb = f.row_bytes(k).expect("whole blocks");
    let q8k = block == 256;
    let mut wr = vec![0.0f32; k];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        let xq = quantized_activations(f, xr);
        let e: Vec<f32> = xr
            .chunks_exact(block)
            .map(|b| {
                let amax = b.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                if q8k {
                    0.5 * amax / 127.0 * (1.0 + 2f32.powi(-20))
                } else {
                    (0.5 + 127.0 * 2f32.powi(-11)) * amax / 127.0
                }
            })
            .collect();
        for j in 0..n {
            WeightRef::Quant { format: f, data: w }.row_to_f32(j, k, &mut wr);
            let (mut quant_err, mut mag) = (0.0f64, 0.0f64);
            for t in 0..k {
                let eb = e[t / block] as f64;
                quant_err += (wr[t] as f64).abs() * eb;
                mag += (wr[t] as f64).abs() * ((xr[t] as f64).abs() + eb);
            }
            let mut min_err = 0.0f64;
            if matches!(f, QuantFormat::Q4_1 | QuantFormat::Q5_1) {
                for b in 0..nb {
                    let mw =
                        f16_to_f32(formats::le16(&w[j * rb + b * f.block_bytes()..], 2)) as f64;
                    let sq: f64 = xq[b * block..(b + 1) * block]
                        .iter()
                        .map(|v| v.abs() as f64)
                        .sum();
                    min_err += mw.abs() * 2f64.powi(-10) * sq;
                }
            }
            let tol = quant_err + min_err + (k + 2 * nb + 16) as f64 * 2f64.powi(-23) * mag;
            let (g, r) = (got[i * n + j] as f64, want[i * n + j] as f64);
            assert!(
                (g - r).abs() <= tol,
                "{what} ({i},{j}): got {g}, reference {r}, tolerance {tol}"
            );
        }
    }
}

#[test]
fn every_path_is_close_to_the_dequantized_reference() {
    let mut rng = Rng::new(21);
    for f in QUANT {
        let k = test_k(f);
        let n = 19;
        let w = random_weights(f, n, k, &mut rng);
        let m = 5;
        let x = rng.vec(m * k);
        for path in paths() {
            let got = run(
                path,
                2,
                &x,
                m,
                k,
                WeightRef::Quant {
                    format: f,
                    data: &w,
                },
                n,
            );
            check_close(f, &x, m, k, &w, n, &got, &format!("{f} {path}"));
        }
    }
}

#[test]
fn model_widths_cross_the_prefill_blocking() {
    // k = 4864 (Qwen2.5-0.5B's down_proj): prefill row blocks of 80 rows,
    // so m = 130 takes two; k = 576 and 1536 (SmolLM2-135M).
    let mut rng = Rng::new(22);
    for (f, k) in [
        (QuantFormat::Q4_0, 4864),
        (QuantFormat::Q8_0, 576),
        (QuantFormat::Q4K, 1536),
        (QuantFormat::Q6K, 4864),
    ] {
        let n = 18;
        let m = 130;
        let w = random_weights(f, n, k, &mut rng);
        let x = rng.vec(m * k);
        let want = reference(f, &x, m, k, &w, n);
        let packed = PackedWeight::new(f, &w, n, k).expect("packs");
        for path in paths().into_iter().filter(|&p| p != KernelPath::Portable) {
            let got = run(path, 2, &x, m, k, WeightRef::Packed(&packed), n);
            assert_bits(&got, &want, &format!("{f} k={k} {path}"));
        }
        let got = run(
            KernelPath::Portable,
            2,
            &x,
            3,
            k,
            WeightRef::Packed(&packed),
            n,
        );
        assert_bits(&got, &want[..3 * n], &format!("{f} k={k} portable"));
        check_close(
            f,
            &x[..4 * k],
            4,
            k,
            &w,
            n,
            &want[..4 * n],
            &format!("{f} k={k}"),
        );
    }
}

#[test]
fn strided_output_equals_contiguous_and_leaves_the_rest_alone() {
    let mut rng = Rng::new(23);
    let (m, k) = (7, 512);
    // A fused projection of three parts in different formats.
    let parts = [
        (QuantFormat::Q4K, 20),
        (QuantFormat::Q4K, 9),
        (QuantFormat::Q6K, 9),
    ];
    let ws: Vec<Vec<u8>> = parts
        .iter()
        .map(|&(f, n)| random_weights(f, n, k, &mut rng))
        .collect();
    let x = rng.vec(m * k);
    let width: usize = parts.iter().map(|p| p.1).sum::<usize>() + 3;
    let bias = rng.vec(width);
    for path in paths() {
        let mut fused = vec![-7.0f32; m * width];
        let mut col = 0;
        for (&(f, n), w) in parts.iter().zip(&ws) {
            let wr = WeightRef::Quant { format: f, data: w };
            let opts = MatmulOptions {
                path: Some(path),
                threads: Some(2),
            };
            let b = &bias[col..col + n];
            matmul_ex(opts, &x, m, k, wr, Some(b), n, &mut fused[col..], width);
            let mut alone = vec![0.0; m * n];
            matmul_ex(opts, &x, m, k, wr, Some(b), n, &mut alone, n);
            for i in 0..m {
                assert_bits(
                    &fused[i * width + col..i * width + col + n],
                    &alone[i * n..(i + 1) * n],
                    &format!("{f} {path} row {i}"),
                );
            }
            col += n;
        }
        for i in 0..m {
            assert!(fused[i * width + col..(i + 1) * width]
                .iter()
                .all(|&v| v == -7.0));
        }
    }
    // The float formats take the stride too.
    let wf = rng.vec(5 * 33);
    let xf = rng.vec(3 * 33);
    let mut a = vec![1.5f32; 3 * 8];
    let mut b = vec![0.0f32; 3 * 5];
    matmul_strided(&xf, 3, 33, WeightRef::F32(&wf), 5, &mut a, 8);
    matmul(&xf, 3, 33, WeightRef::F32(&wf), 5, &mut b);
    for i in 0..3 {
        assert_bits(&a[i * 8..i * 8 + 5], &b[i * 5..i * 5 + 5], "f32 strided");
        assert!(a[i * 8 + 5..i * 8 + 8].iter().all(|&v| v == 1.5));
    }
}

#[test]
fn bias_is_added_after_the_dot_product() {
    let mut rng = Rng::new(24);
    let (m, k, n) = (3, 256, 17);
    for f in [QuantFormat::Q5_1, QuantFormat::Q5K] {
        let w = random_weights(f, n, k, &mut rng);
        let x = rng.vec(m * k);
        let bias = rng.vec(n);
        let wr = WeightRef::Quant {
            format: f,
            data: &w,
        };
        let (mut a, mut b) = (vec![0.0; m * n], vec![0.0; m * n]);
        matmul_bias(&x, m, k, wr, &bias, n, &mut a);
        matmul(&x, m, k, wr, n, &mut b);
        add_bias(&mut b, &bias);
        assert_bits(&a, &b, &format!("{f}"));
    }
}

#[test]
fn rows_ignore_the_other_rows_even_nan() {
    let mut rng = Rng::new(25);
    let (m, k, n) = (6, 256, 17);
    for f in QUANT {
        let w = random_weights(f, n, k, &mut rng);
        let x = rng.vec(m * k);
        let mut poisoned = x.clone();
        for (i, v) in poisoned.iter_mut().enumerate() {
            if i / k != 2 {
                *v = if i % 3 == 0 { f32::NAN } else { 1e30 };
            }
        }
        for path in paths() {
            let wr = WeightRef::Quant {
                format: f,
                data: &w,
            };
            let a = run(path, 2, &x, m, k, wr, n);
            let b = run(path, 2, &poisoned, m, k, wr, n);
            assert_bits(&b[2 * n..3 * n], &a[2 * n..3 * n], &format!("{f} {path}"));
        }
    }
}

#[test]
fn f16_weights_match_the_reference_on_every_path() {
    let mut rng = Rng::new(26);
    let cpu = cpu_features();
    for &(m, k, n) in &[(1usize, 17usize, 5usize), (5, 64, 9), (70, 300, 13)] {
        let w: Vec<u16> = rng
            .vec(n * k)
            .iter()
            .map(|&v| formats::f32_to_f16(v))
            .collect();
        let x = rng.vec(m * k);
        let mut want = vec![0.0; m * n];
        matmul_reference(&x, m, k, WeightRef::F16(&w), n, &mut want);
        let mut seen = Vec::new();
        for p in KernelPath::ALL {
            let p = cpu.clamp(KernelFamily::F16, p);
            if seen.contains(&p) {
                continue;
            }
            seen.push(p);
            let got = run(p, 2, &x, m, k, WeightRef::F16(&w), n);
            let single = run(p, 1, &x[(m - 1) * k..], 1, k, WeightRef::F16(&w), n);
            assert_bits(
                &got[(m - 1) * n..],
                &single,
                &format!("f16 {p} batch invariance"),
            );
            for (g, r) in got.iter().zip(&want) {
                assert!(
                    (g - r).abs() <= 1e-4 * (k as f32).sqrt(),
                    "f16 {p}: {g} vs {r}"
                );
            }
        }
        // The same bytes through `Quant { F16 }` give the same bits.
        let bytes: Vec<u8> = w.iter().flat_map(|h| h.to_le_bytes()).collect();
        let a = run(
            cpu.clamp(KernelFamily::F16, KernelPath::Avx512),
            2,
            &x,
            m,
            k,
            WeightRef::Quant {
                format: QuantFormat::F16,
                data: &bytes,
            },
            n,
        );
        let b = run(
            cpu.clamp(KernelFamily::F16, KernelPath::Avx512),
            2,
            &x,
            m,
            k,
            WeightRef::F16(&w),
            n,
        );
        assert_bits(&a, &b, "f16 bytes");
    }
}

#[test]
fn activation_partners_match_llama_cpp_on_simple_blocks() {
    // Q8_0: d = amax/127 stored as f16; q = round-half-even(x·127/amax).
    let mut x = [0.0f32; 32];
    x[0] = 127.0;
    x[1] = 0.5;
    x[2] = 1.5;
    x[3] = -2.5;
    let mut q = [0i8; 32];
    let (d, s, sum) = quant::quantize_q8_0_block(&x, &mut q);
    assert_eq!(d, 1.0);
    assert_eq!(&q[..4], &[127, 0, 2, -2], "ties go to even");
    assert_eq!(sum, 127);
    assert_eq!(s, 127.0);
    // Q8_K: iscale = -127/max, d = 1/iscale, and the sums of 16.
    let mut x = [0.0f32; 256];
    x[5] = -254.0;
    x[20] = 3.0;
    let mut q = [0i8; 256];
    let mut sums = [0i32; 16];
    let d = quant::quantize_q8_k_block(&x, &mut q, &mut sums);
    assert_eq!(d, 2.0, "iscale = -127 / -254");
    assert_eq!((q[5], q[20]), (-127, 2), "3 · 0.5 = 1.5 rounds to 2");
    assert_eq!((sums[0], sums[1]), (-127, 2));
}

#[test]
fn degenerate_and_bad_shapes() {
    let w = vec![0u8; 3 * 34];
    let wr = WeightRef::Quant {
        format: QuantFormat::Q8_0,
        data: &w,
    };
    // m = 0 and n = 0 do nothing.
    matmul(&[], 0, 32, wr, 3, &mut []);
    matmul(
        &[0.0; 32],
        1,
        32,
        WeightRef::Quant {
            format: QuantFormat::Q8_0,
            data: &[],
        },
        0,
        &mut [],
    );
    // Zero weights give zeros (plus the bias).
    let mut out = [f32::NAN; 3];
    matmul_bias(&[1.0; 32], 1, 32, wr, &[1.0, 2.0, 3.0], 3, &mut out);
    assert_eq!(out, [1.0, 2.0, 3.0]);
    let r = std::panic::catch_unwind(|| {
        let mut out = [0.0f32; 3];
        matmul(&[0.0; 33], 1, 33, wr, 3, &mut out);
    });
    assert!(r.is_err(), "k not a whole number of blocks");
    let r = std::panic::catch_unwind(|| {
        let mut out = [0.0f32; 4];
        matmul(&[0.0; 32], 1, 32, wr, 4, &mut out);
    });
    assert!(r.is_err(), "too few weight bytes");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random shapes: a batched call equals single-row calls bit for bit,
    /// on every path, for every format.
    #[test]
    fn batched_rows_equal_single_rows(
        seed in any::<u64>(),
        fi in 0usize..8,
        m in 1usize..12,
        blocks in 1usize..4,
        n in 1usize..40,
        threads in 1usize..4,
    ) {
        let f = QUANT[fi];
        let k = blocks * f.block_size();
        let mut rng = Rng::new(seed);
        let w = random_weights(f, n, k, &mut rng);
        let x = rng.vec(m * k);
        let wr = WeightRef::Quant { format: f, data: &w };
        for path in paths() {
            let batched = run(path, threads, &x, m, k, wr, n);
            for i in 0..m {
                let single = run(path, 1, &x[i * k..], 1, k, wr, n);
                prop_assert!(
                    batched[i * n..(i + 1) * n]
                        .iter()
                        .zip(&single)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} {} row {}", f, path, i
                );
            }
        }
    }
}
