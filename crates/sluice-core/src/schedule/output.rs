//! The `SchedulerOutput` of a step: full data for new requests, deltas for
//! running ones (their fresh blocks), the whole table for resumed ones,
//! draft tokens to verify, and the ids preempted and finished since the
//! last step.

use super::StepScratch;
use crate::kv_cache::GroupId;
use crate::output::{
    CachedRequestData, NewRequestData, ReqHandle, ScheduledRequest, SchedulerOutput,
};
use crate::scheduler::Scheduler;

impl Scheduler {
    pub(super) fn build_output(&mut self, s: &StepScratch) -> SchedulerOutput {
        let handle = |sched: &Scheduler, slot: u32| ReqHandle {
            slot,
            generation: sched.slots[slot as usize].generation,
        };
        let scheduled: Vec<ScheduledRequest> = s
            .scheduled
            .iter()
            .map(|&(slot, n)| ScheduledRequest {
                req_id: self.req(slot).id.clone(),
                handle: handle(self, slot),
                num_tokens: n,
            })
            .collect();
        let total = s.scheduled.iter().map(|&(_, n)| n).sum();

        let new_reqs = s
            .new_reqs
            .iter()
            .map(|&slot| {
                let req = self.req(slot);
                NewRequestData {
                    req_id: req.id.clone(),
                    prompt_token_ids: req.prompt_token_ids().to_vec(),
                    sampling_params: req.sampling_params.clone(),
                    block_ids: (0..self.kv.num_groups())
                        .map(|g| {
                            self.kv
                                .group_block_ids(GroupId(g as u32), slot as usize)
                                .to_vec()
                        })
                        .collect(),
                    num_computed_tokens: req.num_computed_tokens,
                }
            })
            .collect();

        let mut cached = CachedRequestData::default();
        cached.reserve(s.running_scheduled.len() + s.resumed_reqs.len());
        let kv = &self.kv;
        for (slot, fresh) in &s.running_scheduled {
            let req = self.req(*slot);
            let tails = fresh.iter().enumerate().map(|(g, &n)| {
                let table = kv.group_block_ids(GroupId(g as u32), *slot as usize);
                &table[table.len() - n..]
            });
            cached.push(
                req.id.clone(),
                false,
                req.num_computed_tokens,
                req.num_output_tokens(),
                tails,
                None,
            );
        }
        for &slot in &s.resumed_reqs {
            let req = self.req(slot);
            let tables =
                (0..kv.num_groups()).map(|g| kv.group_block_ids(GroupId(g as u32), slot as usize));
            cached.push(
                req.id.clone(),
                true,
                req.num_computed_tokens,
                req.num_output_tokens(),
                tables,
                Some(req.all_token_ids.clone()),
            );
        }

        let spec = s
            .spec
            .iter()
            .map(|(slot, drafts)| (self.req(*slot).id.clone(), drafts.clone()))
            .collect();

        SchedulerOutput {
            scheduled_new_reqs: new_reqs,
            scheduled_cached_reqs: cached,
            num_scheduled_tokens: scheduled,
            total_num_scheduled_tokens: total,
            scheduled_spec_decode_tokens: spec,
            preempted_req_ids: std::mem::take(&mut self.preempted_req_ids),
            finished_req_ids: std::mem::take(&mut self.finished_req_ids),
            grammar_bitmask: None,
        }
    }
}
