//! Scheduler and KV cache settings, with vLLM's defaults and validation.

use crate::block_hash::HashAlgo;
use crate::error::FieldError;
use std::fmt;
use std::str::FromStr;

/// How the waiting queue is ordered and who is preempted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// First come, first served; the running tail is preempted.
    #[default]
    Fcfs,
    /// Lowest (priority, arrival) first; the largest is preempted.
    Priority,
}

impl FromStr for SchedulingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "priority" => Ok(Self::Priority),
            other => Err(format!(
                "unknown scheduling policy {other:?} (expected \"fcfs\" or \"priority\")"
            )),
        }
    }
}

impl fmt::Display for SchedulingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fcfs => "fcfs",
            Self::Priority => "priority",
        })
    }
}

/// Everything `Scheduler::new` needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Most requests in `running` at once.
    pub max_num_seqs: usize,
    /// Token budget of one step (input side).
    pub max_num_batched_tokens: usize,
    /// Tokens scheduled per step; defaults to `max_num_batched_tokens`.
    pub max_num_scheduled_tokens: Option<usize>,
    pub max_model_len: usize,
    pub enable_chunked_prefill: bool,
    /// Caps the tokens of any one request in a step (0 = off), except in a
    /// step that starts with a single request.
    pub long_prefill_token_threshold: usize,
    pub policy: SchedulingPolicy,
    /// Admit a waiting request only if the pool can hold all its known tokens
    /// (vLLM's `scheduler_reserve_full_isl`, on by default).
    pub reserve_full_sequence: bool,
    /// Extra slots reserved per step for speculative tokens.
    pub num_lookahead_tokens: usize,
    pub block_size: usize,
    /// The whole pool, null block included.
    pub num_gpu_blocks: usize,
    pub enable_prefix_caching: bool,
    pub prefix_caching_hash_algo: HashAlgo,
    /// Fraction of the pool kept free when admitting (vLLM's watermark).
    pub watermark: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_num_scheduled_tokens: None,
            max_model_len: 4096,
            enable_chunked_prefill: true,
            long_prefill_token_threshold: 0,
            policy: SchedulingPolicy::Fcfs,
            reserve_full_sequence: true,
            num_lookahead_tokens: 0,
            block_size: 16,
            num_gpu_blocks: 4096,
            enable_prefix_caching: true,
            prefix_caching_hash_algo: HashAlgo::Sha256,
            watermark: 0.0,
        }
    }
}

/// A rejected configuration: the option's name and what is wrong with it.
pub type ConfigError = FieldError;

fn err(field: &'static str, message: impl Into<String>) -> Result<(), ConfigError> {
    Err(FieldError::new(field, message))
}

impl SchedulerConfig {
    pub fn max_num_scheduled_tokens(&self) -> usize {
        self.max_num_scheduled_tokens
            .unwrap_or(self.max_num_batched_tokens)
    }

    /// The checks without which the scheduler is undefined (what a trace must
    /// satisfy).
    pub fn validate_basic(&self) -> Result<(), ConfigError> {
        if self.block_size == 0 {
            return err("block_size", "must be at least 1");
        }
        if self.num_gpu_blocks < 2 {
            return err(
                "num_gpu_blocks",
                format!(
                    "must be at least 2 (block 0 is the reserved null block), got {}",
                    self.num_gpu_blocks
                ),
            );
        }
        if self.max_num_batched_tokens == 0 {
            return err("max_num_batched_tokens", "must be at least 1");
        }
        if self.max_num_scheduled_tokens == Some(0) {
            return err("max_num_scheduled_tokens", "must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return err("max_num_seqs", "must be at least 1");
        }
        if self.max_model_len < 2 {
            return err("max_model_len", "must be at least 2");
        }
        if !(0.0..1.0).contains(&self.watermark) {
            return err(
                "watermark",
                format!("must be in [0, 1), got {}", self.watermark),
            );
        }
        Ok(())
    }

    /// Everything vLLM's engine refuses at startup (`verify_max_model_len`),
    /// on top of the basic checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_basic()?;
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return err(
                "max_num_batched_tokens",
                format!(
                    "({}) is smaller than max_model_len ({}) with chunked prefill disabled; \
                     longer prompts could never be scheduled. Increase \
                     max_num_batched_tokens, decrease max_model_len or enable chunked prefill",
                    self.max_num_batched_tokens, self.max_model_len
                ),
            );
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return err(
                "max_num_batched_tokens",
                format!(
                    "({}) must be greater than or equal to max_num_seqs ({})",
                    self.max_num_batched_tokens, self.max_num_seqs
                ),
            );
        }
        if self.long_prefill_token_threshold > self.max_model_len {
            return err(
                "long_prefill_token_threshold",
                format!(
                    "({}) cannot be greater than max_model_len ({})",
                    self.long_prefill_token_threshold, self.max_model_len
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        SchedulerConfig::default().validate().unwrap();
    }

    #[test]
    fn chunking_off_needs_a_budget_of_a_whole_sequence() {
        let c = SchedulerConfig {
            enable_chunked_prefill: false,
            max_num_batched_tokens: 256,
            max_model_len: 4096,
            max_num_seqs: 4,
            ..SchedulerConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "max_num_batched_tokens");
        // The trace format allows it (the seed example uses it).
        c.validate_basic().unwrap();
    }

    #[test]
    fn tiny_pool_is_rejected() {
        let c = SchedulerConfig {
            num_gpu_blocks: 1,
            ..SchedulerConfig::default()
        };
        let e = c.validate_basic().unwrap_err();
        assert_eq!(e.field, "num_gpu_blocks");
        assert!(e.to_string().contains("null block"));
    }

    #[test]
    fn policy_parses() {
        assert_eq!(
            "priority".parse::<SchedulingPolicy>(),
            Ok(SchedulingPolicy::Priority)
        );
        assert!("lifo".parse::<SchedulingPolicy>().is_err());
    }
}
