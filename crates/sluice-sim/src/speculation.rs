//! Speculative decoding in the simulator: how many drafts each request
//! gets after a step, and how many of them verification accepts — vLLM's
//! `synthetic` rejection sampling, where position i of a run of drafts is
//! accepted with probability `p_i / p_{i-1}` given the ones before it
//! (`p`: the unconditional per-position rates of
//! `synthetic_acceptance_rates`, or those vLLM derives from
//! `synthetic_acceptance_length`).
//!
//! The step-time model prices what speculation costs: a request verifying
//! k drafts is a row of k + 1 new tokens in the step's shape, as the
//! scheduler schedules it. Promises: the same seed gives the same
//! acceptances; no draft reaches past `max_model_len`.

use crate::workload::Rng;

/// Speculative decoding settings for a simulated engine.
#[derive(Clone, Debug, PartialEq)]
pub struct SimSpeculation {
    /// Drafts per request after a step that ran `b` requests:
    /// `k_by_batch_size[b]` (the last entry for larger batches).
    pub k_by_batch_size: Vec<usize>,
    /// Conditional acceptance of draft position i given positions < i.
    conditional: Vec<f64>,
    pub max_model_len: usize,
}

impl SimSpeculation {
    /// `unconditional[i]`: the probability that the first i + 1 drafts are
    /// all accepted (non-increasing, in [0, 1]).
    pub fn new(k_by_batch_size: Vec<usize>, unconditional: &[f64], max_model_len: usize) -> Self {
        let mut prev = 1.0;
        let conditional = unconditional
            .iter()
            .map(|&p| {
                let c = if prev > 0.0 { p / prev } else { 0.0 };
                prev = p;
                c
            })
            .collect();
        SimSpeculation {
            k_by_batch_size,
            conditional,
            max_model_len,
        }
    }

    /// Drafts for a request with `num_tokens` tokens after a step of
    /// `batch` requests.
    pub fn k_for(&self, batch: usize, num_tokens: usize) -> usize {
        let ks = &self.k_by_batch_size;
        let k = ks.get(batch).or(ks.last()).copied().unwrap_or(0);
        k.min(self.max_model_len.saturating_sub(num_tokens))
    }

    /// How many of `n` drafts are accepted, drawn with `rng`.
    pub fn accepted(&self, n: usize, rng: &mut Rng) -> usize {
        (0..n)
            .take_while(|&i| rng.f64() < self.conditional.get(i).copied().unwrap_or(0.0))
            .count()
    }
}

/// The generator of one verification: fixed by the seed, the request and
/// how many tokens it had, so reruns repeat.
pub fn verification_rng(seed: u64, request: usize, num_output_tokens: usize) -> Rng {
    let mix = seed
        ^ (request as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (num_output_tokens as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    Rng::new(mix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_follows_the_unconditional_rates() {
        // vLLM's rates for a mean acceptance length of 2.5 at k = 4.
        let s = SimSpeculation::new(vec![4], &[1.0, 0.5, 0.0, 0.0], 1000);
        let mut counts = [0usize; 5];
        for i in 0..20_000 {
            counts[s.accepted(4, &mut verification_rng(1, i, 0))] += 1;
        }
        // Exactly 1 accepted never happens (position 0 always passes),
        // 1 or 2 about half the time each, never 3 or 4.
        assert_eq!((counts[0], counts[3], counts[4]), (0, 0, 0));
        let half = counts[2] as f64 / 20_000.0;
        assert!((half - 0.5).abs() < 0.02, "{counts:?}");
        assert_eq!(counts[1] + counts[2], 20_000);
    }

    #[test]
    fn k_by_batch_size_and_the_context_limit() {
        let s = SimSpeculation::new(vec![0, 3, 3, 0], &[0.5; 3], 100);
        assert_eq!(s.k_for(1, 10), 3);
        assert_eq!(s.k_for(3, 10), 0);
        assert_eq!(s.k_for(9, 10), 0);
        assert_eq!(s.k_for(2, 99), 1);
        assert_eq!(s.k_for(2, 100), 0);
    }
}
