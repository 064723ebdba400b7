//! The activation partners of the quantized formats: each row of `x`
//! quantized per block to Q8_0 / Q8_1 / Q8_K, exactly as llama.cpp's x86
//! build does (the module docs of `quant` spell the rounding out).
//!
//! Owns: `ActKind`, the per-call buffers (`Acts`) and the one-block
//! quantizers. Promises: a warm call allocates nothing (buffers only grow).

// Tile loops index several arrays by the same (i, j); ranges read closer
// to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use crate::kernels::formats::{f16_to_f32, f32_to_f16, QuantFormat};

/// The activation format a weight format's integer kernels pair with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActKind {
    /// Elements per activation block.
    pub(crate) fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 32,
            ActKind::Q8K => 256,
        }
    }

    /// Integer sums kept per block: the block's Σq, or Q8_K's 16 sums of 16.
    pub(crate) fn sums_per_block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 1,
            ActKind::Q8K => 16,
        }
    }
}

/// One activation block, as the scalar steps read it.
pub(crate) struct ActBlock<'a> {
    pub qs: &'a [i8],
    /// The block scale: Q8_0/Q8_1's f16-rounded `d` widened, Q8_K's f32 `d`.
    pub d: f32,
    /// Q8_1: `f16(d · Σq)` widened; 0 otherwise.
    pub s: f32,
    /// Σq (Q8_0/Q8_1), or the 16 sums of 16 (Q8_K).
    pub sums: &'a [i32],
}

/// Activation rows quantized for one call.
#[derive(Default)]
pub(crate) struct Acts {
    pub kind: Option<ActKind>,
    pub m: usize,
    pub k: usize,
    /// Blocks per row.
    pub nb: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub sums: Vec<i32>,
}

impl Acts {
    /// Quantizes `x[m×k]` (rows `ldx` apart) for `kind`, reusing buffers.
    pub(crate) fn quantize(&mut self, kind: ActKind, x: &[f32], ldx: usize, m: usize, k: usize) {
        let block = kind.block();
        debug_assert!(k.is_multiple_of(block));
        let nb = k / block;
        let spb = kind.sums_per_block();
        self.kind = Some(kind);
        self.m = m;
        self.k = k;
        self.nb = nb;
        // `resize` only grows the buffers: a warm step allocates nothing.
        fit(&mut self.qs, m * k, 0);
        fit(&mut self.d, m * nb, 0.0);
        fit(&mut self.s, m * nb, 0.0);
        fit(&mut self.sums, m * nb * spb, 0);
        for i in 0..m {
            let row = &x[i * ldx..i * ldx + k];
            for b in 0..nb {
                let src = &row[b * block..(b + 1) * block];
                let qs = &mut self.qs[i * k + b * block..i * k + (b + 1) * block];
                let at = i * nb + b;
                match kind {
                    ActKind::Q8_0 | ActKind::Q8_1 => {
                        let (d, s, sum) = quantize_q8_0_block(src, qs);
                        self.d[at] = d;
                        self.s[at] = if kind == ActKind::Q8_1 { s } else { 0.0 };
                        self.sums[at] = sum;
                    }
                    ActKind::Q8K => {
                        let sums = &mut self.sums[at * 16..at * 16 + 16];
                        self.d[at] = quantize_q8_k_block(src, qs, sums);
                        self.s[at] = 0.0;
                    }
                }
            }
        }
    }

    /// Block `b` of row `i`.
    pub(crate) fn block(&self, i: usize, b: usize) -> ActBlock<'_> {
        let kind = self.kind.unwrap_or(ActKind::Q8_0);
        let block = kind.block();
        let spb = kind.sums_per_block();
        let at = i * self.nb + b;
        ActBlock {
            qs: &self.qs[i * self.k + b * block..i * self.k + (b + 1) * block],
            d: self.d[at],
            s: self.s[at],
            sums: &self.sums[at * spb..(at + 1) * spb],
        }
    }
}

fn fit<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}

/// `x.round_ties_even()` for the quantizers' `|x| <= 2²²` (scaled values
/// of at most 127 in magnitude; NaN stays NaN), by ggml's 1.5·2²³ trick:
/// adding it leaves no fraction bits, so the FPU's round-to-nearest-even
/// does the rounding. `round_ties_even` itself is a libm call (`rintf`)
/// on x86-64's baseline, which showed in prefill profiles.
#[inline(always)]
fn round_half_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
    (x + MAGIC) - MAGIC
}

/// One Q8_0 / Q8_1 block as llama.cpp's AVX2 `quantize_row_q8_0/1` makes
/// it: returns `(f16(d) widened, f16(d·Σq) widened, Σq)`.
pub(crate) fn quantize_q8_0_block(x: &[f32], q: &mut [i8]) -> (f32, f32, i32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        // `_mm256_round_ps(_MM_ROUND_NEAREST)` then `cvtps_epi32`; the sum
        // is taken before the saturating packs (which never bind: |v·id|
        // <= 127 up to rounding).
        let r = round_half_even(v * id);
        let r = if r.is_nan() { 0 } else { r as i32 };
        sum += r;
        *o = r.clamp(-128, 127) as i8;
    }
    let dh = f16_to_f32(f32_to_f16(d));
    let s = f16_to_f32(f32_to_f16(d * sum as f32));
    (dh, s, sum)
}

/// One Q8_K block (ggml's `quantize_row_q8_K_ref`, what x86 runs): returns
/// `d`; writes the quants and the 16 sums of 16.
pub(crate) fn quantize_q8_k_block(x: &[f32], q: &mut [i8], sums: &mut [i32]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        sums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q.iter_mut().zip(x) {
        // ggml's `nearest_int` (the 1.5·2²³ trick) rounds half to even.
        let r = round_half_even(iscale * v);
        let r = if r.is_nan() { 0 } else { r as i32 };
        *o = r.clamp(-128, 127) as i8;
    }
    for (j, s) in sums.iter_mut().enumerate() {
        *s = q[j * 16..(j + 1) * 16].iter().map(|&v| v as i32).sum();
    }
    1.0 / iscale
}

/// The values the kernels actually multiply for activation row `x`: each
/// element dequantized from its partner block (`d · q`), for tolerance
/// arguments in tests.
pub fn quantized_activations(format: QuantFormat, x: &[f32]) -> Vec<f32> {
    let Some(kern) = format.info().kernels else {
        return x.to_vec();
    };
    let k = x.len();
    let mut acts = Acts::default();
    acts.quantize(kern.act, x, k, 1, k);
    let mut out = Vec::with_capacity(k);
    for b in 0..acts.nb {
        let a = acts.block(0, b);
        out.extend(a.qs.iter().map(|&q| a.d * q as f32));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::round_half_even;

    #[test]
    fn the_rounding_trick_is_round_ties_even_in_range() {
        // Every multiple of 1/8 in [-200, 200] (halves included), and
        // awkward values near them.
        let mut xs: Vec<f32> = (-1600..=1600).map(|i| i as f32 / 8.0).collect();
        xs.extend([
            0.49999997,
            -0.49999997,
            126.5,
            -127.5,
            1e-30,
            -0.0,
            4_194_303.5,
        ]);
        for x in xs {
            assert_eq!(
                round_half_even(x).to_bits() & !(1 << 31),
                x.round_ties_even().to_bits() & !(1 << 31),
                "{x}"
            );
        }
        assert!(round_half_even(f32::NAN).is_nan());
    }
}
