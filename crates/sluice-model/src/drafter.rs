//! Drafters for speculative decoding: after each step, propose the tokens
//! a request is likely to generate next, for the runner to verify in one
//! forward pass the step after (`runner/verify.rs`).
//!
//! A drafter only ever changes how many steps the outputs take, never the
//! outputs: a wrong draft is rejected by verification. [`NgramDrafter`] is
//! vLLM's `ngram` method (prompt-lookup decoding): the request's last n
//! tokens are looked up earlier in its own context and what followed them
//! there is proposed.

use sluice_core::{RequestId, TokenId};

/// What a drafter sees of one request after a step.
#[derive(Clone, Copy, Debug)]
pub struct DraftRequest<'a> {
    pub req_id: &'a RequestId,
    /// Prompt, then every output so far (the step's sampled tokens
    /// included).
    pub token_ids: &'a [TokenId],
    pub num_prompt_tokens: usize,
}

/// Proposes draft tokens for running requests.
pub trait Drafter: Send {
    /// Writes at most `k` draft tokens for `req` into `drafts` (empty:
    /// nothing to propose). `drafts` arrives empty.
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>);
}

/// Prompt-lookup decoding (vLLM's `ngram` speculative method): for n from
/// `max_n` down to `min_n`, the last n tokens are searched for earlier in
/// the context; at the first n with a match, the tokens that followed its
/// most recent earlier occurrence are proposed (up to k, and never past the
/// current end). No match at any n proposes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramDrafter {
    min_n: usize,
    max_n: usize,
}

impl NgramDrafter {
    /// vLLM's `prompt_lookup_min` / `prompt_lookup_max`. Refuses `min_n`
    /// of 0 and `min_n > max_n`, naming both.
    pub fn new(min_n: usize, max_n: usize) -> anyhow::Result<Self> {
        if min_n == 0 || min_n > max_n {
            anyhow::bail!(
                "n-gram drafter: prompt_lookup_min ({min_n}) must be at least 1 and at most \
                 prompt_lookup_max ({max_n})"
            );
        }
        Ok(NgramDrafter { min_n, max_n })
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>) {
        let t = req.token_ids;
        if k == 0 {
            return;
        }
        for n in (self.min_n..=self.max_n.min(t.len().saturating_sub(1))).rev() {
            let suffix = &t[t.len() - n..];
            // Start positions of earlier occurrences, latest first; the
            // suffix itself (start t.len() - n) is excluded.
            if let Some(start) = (0..t.len() - n).rev().find(|&s| &t[s..s + n] == suffix) {
                let follow = start + n;
                let end = (follow + k).min(t.len());
                drafts.extend_from_slice(&t[follow..end]);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(d: &mut NgramDrafter, tokens: &[TokenId], k: usize) -> Vec<TokenId> {
        let id: RequestId = "r".into();
        let req = DraftRequest {
            req_id: &id,
            token_ids: tokens,
            num_prompt_tokens: tokens.len(),
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
    fn most_recent_occurrence_and_no_match() {
        let mut d = NgramDrafter::new(1, 1).unwrap();
        assert_eq!(propose(&mut d, &[2, 10, 2, 11, 2], 1), [11]);
        assert!(propose(&mut d, &[1, 2, 3], 4).is_empty());
        assert!(propose(&mut d, &[1], 4).is_empty());
        assert!(propose(&mut d, &[1, 1], 0).is_empty());
    }

    #[test]
    fn bad_bounds_are_refused() {
        assert!(NgramDrafter::new(0, 2).is_err());
        let e = NgramDrafter::new(3, 2).unwrap_err().to_string();
        assert!(e.contains("prompt_lookup_min (3)") && e.contains("prompt_lookup_max (2)"));
    }
}
