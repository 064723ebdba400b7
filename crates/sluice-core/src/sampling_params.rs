//! Per-request generation settings.
//!
//! The scheduler reads only the stop-related fields (`max_tokens`,
//! `eos_token_id`, `stop_token_ids`, `min_tokens` through the sampler); the rest
//! travel untouched to the model runner inside `NewRequestData`, the way vLLM's
//! `SamplingParams` does.

use crate::error::FieldError;
use serde::{Deserialize, Serialize};

/// Sampling and stopping parameters of one request (vLLM's `SamplingParams`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Number of completions the caller wants; the engine fans these out into
    /// separate scheduler requests, the scheduler itself ignores it.
    pub n: usize,
    /// Most output tokens this request may produce.
    pub max_tokens: usize,
    /// Output tokens before EOS / stop tokens are allowed. Enforced by the
    /// sampler (masking), never by the scheduler's stop check.
    pub min_tokens: usize,
    /// 0 means greedy.
    pub temperature: f32,
    /// 1.0 disables nucleus sampling.
    pub top_p: f32,
    /// 0 (or negative) disables top-k.
    pub top_k: i32,
    /// 0 disables min-p.
    pub min_p: f32,
    /// Per-request seed: the same seed gives the same tokens whatever else is
    /// in the batch.
    pub seed: Option<u64>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1.0 disables the repetition penalty.
    pub repetition_penalty: f32,
    /// The primary EOS token. `None` when `ignore_eos` is set or the model has
    /// none (vLLM stores it only when EOS is not ignored).
    pub eos_token_id: Option<u32>,
    pub ignore_eos: bool,
    /// Extra tokens that stop generation (finish reason `stop`, stop reason =
    /// the token).
    pub stop_token_ids: Vec<u32>,
    /// Stop strings, matched by the detokenizer in the engine.
    pub stop: Vec<String>,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    /// Number of top logprobs to return per sampled token (the sampled token's
    /// own logprob is always included when this is set).
    pub logprobs: Option<usize>,
    /// Number of top logprobs per prompt position. Requests asking for prompt
    /// logprobs never read the prefix cache (vLLM's
    /// `skip_reading_prefix_cache`), since cached positions have no logits.
    pub prompt_logprobs: Option<usize>,
    /// Additive bias per token id, applied to logits before sampling.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            max_tokens: 16,
            min_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            eos_token_id: None,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            max_tokens,
            ..Self::default()
        }
    }

    /// True when sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 1e-5 || self.top_k == 1
    }

    /// Every token id that ends generation and is masked while fewer than
    /// `min_tokens` outputs exist: the EOS token (even when ignored, as vLLM
    /// does) plus `stop_token_ids`.
    pub fn all_stop_token_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eos_token_id
            .into_iter()
            .chain(self.stop_token_ids.iter().copied())
    }

    /// Applies the model's EOS ids the way vLLM's
    /// `update_from_generation_config` does: the primary EOS becomes
    /// `eos_token_id` unless EOS is ignored, and any further EOS ids of the
    /// generation config become stop tokens (again, unless ignored).
    pub fn apply_model_eos(&mut self, primary_eos: Option<u32>, extra_eos: &[u32]) {
        if !self.ignore_eos {
            self.eos_token_id = primary_eos;
            for &id in extra_eos {
                if Some(id) != primary_eos && !self.stop_token_ids.contains(&id) {
                    self.stop_token_ids.push(id);
                }
            }
        }
    }

    /// Checks the fields a user sets, naming the first bad one.
    pub fn validate(&self) -> Result<(), FieldError> {
        let fail = |field, message: String| Err(FieldError::new(field, message));
        if self.n == 0 {
            return fail("n", "must be at least 1".into());
        }
        if self.min_tokens > self.max_tokens {
            return fail(
                "min_tokens",
                format!(
                    "must be at most max_tokens ({}), got {}",
                    self.max_tokens, self.min_tokens
                ),
            );
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return fail(
                "temperature",
                format!("must be a finite number >= 0, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return fail("top_p", format!("must be in (0, 1], got {}", self.top_p));
        }
        if self.top_k < -1 {
            return fail(
                "top_k",
                format!("must be -1 or 0 (disabled) or positive, got {}", self.top_k),
            );
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return fail("min_p", format!("must be in [0, 1], got {}", self.min_p));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return fail(
                "presence_penalty",
                format!("must be in [-2, 2], got {}", self.presence_penalty),
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return fail(
                "frequency_penalty",
                format!("must be in [-2, 2], got {}", self.frequency_penalty),
            );
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return fail(
                "repetition_penalty",
                format!(
                    "must be a finite number > 0, got {}",
                    self.repetition_penalty
                ),
            );
        }
        if let Some((id, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return fail(
                "logit_bias",
                format!("bias for token {id} is not finite ({b})"),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_eos_respects_ignore_eos() {
        let mut p = SamplingParams::default();
        p.apply_model_eos(Some(2), &[2, 7]);
        assert_eq!(p.eos_token_id, Some(2));
        assert_eq!(p.stop_token_ids, vec![7]);

        let mut q = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::default()
        };
        q.apply_model_eos(Some(2), &[2, 7]);
        assert_eq!(q.eos_token_id, None);
        assert!(q.stop_token_ids.is_empty());
    }

    #[test]
    fn validate_names_the_field() {
        let p = SamplingParams {
            min_tokens: 5,
            max_tokens: 2,
            ..SamplingParams::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "min_tokens");
        let p = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "top_p");
        assert!(SamplingParams::default().validate().is_ok());
    }
}
