//! vLLM's `ngram` speculative method (prompt-lookup decoding): the
//! request's last n tokens are looked up earlier in its own context and
//! what followed them there is proposed.
//!
//! Promises: the same proposal as vLLM 0.33's `NgramProposer` for the same
//! context, `k`, bounds and `max_model_len` (checked against cases its own
//! function computed, `tests/data/speculative_vllm.json`, made by
//! `tools/make_speculative_fixtures.py`): the longest suffix
//! of length at most `prompt_lookup_max` that occurred before (ties: its
//! earliest occurrence), if at least `prompt_lookup_min` long, and up to k
//! of the tokens that followed it, never past the context's end nor
//! `max_model_len`.

use super::{DraftRequest, Drafter};
use sluice_core::TokenId;

/// Prompt-lookup decoding (vLLM's `ngram` method).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgramDrafter {
    min_n: usize,
    max_n: usize,
    /// KMP failure values of the reversed context's first `max_n` tokens,
    /// kept to not allocate per proposal.
    lps: Vec<usize>,
}

impl NgramDrafter {
    /// vLLM's `prompt_lookup_min` / `prompt_lookup_max`. Refuses `min_n`
    /// of 0 and `min_n > max_n`, naming both.
    pub fn new(min_n: usize, max_n: usize) -> anyhow::Result<Self> {
        if min_n == 0 || min_n > max_n {
            anyhow::bail!(
                "prompt_lookup_min={min_n} must be >= 1 and <= prompt_lookup_max={max_n}"
            );
        }
        Ok(NgramDrafter {
            min_n,
            max_n,
            lps: vec![0; max_n],
        })
    }

    /// Where the proposal starts in `t` and how long it is at most, or
    /// `None`: the longest suffix of `t` (at most `max_n` tokens) seen
    /// earlier in `t`, found with KMP on the reversed context as vLLM does.
    fn find(&mut self, t: &[TokenId]) -> Option<usize> {
        let total = t.len();
        if total < self.min_n {
            return None;
        }
        // r(i) is the i-th token from the end; a prefix of the reversed
        // context is a suffix of the context.
        let r = |i: usize| t[total - 1 - i];
        self.lps.iter_mut().for_each(|v| *v = 0);
        let (mut longest, mut position, mut prev, mut i) = (0usize, 0usize, 0usize, 1usize);
        while i < total {
            if r(prev) == r(i) {
                prev += 1;
                // `>=`: of equally long matches the one furthest back (the
                // earliest in the context) wins, as in vLLM.
                if prev >= longest {
                    longest = prev;
                    position = i;
                }
                if i < self.max_n {
                    self.lps[i] = prev;
                }
                if prev == self.max_n {
                    prev = self.lps[self.max_n - 1];
                }
                i += 1;
            } else if prev != 0 {
                prev = self.lps[prev - 1];
            } else {
                i += 1;
            }
        }
        (longest >= self.min_n).then(|| total - 1 - position + longest)
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>) {
        let t = req.token_ids;
        let k = k.min(req.max_model_len.saturating_sub(t.len()));
        if k == 0 {
            return;
        }
        if let Some(start) = self.find(t) {
            let end = (start + k).min(t.len());
            drafts.extend_from_slice(&t[start..end]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::RequestId;

    fn propose(d: &mut NgramDrafter, tokens: &[TokenId], k: usize) -> Vec<TokenId> {
        let id: RequestId = "r".into();
        let req = DraftRequest {
            req_id: &id,
            token_ids: tokens,
            num_prompt_tokens: tokens.len(),
            max_model_len: 1 << 20,
        };
        let mut out = Vec::new();
        d.propose(&req, k, &mut out);
        out
    }

    #[test]
    fn proposes_what_followed_the_longest_match() {
        let mut d = NgramDrafter::new(1, 3).unwrap();
        // "5 6 7" occurred before, followed by 8 9; "7" alone more recently
        // (followed by 1), but the longer n-gram wins.
        assert_eq!(propose(&mut d, &[5, 6, 7, 8, 9, 7, 1, 5, 6, 7], 2), [8, 9]);
        // k caps the proposal; the context end caps it too.
        assert_eq!(propose(&mut d, &[5, 6, 7, 8, 9, 7, 1, 5, 6, 7], 1), [8]);
        assert_eq!(propose(&mut d, &[3, 4, 3], 5), [4, 3]);
    }

    #[test]
    fn earliest_occurrence_and_no_match() {
        let mut d = NgramDrafter::new(1, 1).unwrap();
        // "2" occurs at 0 and 2: the earliest (followed by 10) wins.
        assert_eq!(propose(&mut d, &[2, 10, 2, 11, 2], 1), [10]);
        assert!(propose(&mut d, &[1, 2, 3], 4).is_empty());
        assert!(propose(&mut d, &[1], 4).is_empty());
        assert!(propose(&mut d, &[1, 1], 0).is_empty());
    }

    #[test]
    fn max_model_len_caps_the_proposal() {
        let mut d = NgramDrafter::new(1, 2).unwrap();
        let id: RequestId = "r".into();
        let t = [1, 2, 3, 1, 2];
        let mut out = Vec::new();
        let req = |max_model_len| DraftRequest {
            req_id: &id,
            token_ids: &t,
            num_prompt_tokens: 5,
            max_model_len,
        };
        d.propose(&req(6), 3, &mut out);
        assert_eq!(out, [3]);
        out.clear();
        d.propose(&req(5), 3, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn bad_bounds_are_refused() {
        assert!(NgramDrafter::new(0, 2).is_err());
        let e = NgramDrafter::new(3, 2).unwrap_err().to_string();
        assert!(e.contains("prompt_lookup_min=3") && e.contains("prompt_lookup_max=2"));
    }
}
