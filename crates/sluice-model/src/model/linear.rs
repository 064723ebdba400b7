//! Linear layers, possibly made of parts: `y = x·Wᵀ + b` where `W` stacks
//! several tensors along its rows (q/k/v, gate/up).
//!
//! Parts that share one weight format are fused at load into one matrix,
//! so the layer is one matmul call (every safetensors checkpoint: the loader
//! converts all of them to one dtype). Parts stored in different formats (a
//! GGUF Q4_K_M file keeps q and k in Q4_K and v in Q6_K) cannot share a
//! matrix; each runs its own matmul into its columns of the fused output,
//! so the callers see the same `[m × out_features]` rows either way.
//!
//! Promises: the fused path is exactly one `matmul` / `matmul_bias` call, as
//! before parts existed. The parts path writes each part straight into its
//! columns (`matmul_strided`, bit for bit the part's contiguous result), so
//! a part's columns are what the kernel gives for that part alone, batch
//! invariance carries over, and nothing is allocated or copied.

use crate::kernels::{matmul, matmul_bias, matmul_bias_strided, matmul_strided};
use crate::weights::Weight;

/// One part of a linear layer whose parts have different formats.
#[derive(Clone, Debug)]
pub struct LinearPart {
    /// `[out_features × in_features]`, row-major.
    pub weight: Weight,
    pub out_features: usize,
}

/// The weight of a linear layer.
#[derive(Clone, Debug)]
pub enum LinearWeight {
    /// One `[out × in]` matrix (the parts, if any, share a format).
    Fused(Weight),
    /// Parts in row order, each in its own format.
    Parts(Vec<LinearPart>),
}

/// A linear layer `y = x·Wᵀ + b` with `W` row-major `[out × in]`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: LinearWeight,
    /// `out_features` values (the parts' biases concatenated), always f32.
    pub bias: Option<Vec<f32>>,
    pub in_features: usize,
    pub out_features: usize,
}

impl Linear {
    /// A layer over one matrix.
    pub fn fused(
        weight: Weight,
        bias: Option<Vec<f32>>,
        in_features: usize,
        out_features: usize,
    ) -> Self {
        Linear {
            weight: LinearWeight::Fused(weight),
            bias,
            in_features,
            out_features,
        }
    }

    /// `out[m × out_features] = x[m × in_features]·Wᵀ (+ b)`, the bias
    /// added inside the kernel's store (no second pass over `out`).
    pub fn forward(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (k, n) = (self.in_features, self.out_features);
        match &self.weight {
            LinearWeight::Fused(w) => {
                let w = w.as_weight_ref();
                match &self.bias {
                    Some(b) => matmul_bias(x, m, k, w, b, n, out),
                    None => matmul(x, m, k, w, n, out),
                }
            }
            LinearWeight::Parts(_) if m == 0 => {}
            LinearWeight::Parts(parts) => {
                let out = &mut out[..m * n];
                let mut col = 0;
                for part in parts {
                    let rows = part.out_features;
                    let w = part.weight.as_weight_ref();
                    // Row i of this part lands at out[i·n + col ..][..rows].
                    let dst = &mut out[col..];
                    match &self.bias {
                        Some(b) => {
                            matmul_bias_strided(x, m, k, w, &b[col..col + rows], rows, dst, n)
                        }
                        None => matmul_strided(x, m, k, w, rows, dst, n),
                    }
                    col += rows;
                }
            }
        }
    }

    /// Bytes of weights and bias held.
    pub fn size_in_bytes(&self) -> usize {
        let weights = match &self.weight {
            LinearWeight::Fused(w) => w.size_in_bytes(),
            LinearWeight::Parts(parts) => parts.iter().map(|p| p.weight.size_in_bytes()).sum(),
        };
        weights + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }

    /// The fused matrix, when the layer has one.
    pub fn fused_weight(&self) -> Option<&Weight> {
        match &self.weight {
            LinearWeight::Fused(w) => Some(w),
            LinearWeight::Parts(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::f32_to_bf16;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.5)
            .collect()
    }

    /// q/k/v of 24 / 8 / 8 rows over k = 40, x of 5 rows.
    fn setup() -> (Vec<f32>, [Vec<f32>; 3], Vec<f32>) {
        let k = 40;
        let x = values(5 * k, 1);
        let w = [values(24 * k, 2), values(8 * k, 3), values(8 * k, 4)];
        let b = values(40, 5);
        (x, w, b)
    }

    /// Mixed formats (v in bf16): every part's columns are bitwise what the
    /// kernel gives for that part alone, bias included.
    #[test]
    fn mixed_parts_fill_their_columns() {
        let (x, [q, kk, v], b) = setup();
        let (m, k) = (5, 40);
        let v16: Vec<u16> = v.iter().map(|&a| f32_to_bf16(a)).collect();
        let lin = Linear {
            weight: LinearWeight::Parts(vec![
                LinearPart {
                    weight: Weight::F32(q.clone()),
                    out_features: 24,
                },
                LinearPart {
                    weight: Weight::F32(kk.clone()),
                    out_features: 8,
                },
                LinearPart {
                    weight: Weight::Bf16(v16.clone()),
                    out_features: 8,
                },
            ]),
            bias: Some(b.clone()),
            in_features: k,
            out_features: 40,
        };
        let mut out = vec![f32::NAN; m * 40];
        lin.forward(&x, m, &mut out);
        let mut col = 0;
        for (w, rows) in [
            (Weight::F32(q), 24),
            (Weight::F32(kk), 8),
            (Weight::Bf16(v16), 8),
        ] {
            let mut alone = vec![0.0; m * rows];
            matmul_bias(
                &x,
                m,
                k,
                w.as_weight_ref(),
                &b[col..col + rows],
                rows,
                &mut alone,
            );
            for i in 0..m {
                assert_eq!(
                    out[i * 40 + col..i * 40 + col + rows],
                    alone[i * rows..(i + 1) * rows]
                );
            }
            col += rows;
        }
        // Row 3 alone gives the same row: batch invariance holds.
        let mut one = vec![0.0; 40];
        lin.forward(&x[3 * k..4 * k], 1, &mut one);
        assert_eq!(one, out[3 * 40..4 * 40]);
    }

    /// The same three parts in one format, fused or not: the same values.
    #[test]
    fn parts_of_one_format_equal_the_fused_matrix() {
        let (x, [q, kk, v], b) = setup();
        let (m, k) = (5, 40);
        let fused: Vec<f32> = [q.clone(), kk.clone(), v.clone()].concat();
        let fused = Linear::fused(Weight::F32(fused), Some(b.clone()), k, 40);
        let parts = Linear {
            weight: LinearWeight::Parts(
                [(q, 24), (kk, 8), (v, 8)]
                    .into_iter()
                    .map(|(w, r)| LinearPart {
                        weight: Weight::F32(w),
                        out_features: r,
                    })
                    .collect(),
            ),
            bias: Some(b),
            in_features: k,
            out_features: 40,
        };
        let (mut a, mut c) = (vec![0.0; m * 40], vec![0.0; m * 40]);
        fused.forward(&x, m, &mut a);
        parts.forward(&x, m, &mut c);
        assert_eq!(a, c);
        assert_eq!(fused.size_in_bytes(), parts.size_in_bytes());
    }
}
