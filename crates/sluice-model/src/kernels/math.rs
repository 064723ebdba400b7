//! Scalar math shared by the compiled-loop kernels (RMSNorm, SwiGLU,
//! attention): a dot product in a fixed order and a vectorisable `e^x`.
//!
//! Owns: these two functions and the constants of `exp_f32` (which the
//! AVX-512 attention kernel shares for its vector form). Promises: plain
//! IEEE arithmetic in a fixed order, so a loop over them gives the same
//! bits on every kernel path it is compiled for, and no call into libm, so
//! such loops vectorise.

/// Dot product with 16 independent partial sums, reduced pairwise (used by
/// RMSNorm).
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

/// `a·b + c`, fused into one rounding when `FMA` (the AVX2 / AVX-512
/// instantiations of a kernel) or as two roundings otherwise.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

// Constants of `exp_f32` (shared with the vector version).
pub(crate) const EXP_LO: f32 = -87.0;
pub(crate) const EXP_HI: f32 = 88.0;
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a high part exact in f32 and a low correction.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds to an integer kept in the low mantissa bits.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;
/// Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf), highest
/// degree first.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];

/// `e^x` within ~2 ulp of `f32::exp`, in plain arithmetic so that loops
/// over it vectorise. The argument is clamped to [-87, 88]: below, `e^x`
/// would be subnormal and comes out as about 1e-38 instead (no softmax or
/// sigmoid can tell); above, it would overflow.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let k = x * LOG2E + ROUND_MAGIC;
    let n_bits = k.to_bits().wrapping_sub(ROUND_MAGIC.to_bits()) as i32;
    let n = k - ROUND_MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p * r + c;
    }
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
        while x <= 88.0 {
            let (a, b) = (exp_f32(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) < 1e-37);
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
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
