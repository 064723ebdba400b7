//! Vocabulary-wide loops of the sampler, written so the compiler vectorises
//! them: fixed-width lane accumulators, branch-free selects, no calls into
//! libm inside the loops.
//!
//! Only IEEE-754 basic operations (no fused multiply-add, whose use would
//! depend on the target) are used on the sampling path, so a token choice is
//! bit-for-bit the same on every platform. Each loop is compiled for every
//! path of `KernelFamily::Sampling` (`kernels::multiversion!`), which the
//! kernels' one dispatch picks from.

use crate::kernels::multiversion;

/// Elements per block: small enough that a block stays in L1 between the
/// exponential pass and its sum, large enough that the per-block bookkeeping
/// is negligible.
pub(crate) const BLOCK: usize = 512;

/// Lanes of the vectorised reductions (one AVX-512 register of f32, two AVX2
/// ones); also fixes the summation order, hence the result.
const LANES: usize = 16;

/// `exp(x)` for `x <= 0` to about 2 ulp, branch-free so it vectorises.
///
/// Returns exactly 0 for `x < -87` (and for NaN or -inf), which the sampler
/// relies on: masked tokens must have zero probability, and tokens
/// `e^-87 ≈ 1.6e-38` below the maximum are zero in f32 softmax too. Positive
/// `x` are clamped at 88 (the sampler never passes them).
///
/// Cephes' `expf`: `x = n ln2 + r` with `|r| <= ln2/2`, a degree-7
/// polynomial for `e^r`, then `2^n` built in the exponent bits.
#[inline(always)]
#[allow(clippy::excessive_precision)] // Cephes' coefficients, as published
pub(crate) fn exp_nonpos(x: f32) -> f32 {
    const LO: f32 = -87.0;
    const HI: f32 = 88.0;
    // 1.5 * 2^23: adding it rounds to the nearest integer, which lands in the
    // low mantissa bits (no float->int conversion or floor needed, neither of
    // which vectorises on baseline x86-64).
    const MAGIC: f32 = 12_582_912.0;
    let xc = if x < LO { LO } else { x };
    let xc = if xc > HI { HI } else { xc };
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n_int = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let n = t - MAGIC;
    // ln 2 split in two so that n * C1 is exact.
    let r = xc - n * 0.693_359_375 - n * -2.121_944_400_5e-4;
    let p = ((((1.987_569_150_0e-4 * r + 1.398_199_950_7e-3) * r + 8.333_451_907_3e-3) * r
        + 4.166_579_589_4e-2)
        * r
        + 1.666_666_545_9e-1)
        * r
        + 5.000_000_120_1e-1;
    let p = p * r * r + r + 1.0;
    // n is in [-126, 127] after the clamp, so this is a normal power of two.
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    let y = p * scale;
    // `>=` is false for NaN, so NaN maps to 0 as well.
    if x >= LO {
        y
    } else {
        0.0
    }
}

/// Largest element ignoring NaN; -inf for an empty or all-NaN slice.
#[inline(always)]
fn max_lanes(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            // `v > a` is false for NaN, so NaN never enters (maxps semantics).
            *a = if v > *a { v } else { *a };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in acc.iter().chain(rem) {
        m = if v > m { v } else { m };
    }
    m
}

/// Sum with a fixed lane order (so the result is reproducible).
#[inline(always)]
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rem = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    let mut s = 0.0f32;
    for &v in acc.iter().chain(rem) {
        s += v;
    }
    s
}

/// Number of elements for which `pred` holds. Counted in f32 lanes on
/// purpose: integer lane counters get vectorised across iterations into a
/// gather-like mess (integer adds may be reassociated), while float adds may
/// not, which leaves one clean vector compare-and-add per chunk. Pieces of
/// 2^20 elements keep every lane (at most 2^16) exact in f32.
#[inline(always)]
fn count_lanes(x: &[f32], pred: impl Fn(f32) -> bool) -> usize {
    let mut n = 0usize;
    for piece in x.chunks(1 << 20) {
        let (chunks, rem) = piece.as_chunks::<LANES>();
        let mut acc = [0.0f32; LANES];
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += if pred(v) { 1.0 } else { 0.0 };
            }
        }
        n += acc.iter().map(|&a| a as usize).sum::<usize>();
        n += rem.iter().filter(|&&v| pred(v)).count();
    }
    n
}

multiversion! { Sampling;
    /// Largest element ignoring NaN; -inf for an empty or all-NaN slice.
    pub(crate) fn max(x: &[f32]) -> f32 {
        max_lanes(x)
    }
}

multiversion! { Sampling;
    /// Index of the first maximum (as `torch.argmax`), NaN counting as -inf.
    /// 0 when the slice is empty or holds nothing but -inf / NaN.
    ///
    /// One pass over memory: a vectorised maximum per block, and a scan of
    /// the block for the position only when the block improves on the best.
    pub(crate) fn argmax(x: &[f32]) -> usize {
        let mut best = f32::NEG_INFINITY;
        let mut best_i = 0;
        for (b, block) in x.chunks(BLOCK).enumerate() {
            let m = max_lanes(block);
            // Strict `>`: an equal maximum in a later block is not the first.
            if m > best {
                best = m;
                // `max_lanes` returns one of the block's values, so it is found.
                best_i = b * BLOCK + block.iter().position(|&v| v == m).unwrap_or(0);
            }
        }
        best_i
    }
}

multiversion! { Sampling;
    /// Number of elements whose logprob `(x - max) - ln_sum` is `>= lp`
    /// (NaN elements never are): the rank of a token with logprob `lp`.
    pub(crate) fn count_logprob_ge(x: &[f32], max: f32, ln_sum: f32, lp: f32) -> usize {
        count_lanes(x, |v| (v - max) - ln_sum >= lp)
    }
}

multiversion! { Sampling;
    /// Divides every logit by `temperature` (unless it is 1), maps NaN to
    /// -inf, and returns the maximum. Division rather than multiplication by
    /// `1/t` because that is what vLLM's `apply_temperature` computes.
    pub(crate) fn scale_sanitize_max(x: &mut [f32], temperature: f32) -> f32 {
        let scale = temperature != 1.0;
        let mut acc = [f32::NEG_INFINITY; LANES];
        let mut chunks = x.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for (a, v) in acc.iter_mut().zip(c.iter_mut()) {
                let y = if scale { *v / temperature } else { *v };
                let y = if y.is_nan() { f32::NEG_INFINITY } else { y };
                *v = y;
                *a = if y > *a { y } else { *a };
            }
        }
        let mut m = f32::NEG_INFINITY;
        for v in chunks.into_remainder() {
            let y = if scale { *v / temperature } else { *v };
            let y = if y.is_nan() { f32::NEG_INFINITY } else { y };
            *v = y;
            m = if y > m { y } else { m };
        }
        for &a in &acc {
            m = if a > m { a } else { m };
        }
        m
    }
}

multiversion! { Sampling;
    /// Sum of `exp(x_i - max)` over a row (NaN counting as -inf), accumulated
    /// per block in f32 lanes and across blocks in f64. `max` must be finite.
    pub(crate) fn sum_exp_shifted(x: &[f32], max: f32) -> f64 {
        let mut total = 0.0f64;
        let mut buf = [0.0f32; BLOCK];
        for block in x.chunks(BLOCK) {
            let buf = &mut buf[..block.len()];
            for (e, &v) in buf.iter_mut().zip(block) {
                *e = exp_nonpos(v - max);
            }
            total += f64::from(sum_lanes(buf));
        }
        total
    }
}

multiversion! { Sampling;
    /// Turns scaled logits into unnormalised probabilities in place:
    /// `e_i = exp(l_i - max)`, or 0 for tokens below `floor` (top-k) or with
    /// `e_i < min_ratio` (min-p, whose threshold `p_i < min_p * p_max` is
    /// `e_i < min_p` since `e_max = 1`). Records one f64 sum per [`BLOCK`] in
    /// `block_sums` (for a fast inverse-CDF scan) and, when `hist` is given,
    /// the mass per f32 exponent (for top-p). Returns the total. `max` must
    /// be finite.
    pub(crate) fn exp_in_place(
        x: &mut [f32],
        max: f32,
        floor: f32,
        min_ratio: f32,
        block_sums: &mut Vec<f64>,
        hist: Option<&mut ExpHist>,
    ) -> f64 {
        let mut hist = hist;
        block_sums.clear();
        let mut total = 0.0f64;
        for block in x.chunks_mut(BLOCK) {
            for v in block.iter_mut() {
                let l = *v;
                let e = exp_nonpos(l - max);
                // `&`, not `&&`: no branch, so the loop vectorises.
                *v = if (l >= floor) & (e >= min_ratio) { e } else { 0.0 };
            }
            let s = f64::from(sum_lanes(block));
            block_sums.push(s);
            total += s;
            if let Some(h) = hist.as_deref_mut() {
                h.add(block);
            }
        }
        if let Some(h) = hist {
            h.finish();
        }
        total
    }
}

/// Inverse-CDF draw over unnormalised weights `e` whose per-block sums (in
/// order) are `block_sums` and total `total`: the first token whose running
/// sum exceeds `u * total`. Zero-weight tokens are never returned unless
/// nothing has weight (then 0).
pub(crate) fn scan_blocks(e: &[f32], block_sums: &[f64], total: f64, u: f64) -> usize {
    let target = u * total;
    let mut acc = 0.0f64;
    for (b, &s) in block_sums.iter().enumerate() {
        if s > 0.0 && acc + s > target {
            let start = b * BLOCK;
            let block = e.get(start..(start + BLOCK).min(e.len())).unwrap_or(&[]);
            let mut a = acc;
            let mut last = None;
            for (j, &v) in block.iter().enumerate() {
                if v > 0.0 {
                    last = Some(j);
                    a += f64::from(v);
                    if a > target {
                        return start + j;
                    }
                }
            }
            // The sequential sum came out a hair below the lane sum: the draw
            // belongs to this block's last token with weight.
            if let Some(j) = last {
                return start + j;
            }
        }
        acc += s;
    }
    // Rounding left the draw past the end: take the last token with weight.
    e.iter().rposition(|&v| v > 0.0).unwrap_or(0)
}

/// Mass of unnormalised probabilities (all in `[0, 1]`) per f32 exponent:
/// bucket `b` holds values in `[2^(b-127), 2^(b-126))`, bucket 0 the zeros.
pub(crate) struct ExpHist {
    /// Valid after [`ExpHist::finish`].
    pub(crate) mass: [f64; 256],
    /// Consecutive elements go to different copies: most values share a
    /// handful of buckets, and a single table would serialise every add on
    /// the previous one's store (a ~5-cycle chain per element).
    parts: [[f64; 256]; HIST_WAYS],
}

const HIST_WAYS: usize = 8;

impl ExpHist {
    pub(crate) fn new() -> Self {
        Self {
            mass: [0.0; 256],
            parts: [[0.0; 256]; HIST_WAYS],
        }
    }

    pub(crate) fn clear(&mut self) {
        self.mass = [0.0; 256];
        self.parts = [[0.0; 256]; HIST_WAYS];
    }

    #[inline(always)]
    fn add(&mut self, e: &[f32]) {
        let (chunks, rem) = e.as_chunks::<HIST_WAYS>();
        for c in chunks {
            for (part, &v) in self.parts.iter_mut().zip(c) {
                part[exponent_bucket(v)] += f64::from(v);
            }
        }
        for &v in rem {
            self.parts[0][exponent_bucket(v)] += f64::from(v);
        }
    }

    /// Folds the copies into `mass` (in a fixed order: reproducible).
    fn finish(&mut self) {
        for (b, m) in self.mass.iter_mut().enumerate() {
            *m = self.parts.iter().map(|p| p[b]).sum();
        }
    }
}

#[inline(always)]
pub(crate) fn exponent_bucket(e: f32) -> usize {
    ((e.to_bits() >> 23) & 0xFF) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exp_matches_std_over_the_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpos(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.000_97;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(f32::NAN), 0.0);
        assert_eq!(exp_nonpos(-1000.0), 0.0);
    }

    #[test]
    fn argmax_first_of_ties_across_blocks() {
        let mut x = vec![0.0f32; 3 * BLOCK + 7];
        x[BLOCK + 3] = 5.0;
        x[2 * BLOCK + 1] = 5.0;
        x[5] = f32::NAN;
        assert_eq!(argmax(&x), BLOCK + 3);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
        assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), 1);
    }

    proptest! {
        #[test]
        fn argmax_equals_naive(x in prop::collection::vec(-50.0f32..50.0, 1..2000)) {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            prop_assert_eq!(argmax(&x), best);
        }

        #[test]
        fn exp_relative_error(x in -87.0f32..=0.0) {
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpos(x));
            prop_assert!(((got - want) / want).abs() < 4e-7);
        }
    }
}
