//! One completion's text: detokenization, stop strings and hold-back,
//! turning each step's new tokens into what the caller is sent.
//!
//! Promises: the text sent, concatenated, is the completion's final text;
//! EOS / stop-token text is not part of it unless
//! `include_stop_str_in_output`; nothing after a stop string is ever sent.

use crate::detokenizer::IncrementalDetokenizer;
use crate::stop::{StopState, StopStrings};
use sluice_core::{SamplingParams, TokenId};
use sluice_tokenizer::Tokenizer;
use std::sync::Arc;

/// What one step's tokens produced.
#[derive(Debug, Default, PartialEq)]
pub struct StepText {
    /// Text to send now.
    pub text: String,
    /// How many of the step's tokens belong to the completion (tokens after
    /// the one completing a stop string are dropped).
    pub num_kept_tokens: usize,
    /// The stop string that ended the completion, if one did.
    pub stop_string: Option<String>,
}

/// Text state of one completion.
#[derive(Debug)]
pub struct CompletionText {
    detokenizer: IncrementalDetokenizer,
    /// Shared by the request's `n` completions; compiled on the caller's
    /// thread.
    stops: Arc<StopStrings>,
    stop_state: StopState,
    min_tokens: usize,
    include_stop_str_in_output: bool,
    /// Text so far (after any cut).
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    num_tokens: usize,
}

impl CompletionText {
    /// Compiles the stop strings itself (see `with_stops` to share them).
    pub fn new(prompt_token_ids: &[TokenId], params: &SamplingParams) -> Self {
        let stops = StopStrings::new(&params.stop, params.include_stop_str_in_output);
        Self::with_stops(prompt_token_ids, params, Arc::new(stops))
    }

    /// `stops` must be `params.stop` compiled.
    pub fn with_stops(
        prompt_token_ids: &[TokenId],
        params: &SamplingParams,
        stops: Arc<StopStrings>,
    ) -> Self {
        CompletionText {
            detokenizer: IncrementalDetokenizer::new(prompt_token_ids, params.skip_special_tokens),
            stop_state: stops.start(),
            stops,
            min_tokens: params.min_tokens,
            include_stop_str_in_output: params.include_stop_str_in_output,
            text: String::new(),
            sent: 0,
            num_tokens: 0,
        }
    }

    /// Full text so far (including what is held back).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Processes one step's new tokens. `stop_terminated`: the last token is
    /// the EOS or a stop token that ended the request (its text is dropped
    /// unless `include_stop_str_in_output`). `finished`: the scheduler ended
    /// the request with this step, so everything pending is released.
    pub fn update(
        &mut self,
        tokenizer: &Tokenizer,
        new_tokens: &[TokenId],
        stop_terminated: bool,
        finished: bool,
    ) -> StepText {
        let mut out = StepText::default();
        for (i, &token) in new_tokens.iter().enumerate() {
            self.num_tokens += 1;
            out.num_kept_tokens = i + 1;
            let is_last = i + 1 == new_tokens.len();
            if is_last && stop_terminated && !self.include_stop_str_in_output {
                break;
            }
            let before = self.text.len();
            let piece = self.detokenizer.push(tokenizer, token);
            self.text.push_str(&piece);
            if !self.stops.is_empty() {
                // Text within min_tokens moves the automaton but cannot stop.
                let report = self.num_tokens > self.min_tokens;
                if let Some(m) = self
                    .stops
                    .feed(&mut self.stop_state, &self.text, before, report)
                {
                    self.text.truncate(m.truncate_to);
                    out.stop_string = Some(m.stop);
                    break;
                }
            }
        }
        let done = finished || out.stop_string.is_some();
        if done && out.stop_string.is_none() {
            let rest = self.detokenizer.flush(tokenizer);
            self.text.push_str(&rest);
        }
        let end = if done {
            self.text.len()
        } else {
            self.text.len() - self.stops.holdback(self.stop_state)
        };
        if end > self.sent {
            out.text = self.text[self.sent..end].to_string();
            self.sent = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(stop: &[&str], include: bool) -> SamplingParams {
        SamplingParams {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            include_stop_str_in_output: include,
            ..SamplingParams::default()
        }
    }

    fn bytes(s: &str) -> Vec<TokenId> {
        s.bytes().map(u32::from).collect()
    }

    #[test]
    fn stop_string_split_across_tokens_is_never_sent() {
        let tok = Tokenizer::builtin();
        let mut c = CompletionText::new(&[104], &params(&["END"], false));
        let mut sent = String::new();
        for t in bytes("abEN") {
            let s = c.update(&tok, &[t], false, false);
            assert!(s.stop_string.is_none());
            sent.push_str(&s.text);
        }
        assert_eq!(sent, "ab");
        let s = c.update(&tok, &bytes("Dxy"), false, false);
        assert_eq!(s.stop_string.as_deref(), Some("END"));
        assert_eq!(s.num_kept_tokens, 1);
        assert_eq!(s.text, "");
        assert_eq!(c.text(), "ab");
    }

    #[test]
    fn held_text_is_released_when_it_stops_matching_or_at_the_end() {
        let tok = Tokenizer::builtin();
        let mut c = CompletionText::new(&[104], &params(&["END"], false));
        assert_eq!(c.update(&tok, &bytes("aE"), false, false).text, "a");
        assert_eq!(c.update(&tok, &bytes("x"), false, false).text, "Ex");
        assert_eq!(c.update(&tok, &bytes("EN"), false, false).text, "");
        assert_eq!(c.update(&tok, &bytes("!"), false, true).text, "EN!");
    }

    #[test]
    fn include_stop_str_in_output_keeps_the_stop_string_and_eos_text() {
        let tok = Tokenizer::builtin();
        let mut c = CompletionText::new(&[104], &params(&["END"], true));
        let s = c.update(&tok, &bytes("aEND tail"), false, false);
        assert_eq!(s.text, "aEND");
        assert_eq!(s.stop_string.as_deref(), Some("END"));

        // The EOS token's text: dropped by default, kept with include.
        let p = SamplingParams {
            skip_special_tokens: false,
            ..SamplingParams::default()
        };
        let mut c = CompletionText::new(&[104], &p);
        assert_eq!(c.update(&tok, &[b'a' as u32, 258], true, true).text, "a");
        let p = SamplingParams {
            skip_special_tokens: false,
            include_stop_str_in_output: true,
            ..SamplingParams::default()
        };
        let mut c = CompletionText::new(&[104], &p);
        assert_eq!(
            c.update(&tok, &[b'a' as u32, 258], true, true).text,
            "a<|im_end|>"
        );
    }

    #[test]
    fn stop_strings_wait_for_min_tokens() {
        let tok = Tokenizer::builtin();
        let p = SamplingParams {
            stop: vec!["a".into()],
            min_tokens: 2,
            max_tokens: 10,
            ..SamplingParams::default()
        };
        let mut c = CompletionText::new(&[104], &p);
        let s = c.update(&tok, &bytes("a"), false, false);
        assert_eq!(s.stop_string, None);
        let s = c.update(&tok, &bytes("b"), false, false);
        assert_eq!(s.stop_string, None);
        let s = c.update(&tok, &bytes("a"), false, false);
        assert_eq!(s.stop_string.as_deref(), Some("a"));
        assert_eq!(c.text(), "ab");
    }
}
