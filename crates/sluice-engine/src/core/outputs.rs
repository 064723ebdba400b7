//! Each step's `EngineCoreOutput`s to their callers' streams: a
//! completion's new tokens go through its grammar, its detokenizer and its
//! stop strings, gather their logprobs (and the prompt's, on the first
//! output), and are sent as one `RequestOutput`; a completion that ended
//! is finished here, and a caller that left or stopped reading is aborted.

use super::EngineCore;
use crate::request::{Finished, RequestOutput, StopReason};
use crate::stream::output_cost;
use sluice_core::{
    EngineCoreOutput, FinishReason, ModelRunnerOutput, SampleLogprobs, SchedulerOutput,
    StopReason as CoreStopReason,
};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl EngineCore {
    pub(super) fn collect_prompt_logprobs(&mut self, runner_out: &ModelRunnerOutput) {
        for pl in &runner_out.prompt_logprobs {
            if let Some(child) = self.children.get_mut(&pl.req_id) {
                let want = child.num_prompt_tokens.saturating_sub(1);
                if let Some(acc) = child.prompt_logprobs.as_mut() {
                    // A recompute after preemption reports them again.
                    let room = want.saturating_sub(acc.len());
                    acc.extend(pl.positions.iter().take(room).cloned());
                }
            }
        }
    }

    /// Sends one request's step output; finishes it if it ended.
    pub(super) fn route(
        &mut self,
        _sched_out: &SchedulerOutput,
        runner_out: &ModelRunnerOutput,
        out: EngineCoreOutput,
    ) {
        if !self.advance_grammar(&out) {
            return;
        }
        let Some(child) = self.children.get_mut(&out.req_id) else {
            return;
        };
        let now = Instant::now();
        let scheduler_finished = out.finish_reason.is_some();
        let stop_terminated = out.finish_reason == Some(FinishReason::Stop);
        let step = child.text.update(
            &self.tokenizer,
            &out.new_token_ids,
            stop_terminated,
            scheduler_finished,
        );
        let kept = step.num_kept_tokens;
        child.num_cached_tokens = child.num_cached_tokens.max(out.num_cached_tokens);
        if kept > 0 {
            match child.last_token {
                None => {
                    child.first_token = Some(now);
                    self.stats.record_first_token(
                        now.saturating_duration_since(child.arrival).as_secs_f64(),
                        child.num_prompt_tokens,
                        child.num_cached_tokens,
                    );
                }
                Some(last) => self
                    .stats
                    .record_inter_token(now.saturating_duration_since(last).as_secs_f64()),
            }
            child.last_token = Some(now);
            self.stats.record_generation_tokens(kept);
        }
        child.num_output_tokens += kept;
        let logprobs: Vec<SampleLogprobs> = runner_out
            .sample_logprobs(out.index)
            .map(|lps| lps.iter().take(kept).flatten().cloned().collect())
            .unwrap_or_default();
        let finished = if let Some(stop) = step.stop_string {
            Some((FinishReason::Stop, Some(StopReason::String(stop))))
        } else {
            out.finish_reason.map(|reason| {
                let stop_reason = match out.stop_reason {
                    Some(CoreStopReason::Token(t)) => Some(StopReason::Token(t)),
                    _ => None,
                };
                (reason, stop_reason)
            })
        };
        let prompt_logprobs = if child.last_token.is_some() || finished.is_some() {
            child.prompt_logprobs.take()
        } else {
            None
        };
        let output = RequestOutput {
            index: child.index,
            token_ids: out.new_token_ids[..kept].to_vec(),
            text: step.text,
            logprobs,
            prompt_logprobs,
            finished: finished.as_ref().map(|(reason, stop_reason)| Finished {
                reason: *reason,
                stop_reason: stop_reason.clone(),
                num_output_tokens: child.num_output_tokens,
                num_cached_tokens: child.num_cached_tokens,
                error: None,
            }),
        };
        let parent_seq = child.parent;
        let cost = output_cost(&output);
        let limit = self.shared.config.limits.max_stream_buffer_bytes;
        let (delivered, overflowed) = match self.parents.get(&parent_seq) {
            Some(p) => {
                let sent = p.sender.send(output).is_ok();
                let buffered = p.buffered.fetch_add(cost, Ordering::AcqRel) + cost;
                (sent, sent && buffered > limit)
            }
            None => (false, false),
        };
        if let Some((reason, _)) = finished {
            self.finish_child(&out.req_id, reason);
        }
        if !delivered {
            // The caller is gone (its stream's abort is on its way too).
            self.abort_parent(parent_seq, FinishReason::Abort, None);
        } else if overflowed && self.parents.contains_key(&parent_seq) {
            // The caller stopped reading: generating on would only grow
            // memory, and its blocks serve others better.
            if let Some(p) = self.parents.get(&parent_seq) {
                eprintln!(
                    "sluice: aborting request {}: its client has not read {limit} bytes of \
                     output (--max-stream-buffer-bytes)",
                    p.request_id
                );
            }
            self.abort_parent(parent_seq, FinishReason::Abort, None);
        }
    }
}
