//! `Scheduler::update_from_output()`: apply what the model produced.
//!
//! For each scheduled request, in scheduling order: correct
//! `num_computed_tokens` for rejected draft tokens, append the sampled tokens
//! one by one and run the stop check after each, and free a request that
//! stopped at once (its blocks return to the pool in this order, which fixes
//! the block ids later requests receive).

use crate::output::{EngineCoreOutput, ModelRunnerOutput, SchedulerOutput, TokenVec};
use crate::request::RequestStatus;
use crate::scheduler::Scheduler;

impl Scheduler {
    /// Applies one step's model output. Returns an output for every request
    /// that got tokens or finished. Requests finished or aborted since the
    /// step was scheduled are skipped.
    pub fn update_from_output(
        &mut self,
        sched_out: &SchedulerOutput,
        runner_out: &ModelRunnerOutput,
    ) -> Vec<EngineCoreOutput> {
        let mut outputs = Vec::with_capacity(sched_out.num_scheduled_tokens.len());
        let mut stopped_running = 0usize;
        let max_model_len = self.config.max_model_len;

        for (index, sched) in sched_out.num_scheduled_tokens.iter().enumerate() {
            let slot = sched.handle.slot;
            let Some(entry) = self.slots.get_mut(slot as usize) else {
                continue;
            };
            if entry.generation != sched.handle.generation {
                continue;
            }
            let Some(req) = entry.req.as_mut() else {
                continue;
            };
            if req.is_finished() {
                continue;
            }
            let sampled = runner_out.sampled(index);

            let spec = if sched_out.scheduled_spec_decode_tokens.is_empty() {
                None
            } else {
                sched_out
                    .scheduled_spec_decode_tokens
                    .iter()
                    .find(|(id, _)| *id == sched.req_id)
            };
            if let Some((_, drafts)) = spec {
                if !sampled.is_empty() {
                    let accepted = sampled.len() - 1;
                    let rejected = drafts.len().saturating_sub(accepted);
                    if req.num_computed_tokens > 0 {
                        req.num_computed_tokens -= rejected;
                    }
                }
            }

            let status_before = req.status;
            let mut new_tokens = TokenVec::new();
            let mut stopped = false;
            let hasher = self.kv.hasher();
            for (j, &token) in sampled.iter().enumerate() {
                req.append_output_token(token, hasher);
                new_tokens.push(token);
                if req.check_stop(max_model_len) {
                    // Computed covers every new token but the last one; keep
                    // that true for the tokens dropped after the stop.
                    req.num_computed_tokens -= sampled.len() - (j + 1);
                    stopped = true;
                    break;
                }
            }
            // As vLLM, with speculative decoding on, the blocks the accepted
            // tokens filled are cached now (scheduling cached only up to the
            // tokens known then).
            let speculative = spec.is_some() || self.config.num_speculative_tokens > 0;
            if speculative && !sampled.is_empty() && status_before == RequestStatus::Running {
                let computed = req.num_computed_tokens;
                let req = self.slots[slot as usize].req.as_ref().expect("live slot");
                self.kv.cache_blocks(slot as usize, req, computed);
            }

            if !stopped && new_tokens.is_empty() {
                continue;
            }
            let req = self.slots[slot as usize].req.as_ref().expect("live slot");
            let finish_reason = if stopped {
                req.status.finish_reason()
            } else {
                None
            };
            outputs.push(EngineCoreOutput {
                req_id: sched.req_id.clone(),
                index,
                new_token_ids: new_tokens,
                finish_reason,
                stop_reason: req.stop_reason,
                num_cached_tokens: req.num_cached_tokens.unwrap_or(0),
            });
            if stopped {
                if status_before == RequestStatus::Running {
                    stopped_running += 1;
                }
                self.free_request(slot);
            }
        }

        if stopped_running > 0 {
            let slots = &self.slots;
            self.running.retain(|&s| slots[s as usize].req.is_some());
        }
        outputs
    }
}
