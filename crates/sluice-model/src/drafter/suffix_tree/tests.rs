//! The suffix tree against brute force: counts of every short string and
//! every proposal computed by scanning the sequences directly, after
//! random appends and removals.

use super::*;

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The sequences the tree should hold, scanned directly.
struct Brute<'a> {
    seqs: Vec<&'a [TokenId]>,
    max_depth: usize,
}

impl Brute<'_> {
    fn count(&self, s: &[TokenId]) -> u64 {
        if s.is_empty() || s.len() > self.max_depth {
            return 0;
        }
        self.seqs
            .iter()
            .map(|q| q.windows(s.len()).filter(|w| *w == s).count() as u64)
            .sum()
    }

    fn alphabet(&self) -> Vec<TokenId> {
        let mut a: Vec<TokenId> = self.seqs.iter().flat_map(|q| q.iter().copied()).collect();
        a.sort_unstable();
        a.dedup();
        a
    }

    /// Suffix decoding's proposal on the uncompressed trie: from each
    /// matched suffix, follow the most frequent continuation (smallest
    /// token on ties) multiplying count(s·t) / count(s).
    fn speculate(
        &self,
        context: &[TokenId],
        max_spec: usize,
        factor: f32,
        min_prob: f32,
    ) -> SuffixDraft {
        let context = &context[context.len().saturating_sub(self.max_depth)..];
        let alphabet = self.alphabet();
        let mut best = SuffixDraft::default();
        for match_len in 1..context.len() {
            let mut cur: Vec<TokenId> = context[context.len() - match_len..].to_vec();
            if self.count(&cur) == 0 {
                break;
            }
            let max_tokens = max_spec.min((f64::from(match_len as f32 * factor) + 1e-6) as usize);
            let mut d = SuffixDraft::default();
            let mut prob = 1.0f32;
            while d.token_ids.len() < max_tokens {
                let here = self.count(&cur);
                let next = alphabet
                    .iter()
                    .map(|&t| {
                        cur.push(t);
                        let c = self.count(&cur);
                        cur.pop();
                        (c, std::cmp::Reverse(t))
                    })
                    .max()
                    .filter(|&(c, _)| c > 0);
                let Some((c, std::cmp::Reverse(t))) = next else {
                    break;
                };
                if c != here {
                    prob *= c as f32 / here as f32;
                }
                if prob < min_prob {
                    break;
                }
                d.token_ids.push(t);
                d.probs.push(prob);
                d.score += prob;
                cur.push(t);
            }
            if d.score >= best.score {
                best = SuffixDraft { match_len, ..d };
            }
        }
        best
    }
}

fn check(tree: &SuffixTree, seqs: &[(SeqId, Vec<TokenId>)], rng: &mut Rng, what: &str) {
    tree.check_integrity()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let brute = Brute {
        seqs: seqs.iter().map(|(_, s)| &s[..]).collect(),
        max_depth: tree.max_depth(),
    };
    // Every string of up to max_depth tokens over the alphabet (plus one
    // absent token): the tree's count equals the scan's.
    let mut alphabet = brute.alphabet();
    alphabet.push(99);
    let mut strings: Vec<Vec<TokenId>> = vec![vec![]];
    for _ in 0..tree.max_depth() {
        strings = strings
            .iter()
            .flat_map(|s| alphabet.iter().map(move |&t| [&s[..], &[t]].concat()))
            .filter(|s| brute.count(s) > 0 || s.len() == 1)
            .collect();
        for s in &strings {
            let got = tree.match_context(s).map_or(0, |(n, _)| tree.n(n).count);
            assert_eq!(got, brute.count(s), "{what}: count of {s:?}");
        }
    }
    // Proposals for random contexts and parameters.
    for _ in 0..40 {
        let len = rng.below(8) as usize;
        let context: Vec<TokenId> = (0..len).map(|_| rng.below(4) as TokenId).collect();
        let max_spec = rng.below(7) as usize;
        let factor = [0.5f32, 1.0, 2.0][rng.below(3) as usize];
        let min_prob = [0.0f32, 0.1, 0.4, 0.9][rng.below(4) as usize];
        let got = tree.speculate(&context, max_spec, factor, min_prob);
        let want = brute.speculate(&context, max_spec, factor, min_prob);
        assert_eq!(
            got, want,
            "{what}: speculate({context:?}, {max_spec}, {factor}, {min_prob})"
        );
    }
}

#[test]
fn counts_and_proposals_equal_brute_force_through_appends_and_removals() {
    let mut rng = Rng(0x5EED);
    for round in 0..30 {
        let depth = 1 + rng.below(5) as usize;
        let mut tree = SuffixTree::new(depth);
        let mut seqs: Vec<(SeqId, Vec<TokenId>)> = Vec::new();
        let mut next_id = 0;
        for op in 0..60 {
            let what = format!("round {round} (depth {depth}) op {op}");
            match rng.below(10) {
                0 if !seqs.is_empty() => {
                    let i = rng.below(seqs.len() as u64) as usize;
                    let (id, _) = seqs.remove(i);
                    tree.remove(id);
                }
                1 | 2 => {
                    seqs.push((next_id, Vec::new()));
                    next_id += 1;
                }
                _ if !seqs.is_empty() => {
                    let i = rng.below(seqs.len() as u64) as usize;
                    let t = rng.below(3) as TokenId;
                    seqs[i].1.push(t);
                    tree.append(seqs[i].0, t);
                }
                _ => {}
            }
            check(&tree, &seqs, &mut rng, &what);
        }
        // Removing everything leaves the root alone.
        for (id, _) in seqs.drain(..) {
            tree.remove(id);
        }
        tree.check_integrity().unwrap();
        assert_eq!(
            tree.num_nodes(),
            1,
            "round {round}: nodes left after removing all"
        );
    }
}

#[test]
fn hand_checked_proposal() {
    // "1 2 3" twice and "1 2 4" once: after "1 2", 3 has probability 2/3.
    let mut tree = SuffixTree::new(8);
    tree.extend(0, &[1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4]);
    let d = tree.speculate(&[7, 1, 2], 3, 1.0, 0.1);
    // Match "1 2" (length 2, so at most 2 tokens): 3 (2/3), then 9 (2/3).
    assert_eq!(d.token_ids, [3, 9]);
    assert_eq!(d.match_len, 2);
    assert!((d.probs[0] - 2.0 / 3.0).abs() < 1e-6 && (d.probs[1] - 2.0 / 3.0).abs() < 1e-6);
    // min_token_prob above 2/3: nothing from "1 2"; the shorter match "2"
    // has the same continuation counts, so nothing at all.
    let d = tree.speculate(&[7, 1, 2], 3, 1.0, 0.7);
    assert!(d.token_ids.is_empty());
    // A context the tree never saw proposes nothing.
    assert!(tree.speculate(&[5, 6], 3, 1.0, 0.0).token_ids.is_empty());
}
