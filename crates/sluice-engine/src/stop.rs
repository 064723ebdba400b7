//! Stop strings: where a completion's text must end, and how much of it may
//! be shown before that is known.
//!
//! Promises (vLLM's semantics): a stop string counts only when it ends in
//! text produced after the first `min_tokens` tokens; among several, the one
//! that completes earliest wins (ties: list order); the text is cut before
//! it (or after it with `include_stop_str_in_output`). While streaming,
//! the longest suffix of the text that could still grow into a stop string
//! is held back, so text that is later cut away is never sent.

/// The stop strings of one request.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    include_in_output: bool,
}

/// A stop string found in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopMatch {
    pub stop: String,
    /// Length the text must be cut to.
    pub truncate_to: usize,
}

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere).
    pub fn new(stops: &[String], include_in_output: bool) -> Self {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            include_in_output,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The stop string completing earliest among those ending after byte
    /// `new_from` of `text` (the text before it was searched already).
    pub fn find(&self, text: &str, new_from: usize) -> Option<StopMatch> {
        let mut best: Option<(usize, usize, &str)> = None; // (end, start, stop)
        for stop in &self.stops {
            let mut from = new_from.saturating_sub(stop.len() - 1);
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            let hit = text[from..]
                .match_indices(stop.as_str())
                .map(|(i, _)| (from + i, from + i + stop.len()))
                .find(|&(_, end)| end > new_from);
            if let Some((start, end)) = hit {
                if best.is_none_or(|(best_end, _, _)| end < best_end) {
                    best = Some((end, start, stop));
                }
            }
        }
        best.map(|(end, start, stop)| StopMatch {
            stop: stop.to_string(),
            truncate_to: if self.include_in_output { end } else { start },
        })
    }

    /// Bytes at the end of `text` to hold back: the longest suffix that is
    /// a proper prefix of some stop string. Nothing when the stop strings
    /// are shown anyway.
    pub fn holdback(&self, text: &str) -> usize {
        if self.include_in_output {
            return 0;
        }
        let mut held = 0;
        for stop in &self.stops {
            let longest = (stop.len() - 1).min(text.len());
            for k in (held + 1..=longest).rev() {
                let start = text.len() - k;
                if text.is_char_boundary(start)
                    && stop.as_bytes().starts_with(&text.as_bytes()[start..])
                {
                    held = k;
                    break;
                }
            }
        }
        held
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

    #[test]
    fn finds_the_earliest_completion_in_new_text() {
        let s = stops(&["world", "lo"], false);
        let m = s.find("hello world", 0).unwrap();
        assert_eq!(
            m,
            StopMatch {
                stop: "lo".into(),
                truncate_to: 3
            }
        );
        // Text before `new_from` was searched already: only matches ending
        // in the new part count.
        assert_eq!(s.find("hello", 5), None);
        assert_eq!(s.find("hello", 4).unwrap().truncate_to, 3);
        let s = stops(&["world"], true);
        assert_eq!(s.find("hello world!", 8).unwrap().truncate_to, 11);
    }

    #[test]
    fn holds_back_possible_starts() {
        let s = stops(&["STOP", "xy"], false);
        assert_eq!(s.holdback("abcST"), 2);
        assert_eq!(s.holdback("abcSTO"), 3);
        assert_eq!(s.holdback("abcx"), 1);
        assert_eq!(s.holdback("abc"), 0);
        assert_eq!(stops(&["STOP"], true).holdback("abcST"), 0);
        // Multi-byte: a suffix inside a character is never a candidate.
        let s = stops(&["é!"], false);
        assert_eq!(s.holdback("café"), 2);
        assert_eq!(s.holdback("cafe"), 0);
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let s = stops(&[""], false);
        assert!(s.is_empty());
        assert_eq!(s.find("abc", 0), None);
    }
}
