//! A depth-limited, path-compressed suffix tree over several token
//! sequences, with occurrence counts: the index behind suffix decoding
//! (Oliaro et al., "SuffixDecoding", arXiv:2411.04975; the algorithm of
//! Arctic Inference's `SuffixTree`, which vLLM's `suffix` method calls).
//!
//! What it represents: for every string `s` of at most `max_depth` tokens,
//! `count(s)`, the number of positions of all sequences where `s` starts.
//! Sequences grow one token at a time ([`SuffixTree::append`], O(depth)
//! per token) and can be removed ([`SuffixTree::remove`]). A node holds a
//! segment of tokens (referenced in one of the sequences, not copied), and
//! every string inside a segment has the node's count: a node is split
//! where a suffix ends or a continuation branches.
//!
//! [`SuffixTree::speculate`] is suffix decoding's proposal: for each match
//! length m, the context's last m tokens are found in the tree, and the
//! most frequent continuation is followed while its estimated probability
//! `count(s·t) / count(s)` (multiplied along the path) stays at least
//! `min_token_prob`, up to `min(max_spec_tokens, m · max_spec_factor)`
//! tokens; the match whose draft has the largest score (the sum of its
//! tokens' probabilities; ties: the longer match) wins. Of equally frequent
//! continuations the smallest token id is taken (Arctic's order is its hash
//! map's).

use sluice_core::TokenId;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

type NodeId = u32;
const ROOT: NodeId = 0;

/// A sequence's number inside one tree.
pub type SeqId = u32;

/// Hashes a `u32` key with one multiply (keys are token or sequence ids,
/// spread enough for a multiplicative hash).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

#[derive(Clone, Debug, Default)]
struct Node {
    /// The segment's first token (the key in the parent's children).
    token: TokenId,
    parent: NodeId,
    /// Occurrences of every string ending inside this segment.
    count: u64,
    /// Tokens in the segment (0 only for the root).
    length: u32,
    /// The segment is `seqs[ref_seq][ref_idx..ref_idx + length]`.
    ref_seq: SeqId,
    ref_idx: u32,
    children: IdMap<NodeId>,
    /// Sequences with a suffix ending at this segment's end: sequence ->
    /// the end index of that suffix in it (one per sequence).
    endpoints: IdMap<u32>,
}

/// A proposal of [`SuffixTree::speculate`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SuffixDraft {
    pub token_ids: Vec<TokenId>,
    /// Each token's estimated probability (along the path).
    pub probs: Vec<f32>,
    /// The sum of `probs`: the expected number of accepted tokens.
    pub score: f32,
    /// The length of the context suffix it continues.
    pub match_len: usize,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct SuffixTree {
    max_depth: usize,
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    seqs: IdMap<Vec<TokenId>>,
    /// Per sequence, the nodes where its last `max_depth` suffixes end
    /// (the oldest, longest first).
    active: IdMap<VecDeque<NodeId>>,
}

impl SuffixTree {
    /// An empty tree holding strings of at most `max_depth` (>= 1) tokens.
    pub fn new(max_depth: usize) -> Self {
        SuffixTree {
            max_depth: max_depth.max(1),
            nodes: vec![Node::default()],
            free: Vec::new(),
            seqs: IdMap::default(),
            active: IdMap::default(),
        }
    }

    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Whether sequence `seq` is in the tree.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Nodes in use (the root included): the tree's size.
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    fn release(&mut self, id: NodeId) {
        self.nodes[id as usize] = Node::default();
        self.free.push(id);
    }

    /// Frees `id` and everything under it.
    fn release_subtree(&mut self, id: NodeId) {
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            stack.extend(self.nodes[n as usize].children.values().copied());
            self.release(n);
        }
    }

    fn n(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    fn n_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    /// The `i`-th token of `id`'s segment.
    fn seg_token(&self, id: NodeId, i: u32) -> TokenId {
        let n = self.n(id);
        self.seqs[&n.ref_seq][(n.ref_idx + i) as usize]
    }

    /// Appends each of `tokens` to sequence `seq` (created when new).
    pub fn extend(&mut self, seq: SeqId, tokens: &[TokenId]) {
        for &t in tokens {
            self.append(seq, t);
        }
    }

    /// Appends `token` to sequence `seq` (created when new): every one of
    /// its last `max_depth` suffixes grows by `token`, the oldest one
    /// stops growing, and a new one starts.
    pub fn append(&mut self, seq: SeqId, token: TokenId) {
        let len_before = {
            let s = self.seqs.entry(seq).or_default();
            s.len() as u32
        };
        let active = self.active.entry(seq).or_default();
        active.push_back(ROOT);
        if active.len() > self.max_depth {
            active.pop_front();
        }
        let root = self.n_mut(ROOT);
        root.endpoints.insert(seq, len_before);
        root.count += 1;
        self.seqs.get_mut(&seq).expect("inserted above").push(token);
        let len = len_before + 1;

        let num_active = self.active[&seq].len();
        for i in 0..num_active {
            let node = self.active[&seq][i];
            let child = self.n(node).children.get(&token).copied();
            let next = match child {
                None => self.grow_leaf_or_branch(seq, node, token, len),
                Some(child) if node != ROOT && self.n(node).count == self.n(child).count + 1 => {
                    self.grow_into_only_child(seq, node, child, token, len)
                }
                Some(child) => self.step_into_child(seq, node, child, token, len),
            };
            self.active.get_mut(&seq).expect("present")[i] = next;
        }
    }

    /// `node` has no continuation by `token`: a leaf that only this suffix
    /// reaches grows in place; otherwise a new leaf is added.
    fn grow_leaf_or_branch(
        &mut self,
        seq: SeqId,
        node: NodeId,
        token: TokenId,
        len: u32,
    ) -> NodeId {
        if node != ROOT && self.n(node).count == 1 {
            let n = self.n_mut(node);
            debug_assert!(n.children.is_empty() && n.ref_seq == seq);
            n.length += 1;
            n.endpoints.insert(seq, len);
            return node;
        }
        let leaf = self.alloc(Node {
            token,
            parent: node,
            count: 1,
            length: 1,
            ref_seq: seq,
            ref_idx: len - 1,
            children: IdMap::default(),
            endpoints: std::iter::once((seq, len)).collect(),
        });
        let n = self.n_mut(node);
        n.children.insert(token, leaf);
        n.endpoints.remove(&seq);
        leaf
    }

    /// Every other suffix through `node` continues into `child` (its count
    /// is one less than `node`'s, and only this suffix ends at `node`).
    fn grow_into_only_child(
        &mut self,
        seq: SeqId,
        node: NodeId,
        child: NodeId,
        token: TokenId,
        len: u32,
    ) -> NodeId {
        if self.n(child).length == 1 {
            // The grown suffix covers `child` exactly: `child` takes
            // `node`'s place.
            let (parent, ntoken, nlength) = {
                let n = self.n(node);
                (n.parent, n.token, n.length)
            };
            let c = self.n_mut(child);
            c.token = ntoken;
            c.count += 1;
            c.length = nlength + 1;
            c.endpoints.insert(seq, len);
            c.ref_seq = seq;
            c.ref_idx = len - c.length;
            c.parent = parent;
            self.n_mut(parent).children.insert(ntoken, child);
            self.release(node);
            return child;
        }
        // `node` grows by one token into `child`'s segment.
        {
            let n = self.n_mut(node);
            n.length += 1;
            n.endpoints.insert(seq, len);
            n.ref_seq = seq;
            n.ref_idx = len - n.length;
        }
        {
            let c = self.n_mut(child);
            c.length -= 1;
            c.ref_idx += 1;
        }
        let first = self.seg_token(child, 0);
        self.n_mut(child).token = first;
        if first != token {
            let n = self.n_mut(node);
            n.children.remove(&token);
            n.children.insert(first, child);
        }
        node
    }

    /// The suffix moves into `child`, which other suffixes share: a
    /// one-token child is entered, a longer one split after its first token.
    fn step_into_child(
        &mut self,
        seq: SeqId,
        node: NodeId,
        child: NodeId,
        token: TokenId,
        len: u32,
    ) -> NodeId {
        self.n_mut(node).endpoints.remove(&seq);
        if self.n(child).length == 1 {
            let c = self.n_mut(child);
            c.count += 1;
            c.endpoints.insert(seq, len);
            c.ref_seq = seq;
            c.ref_idx = len - 1;
            return child;
        }
        let count = self.n(child).count + 1;
        let mid = self.alloc(Node {
            token,
            parent: node,
            count,
            length: 1,
            ref_seq: seq,
            ref_idx: len - 1,
            children: IdMap::default(),
            endpoints: std::iter::once((seq, len)).collect(),
        });
        let second = self.seg_token(child, 1);
        {
            let c = self.n_mut(child);
            c.token = second;
            c.parent = mid;
            c.length -= 1;
            c.ref_idx += 1;
        }
        self.n_mut(mid).children.insert(second, child);
        self.n_mut(node).children.insert(token, mid);
        mid
    }

    /// Removes sequence `seq` and every count it contributed (a no-op for
    /// an unknown one).
    pub fn remove(&mut self, seq: SeqId) {
        // Taken out now: the walk below reads only counts, lengths and
        // endpoints, never the removed sequence's tokens.
        let Some(tokens) = self.seqs.remove(&seq) else {
            return;
        };
        let mut path: Vec<NodeId> = Vec::new();
        for start in 0..tokens.len() {
            let mut node = ROOT;
            self.n_mut(ROOT).count -= 1;
            let mut idx = start;
            path.clear();
            while idx < tokens.len() {
                let tok = tokens[idx];
                let Some(child) = self.n(node).children.get(&tok).copied() else {
                    break;
                };
                let c = self.n_mut(child);
                c.count -= 1;
                if c.count == 0 {
                    self.n_mut(node).children.remove(&tok);
                    self.release_subtree(child);
                    break;
                }
                c.endpoints.remove(&seq);
                idx += c.length as usize;
                node = child;
                path.push(node);
            }
            // The last node may now have one child with its own count:
            // the two segments merge.
            if node != ROOT && self.n(node).children.len() == 1 {
                let only = *self.n(node).children.values().next().expect("one child");
                if self.n(node).count == self.n(only).count {
                    let (ntoken, nlength, parent) = {
                        let n = self.n(node);
                        (n.token, n.length, n.parent)
                    };
                    let c = self.n_mut(only);
                    c.token = ntoken;
                    c.length += nlength;
                    c.ref_idx -= nlength;
                    c.parent = parent;
                    self.n_mut(parent).children.insert(ntoken, only);
                    self.release(node);
                    *path.last_mut().expect("node is on the path") = only;
                    node = only;
                }
            }
            self.repoint_path(seq, node, &path);
        }
        self.active.remove(&seq);
    }

    /// Segments on `path` (ending at `node`) that reference the sequence
    /// being removed are re-pointed at another sequence holding the same
    /// tokens, found through an endpoint of a leaf below `node`.
    fn repoint_path(&mut self, seq: SeqId, node: NodeId, path: &[NodeId]) {
        let mut leaf = node;
        let mut distance = 0u32;
        while let Some(&c) = self.n(leaf).children.values().next() {
            leaf = c;
            distance += self.n(leaf).length;
        }
        let endpoints = &self.n(leaf).endpoints;
        if endpoints.is_empty() || endpoints.contains_key(&seq) {
            // The leaf is visited again later in this removal, or nothing
            // else holds these tokens.
            return;
        }
        let (&ref_seq, &end) = endpoints.iter().next().expect("not empty");
        let mut ref_idx = end - distance;
        for &n in path.iter().rev() {
            let node = self.n_mut(n);
            ref_idx -= node.length;
            if node.ref_seq == seq {
                node.ref_seq = ref_seq;
                node.ref_idx = ref_idx;
            }
        }
    }

    /// The node and offset in its segment where `context` ends, if the
    /// tree holds it.
    fn match_context(&self, context: &[TokenId]) -> Option<(NodeId, u32)> {
        let mut node = ROOT;
        let mut idx = 0u32;
        for &c in context {
            if idx >= self.n(node).length {
                node = *self.n(node).children.get(&c)?;
                idx = 0;
            }
            if self.seg_token(node, idx) != c {
                return None;
            }
            idx += 1;
        }
        Some((node, idx))
    }

    /// The most frequent continuation from `(node, idx)`, token by token.
    fn speculate_path(
        &self,
        mut node: NodeId,
        mut idx: u32,
        max_tokens: usize,
        min_token_prob: f32,
    ) -> SuffixDraft {
        let mut draft = SuffixDraft::default();
        let mut prob = 1.0f32;
        while draft.token_ids.len() < max_tokens && prob >= min_token_prob {
            if idx < self.n(node).length {
                draft.token_ids.push(self.seg_token(node, idx));
                draft.probs.push(prob);
                draft.score += prob;
                idx += 1;
                continue;
            }
            let best = self
                .n(node)
                .children
                .iter()
                .map(|(&t, &c)| (self.n(c).count, std::cmp::Reverse(t), c))
                .max();
            let Some((count, _, child)) = best else {
                break;
            };
            prob *= count as f32 / self.n(node).count as f32;
            node = child;
            idx = 0;
        }
        draft
    }

    /// Suffix decoding's proposal for the sequence ending in `context` (see
    /// the module documentation); only its last `max_depth` tokens count.
    pub fn speculate(
        &self,
        context: &[TokenId],
        max_spec_tokens: usize,
        max_spec_factor: f32,
        min_token_prob: f32,
    ) -> SuffixDraft {
        let context = &context[context.len().saturating_sub(self.max_depth)..];
        let mut best = SuffixDraft::default();
        for match_len in 1..context.len() {
            let Some((node, idx)) = self.match_context(&context[context.len() - match_len..])
            else {
                break;
            };
            // Arctic's arithmetic: a float product, a double epsilon, then
            // truncation (negative: none).
            let by_factor = (f64::from(match_len as f32 * max_spec_factor) + 1e-6) as usize;
            let max_tokens = max_spec_tokens.min(by_factor);
            let draft = self.speculate_path(node, idx, max_tokens, min_token_prob);
            if draft.score >= best.score {
                best = SuffixDraft { match_len, ..draft };
            }
        }
        best
    }

    /// Checks every invariant (counts, references, parents, endpoints):
    /// an error names the first one broken. For tests.
    pub fn check_integrity(&self) -> Result<(), String> {
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            let n = self.n(id);
            let sum: u64 = n.children.values().map(|&c| self.n(c).count).sum();
            if sum > n.count {
                return Err(format!(
                    "node {id}: children count {sum} > count {}",
                    n.count
                ));
            }
            for (&t, &c) in &n.children {
                let ch = self.n(c);
                if ch.parent != id || ch.token != t {
                    return Err(format!("node {c}: wrong parent or key"));
                }
                if ch.count == 0 || ch.length == 0 {
                    return Err(format!("node {c}: empty"));
                }
                if id != ROOT && ch.count >= n.count {
                    return Err(format!("node {c}: count not below its parent's (unmerged)"));
                }
                let Some(s) = self.seqs.get(&ch.ref_seq) else {
                    return Err(format!("node {c}: reference to a removed sequence"));
                };
                if (ch.ref_idx + ch.length) as usize > s.len() || s[ch.ref_idx as usize] != t {
                    return Err(format!("node {c}: bad reference"));
                }
                stack.push(c);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
