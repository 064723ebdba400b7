//! Logprobs of one row of raw logits, as vLLM's `Sampler.compute_logprobs`
//! (log_softmax in f32) and `gather_logprobs` return them: the chosen
//! token's logprob, its rank = the number of tokens whose logprob is `>=`
//! its own (`batched_count_greater_than`, so 1 = best and ties share the
//! worse rank), and the top-n, best first.

use super::kernels;
use super::select::TopN;
use sluice_core::{SampleLogprobs, TokenLogprob};

/// `log_softmax` of a row, with the degenerate rows given a meaning instead
/// of torch's NaN: NaN logits count as -inf; a row with no finite maximum
/// puts all mass on its +inf entries (or, if there are none, has every
/// logprob -inf).
#[derive(Clone, Copy, Debug)]
enum Normaliser {
    /// `logprob = (x - max) - ln(sum exp(x - max))`, torch's formula.
    Finite { max: f32, ln_sum: f32 },
    /// Mass shared equally by the +inf entries.
    PosInf { ln_count: f32 },
    /// Nothing has mass.
    Empty,
}

impl Normaliser {
    fn of(row: &[f32]) -> Self {
        let max = kernels::max(row);
        if max == f32::INFINITY {
            let count = row.iter().filter(|&&x| x == f32::INFINITY).count();
            Normaliser::PosInf {
                ln_count: (count as f32).ln(),
            }
        } else if max == f32::NEG_INFINITY {
            Normaliser::Empty
        } else {
            let sum = kernels::sum_exp_shifted(row, max);
            Normaliser::Finite {
                max,
                ln_sum: sum.ln() as f32,
            }
        }
    }

    #[inline(always)]
    fn logprob(self, x: f32) -> f32 {
        match self {
            Normaliser::Finite { max, ln_sum } => {
                if x.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    (x - max) - ln_sum
                }
            }
            Normaliser::PosInf { ln_count } => {
                if x == f32::INFINITY {
                    -ln_count
                } else {
                    f32::NEG_INFINITY
                }
            }
            Normaliser::Empty => f32::NEG_INFINITY,
        }
    }
}

/// Logprob, rank and top-`n` of `token` in the raw logits `row`. A token
/// outside the row gets logprob -inf (and so rank `row.len()`); `n` is
/// clamped to the row's length.
pub(crate) fn row_logprobs(row: &[f32], token: u32, n: usize, topn: &mut TopN) -> SampleLogprobs {
    let norm = Normaliser::of(row);
    let lp = row
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&x| norm.logprob(x));
    // Counted on logprobs, not logits, as vLLM does: two logits that round
    // to the same logprob tie here too.
    let rank = match norm {
        // Everything is >= -inf (NaN counting as -inf).
        _ if lp == f32::NEG_INFINITY => row.len(),
        Normaliser::Finite { max, ln_sum } => kernels::count_logprob_ge(row, max, ln_sum, lp),
        _ => row.iter().filter(|&&x| norm.logprob(x) >= lp).count(),
    };
    topn.reset(n.min(row.len()));
    topn.extend_row(row);
    let top = topn
        .sorted()
        .iter()
        .map(|&(x, id)| TokenLogprob {
            token_id: id,
            logprob: norm.logprob(x),
        })
        .collect();
    SampleLogprobs {
        sampled: TokenLogprob {
            token_id: token,
            logprob: lp,
        },
        rank,
        top,
    }
}

/// Prompt logprobs: `logits` holds one row of `vocab` logits per prompt
/// position (row `i` predicts token `i + 1`) and `next_tokens[i]` is the
/// token that actually follows. Returns one entry per row, raw log_softmax
/// as for sampled tokens. Rows beyond `next_tokens` (or a trailing partial
/// row) are ignored, so the result has `min(logits.len() / vocab,
/// next_tokens.len())` entries; `vocab == 0` gives none.
pub fn prompt_logprobs(
    logits: &[f32],
    vocab: usize,
    next_tokens: &[u32],
    top_n: usize,
) -> Vec<SampleLogprobs> {
    if vocab == 0 {
        return Vec::new();
    }
    let mut topn = TopN::default();
    logits
        .chunks_exact(vocab)
        .zip(next_tokens)
        .map(|(row, &t)| row_logprobs(row, t, top_n, &mut topn))
        .collect()
}
