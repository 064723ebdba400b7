//! The periodic stats line, as vLLM's `LoggingStatLogger` (vLLM 0.33,
//! `vllm/v1/metrics/loggers.py`) writes it every `VLLM_LOG_STATS_INTERVAL`
//! seconds:
//!
//! `Engine 000: Avg prompt throughput: 12.3 tokens/s, Avg generation
//! throughput: 45.6 tokens/s, Running: 2 reqs, Waiting: 0 reqs, KV cache
//! usage: 3.1%, Prefix cache hit rate: 50.0%, Preempted: 0 reqs`
//!
//! Owns no statistic: every figure is read from the engine's snapshot
//! (`Engine::stats`, the one `/metrics` exports), and a throughput is the
//! difference of a cumulative counter since the previous tick over the
//! seconds between them.
//!
//! Rules, vLLM's unless said:
//! - a line is written at info when this interval or the previous one had
//!   prompt or generation tokens, else at debug: an idle server does not
//!   repeat itself, and the first idle interval still shows the drop to 0;
//! - "KV cache usage", not vLLM's "GPU KV cache usage": sluice's cache is
//!   in host memory, and a pattern for vLLM's `KV cache usage: (.*)%`
//!   still matches;
//! - the prefix cache hit rate is over the lookups of the interval (vLLM:
//!   over its last 1000 requests); an interval without lookups keeps the
//!   last rate, as vLLM's window keeps its value while no request comes;
//! - `Preempted: N reqs` (sluice's addition) counts the preemptions of the
//!   interval;
//! - after it, vLLM's `SpecDecoding metrics: Mean acceptance length: ...`
//!   line (`Per-position acceptance rate` over the interval's
//!   verifications), only when drafts were verified in the interval;
//! - at shutdown a last line covers the time since the previous one, when
//!   it had tokens, so the lines add up to the whole run.

use crate::logging::{self, Level};
use serde_json::Value;
use sluice_engine::{Engine, EngineStats};
use std::time::{Duration, Instant};

/// The cumulative counters the line takes differences of.
#[derive(Clone, Debug, Default, PartialEq)]
struct Counters {
    prompt_tokens: u64,
    generation_tokens: u64,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    num_preemptions: u64,
    spec_drafts: u64,
    spec_draft_tokens: u64,
    spec_accepted_tokens: u64,
    spec_accepted_per_pos: Vec<u64>,
}

impl Counters {
    fn of(s: &EngineStats) -> Self {
        Counters {
            prompt_tokens: s.prompt_tokens,
            generation_tokens: s.generation_tokens,
            prefix_cache_queries: s.prefix_cache_queries,
            prefix_cache_hits: s.prefix_cache_hits,
            num_preemptions: s.num_preemptions,
            spec_drafts: s.spec_decode_num_drafts,
            spec_draft_tokens: s.spec_decode_num_draft_tokens,
            spec_accepted_tokens: s.spec_decode_num_accepted_tokens,
            spec_accepted_per_pos: s.spec_decode_accepted_per_pos.clone(),
        }
    }

    fn since(&self, before: &Counters) -> Counters {
        Counters {
            prompt_tokens: self.prompt_tokens.saturating_sub(before.prompt_tokens),
            generation_tokens: self
                .generation_tokens
                .saturating_sub(before.generation_tokens),
            prefix_cache_queries: self
                .prefix_cache_queries
                .saturating_sub(before.prefix_cache_queries),
            prefix_cache_hits: self
                .prefix_cache_hits
                .saturating_sub(before.prefix_cache_hits),
            num_preemptions: self.num_preemptions.saturating_sub(before.num_preemptions),
            spec_drafts: self.spec_drafts.saturating_sub(before.spec_drafts),
            spec_draft_tokens: self
                .spec_draft_tokens
                .saturating_sub(before.spec_draft_tokens),
            spec_accepted_tokens: self
                .spec_accepted_tokens
                .saturating_sub(before.spec_accepted_tokens),
            spec_accepted_per_pos: self
                .spec_accepted_per_pos
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    n.saturating_sub(before.spec_accepted_per_pos.get(i).copied().unwrap_or(0))
                })
                .collect(),
        }
    }
}

/// The logger's memory between ticks.
#[derive(Debug)]
pub struct StatsLogger {
    last: Counters,
    last_at: Instant,
    /// The previous interval had tokens.
    last_busy: bool,
    /// Percent, of the last interval with prefix cache lookups.
    hit_rate: f64,
}

/// One interval's line: its level, text and fields; and the spec-decode
/// line when drafts were verified in the interval.
struct Line {
    level: Level,
    msg: String,
    fields: Vec<(&'static str, Value)>,
    spec: Option<(String, Vec<(&'static str, Value)>)>,
}

impl Line {
    fn write(&self, level: Level) {
        logging::log(level, &self.msg, &self.fields);
        if let Some((msg, fields)) = &self.spec {
            logging::log(level, msg, fields);
        }
    }
}

/// vLLM's `SpecDecodingLogging` line of an interval of `secs` with these
/// differences, when drafts were verified in it.
fn spec_line(d: &Counters, secs: f64) -> Option<(String, Vec<(&'static str, Value)>)> {
    if d.spec_drafts == 0 {
        return None;
    }
    let drafts = d.spec_drafts as f64;
    let mean_len = 1.0 + d.spec_accepted_tokens as f64 / drafts;
    let accepted_tp = d.spec_accepted_tokens as f64 / secs;
    let drafted_tp = d.spec_draft_tokens as f64 / secs;
    let rates: Vec<f64> = d
        .spec_accepted_per_pos
        .iter()
        .map(|&n| n as f64 / drafts)
        .collect();
    let rates_text: Vec<String> = rates.iter().map(|r| format!("{r:.3}")).collect();
    let avg_rate = if d.spec_draft_tokens == 0 {
        0.0
    } else {
        100.0 * d.spec_accepted_tokens as f64 / d.spec_draft_tokens as f64
    };
    let msg = format!(
        "SpecDecoding metrics: Mean acceptance length: {mean_len:.2}, Accepted throughput: \
         {accepted_tp:.2} tokens/s, Drafted throughput: {drafted_tp:.2} tokens/s, Accepted: {} \
         tokens, Drafted: {} tokens, Per-position acceptance rate: {}, Avg Draft acceptance \
         rate: {avg_rate:.1}%",
        d.spec_accepted_tokens,
        d.spec_draft_tokens,
        rates_text.join(", ")
    );
    let fields = vec![
        ("event", "spec_decode".into()),
        ("engine", 0.into()),
        ("interval_s", secs.into()),
        ("num_drafts", d.spec_drafts.into()),
        ("accepted_tokens", d.spec_accepted_tokens.into()),
        ("drafted_tokens", d.spec_draft_tokens.into()),
        ("mean_acceptance_length", mean_len.into()),
        ("accepted_throughput", accepted_tp.into()),
        ("drafted_throughput", drafted_tp.into()),
        ("per_position_acceptance_rate", rates.into()),
        ("draft_acceptance_rate_pct", avg_rate.into()),
    ];
    Some((msg, fields))
}

impl StatsLogger {
    /// Starts counting from `stats` at `now`.
    pub fn new(stats: &EngineStats, now: Instant) -> Self {
        StatsLogger {
            last: Counters::of(stats),
            last_at: now,
            last_busy: false,
            hit_rate: 0.0,
        }
    }

    /// Writes the line of the interval that ends with `stats` at `now`.
    pub fn tick(&mut self, stats: &EngineStats, now: Instant) {
        let line = self.line(stats, now);
        line.write(line.level);
    }

    /// The last line, at shutdown: written only when the interval had
    /// tokens.
    pub fn finish(&mut self, stats: &EngineStats, now: Instant) {
        let line = self.line(stats, now);
        // `line` left `last_busy` saying whether this interval had tokens.
        if self.last_busy {
            line.write(Level::Info);
        }
    }

    fn line(&mut self, stats: &EngineStats, now: Instant) -> Line {
        let counters = Counters::of(stats);
        let d = counters.since(&self.last);
        let secs = now.duration_since(self.last_at).as_secs_f64().max(1e-9);
        let prompt_tp = d.prompt_tokens as f64 / secs;
        let gen_tp = d.generation_tokens as f64 / secs;
        let busy = d.prompt_tokens > 0 || d.generation_tokens > 0;
        let level = if busy || self.last_busy {
            Level::Info
        } else {
            Level::Debug
        };
        let spec = spec_line(&d, secs);
        if d.prefix_cache_queries > 0 {
            self.hit_rate = 100.0 * d.prefix_cache_hits as f64 / d.prefix_cache_queries as f64;
        }
        self.last = counters;
        self.last_at = now;
        self.last_busy = busy;
        let kv = 100.0 * stats.kv_cache_usage;
        let msg = format!(
            "Engine 000: Avg prompt throughput: {prompt_tp:.1} tokens/s, Avg generation \
             throughput: {gen_tp:.1} tokens/s, Running: {} reqs, Waiting: {} reqs, KV cache \
             usage: {kv:.1}%, Prefix cache hit rate: {:.1}%, Preempted: {} reqs",
            stats.num_running_reqs, stats.num_waiting_reqs, self.hit_rate, d.num_preemptions
        );
        let fields = vec![
            ("event", "stats".into()),
            ("engine", 0.into()),
            ("interval_s", secs.into()),
            ("prompt_tokens", d.prompt_tokens.into()),
            ("generation_tokens", d.generation_tokens.into()),
            ("prompt_throughput", prompt_tp.into()),
            ("generation_throughput", gen_tp.into()),
            ("running", stats.num_running_reqs.into()),
            ("waiting", stats.num_waiting_reqs.into()),
            ("kv_cache_usage_pct", kv.into()),
            ("prefix_cache_hit_rate_pct", self.hit_rate.into()),
            ("preempted", d.num_preemptions.into()),
        ];
        Line {
            level,
            msg,
            fields,
            spec,
        }
    }
}

/// Writes a line every `interval` until `stop` resolves (or its sender is
/// dropped), then the last one.
pub async fn run(engine: Engine, interval: Duration, stop: tokio::sync::oneshot::Receiver<()>) {
    let mut logger = StatsLogger::new(&engine.stats(), Instant::now());
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticks.tick() => logger.tick(&engine.stats(), Instant::now()),
            _ = &mut stop => {
                logger.finish(&engine.stats(), Instant::now());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(prompt: u64, generation: u64, queries: u64, hits: u64) -> EngineStats {
        EngineStats {
            prompt_tokens: prompt,
            generation_tokens: generation,
            prefix_cache_queries: queries,
            prefix_cache_hits: hits,
            num_running_reqs: 2,
            kv_cache_usage: 0.031,
            ..EngineStats::default()
        }
    }

    #[test]
    fn throughput_is_the_interval_difference_over_its_seconds() {
        let t0 = Instant::now();
        let mut l = StatsLogger::new(&stats(10, 0, 0, 0), t0);
        let line = l.line(&stats(30, 50, 20, 10), t0 + Duration::from_secs(2));
        assert_eq!(line.level, Level::Info);
        assert_eq!(
            line.msg,
            "Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: \
             25.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, KV cache usage: 3.1%, Prefix \
             cache hit rate: 50.0%, Preempted: 0 reqs"
        );
        let field = |k: &str| line.fields.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(field("generation_tokens"), 50);
        // The next interval is idle: still at info (it shows the drop),
        // and the hit rate stays; the one after is at debug.
        let idle = l.line(&stats(30, 50, 20, 10), t0 + Duration::from_secs(4));
        assert_eq!(idle.level, Level::Info);
        assert!(
            idle.msg.contains("Prefix cache hit rate: 50.0%"),
            "{}",
            idle.msg
        );
        let idle = l.line(&stats(30, 50, 20, 10), t0 + Duration::from_secs(6));
        assert_eq!(idle.level, Level::Debug);
        assert!(idle.spec.is_none());
    }

    #[test]
    fn the_spec_decode_line_covers_the_intervals_drafts() {
        let t0 = Instant::now();
        let mut before = stats(0, 0, 0, 0);
        before.spec_decode_num_drafts = 10;
        before.spec_decode_num_draft_tokens = 30;
        before.spec_decode_num_accepted_tokens = 20;
        before.spec_decode_accepted_per_pos = vec![9, 7, 4];
        let mut l = StatsLogger::new(&before, t0);
        let mut after = stats(0, 40, 0, 0);
        after.spec_decode_num_drafts = 20;
        after.spec_decode_num_draft_tokens = 60;
        after.spec_decode_num_accepted_tokens = 35;
        after.spec_decode_accepted_per_pos = vec![17, 12, 6];
        let line = l.line(&after, t0 + Duration::from_secs(2));
        let (msg, _) = line.spec.expect("a spec decode line");
        assert_eq!(
            msg,
            "SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: 7.50 \
             tokens/s, Drafted throughput: 15.00 tokens/s, Accepted: 15 tokens, Drafted: 30 \
             tokens, Per-position acceptance rate: 0.800, 0.500, 0.200, Avg Draft acceptance \
             rate: 50.0%"
        );
    }
}
