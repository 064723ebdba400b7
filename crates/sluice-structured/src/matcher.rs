//! One sequence's walk through a compiled grammar: the allowed-token bitmask
//! of each step, the sampled tokens fed back, speculative drafts validated
//! and rolled back.
//!
//! Owns the rules llguidance leaves to its caller: it never asks llguidance
//! for a mask or feeds it a token once the grammar has stopped (that would
//! turn a clean stop into an error), it accepts stop ids after completion
//! itself and counts them for `rollback`, and it checks token ids before
//! llguidance sees them (an out-of-range id is an llguidance error too).
//!
//! Promises: a bitmask is never all zero: where llguidance has no mask (the
//! grammar completed, or the matcher failed) it allows just the stop ids, so
//! the sequence ends rather than sampling from nothing.

use crate::vocab::VocabShared;
use llguidance::Matcher;
use std::sync::Arc;

/// A sequence's position in a compiled grammar. Send; single owner.
pub struct GrammarMatcher {
    m: Matcher,
    vocab: Arc<VocabShared>,
    /// Tokens llguidance consumed (what it can roll back).
    fed: usize,
    /// Stop ids accepted after llguidance stopped, which it never saw; they
    /// come after the `fed` ones, so rollback undoes them first.
    unfed: usize,
    /// Why the matcher failed, where llguidance itself does not know (a token
    /// refused before it reached llguidance).
    failed: Option<String>,
}

impl GrammarMatcher {
    pub(crate) fn new(m: Matcher, vocab: Arc<VocabShared>) -> Self {
        GrammarMatcher {
            m,
            vocab,
            fed: 0,
            unfed: 0,
            failed: None,
        }
    }

    /// Writes the allowed-token bitmask of the current state into `out` (len
    /// == mask_words; bit i%32 of word i/32 set = token i allowed). Stop ids
    /// are allowed only where the grammar can end; once the grammar is
    /// complete (stopped) only the stop ids are allowed. Never leaves the
    /// matcher in an error state by being called when stopped.
    ///
    /// A matcher in the error state (a rejected token, or a grammar too
    /// complex for llguidance's per-step limits) also gets only the stop
    /// ids. An `out` of another length gets the first `out.len()` words,
    /// the rest zero.
    pub fn fill_bitmask(&mut self, out: &mut [u32]) {
        let n = out.len().min(self.vocab.mask_words);
        let (head, tail) = out.split_at_mut(n);
        tail.fill(0);
        if self.is_error() || self.m.is_stopped() {
            head.copy_from_slice(&self.vocab.stop_mask[..n]);
            return;
        }
        match self.m.compute_mask() {
            // llguidance's set can be one word longer than the logits need
            // (it allocates vocab_size + 1 bits); the trie has exactly
            // vocab_size ids, so the words kept have no bit past them.
            Ok(mask) => head.copy_from_slice(&mask.as_slice()[..n]),
            Err(_) => head.copy_from_slice(&self.vocab.stop_mask[..n]),
        }
    }

    /// Advances by one sampled token. A stop id where the grammar can end
    /// (or after it completed) is accepted (returns true). Returns false for
    /// a token the grammar rejects (the matcher is then unusable: is_error()
    /// true).
    pub fn accept_token(&mut self, token: u32) -> bool {
        if self.is_error() {
            return false;
        }
        if token as usize >= self.vocab.vocab_size {
            self.failed = Some(format!("token id {token} is past the vocabulary"));
            return false;
        }
        if self.m.is_stopped() {
            if self.vocab.is_stop(token) {
                self.unfed += 1;
                return true;
            }
            self.failed = Some(format!("token {token} after the grammar completed"));
            return false;
        }
        match self.m.consume_token(token) {
            Ok(()) => {
                self.fed += 1;
                true
            }
            Err(_) => false,
        }
    }

    /// `accept_token` for each, stopping at the first refused (then false).
    pub fn accept_tokens(&mut self, tokens: &[u32]) -> bool {
        tokens.iter().all(|&t| self.accept_token(t))
    }

    /// How many leading tokens of `tokens` the grammar would accept, without
    /// advancing (for speculative drafts). Counts as `accept_tokens` would:
    /// stop ids after the grammar can end count too.
    pub fn validate_tokens(&mut self, tokens: &[u32]) -> usize {
        if self.is_error() {
            return 0;
        }
        let stops_from = |from: usize| {
            tokens[from..]
                .iter()
                .take_while(|&&t| self.vocab.is_stop(t))
                .count()
        };
        if self.m.is_stopped() {
            return stops_from(0);
        }
        // llguidance fails the matcher on an id past its vocabulary; cut
        // the draft there instead.
        let cut = tokens
            .iter()
            .position(|&t| t as usize >= self.vocab.vocab_size)
            .unwrap_or(tokens.len());
        let k = match self.m.validate_tokens(&tokens[..cut]) {
            Ok(k) => k.min(cut),
            Err(_) => return 0,
        };
        // llguidance stops counting at the first stop id it accepts;
        // `accept_token` takes any further stop ids.
        if k > 0 && self.vocab.is_stop(tokens[k - 1]) {
            k + stops_from(k)
        } else {
            k
        }
    }

    /// Undoes the last `n` accepted tokens (speculative decoding's rejected
    /// drafts). False, changing nothing, if fewer than `n` were accepted or
    /// the matcher failed.
    pub fn rollback(&mut self, n: usize) -> bool {
        if self.is_error() || n > self.fed + self.unfed {
            return false;
        }
        let from_unfed = n.min(self.unfed);
        let rest = n - from_unfed;
        if rest > 0 {
            if self.m.rollback(rest).is_err() {
                return false;
            }
            self.fed -= rest;
        }
        self.unfed -= from_unfed;
        true
    }

    /// The grammar is complete: nothing but a stop id may follow.
    pub fn is_terminated(&self) -> bool {
        !self.is_error() && self.m.is_stopped()
    }

    pub fn is_error(&self) -> bool {
        self.failed.is_some() || self.m.is_error()
    }

    /// Why the matcher failed, `None` while it has not.
    pub fn error(&self) -> Option<String> {
        self.failed.clone().or_else(|| self.m.get_error())
    }

    /// Whether a stop id may come now (the output so far is complete).
    pub fn can_stop(&mut self) -> bool {
        if self.is_error() {
            return false;
        }
        self.m.is_stopped() || self.m.is_accepting().unwrap_or(false)
    }

    /// The tokens accepted so far, stop ids included.
    pub fn num_accepted(&self) -> usize {
        self.fed + self.unfed
    }
}
