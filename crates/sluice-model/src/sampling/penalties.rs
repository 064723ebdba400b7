//! Repetition, frequency and presence penalties, as vLLM's
//! `apply_penalties` (`vllm/model_executor/layers/utils.py`) and
//! `apply_repetition_penalties_torch` (`vllm/_custom_ops.py`) compute them:
//!
//! 1. repetition, for every token seen in the prompt or the output:
//!    `logit *= (logit > 0 ? 1/r : r)` (the reciprocal taken first, as vLLM);
//! 2. frequency: `logit -= f * count_in_output`;
//! 3. presence: `logit -= p` for tokens that occur in the output.
//!
//! Instead of vocabulary-sized count tensors per step, the state keeps sorted
//! token lists updated incrementally as outputs arrive, so a step costs
//! O(distinct tokens) and nothing is allocated once they stop growing.

/// Per-request penalty state; exists only when some penalty is active.
pub(crate) struct Penalties {
    repetition: f32,
    frequency: f32,
    presence: f32,
    /// Sorted, deduplicated prompt tokens (to rebuild `seen` on a resync).
    prompt: Vec<u32>,
    /// Sorted, deduplicated prompt ∪ output tokens (repetition penalty).
    seen: Vec<u32>,
    /// Sorted (token, occurrences in the output).
    counts: Vec<(u32, u32)>,
    /// Output tokens folded into `counts` / `seen` so far.
    consumed: usize,
    /// `output_token_ids[consumed - 1]`, to notice outputs that were
    /// replaced rather than appended to.
    last: Option<u32>,
}

impl Penalties {
    /// `None` when every penalty is neutral (vLLM's `no_penalties`).
    pub(crate) fn new(
        repetition: f32,
        frequency: f32,
        presence: f32,
        prompt_token_ids: &[u32],
    ) -> Option<Self> {
        let rep_active = repetition != 1.0;
        if !rep_active && frequency == 0.0 && presence == 0.0 {
            return None;
        }
        let mut prompt = Vec::new();
        if rep_active {
            prompt.extend_from_slice(prompt_token_ids);
            prompt.sort_unstable();
            prompt.dedup();
        }
        Some(Self {
            repetition,
            frequency,
            presence,
            seen: prompt.clone(),
            prompt,
            counts: Vec::new(),
            consumed: 0,
            last: None,
        })
    }

    /// Brings the counts up to date with `outputs`. Outputs only ever grow
    /// by appending; anything else (shorter, or a different token at the
    /// last position we saw) triggers a rebuild rather than wrong counts.
    fn sync(&mut self, outputs: &[u32]) {
        let appended = outputs.len() >= self.consumed
            && (self.consumed == 0 || outputs.get(self.consumed - 1).copied() == self.last);
        if !appended {
            self.counts.clear();
            self.seen.clear();
            self.seen.extend_from_slice(&self.prompt);
            self.consumed = 0;
        }
        let track_seen = self.repetition != 1.0;
        for &t in outputs.get(self.consumed..).unwrap_or(&[]) {
            match self.counts.binary_search_by_key(&t, |c| c.0) {
                Ok(i) => self.counts[i].1 = self.counts[i].1.saturating_add(1),
                Err(i) => {
                    self.counts.insert(i, (t, 1));
                    if track_seen {
                        if let Err(j) = self.seen.binary_search(&t) {
                            self.seen.insert(j, t);
                        }
                    }
                }
            }
        }
        self.consumed = outputs.len();
        self.last = outputs.last().copied();
    }

    /// Applies the penalties to `logits` given the request's outputs so far.
    /// Token ids outside the vocabulary are ignored.
    pub(crate) fn apply(&mut self, logits: &mut [f32], outputs: &[u32]) {
        self.sync(outputs);
        if self.repetition != 1.0 {
            // vLLM multiplies by the reciprocal rather than dividing.
            let inv = 1.0 / self.repetition;
            for &t in &self.seen {
                if let Some(x) = logits.get_mut(t as usize) {
                    *x *= if *x > 0.0 { inv } else { self.repetition };
                }
            }
        }
        if self.frequency != 0.0 || self.presence != 0.0 {
            for &(t, c) in &self.counts {
                if let Some(x) = logits.get_mut(t as usize) {
                    // Two subtractions in vLLM's order; exact count as f32
                    // (torch promotes the int64 bin counts to f32).
                    *x -= self.frequency * c as f32;
                    *x -= self.presence;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_penalties_make_no_state() {
        assert!(Penalties::new(1.0, 0.0, 0.0, &[1, 2]).is_none());
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative() {
        let mut p = Penalties::new(2.0, 0.0, 0.0, &[0, 1, 1, 99]).unwrap();
        let mut logits = [4.0f32, -3.0, 4.0, -3.0, 0.0];
        // Token 4 appears in the output only; 0.0 counts as non-positive.
        p.apply(&mut logits, &[4, 4]);
        assert_eq!(logits, [2.0, -6.0, 4.0, -3.0, 0.0]);
    }

    #[test]
    fn frequency_and_presence_count_outputs_only() {
        let mut p = Penalties::new(1.0, 0.5, 1.0, &[0]).unwrap();
        let mut logits = [1.0f32; 4];
        p.apply(&mut logits, &[2, 3, 2, 2]);
        // token 2: 1 - 0.5*3 - 1 = -1.5; token 3: 1 - 0.5 - 1 = -0.5
        assert_eq!(logits, [1.0, 1.0, -1.5, -0.5]);
        // Incremental: one more output of token 3.
        let mut logits = [1.0f32; 4];
        p.apply(&mut logits, &[2, 3, 2, 2, 3]);
        assert_eq!(logits, [1.0, 1.0, -1.5, -1.0]);
    }

    #[test]
    fn replaced_outputs_are_recounted() {
        let mut p = Penalties::new(1.0, 1.0, 0.0, &[]).unwrap();
        let mut logits = [0.0f32; 3];
        p.apply(&mut logits, &[1, 1]);
        assert_eq!(logits, [0.0, -2.0, 0.0]);
        // Same length + 1, but the history changed: must not keep old counts.
        let mut logits = [0.0f32; 3];
        p.apply(&mut logits, &[2, 2, 2]);
        assert_eq!(logits, [0.0, 0.0, -3.0]);
        let mut logits = [0.0f32; 3];
        p.apply(&mut logits, &[0]);
        assert_eq!(logits, [-1.0, 0.0, 0.0]);
    }
}
