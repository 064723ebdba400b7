//! Preemption within the running pass: when the pool cannot hold a running
//! request's next tokens, the policy's victim is preempted (its scheduling
//! earlier in this step undone) until the allocation fits or the request
//! itself was the victim.

use super::{Budget, StepScratch};
use crate::kv_cache::{FreshBlocks, SlotRequest};
use crate::scheduler::Scheduler;

impl Scheduler {
    /// Room for `n` more tokens of the running request in `slot`, at index
    /// `*i` of `running` (moved back when a victim before it leaves).
    /// Returns its fresh blocks, or `None` when it was preempted itself.
    pub(super) fn allocate_or_preempt(
        &mut self,
        s: &mut StepScratch,
        b: &mut Budget,
        slot: u32,
        n: usize,
        i: &mut usize,
    ) -> Option<FreshBlocks> {
        loop {
            let req = self.slots[slot as usize].req.as_ref().expect("live slot");
            let request = SlotRequest {
                num_new_tokens: n,
                num_lookahead_tokens: b.lookahead,
                has_scheduled_reqs: true,
                ..SlotRequest::default()
            };
            if let Some(k) = self.kv.allocate_slots(slot as usize, req, request) {
                return Some(k);
            }
            let vi = {
                let slots = &self.slots;
                let req = |slot: u32| slots[slot as usize].req.as_ref().expect("live slot");
                self.policy.preemption_victim(&self.running, &req)
            };
            let victim = self.running.remove(vi);
            if vi < *i {
                *i -= 1;
            }
            // Undo the victim's scheduling earlier in this step (never under
            // FCFS: its victim is the tail, not reached yet).
            if let Some(pos) = s.running_scheduled.iter().position(|(v, _)| *v == victim) {
                s.running_scheduled.remove(pos);
                let pos = s.scheduled.iter().position(|&(v, _)| v == victim);
                let (_, restored) = s.scheduled.remove(pos.expect("scheduled entry"));
                b.token += restored;
                b.input += restored + b.draft_slots;
                s.spec.retain(|(v, _)| *v != victim);
            }
            self.preempt(victim);
            if victim == slot {
                return None;
            }
        }
    }
}
