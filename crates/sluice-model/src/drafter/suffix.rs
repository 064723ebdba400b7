//! vLLM's `suffix` speculative method (suffix decoding, as Arctic
//! Inference's `SuffixDecodingCache` which vLLM calls): each running
//! request has a suffix tree of its own prompt and output, and one global
//! tree holds the responses of up to `max_cached_requests` requests (the
//! running ones included, oldest evicted first). A proposal is the better
//! (higher score) of the two trees' [`SuffixTree::speculate`], the global
//! one only when strictly better; its length adapts to how well the
//! context matched, up to k.
//!
//! Promises: a request's trees follow its tokens exactly (each token once,
//! also across preemption, where vLLM restarts the request's tree from its
//! prompt); its own tree is dropped when it finishes, its response stays in
//! the global tree until evicted.

use super::suffix_tree::{SeqId, SuffixTree};
use super::{DraftRequest, Drafter};
use sluice_core::{RequestId, TokenId};
use std::collections::{HashMap, VecDeque};

/// vLLM's `suffix_decoding_*` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SuffixParams {
    /// `suffix_decoding_max_tree_depth`: the longest match plus proposal.
    pub max_tree_depth: usize,
    /// `suffix_decoding_max_cached_requests`: responses in the global
    /// tree (0: no global tree).
    pub max_cached_requests: usize,
    /// `suffix_decoding_max_spec_factor`: a match of m tokens proposes at
    /// most m × this many.
    pub max_spec_factor: f32,
    /// `suffix_decoding_min_token_prob`: the lowest estimated probability
    /// a proposed token may have.
    pub min_token_prob: f32,
}

impl Default for SuffixParams {
    /// vLLM 0.33's defaults.
    fn default() -> Self {
        SuffixParams {
            max_tree_depth: 24,
            max_cached_requests: 10000,
            max_spec_factor: 1.0,
            min_token_prob: 0.1,
        }
    }
}

/// One running request's own tree.
struct Local {
    tree: SuffixTree,
    /// Tokens of the request already in its trees.
    seen: usize,
}

/// Suffix decoding (vLLM's `suffix` method).
pub struct SuffixDrafter {
    params: SuffixParams,
    local: HashMap<RequestId, Local>,
    global: SuffixTree,
    /// Requests whose response is in the global tree, oldest first.
    cached: VecDeque<(RequestId, SeqId)>,
    seq_of: HashMap<RequestId, SeqId>,
    next_seq: SeqId,
}

impl SuffixDrafter {
    pub fn new(params: SuffixParams) -> Self {
        SuffixDrafter {
            params,
            local: HashMap::new(),
            global: SuffixTree::new(params.max_tree_depth),
            cached: VecDeque::new(),
            seq_of: HashMap::new(),
            next_seq: 0,
        }
    }

    /// Requests whose responses the global tree holds.
    pub fn num_cached_responses(&self) -> usize {
        self.cached.len()
    }

    /// A global-tree slot for a request seen for the first time, evicting
    /// the oldest responses past `max_cached_requests`.
    fn start_response(&mut self, req_id: &RequestId) {
        if self.params.max_cached_requests == 0 || self.seq_of.contains_key(req_id) {
            return;
        }
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.seq_of.insert(req_id.clone(), seq);
        self.cached.push_back((req_id.clone(), seq));
        while self.cached.len() > self.params.max_cached_requests {
            let (old, old_seq) = self.cached.pop_front().expect("longer than the limit");
            self.seq_of.remove(&old);
            self.global.remove(old_seq);
        }
    }
}

impl Drafter for SuffixDrafter {
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>) {
        let t = req.token_ids;
        if t.len() >= req.max_model_len {
            return;
        }
        if !self.local.contains_key(req.req_id) {
            self.start_response(req.req_id);
            let mut tree = SuffixTree::new(self.params.max_tree_depth);
            tree.extend(0, &t[..req.num_prompt_tokens]);
            self.local.insert(
                req.req_id.clone(),
                Local {
                    tree,
                    seen: req.num_prompt_tokens,
                },
            );
        }
        let local = self.local.get_mut(req.req_id).expect("inserted above");
        let new = &t[local.seen.min(t.len())..];
        local.tree.extend(0, new);
        if let Some(&seq) = self.seq_of.get(req.req_id) {
            self.global.extend(seq, new);
        }
        local.seen = t.len();

        let max_spec = k.min(req.max_model_len - t.len() - 1);
        let p = &self.params;
        let pattern = &t[t.len().saturating_sub(p.max_tree_depth)..];
        let mine = local
            .tree
            .speculate(pattern, max_spec, p.max_spec_factor, p.min_token_prob);
        let theirs = self
            .global
            .speculate(pattern, max_spec, p.max_spec_factor, p.min_token_prob);
        let best = if theirs.score > mine.score {
            theirs
        } else {
            mine
        };
        drafts.extend_from_slice(&best.token_ids);
    }

    fn finish(&mut self, req_id: &RequestId) {
        self.local.remove(req_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(
        d: &mut SuffixDrafter,
        id: &str,
        t: &[TokenId],
        prompt: usize,
        k: usize,
    ) -> Vec<TokenId> {
        let id: RequestId = id.into();
        let mut out = Vec::new();
        let req = DraftRequest {
            req_id: &id,
            token_ids: t,
            num_prompt_tokens: prompt,
            max_model_len: 1000,
        };
        d.propose(&req, k, &mut out);
        out
    }

    #[test]
    fn the_prompt_and_earlier_responses_propose() {
        let mut d = SuffixDrafter::new(SuffixParams::default());
        // The prompt holds "10 11 12 13 14"; the output so far ends in
        // "10 11": the prompt's continuation is proposed, at most as long
        // as the match (max_spec_factor 1).
        let prompt = [10, 11, 12, 13, 14, 5];
        let t = [&prompt[..], &[10, 11]].concat();
        assert_eq!(propose(&mut d, "a", &t, prompt.len(), 8), [12, 13]);
        // Request a answered "20 21 22 23"; b's output starts the same:
        // the global tree proposes a's answer.
        let t = [&prompt[..], &[10, 11, 20, 21, 22, 23]].concat();
        propose(&mut d, "a", &t, prompt.len(), 8);
        d.finish(&"a".into());
        let b = [1, 2, 3, 20, 21];
        assert_eq!(propose(&mut d, "b", &b, 3, 8), [22, 23]);
    }

    #[test]
    fn no_global_tree_and_eviction() {
        let params = SuffixParams {
            max_cached_requests: 0,
            ..SuffixParams::default()
        };
        let mut d = SuffixDrafter::new(params);
        propose(&mut d, "a", &[1, 20, 21, 22, 23], 1, 4);
        d.finish(&"a".into());
        assert!(propose(&mut d, "b", &[2, 20, 21], 1, 4).is_empty());

        let params = SuffixParams {
            max_cached_requests: 2,
            ..SuffixParams::default()
        };
        let mut d = SuffixDrafter::new(params);
        propose(&mut d, "a", &[1, 20, 21, 22, 23], 1, 4);
        d.finish(&"a".into());
        propose(&mut d, "b", &[2, 30, 31], 1, 4);
        d.finish(&"b".into());
        // c takes a slot, evicting a (the oldest); b's response proposes.
        assert_eq!(propose(&mut d, "c", &[3, 30], 1, 4), [31]);
        assert_eq!(d.num_cached_responses(), 2);
        // a's response is gone.
        assert!(propose(&mut d, "d", &[4, 20, 21], 1, 4).is_empty());
    }
}
