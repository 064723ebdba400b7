//! Rotary position embeddings (RoPE), Hugging Face "rotate half" layout,
//! with no / linear / llama3 frequency scaling.
//!
//! Promises: the inverse frequencies and angles are computed the way
//! transformers computes them (f32 `theta^(2i/d)`, f32 `position ·
//! inv_freq`, then cos/sin), so positions land on the same values as the
//! reference to within a rounding of cos/sin. The rotation is compiled for
//! every kernel path of `KernelFamily::Rope` (same operations in the same
//! order on each, so the same bits).

use super::RopeParams;
use crate::config::{ModelConfig, RopeScaling};
use crate::kernels::multiversion;

/// Inverse frequencies of one model; tables per step are built by
/// [`Rope::cos_sin`].
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// The config's own RoPE (`rope_theta`, `rope_scaling`).
    pub fn new(config: &ModelConfig) -> Self {
        Self::from_params(config.head_dim, RopeParams::of(config))
    }

    /// The RoPE of `params` over heads of `head_dim` dimensions (a layer
    /// with a base of its own, such as Gemma 3's local layers).
    pub fn from_params(head_dim: usize, params: RopeParams) -> Self {
        let dim = head_dim;
        let base = params.base as f32;
        let default: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32))
            .collect();
        let inv_freq = match params.scaling {
            RopeScaling::None => default,
            RopeScaling::Linear { factor } => default.iter().map(|f| f / factor as f32).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_len,
            } => {
                // Long wavelengths (low frequencies) are divided by `factor`,
                // short ones kept, and the band between is interpolated.
                let low_freq_wavelen = old_len / low_freq_factor;
                let high_freq_wavelen = old_len / high_freq_factor;
                default
                    .iter()
                    .map(|&f| {
                        let f = f as f64;
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f as f32
                        } else if wavelen > low_freq_wavelen {
                            (f / factor) as f32
                        } else {
                            let smooth = (old_len / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            ((1.0 - smooth) * f / factor + smooth * f) as f32
                        }
                    })
                    .collect()
            }
        };
        Rope { inv_freq }
    }

    /// Each frequency divided by its factor (llama.cpp's `rope_freqs`
    /// tensor, which is how its converter stores Llama 3.1's long-context
    /// scaling). `factors` has `head_dim / 2` entries.
    pub fn divide_by(&mut self, factors: &[f32]) {
        for (f, d) in self.inv_freq.iter_mut().zip(factors) {
            *f /= *d;
        }
    }

    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Fills `cos` and `sin` with one row of `head_dim / 2` values per
    /// position.
    pub fn cos_sin(&self, positions: &[usize], cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        cos.clear();
        sin.clear();
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
    }

    /// Rotates `heads` consecutive heads of `head_dim` values in place, with
    /// one position's `cos` / `sin` row.
    #[inline]
    pub fn apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        rotate_half(x, head_dim, cos, sin);
    }
}

multiversion! { Rope;
    /// "Rotate half" of every `head_dim`-wide head of `x`: the pairs
    /// `(x[i], x[i + head_dim/2])` turned by the angle of `cos[i]` /
    /// `sin[i]`.
    fn rotate_half(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = head_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            let (x1, x2) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_frequencies_match_the_fixture() {
        // rope_scaling_check.inv_freq_llama3 of tests/data/tiny-llama.
        let (mut c, _) = crate::builtin::config("tiny").unwrap();
        c.head_dim = 8;
        c.rope_theta = 10000.0;
        c.rope_scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let want = [1.0, 0.013042256, 0.00125, 0.000125];
        for (got, want) in Rope::new(&c).inv_freq().iter().zip(want) {
            assert!((got - want).abs() <= want * 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let (c, _) = crate::builtin::config("tiny").unwrap();
        let rope = Rope::new(&c);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rope.cos_sin(&[0, 17], &mut cos, &mut sin);
        let half = c.head_dim / 2;
        let x: Vec<f32> = (0..c.head_dim).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y = x.clone();
        Rope::apply(&mut y, c.head_dim, &cos[..half], &sin[..half]);
        assert_eq!(x, y);
        Rope::apply(&mut y, c.head_dim, &cos[half..], &sin[half..]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x) - n(&y)).abs() < 1e-5);
        assert_ne!(x, y);
    }
}
