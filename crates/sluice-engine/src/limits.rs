//! Limits that keep one client from stalling the engine loop or starving
//! everyone else, and the one vocabulary check every entry point shares.
//!
//! Each limit is checked in `Engine::generate`, on the caller's thread,
//! before anything reaches the engine loop; a request past one is refused
//! with an error naming the field and the limit (400 over HTTP), or with
//! `Overloaded` (503) for the queue bounds, which clear by themselves.

use sluice_core::{FieldError, SamplingParams, TokenId};

/// Per-request and queue limits (see each field). `Default` is what
/// `sluice serve` uses unless told otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most stop strings one request may give.
    pub max_stop_strings: usize,
    /// Longest stop string, in bytes.
    pub max_stop_string_bytes: usize,
    /// Most `logit_bias` entries one request may give.
    pub max_logit_bias: usize,
    /// New requests are refused (`Overloaded`) while the requests that have
    /// not started yet hold this many prompt + `max_tokens` tokens; a
    /// request that alone asks for more is invalid. `None`: no bound.
    pub max_waiting_tokens: Option<usize>,
    /// Output bytes a request's stream may hold unread; past this its
    /// client is taken to have stopped reading, and the request is aborted
    /// (its KV blocks freed) instead of generating into memory.
    pub max_stream_buffer_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_stop_strings: 256,
            max_stop_string_bytes: 1024,
            max_logit_bias: 2048,
            max_waiting_tokens: None,
            max_stream_buffer_bytes: 4 << 20,
        }
    }
}

fn invalid(field: &'static str, message: String) -> FieldError {
    FieldError::new(field, message)
}

/// Token ids must be below `vocab_size`: the one vocabulary check shared by
/// prompts, `stop_token_ids`, `logit_bias` and `/detokenize`.
pub fn check_token_ids(
    field: &'static str,
    ids: impl IntoIterator<Item = TokenId>,
    vocab_size: usize,
) -> Result<(), FieldError> {
    for (i, t) in ids.into_iter().enumerate() {
        if t as usize >= vocab_size {
            return Err(invalid(
                field,
                format!(
                    "token id {t} at position {i} is out of vocabulary (the vocabulary has \
                     {vocab_size} tokens, ids 0..{})",
                    vocab_size.saturating_sub(1)
                ),
            ));
        }
    }
    Ok(())
}

impl RequestLimits {
    /// Checks the fields of `params` these limits bound.
    pub fn check(&self, params: &SamplingParams) -> Result<(), FieldError> {
        if params.stop.len() > self.max_stop_strings {
            return Err(invalid(
                "stop",
                format!(
                    "{} stop strings given; at most {} are accepted (--max-stop-strings)",
                    params.stop.len(),
                    self.max_stop_strings
                ),
            ));
        }
        if let Some((i, s)) = params
            .stop
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() > self.max_stop_string_bytes)
        {
            return Err(invalid(
                "stop",
                format!(
                    "stop string {i} is {} bytes long; at most {} are accepted \
                     (--max-stop-string-bytes)",
                    s.len(),
                    self.max_stop_string_bytes
                ),
            ));
        }
        if params.logit_bias.len() > self.max_logit_bias {
            return Err(invalid(
                "logit_bias",
                format!(
                    "{} logit_bias entries given; at most {} are accepted (--max-logit-bias)",
                    params.logit_bias.len(),
                    self.max_logit_bias
                ),
            ));
        }
        Ok(())
    }
}

/// Tokens a request holds in the queue until it starts: prompt plus
/// `max_tokens`, per completion.
pub fn queued_tokens(num_prompt_tokens: usize, params: &SamplingParams) -> usize {
    num_prompt_tokens
        .saturating_add(params.max_tokens)
        .saturating_mul(params.n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_are_checked_against_the_vocabulary() {
        assert!(check_token_ids("prompt", [0, 9], 10).is_ok());
        let e = check_token_ids("prompt", [1, 10], 10).unwrap_err();
        assert_eq!(e.field, "prompt");
        assert!(e.message.contains("token id 10 at position 1"), "{e}");
    }

    #[test]
    fn limits_name_the_field_and_the_flag() {
        let l = RequestLimits {
            max_stop_strings: 2,
            max_stop_string_bytes: 3,
            max_logit_bias: 1,
            ..RequestLimits::default()
        };
        let mut p = SamplingParams {
            stop: vec!["a".into(), "b".into(), "c".into()],
            ..SamplingParams::default()
        };
        let e = l.check(&p).unwrap_err();
        assert_eq!(e.field, "stop");
        assert!(e.message.contains("--max-stop-strings"), "{e}");
        p.stop = vec!["abcd".into()];
        assert!(l.check(&p).unwrap_err().message.contains("stop string 0"));
        p.stop.clear();
        p.logit_bias = vec![(1, 1.0), (2, 1.0)];
        assert_eq!(l.check(&p).unwrap_err().field, "logit_bias");
        p.logit_bias.pop();
        assert!(l.check(&p).is_ok());
    }

    #[test]
    fn queued_tokens_count_every_completion() {
        let p = SamplingParams {
            n: 3,
            max_tokens: 10,
            ..SamplingParams::default()
        };
        assert_eq!(queued_tokens(5, &p), 45);
    }
}
