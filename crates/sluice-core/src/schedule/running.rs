//! The running pass of `schedule()`: requests already running, in running
//! order, each get as many tokens as they lack (capped by the long-prefill
//! threshold, the budgets and `max_model_len`), their KV allocated now;
//! scheduled drafts are cut to the tokens that fit.

use super::{Budget, StepScratch};
use crate::scheduler::Scheduler;

impl Scheduler {
    pub(super) fn schedule_running(&mut self, s: &mut StepScratch, b: &mut Budget) {
        let mut i = 0;
        while i < self.running.len() && b.token > 0 {
            if b.input <= b.draft_slots {
                break;
            }
            let slot = self.running[i];
            let req = self.slots[slot as usize].req.as_ref().expect("live slot");
            let mut n = req.num_tokens_with_spec() - req.num_computed_tokens;
            if b.threshold > 0 && b.threshold < n {
                n = b.threshold;
            }
            n = n.min(b.token).min(b.input - b.draft_slots);
            // One position stays free for the token this step samples.
            n = n.min(b.max_model_len.saturating_sub(req.num_computed_tokens + 1));
            if n == 0 {
                i += 1;
                continue;
            }

            let Some(k) = self.allocate_or_preempt(s, b, slot, n, &mut i) else {
                // It was the victim and preempted itself; `i` already points
                // at the next one (under FCFS there is none: it was the
                // tail), which may fit now.
                continue;
            };
            s.running_scheduled.push((slot, k));
            s.prefill_scheduled |= self.slots[slot as usize]
                .req
                .as_ref()
                .is_some_and(|r| r.is_prefill_chunk);
            s.scheduled.push((slot, n));
            b.token -= n;
            b.input -= n + b.draft_slots;
            i += 1;
            let req = self.req_mut(slot);
            if !req.spec_token_ids.is_empty() {
                let k = (n + req.num_computed_tokens).saturating_sub(req.num_tokens());
                let mut drafts = std::mem::take(&mut req.spec_token_ids);
                if k > 0 {
                    drafts.truncate(k);
                    s.spec.push((slot, drafts));
                }
            }
        }
    }
}
