//! Scheduler and KV cache settings, with vLLM's defaults and validation.

use crate::block_hash::HashAlgo;
use crate::error::FieldError;
use crate::kv_cache::KvCacheGroupSpec;
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
    /// Drafts per request and step the executor may propose (vLLM's
    /// `num_speculative_tokens`; 0 without speculative decoding). Drafts
    /// arrive through `Executor::take_draft_token_ids` whatever this says;
    /// it sizes what is reported (vLLM's per-position acceptance
    /// counters).
    pub num_speculative_tokens: usize,
    /// Input-budget slots each scheduled request reserves for a drafter
    /// that proposes in the same forward pass (vLLM's draft slots); 0, the
    /// default, without one. Drafts themselves come from the executor
    /// (`Executor::take_draft_token_ids`).
    pub num_draft_slots: usize,
    /// Pad a request admitted with exactly one token to compute to
    /// `1 + num_speculative_tokens` rows of placeholder drafts
    /// (`PLACEHOLDER_TOKEN_ID`), as vLLM 0.33 does with a fixed
    /// `num_speculative_tokens` (no per-batch-size schedule) so that its
    /// decode batches keep one shape; the placeholders are always rejected.
    pub pad_spec_decode: bool,
    pub block_size: usize,
    /// The whole pool, null block included.
    pub num_gpu_blocks: usize,
    pub enable_prefix_caching: bool,
    pub prefix_caching_hash_algo: HashAlgo,
    /// The seed of the block-hash chain: the value of `PYTHONHASHSEED` in
    /// vLLM, which derives its root hash from that variable when it is set
    /// (and from a fixed string otherwise). `None` = not set. The crate reads
    /// no environment: the binary that builds the config passes it in.
    pub hash_seed: Option<String>,
    /// Queue KV cache events (vLLM's `--kv-events-config` with
    /// `enable_kv_cache_events`), handed out by
    /// `Scheduler::take_kv_cache_events`. Only with prefix caching on.
    pub enable_kv_cache_events: bool,
    /// Fraction of the pool kept free when admitting (vLLM's watermark).
    pub watermark: f64,
    /// The model's KV cache groups, in order (vLLM's `kv_cache_groups`):
    /// one full-attention group for a plain decoder; sliding-window and
    /// chunked-local groups beside it for a hybrid model. All groups share
    /// the pool; a group without its own block size has `block_size`.
    pub kv_cache_groups: Vec<KvCacheGroupSpec>,
    /// The KV cache's element type as vLLM's `cache_dtype` names it
    /// (`bfloat16`, `q8_0`, ...; vLLM's default `auto` when the executor
    /// does not say). Reported (`vllm:cache_config_info`), never read by
    /// the scheduler: block ids mean tokens, whatever a token's bytes.
    pub cache_dtype: String,
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
            num_speculative_tokens: 0,
            num_draft_slots: 0,
            pad_spec_decode: false,
            block_size: 16,
            num_gpu_blocks: 4096,
            enable_prefix_caching: true,
            prefix_caching_hash_algo: HashAlgo::Sha256,
            hash_seed: None,
            enable_kv_cache_events: false,
            watermark: 0.0,
            kv_cache_groups: vec![KvCacheGroupSpec::FULL],
            cache_dtype: "auto".to_string(),
        }
    }
}

/// A rejected configuration: the option's name and what is wrong with it.
pub type ConfigError = FieldError;

// Upper bounds of the sizes a configuration may name. They are far above any
// real deployment; they exist so that a typo, a fuzzed trace or a runaway
// flag is refused with an error naming the field instead of aborting the
// process on an allocation or overflowing arithmetic.

/// Most blocks in the KV pool (2^24). The block pool allocates its
/// bookkeeping for every block up front (about 45 bytes per block, plus
/// the prefix-cache table sized to the pool: at the limit a replay takes
/// about 0.8 GB resident and 1.4 s to start), and block ids are `u32`.
/// vLLM deployments use 10^4 to 10^6 blocks.
pub const MAX_NUM_GPU_BLOCKS: usize = 1 << 24;
/// Most tokens per KV block (2^16); vLLM's largest is a few hundred.
pub const MAX_BLOCK_SIZE: usize = 1 << 16;
/// Longest context (2^24 tokens, above the longest published context
/// windows). A request reserves room for up to this many token ids.
pub const MAX_MODEL_LEN: usize = 1 << 24;
/// Most requests running at once (2^24).
pub const MAX_NUM_SEQS: usize = 1 << 24;
/// Largest per-step token budget (2^31). A budget sizes no allocation; the
/// bound keeps sums of token counts far from overflow.
pub const MAX_TOKEN_BUDGET: usize = 1 << 31;

fn err(field: &'static str, message: impl Into<String>) -> Result<(), ConfigError> {
    Err(FieldError::new(field, message))
}

/// `value` above `max`: an error naming `field` and the limit.
pub(crate) fn at_most(field: &'static str, value: usize, max: usize) -> Result<(), ConfigError> {
    if value > max {
        let power = if max.is_power_of_two() {
            format!(" (2^{})", max.ilog2())
        } else {
            String::new()
        };
        return err(field, format!("must be at most {max}{power}, got {value}"));
    }
    Ok(())
}

impl SchedulerConfig {
    /// The most blocks one request of `max_model_len` tokens holds at once,
    /// summed over the KV cache groups, which all draw from the one pool
    /// (vLLM 0.33's per-request sum in
    /// `get_max_concurrency_for_kv_cache_config`, each group's
    /// `max_memory_usage_bytes ÷ page_size`): a full group's whole
    /// sequence, a sliding-window group its window and a step.
    pub fn max_blocks_per_request(&self) -> usize {
        self.kv_cache_groups
            .iter()
            .map(|g| {
                g.max_blocks_per_request(
                    g.block_size_or(self.block_size),
                    self.max_num_batched_tokens,
                    self.max_model_len,
                )
            })
            .fold(0, usize::saturating_add)
    }

    /// The groups' own rules: at least one group; windows, chunks and block
    /// sizes of at least one token and bounded; with prefix caching, a
    /// chunked-local group's block size equal to the scheduler's (vLLM
    /// asserts it at its first lookup).
    fn validate_kv_cache_groups(&self) -> Result<(), ConfigError> {
        use crate::kv_cache::AttentionKind;
        if self.kv_cache_groups.is_empty() {
            return err("kv_cache_groups", "must name at least one group");
        }
        for g in &self.kv_cache_groups {
            let b = g.block_size_or(self.block_size);
            if b == 0 {
                return err("kv_cache_groups", "a group's block_size must be at least 1");
            }
            at_most("kv_cache_groups", b, MAX_BLOCK_SIZE)?;
            match g.kind {
                AttentionKind::SlidingWindow { window: 0 } => {
                    return err("kv_cache_groups", "a sliding_window must be at least 1")
                }
                AttentionKind::ChunkedLocal { chunk: 0 } => {
                    return err(
                        "kv_cache_groups",
                        "an attention_chunk_size must be at least 1",
                    )
                }
                AttentionKind::SlidingWindow { window: w }
                | AttentionKind::ChunkedLocal { chunk: w } => {
                    at_most("kv_cache_groups", w, MAX_MODEL_LEN)?
                }
                AttentionKind::Full => {}
            }
        }
        let (sched_bs, _) = self.block_layout();
        at_most("kv_cache_groups", sched_bs, MAX_BLOCK_SIZE)?;
        if self.enable_prefix_caching {
            for (i, g) in self.kv_cache_groups.iter().enumerate() {
                let b = g.block_size_or(self.block_size);
                if matches!(g.kind, AttentionKind::ChunkedLocal { .. }) && b != sched_bs {
                    return err(
                        "kv_cache_groups",
                        format!(
                            "group {i}: a chunked_local group needs block size {sched_bs} (the \
                             LCM of all group block sizes) when prefix caching is on"
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// `(scheduler block size, hash block size)` the groups imply
    /// (`kv_cache::block_layout`).
    pub fn block_layout(&self) -> (usize, usize) {
        crate::kv_cache::block_layout(
            &self.kv_cache_groups,
            self.block_size,
            self.enable_prefix_caching,
        )
    }

    pub fn max_num_scheduled_tokens(&self) -> usize {
        self.max_num_scheduled_tokens
            .unwrap_or(self.max_num_batched_tokens)
    }

    /// The checks without which the scheduler is undefined (what a trace must
    /// satisfy), and the upper bounds (`MAX_*`) past which it cannot be
    /// allocated.
    pub fn validate_basic(&self) -> Result<(), ConfigError> {
        if self.block_size == 0 {
            return err("block_size", "must be at least 1");
        }
        at_most("block_size", self.block_size, MAX_BLOCK_SIZE)?;
        self.validate_kv_cache_groups()?;
        if self.num_gpu_blocks < 2 {
            return err(
                "num_gpu_blocks",
                format!(
                    "must be at least 2 (block 0 is the reserved null block), got {}",
                    self.num_gpu_blocks
                ),
            );
        }
        at_most("num_gpu_blocks", self.num_gpu_blocks, MAX_NUM_GPU_BLOCKS)?;
        if self.max_num_batched_tokens == 0 {
            return err("max_num_batched_tokens", "must be at least 1");
        }
        at_most(
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            MAX_TOKEN_BUDGET,
        )?;
        if let Some(n) = self.max_num_scheduled_tokens {
            if n == 0 {
                return err("max_num_scheduled_tokens", "must be at least 1");
            }
            at_most("max_num_scheduled_tokens", n, MAX_TOKEN_BUDGET)?;
        }
        if self.max_num_seqs == 0 {
            return err("max_num_seqs", "must be at least 1");
        }
        at_most("max_num_seqs", self.max_num_seqs, MAX_NUM_SEQS)?;
        if self.max_model_len < 2 {
            return err("max_model_len", "must be at least 2");
        }
        at_most("max_model_len", self.max_model_len, MAX_MODEL_LEN)?;
        at_most(
            "long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            MAX_TOKEN_BUDGET,
        )?;
        at_most(
            "num_lookahead_tokens",
            self.num_lookahead_tokens,
            MAX_MODEL_LEN,
        )?;
        at_most("num_draft_slots", self.num_draft_slots, MAX_MODEL_LEN)?;
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
    fn absurd_sizes_are_refused_naming_the_field() {
        let base = SchedulerConfig::default();
        let cases: [(&str, SchedulerConfig); 8] = [
            (
                "num_gpu_blocks",
                SchedulerConfig {
                    num_gpu_blocks: MAX_NUM_GPU_BLOCKS + 1,
                    ..base.clone()
                },
            ),
            (
                "block_size",
                SchedulerConfig {
                    block_size: usize::MAX,
                    ..base.clone()
                },
            ),
            (
                "max_model_len",
                SchedulerConfig {
                    max_model_len: 1 << 31,
                    ..base.clone()
                },
            ),
            (
                "max_num_seqs",
                SchedulerConfig {
                    max_num_seqs: 1 << 40,
                    ..base.clone()
                },
            ),
            (
                "max_num_batched_tokens",
                SchedulerConfig {
                    max_num_batched_tokens: usize::MAX,
                    ..base.clone()
                },
            ),
            (
                "max_num_scheduled_tokens",
                SchedulerConfig {
                    max_num_scheduled_tokens: Some(usize::MAX),
                    ..base.clone()
                },
            ),
            (
                "long_prefill_token_threshold",
                SchedulerConfig {
                    long_prefill_token_threshold: usize::MAX,
                    ..base.clone()
                },
            ),
            (
                "num_lookahead_tokens",
                SchedulerConfig {
                    num_lookahead_tokens: usize::MAX,
                    ..base.clone()
                },
            ),
        ];
        for (field, c) in cases {
            let e = c.validate_basic().unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.message.starts_with("must be at most"), "{e}");
            // Scheduler::new refuses it too, before allocating anything.
            assert_eq!(crate::Scheduler::new(c).err().map(|e| e.field), Some(field));
        }
        let e = SchedulerConfig {
            num_gpu_blocks: 1 << 31,
            ..base.clone()
        }
        .validate_basic()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "num_gpu_blocks: must be at most 16777216 (2^24), got 2147483648"
        );
        // The limits themselves are accepted.
        SchedulerConfig {
            num_gpu_blocks: MAX_NUM_GPU_BLOCKS,
            block_size: MAX_BLOCK_SIZE,
            max_model_len: MAX_MODEL_LEN,
            max_num_seqs: MAX_NUM_SEQS,
            max_num_batched_tokens: MAX_TOKEN_BUDGET,
            ..base
        }
        .validate_basic()
        .unwrap();
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
