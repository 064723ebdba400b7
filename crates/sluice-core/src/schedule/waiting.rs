//! The waiting pass of `schedule()`, run only in a step that preempted
//! nobody: waiting requests are admitted in the policy's queue order while
//! the budgets, `max_num_seqs` and the KV pool allow — a prefix-cache
//! lookup, the full-sequence admission gate, then their first chunk (or,
//! with speculative decoding, one token padded with placeholder drafts). Any
//! failure to fit ends the pass (head-of-line blocking); waiting never
//! preempts.

use super::{Budget, StepScratch};
use crate::kv_cache::SlotRequest;
use crate::output::PLACEHOLDER_TOKEN_ID;
use crate::request::RequestStatus;
use crate::scheduler::Scheduler;

impl Scheduler {
    pub(super) fn schedule_waiting(&mut self, s: &mut StepScratch, b: &mut Budget) {
        s.skipped.clear();
        while b.token > 0 {
            if self.waiting.is_empty() || b.input <= b.draft_slots {
                break;
            }
            if self.running.len() >= self.config.max_num_seqs {
                break;
            }
            let slot = self.waiting.peek().expect("waiting is not empty");
            let req = self.slots[slot as usize].req.as_ref().expect("live slot");
            if req.status.is_blocked() {
                // Skip it this step; it returns to the head afterwards.
                self.waiting.pop();
                self.deferred_waiting.insert(slot);
                s.skipped.push_front(slot);
                continue;
            }

            let lookup = req.num_computed_tokens == 0;
            let hit = if lookup {
                self.kv.get_computed_blocks(req, &mut s.hit_blocks)
            } else {
                s.hit_blocks.clear();
                0
            };
            // KV loaded from outside (P/D disaggregation) extends the
            // hit, leaving at least the last token to compute.
            let external = if lookup {
                req.num_external_computed_tokens
                    .saturating_sub(hit)
                    .min(req.num_tokens().saturating_sub(hit + 1))
            } else {
                0
            };
            let computed = if lookup {
                hit + external
            } else {
                req.num_computed_tokens
            };
            let first_admission = req.num_preemptions == 0;

            let cap = b.token.min(b.input - b.draft_slots);
            // num_tokens, not the prompt: a resumed request recomputes its
            // outputs too.
            let mut n = req.num_tokens() - computed;
            // vLLM pads a request with one token left (all but its last
            // token found in the prefix cache) to a decode step's uniform
            // 1 + k rows, when no running prefill shares the step, something
            // else runs in it or the request has computed tokens, and there
            // is room for the padded rows plus the sampled token.
            let k = self.config.num_speculative_tokens;
            let mut pad = false;
            if self.config.pad_spec_decode
                && k > 0
                && n == 1
                && !s.prefill_scheduled
                && (!s.running_scheduled.is_empty() || computed > 0)
                && computed + 1 + k < self.config.max_model_len
            {
                if 1 + k > cap {
                    // vLLM would rather not schedule it than unpadded.
                    break;
                }
                n = 1 + k;
                pad = true;
            }
            if b.threshold > 0 && b.threshold < n {
                n = b.threshold;
            }
            if !self.config.enable_chunked_prefill && n > cap {
                break;
            }
            n = n.min(cap);
            debug_assert!(n > 0);

            let has_scheduled = !self.running.is_empty();
            let request = SlotRequest {
                num_new_tokens: external + n,
                num_new_computed_tokens: hit,
                new_computed_blocks: lookup.then_some(&s.hit_blocks),
                num_lookahead_tokens: b.lookahead,
                full_sequence_must_fit: self.config.reserve_full_sequence,
                has_scheduled_reqs: has_scheduled,
            };
            let Some(_) = self.kv.allocate_slots(slot as usize, req, request) else {
                break;
            };
            if lookup {
                self.kv.record_prefix_cache_stats(req, hit);
            }

            self.waiting.pop();
            self.deferred_waiting.remove(&slot);
            self.running.push(slot);
            let req = self.req_mut(slot);
            match req.status {
                RequestStatus::Waiting => s.new_reqs.push(slot),
                RequestStatus::Preempted => s.resumed_reqs.push(slot),
                other => unreachable!("admitting a request in status {other:?}"),
            }
            if first_admission && lookup {
                req.num_cached_tokens = Some(hit);
            }
            req.status = RequestStatus::Running;
            req.num_computed_tokens = computed;
            req.num_external_computed_tokens = 0;
            s.scheduled.push((slot, n));
            if pad && n > 1 {
                s.spec.push((slot, vec![PLACEHOLDER_TOKEN_ID; n - 1]));
            }
            b.token -= n;
            b.input -= n + b.draft_slots;
        }
        // Skipped requests go back to the head in their original order.
        while let Some(slot) = s.skipped.pop_front() {
            let req = self.slots[slot as usize].req.as_ref().expect("live slot");
            self.waiting.prepend(slot, req);
        }
    }
}
