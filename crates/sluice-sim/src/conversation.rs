//! Multi-turn conversations: each turn's prompt is the whole conversation
//! so far, so prefix caching sees the history grow.
//!
//! Conversations arrive like `RandomWorkload`'s requests: a count with
//! vLLM's arrival rule (`send_times`, gaps scaled so the last is at
//! `n / rate`), or a duration with the unscaled process. Each draws a
//! number of turns; turn 0's prompt is an optional shared system prompt
//! (one of `num_system_prompts` groups, picked at random) followed by the
//! first message; turn `k > 0`'s prompt is turn `k−1`'s prompt, then its
//! outputs (`sim::output_token` of turn `k−1`'s index, the tokens the
//! simulator makes it sample), then the new message. Turn `k > 0` waits on
//! turn `k−1` (`after`) and is sent a think time after it finishes;
//! its `arrival_s` is the conversation's arrival (a lower bound only).
//!
//! Promises:
//! - the list is in final index order, conversation by conversation and
//!   turn by turn, so every `after` points earlier and the output tokens
//!   a prompt repeats are the ones the simulator will produce;
//! - no request's prompt plus output exceeds `max_model_len`: a turn that
//!   would is not generated and its conversation ends there (a
//!   conversation whose first turn does not fit is dropped); the summary
//!   counts both;
//! - deterministic for the seed. Each conversation draws from its own
//!   stream (seeded from the main one), so where one conversation ends
//!   does not shift the next one's draws.
//!
//! Ids are `c{conversation}-t{turn}`.

use crate::lengths::{LengthDist, LengthDistError};
use crate::sim::{output_token, SimRequest};
use crate::workload::{
    arrivals_until, check_arrivals, random_tokens, send_times, Rng, WorkloadError,
    MAX_GENERATED_LEN, MAX_GENERATED_REQUESTS, MAX_SHARED_PREFIX_TOKENS,
};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The pause between a turn's last output token and the next turn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ThinkTime {
    /// Always this many seconds.
    Fixed { seconds: f64 },
    /// Exponentially distributed with this mean (seconds).
    Exponential { mean: f64 },
}

impl ThinkTime {
    pub fn validate(&self) -> Result<(), String> {
        let (name, v) = match *self {
            ThinkTime::Fixed { seconds } => ("fixed think time", seconds),
            ThinkTime::Exponential { mean } => ("exponential think time mean", mean),
        };
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(format!("{name} {v} must be a finite number of seconds ≥ 0"))
        }
    }

    pub fn sample(&self, rng: &mut Rng) -> f64 {
        match *self {
            ThinkTime::Fixed { seconds } => seconds,
            ThinkTime::Exponential { mean } => rng.exponential(mean),
        }
    }
}

impl fmt::Display for ThinkTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThinkTime::Fixed { seconds } => write!(f, "fixed:{seconds}"),
            ThinkTime::Exponential { mean } => write!(f, "exp:{mean}"),
        }
    }
}

impl FromStr for ThinkTime {
    type Err = String;

    /// `fixed:SECONDS`, `exp:MEAN` (or `exponential:MEAN`), or a bare
    /// number of seconds (fixed).
    fn from_str(s: &str) -> Result<ThinkTime, String> {
        let number = |text: &str| {
            text.trim()
                .parse::<f64>()
                .map_err(|_| format!("think time `{s}`: `{text}` is not a number of seconds"))
        };
        let t = match s.split_once(':') {
            None => ThinkTime::Fixed {
                seconds: number(s)?,
            },
            Some(("fixed", v)) => ThinkTime::Fixed {
                seconds: number(v)?,
            },
            Some(("exp" | "exponential", v)) => ThinkTime::Exponential { mean: number(v)? },
            Some((kind, _)) => {
                return Err(format!(
                    "think time `{s}`: unknown kind `{kind}` (expected fixed:SECONDS or exp:MEAN)"
                ))
            }
        };
        t.validate()?;
        Ok(t)
    }
}

/// Multi-turn chat sessions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConversationWorkload {
    /// Conversations to start; ignored in duration mode.
    pub num_conversations: usize,
    /// Duration mode: conversations start (unscaled arrivals at
    /// `conversation_rate`) until this many seconds; their later turns may
    /// run past it.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Conversations started per second; infinite starts all at t = 0.
    pub conversation_rate: f64,
    /// Gamma shape of the gaps between conversation starts; 1 is Poisson.
    pub burstiness: f64,
    /// Turns per conversation (at least 1); `LengthDist::fixed(n)` for a
    /// fixed count.
    pub turns: LengthDist,
    /// The first user message's tokens (after the system prompt).
    pub first_message: LengthDist,
    /// Each later user message's tokens.
    pub later_message: LengthDist,
    /// Output tokens of every turn.
    pub output: LengthDist,
    pub think_time: ThinkTime,
    /// Tokens of each shared system prompt (0: none).
    pub system_prompt_len: usize,
    /// Distinct system prompts; each conversation picks one at random.
    pub num_system_prompts: usize,
    /// No request's prompt plus output goes past this.
    pub max_model_len: usize,
    pub seed: u64,
    /// Token ids are drawn below this.
    pub vocab: u32,
}

impl Default for ConversationWorkload {
    fn default() -> Self {
        ConversationWorkload {
            num_conversations: 100,
            duration_s: None,
            conversation_rate: 1.0,
            burstiness: 1.0,
            turns: LengthDist::fixed(4),
            first_message: LengthDist::fixed(512),
            later_message: LengthDist::fixed(128),
            output: LengthDist::fixed(128),
            think_time: ThinkTime::Exponential { mean: 5.0 },
            system_prompt_len: 0,
            num_system_prompts: 1,
            // `SchedulerConfig::default()`'s.
            max_model_len: 4096,
            seed: 0,
            vocab: 32_000,
        }
    }
}

/// What generation kept and cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConversationSummary {
    /// Conversations started (dropped ones included).
    pub conversations: usize,
    /// Turns drawn over all conversations.
    pub turns_drawn: usize,
    /// Requests generated.
    pub requests: usize,
    /// Conversations cut short because a turn would pass `max_model_len`.
    pub ended_early: usize,
    /// Of those, the ones whose first turn did not fit (no requests).
    pub dropped: usize,
}

fn length_err(field: &'static str) -> impl Fn(LengthDistError) -> WorkloadError {
    move |source| WorkloadError::Length { field, source }
}

impl ConversationWorkload {
    fn validate(&self) -> Result<(), WorkloadError> {
        use WorkloadError::Invalid;
        check_arrivals(
            "conversation_rate",
            self.conversation_rate,
            self.burstiness,
            self.duration_s,
        )?;
        if self.vocab == 0 {
            return Err(Invalid("vocab", "at least 1"));
        }
        if self.system_prompt_len > 0 && self.num_system_prompts == 0 {
            return Err(Invalid(
                "num_system_prompts",
                "at least 1 with a system prompt length",
            ));
        }
        if self.max_model_len > MAX_GENERATED_LEN {
            return Err(Invalid(
                "max_model_len",
                "at most 2^24 (the scheduler's limit)",
            ));
        }
        if self
            .system_prompt_len
            .saturating_mul(self.num_system_prompts)
            > MAX_SHARED_PREFIX_TOKENS
        {
            return Err(Invalid(
                "system_prompt_len × num_system_prompts",
                "at most 2^26 tokens",
            ));
        }
        if self.max_model_len < self.system_prompt_len.saturating_add(2) {
            return Err(Invalid(
                "max_model_len",
                "at least the system prompt plus 2 (one message and one output token)",
            ));
        }
        self.turns.validate().map_err(length_err("turns"))?;
        self.first_message
            .validate()
            .map_err(length_err("first message lengths"))?;
        self.later_message
            .validate()
            .map_err(length_err("later message lengths"))?;
        self.output
            .validate()
            .map_err(length_err("output lengths"))?;
        if self.think_time.validate().is_err() {
            return Err(Invalid("think_time", "finite and ≥ 0 seconds"));
        }
        let expected = match self.duration_s {
            Some(d) => self.conversation_rate * d,
            None => self.num_conversations as f64,
        };
        if expected > MAX_GENERATED_REQUESTS as f64 {
            return Err(WorkloadError::TooMany {
                what: "conversations",
                expected,
                limit: MAX_GENERATED_REQUESTS,
            });
        }
        Ok(())
    }

    /// The requests (see the module doc); deterministic for the seed.
    pub fn generate(&self) -> Result<Vec<SimRequest>, WorkloadError> {
        Ok(self.generate_with_summary()?.0)
    }

    /// The requests and what was cut to fit `max_model_len`.
    pub fn generate_with_summary(
        &self,
    ) -> Result<(Vec<SimRequest>, ConversationSummary), WorkloadError> {
        self.validate()?;
        let too_many = |expected: f64| WorkloadError::TooMany {
            what: "requests",
            expected,
            limit: MAX_GENERATED_REQUESTS,
        };
        let mut rng = Rng::new(self.seed);
        let system_prompts: Vec<Vec<u32>> = if self.system_prompt_len == 0 {
            Vec::new()
        } else {
            (0..self.num_system_prompts)
                .map(|_| random_tokens(&mut rng, self.system_prompt_len, self.vocab))
                .collect()
        };
        let starts = match self.duration_s {
            Some(d) => arrivals_until(
                d,
                self.conversation_rate,
                self.burstiness,
                &mut rng,
                MAX_GENERATED_REQUESTS,
            )
            .map_err(|_| too_many(self.conversation_rate * d))?,
            None => send_times(
                self.num_conversations,
                self.conversation_rate,
                self.burstiness,
                &mut rng,
            ),
        };
        let max_len = self.max_model_len;
        // Every turn holds at least one message and one output token more
        // than the last, so no conversation fits more than this many.
        let max_turns = (max_len / 2).max(1);
        let mut out: Vec<SimRequest> = Vec::new();
        let mut summary = ConversationSummary {
            conversations: starts.len(),
            ..ConversationSummary::default()
        };
        for (c, &start) in starts.iter().enumerate() {
            let mut crng = Rng::new(rng.next_u64());
            let turns = self.turns.sample(&mut crng, max_turns);
            summary.turns_drawn += turns;
            let system: &[u32] = if system_prompts.is_empty() {
                &[]
            } else {
                &system_prompts[crng.range_inclusive(0, system_prompts.len() - 1)]
            };
            let mut prev: Option<usize> = None;
            for t in 0..turns {
                let message = if t == 0 {
                    &self.first_message
                } else {
                    &self.later_message
                };
                let message_len = message.sample(&mut crng, max_len);
                let output_len = self.output.sample(&mut crng, max_len);
                let think_time_s = if t == 0 {
                    0.0
                } else {
                    self.think_time.sample(&mut crng)
                };
                let history = match prev {
                    None => system.len(),
                    Some(p) => out[p].prompt.len() + out[p].output_len,
                };
                if history + message_len + output_len > max_len {
                    summary.ended_early += 1;
                    if t == 0 {
                        summary.dropped += 1;
                    }
                    break;
                }
                if out.len() == MAX_GENERATED_REQUESTS {
                    return Err(too_many(summary.turns_drawn as f64));
                }
                let mut prompt = Vec::with_capacity(history + message_len);
                match prev {
                    None => prompt.extend_from_slice(system),
                    Some(p) => {
                        prompt.extend_from_slice(&out[p].prompt);
                        prompt.extend((0..out[p].output_len).map(|j| output_token(p, j)));
                    }
                }
                prompt.extend(random_tokens(&mut crng, message_len, self.vocab));
                let mut req = SimRequest::new(format!("c{c}-t{t}"), start, prompt, output_len);
                req.after = prev;
                req.think_time_s = think_time_s;
                prev = Some(out.len());
                out.push(req);
            }
        }
        summary.requests = out.len();
        Ok((out, summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_time_spellings() {
        assert_eq!(
            "exp:2.5".parse::<ThinkTime>().unwrap(),
            ThinkTime::Exponential { mean: 2.5 }
        );
        assert_eq!(
            "3".parse::<ThinkTime>().unwrap(),
            ThinkTime::Fixed { seconds: 3.0 }
        );
        assert_eq!(
            "fixed:0.5".parse::<ThinkTime>().unwrap().to_string(),
            "fixed:0.5"
        );
        let e = "gauss:1".parse::<ThinkTime>().unwrap_err();
        assert!(e.contains("unknown kind `gauss`"), "{e}");
        let e = "exp:-1".parse::<ThinkTime>().unwrap_err();
        assert!(e.contains("must be a finite number of seconds ≥ 0"), "{e}");
        let e = "fixed:soon".parse::<ThinkTime>().unwrap_err();
        assert!(e.contains("`soon` is not a number"), "{e}");
    }

    #[test]
    fn a_first_turn_that_cannot_fit_drops_the_conversation() {
        let w = ConversationWorkload {
            num_conversations: 3,
            first_message: LengthDist::fixed(100),
            output: LengthDist::fixed(10),
            max_model_len: 64,
            ..ConversationWorkload::default()
        };
        let (reqs, s) = w.generate_with_summary().unwrap();
        assert!(reqs.is_empty());
        assert_eq!((s.conversations, s.dropped, s.ended_early), (3, 3, 3));
    }

    #[test]
    fn invalid_settings_are_errors() {
        let bad = [
            ConversationWorkload {
                conversation_rate: 0.0,
                ..ConversationWorkload::default()
            },
            ConversationWorkload {
                conversation_rate: f64::INFINITY,
                duration_s: Some(10.0),
                ..ConversationWorkload::default()
            },
            ConversationWorkload {
                system_prompt_len: 4095,
                ..ConversationWorkload::default()
            },
            ConversationWorkload {
                think_time: ThinkTime::Fixed { seconds: f64::NAN },
                ..ConversationWorkload::default()
            },
            ConversationWorkload {
                output: LengthDist::Normal {
                    mean: 5.0,
                    std: -1.0,
                },
                ..ConversationWorkload::default()
            },
        ];
        for w in bad {
            assert!(w.generate().is_err(), "{w:?}");
        }
        let e = ConversationWorkload {
            output: LengthDist::Normal {
                mean: 5.0,
                std: -1.0,
            },
            ..ConversationWorkload::default()
        }
        .generate()
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "output lengths: normal: std -1 must be a finite number ≥ 0"
        );
    }
}
