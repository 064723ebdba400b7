//! Stop strings: where a completion's text must end, and how much of it may
//! be shown before that is known.
//!
//! Promises (vLLM's semantics): a stop string counts only when it ends in
//! text produced after the first `min_tokens` tokens; among several, the one
//! that completes earliest wins (ties: list order); the text is cut before
//! it (or after it with `include_stop_str_in_output`). While streaming,
//! the longest suffix of the text that could still grow into a stop string
//! is held back, so text that is later cut away is never sent.
//!
//! Cost: the stop strings of a request become one Aho-Corasick automaton,
//! built once on the caller's thread and shared by the request's `n`
//! completions; each completion keeps one state and feeds it the new text's
//! bytes. Matching and the hold-back are O(1) per byte of new text however
//! many stop strings there are, so no request's stop list can slow the
//! engine loop down for everyone else.

/// Automaton node ids; the root is 0.
type NodeId = u32;
const ROOT: NodeId = 0;
const NO_MATCH: u32 = u32::MAX;

#[derive(Clone, Debug, Default)]
struct Node {
    /// Trie edges, sorted by byte.
    edges: Vec<(u8, NodeId)>,
    /// Longest proper suffix of this node's string that is also a node.
    fail: NodeId,
    /// Index of the first stop string (in list order) that is a suffix of
    /// this node's string, `NO_MATCH` if none.
    first_match: u32,
    /// Bytes to hold back in this state: the length of the longest suffix
    /// of the node's string that is a proper prefix of some stop string.
    hold: u32,
}

/// The stop strings of one request, compiled.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    nodes: Vec<Node>,
    include_in_output: bool,
}

/// A stop string found in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopMatch {
    pub stop: String,
    /// Length the text must be cut to.
    pub truncate_to: usize,
}

/// One completion's position in the automaton: the longest suffix of its
/// text that is a prefix of some stop string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopState(NodeId);

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere). Cost:
    /// linear in the total length of the stop strings.
    pub fn new(stops: &[String], include_in_output: bool) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let mut nodes = vec![Node {
            first_match: NO_MATCH,
            ..Node::default()
        }];
        let mut ends: Vec<u32> = vec![NO_MATCH];
        for (i, stop) in stops.iter().enumerate() {
            let mut at = ROOT;
            for &b in stop.as_bytes() {
                let edges = &nodes[at as usize].edges;
                at = match edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(k) => edges[k].1,
                    Err(k) => {
                        let id = nodes.len() as NodeId;
                        nodes[at as usize].edges.insert(k, (b, id));
                        nodes.push(Node {
                            first_match: NO_MATCH,
                            ..Node::default()
                        });
                        ends.push(NO_MATCH);
                        id
                    }
                };
            }
            // A duplicate keeps the earlier index (list order breaks ties).
            let end = &mut ends[at as usize];
            *end = (*end).min(i as u32);
        }
        // Breadth first, so a node's fail target is finished before it.
        let mut depth = vec![0u32; nodes.len()];
        let mut queue = std::collections::VecDeque::from([ROOT]);
        while let Some(u) = queue.pop_front() {
            let fail_u = nodes[u as usize].fail;
            let has_edges = !nodes[u as usize].edges.is_empty();
            let inherited = if u == ROOT {
                NO_MATCH
            } else {
                nodes[fail_u as usize].first_match
            };
            nodes[u as usize].first_match = ends[u as usize].min(inherited);
            nodes[u as usize].hold = if has_edges {
                depth[u as usize]
            } else if u == ROOT {
                0
            } else {
                nodes[fail_u as usize].hold
            };
            for k in 0..nodes[u as usize].edges.len() {
                let (b, v) = nodes[u as usize].edges[k];
                depth[v as usize] = depth[u as usize] + 1;
                nodes[v as usize].fail = if u == ROOT {
                    ROOT
                } else {
                    Self::step_in(&nodes, fail_u, b)
                };
                queue.push_back(v);
            }
        }
        StopStrings {
            stops,
            nodes,
            include_in_output,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The state of a completion with no text yet.
    pub fn start(&self) -> StopState {
        StopState(ROOT)
    }

    fn step_in(nodes: &[Node], mut at: NodeId, b: u8) -> NodeId {
        loop {
            let edges = &nodes[at as usize].edges;
            if let Ok(k) = edges.binary_search_by_key(&b, |e| e.0) {
                return edges[k].1;
            }
            if at == ROOT {
                return ROOT;
            }
            at = nodes[at as usize].fail;
        }
    }

    /// Feeds the bytes `text[from..]` (new text) into `state`. With
    /// `report`, returns the stop string completing earliest in them (ties:
    /// list order) and stops there; without, only advances the state (text
    /// produced within `min_tokens`).
    pub fn feed(
        &self,
        state: &mut StopState,
        text: &str,
        from: usize,
        report: bool,
    ) -> Option<StopMatch> {
        if self.stops.is_empty() {
            return None;
        }
        let bytes = text.as_bytes();
        for (offset, &b) in bytes.iter().enumerate().skip(from) {
            state.0 = Self::step_in(&self.nodes, state.0, b);
            let hit = self.nodes[state.0 as usize].first_match;
            if report && hit != NO_MATCH {
                let stop = &self.stops[hit as usize];
                let end = offset + 1;
                return Some(StopMatch {
                    stop: stop.clone(),
                    truncate_to: if self.include_in_output {
                        end
                    } else {
                        end - stop.len()
                    },
                });
            }
        }
        None
    }

    /// Bytes at the end of the text to hold back in `state`: the longest
    /// suffix that is a proper prefix of some stop string. Nothing when the
    /// stop strings are shown anyway.
    pub fn holdback(&self, state: StopState) -> usize {
        if self.include_in_output {
            return 0;
        }
        self.nodes[state.0 as usize].hold as usize
    }

    /// Number of automaton states (for tests and sizing).
    pub fn num_states(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str], include: bool) -> StopStrings {
        StopStrings::new(
            &s.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            include,
        )
    }

    /// Feeds `text` in one piece from a fresh state.
    fn find(s: &StopStrings, text: &str) -> Option<StopMatch> {
        let mut st = s.start();
        s.feed(&mut st, text, 0, true)
    }

    fn hold(s: &StopStrings, text: &str) -> usize {
        let mut st = s.start();
        s.feed(&mut st, text, 0, false);
        s.holdback(st)
    }

    #[test]
    fn finds_the_earliest_completion() {
        let s = stops(&["world", "lo"], false);
        assert_eq!(
            find(&s, "hello world"),
            Some(StopMatch {
                stop: "lo".into(),
                truncate_to: 3
            })
        );
        let s = stops(&["world"], true);
        assert_eq!(find(&s, "hello world!").unwrap().truncate_to, 11);
        // Same end: list order.
        let s = stops(&["bc", "abc"], false);
        assert_eq!(find(&s, "xabc").unwrap().stop, "bc");
        let s = stops(&["abc", "bc"], false);
        assert_eq!(find(&s, "xabc").unwrap().stop, "abc");
    }

    #[test]
    fn matches_across_pieces_and_only_in_reported_text() {
        let s = stops(&["END"], false);
        let mut st = s.start();
        let mut text = String::from("abE");
        assert_eq!(s.feed(&mut st, &text, 0, true), None);
        text.push('N');
        assert_eq!(s.feed(&mut st, &text, 3, true), None);
        text.push_str("Dx");
        let m = s.feed(&mut st, &text, 4, true).unwrap();
        assert_eq!(m.truncate_to, 2);
        // Text fed without reporting (within min_tokens) never matches later.
        let mut st = s.start();
        s.feed(&mut st, "END", 0, false);
        assert_eq!(s.feed(&mut st, "ENDx", 3, true), None);
    }

    #[test]
    fn holds_back_possible_starts() {
        let s = stops(&["STOP", "xy"], false);
        assert_eq!(hold(&s, "abcST"), 2);
        assert_eq!(hold(&s, "abcSTO"), 3);
        assert_eq!(hold(&s, "abcx"), 1);
        assert_eq!(hold(&s, "abc"), 0);
        assert_eq!(hold(&stops(&["STOP"], true), "abcST"), 0);
        // Multi-byte: a suffix inside a character is never a candidate.
        let s = stops(&["é!"], false);
        assert_eq!(hold(&s, "café"), 2);
        assert_eq!(hold(&s, "cafe"), 0);
        // A full stop string fed without reporting is not held as a whole,
        // but what could still start another one is.
        let s = stops(&["ab", "abc"], false);
        assert_eq!(hold(&s, "xab"), 2);
        let s = stops(&["ab"], false);
        assert_eq!(hold(&s, "xab"), 0);
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let s = stops(&[""], false);
        assert!(s.is_empty());
        assert_eq!(find(&s, "abc"), None);
    }

    /// The automaton agrees with the obvious quadratic search on random
    /// texts and stop lists over a small alphabet (where overlaps abound).
    #[test]
    fn agrees_with_a_naive_search() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..2000 {
            let k = 1 + rnd(4) as usize;
            let list: Vec<String> = (0..k)
                .map(|_| {
                    (0..1 + rnd(4))
                        .map(|_| (b'a' + rnd(3) as u8) as char)
                        .collect()
                })
                .collect();
            let text: String = (0..rnd(12))
                .map(|_| (b'a' + rnd(3) as u8) as char)
                .collect();
            let s = StopStrings::new(&list, false);
            // Naive: earliest end, then list order.
            let naive = (1..=text.len()).find_map(|end| {
                list.iter()
                    .find(|p| text[..end].ends_with(p.as_str()))
                    .map(|p| (end - p.len(), p.clone()))
            });
            let got = find(&s, &text).map(|m| (m.truncate_to, m.stop));
            assert_eq!(got, naive, "{list:?} in {text:?}");
            if naive.is_none() {
                let naive_hold = (0..=text.len())
                    .rev()
                    .find(|&k| {
                        list.iter()
                            .any(|p| k < p.len() && p.starts_with(&text[text.len() - k..]))
                    })
                    .unwrap_or(0);
                assert_eq!(hold(&s, &text), naive_hold, "{list:?} in {text:?}");
            }
        }
    }
}
