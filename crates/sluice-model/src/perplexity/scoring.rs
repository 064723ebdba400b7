//! The per-position figures of `llama-perplexity` and their statistics:
//! the negative log-likelihood of the next token, the base model's log
//! probabilities packed as 16-bit codes, KL divergence against them, the
//! token probability difference and the "same top token" count — each
//! computed in llama.cpp's precision (f32 logits and `expf`, sums in f64),
//! so that the same logits give the same figures.

/// Per row of a base log-probability file: two f32 (scale, minimum log
/// probability) as four 16-bit words, then one code per token, padded to
/// an even count (llama.cpp's `nv`).
pub fn base_row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Below this log probability a base token counts as zero probability in
/// the KL divergence, and codes cover `[max − 16, max]` of the logits.
const LOG_PROB_FLOOR: f32 = -16.0;

/// `(max, Σ exp(l − max))` over a row, in llama.cpp's types: the max in
/// f32, each `expf` in f32, the sum in f64.
fn max_and_sum_exp(logits: &[f32]) -> (f32, f64) {
    let max = logits[1..].iter().fold(logits[0], |m, &l| m.max(l));
    let sum = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (max, sum)
}

/// The negative log-likelihood of `tok` (llama.cpp's `log_softmax` of
/// plain perplexity: `−(l_tok − max − ln Σ)` with the log in f64).
pub fn nll(logits: &[f32], tok: usize) -> f64 {
    let (max, sum) = max_and_sum_exp(logits);
    -(((logits[tok] - max) as f64) - sum.ln())
}

/// Round to nearest, ties to even, as llama.cpp's `nearest_int` (valid
/// below 2²² in magnitude, which codes of at most 65535 are).
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Packs a row's log probabilities into `out` (`base_row_len` words) as
/// `llama-perplexity --kl-divergence-base` stores them: logits below
/// `max − 16` become the floor, the rest 16-bit codes of `scale = (max −
/// min) / 65535`. Returns the negative log-likelihood of `tok`, computed
/// in f32 as that mode does.
pub fn encode_base_row(logits: &[f32], tok: usize, out: &mut [u16]) -> f64 {
    let n = logits.len();
    debug_assert_eq!(out.len(), base_row_len(n));
    let (max, sum) = max_and_sum_exp(logits);
    let min = logits[1..].iter().fold(logits[0], |m, &l| m.min(l));
    let min = min.max(max + LOG_PROB_FLOOR);
    let log_sum_exp = sum.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    put_f32(out, 0, scale);
    put_f32(out, 1, min_log_prob);
    let codes = &mut out[4..];
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (c, &l) in codes.iter_mut().zip(logits) {
            // A C `int` to `uint16_t` conversion keeps the low 16 bits.
            *c = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    } else {
        codes[..n].fill(0);
    }
    codes[n..].fill(0);
    (max + log_sum_exp - logits[tok]) as f64
}

fn put_f32(row: &mut [u16], i: usize, v: f32) {
    let b = v.to_bits();
    row[2 * i] = b as u16;
    row[2 * i + 1] = (b >> 16) as u16;
}

fn get_f32(row: &[u16], i: usize) -> f32 {
    f32::from_bits(row[2 * i] as u32 | (row[2 * i + 1] as u32) << 16)
}

/// The base log probability of token `i` of a packed row.
pub fn base_log_prob(row: &[u16], i: usize) -> f32 {
    get_f32(row, 0) * row[4 + i] as f32 + get_f32(row, 1)
}

/// Running sums of plain perplexity.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PplSums {
    pub nll: f64,
    pub nll2: f64,
    pub count: usize,
}

impl PplSums {
    pub fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    /// `exp(mean nll)`.
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// llama.cpp's "Final estimate: PPL = P +/- E": `E = P · σ/√(n−1)` of
    /// the per-token nll; `None` when the variance is not positive.
    pub fn estimate(&self) -> (f64, Option<f64>) {
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        let ppl = mean.exp();
        let err = (var > 0.0).then(|| (var / (n - 1.0)).sqrt() * ppl);
        (ppl, err)
    }
}

/// Running sums of `--kl-divergence` (llama.cpp's `kl_divergence_result`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KldSums {
    pub sum_nll: f64,
    pub sum_nll2: f64,
    pub sum_nll_base: f64,
    pub sum_nll_base2: f64,
    pub sum_nll_nll_base: f64,
    pub sum_kld: f64,
    pub sum_kld2: f64,
    pub sum_p_diff: f64,
    pub sum_p_diff2: f64,
    pub sum_p_diff4: f64,
    pub max_p_diff: f32,
    pub n_same_top: usize,
    pub count: usize,
}

impl KldSums {
    /// One position: the model's `logits` against the packed base row,
    /// `tok` the next token. Returns the position's KL divergence and
    /// probability difference `p(tok) − p_base(tok)`.
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) -> (f32, f32) {
        let mut max = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max {
                max = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob) = (get_f32(base, 0), get_f32(base, 1));
        let codes = &base[4..];

        let nll = max + log_sum_exp - logits[tok];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * codes[tok] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;

        let log_norm = max + log_sum_exp;
        let mut kld = 0f64;
        let mut imax_base = 0;
        let mut base_max = 0f32;
        for (i, (&l, &c)) in logits.iter().zip(codes).enumerate() {
            let lp_base = scale * c as f32 + min_log_prob;
            if i == 0 || lp_base > base_max {
                base_max = lp_base;
                imax_base = i;
            }
            if lp_base > LOG_PROB_FLOOR {
                kld += (lp_base.exp() * (lp_base - l + log_norm)) as f64;
            }
        }
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff as f64;
        let p_diff2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        (kld as f32, p_diff)
    }
}

/// Mean and its standard error, llama.cpp's `mean_and_uncertainty` (no
/// error below 11 values).
pub fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// Covariance of the two means (llama.cpp's `covariance`; 0 below 10).
pub fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1.0)
}

/// The linearly interpolated percentile of sorted `values` (llama.cpp's).
pub fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// The median of sorted `values`.
pub fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n.is_multiple_of(2) {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax in f64 from the definition.
    fn log_probs(logits: &[f32]) -> Vec<f64> {
        let max = logits
            .iter()
            .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
        let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        logits.iter().map(|&l| l as f64 - max - z.ln()).collect()
    }

    fn row(seed: u32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed).wrapping_mul(40503) % 1000)
            .map(|v| v as f32 / 70.0 - 7.0)
            .collect()
    }

    #[test]
    fn nll_is_minus_the_log_softmax() {
        let l = row(1, 101);
        let lp = log_probs(&l);
        for tok in [0, 7, 100] {
            assert!((nll(&l, tok) + lp[tok]).abs() < 1e-5, "{tok}");
        }
    }

    /// Packed codes decode to the log probabilities within half a code
    /// step (and the floor below `max − 16`).
    #[test]
    fn base_rows_decode_to_the_log_probabilities() {
        let mut l = row(2, 257);
        l[3] = -40.0; // far below the floor
        let lp = log_probs(&l);
        let mut packed = vec![0u16; base_row_len(l.len())];
        assert_eq!(packed.len(), 2 * 129 + 4);
        let v = encode_base_row(&l, 5, &mut packed);
        assert!((v + lp[5]).abs() < 1e-5);
        let max = lp.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let step = get_f32(&packed, 0) as f64;
        for (i, &want) in lp.iter().enumerate() {
            let got = base_log_prob(&packed, i) as f64;
            if want < max - 16.0 {
                assert!((got - (max - 16.0)).abs() < 1e-4, "{i}: {got}");
            } else {
                assert!(
                    (got - want).abs() <= 0.5 * step + 1e-5,
                    "{i}: {got} vs {want}"
                );
            }
        }
    }

    /// KL divergence, nll and the top-token count against the definitions
    /// in f64 over the decoded base distribution.
    #[test]
    fn kld_matches_the_definition() {
        let base = row(3, 300);
        let mut packed = vec![0u16; base_row_len(base.len())];
        encode_base_row(&base, 9, &mut packed);
        let q: Vec<f32> = base
            .iter()
            .enumerate()
            .map(|(i, &b)| b + ((i % 7) as f32 - 3.0) * 0.05)
            .collect();
        let lq = log_probs(&q);
        let mut want = 0f64;
        for (i, &lqi) in lq.iter().enumerate() {
            let lb = base_log_prob(&packed, i) as f64;
            if lb > -16.0 {
                want += lb.exp() * (lb - lqi);
            }
        }
        let mut sums = KldSums::default();
        let (kld, p_diff) = sums.add(&q, &packed, 9);
        assert!((kld as f64 - want).abs() < 1e-5, "{kld} vs {want}");
        assert!(kld > 0.0);
        let p_base = (base_log_prob(&packed, 9) as f64).exp();
        assert!((p_diff as f64 - (lq[9].exp() - p_base)).abs() < 1e-5);
        assert!((sums.sum_nll + lq[9]).abs() < 1e-4);
        let argmax = |v: &[f32]| (0..v.len()).fold(0, |m, i| if v[i] > v[m] { i } else { m });
        assert_eq!(sums.n_same_top, (argmax(&q) == argmax(&base)) as usize);
        // Against itself: zero divergence (up to the codes' rounding).
        let mut own = KldSums::default();
        let (k, _) = own.add(&base, &packed, 9);
        assert!(k.abs() < 1e-4, "{k}");
        assert_eq!(own.n_same_top, 1);
    }

    #[test]
    fn statistics_are_llama_cpps() {
        let mut s = PplSums::default();
        for v in [1.0, 2.0, 3.0, 4.0] {
            s.add(v);
        }
        let (ppl, err) = s.estimate();
        assert!((ppl - 2.5f64.exp()).abs() < 1e-12);
        // σ² = 7.5 − 6.25 = 1.25 over n − 1 = 3.
        assert!((err.unwrap() - (1.25f64 / 3.0).sqrt() * ppl).abs() < 1e-12);
        assert_eq!(mean_and_uncertainty(10.0, 30.0, 5), (2.0, 0.0));
        let v = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.5);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(median(&v), 2.5);
        assert_eq!(median(&v[..3]), 2.0);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
    }
}
