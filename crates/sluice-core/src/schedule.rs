//! `Scheduler::schedule()`: one step's decision.
//!
//! 1. Running requests, in running order, each get as many tokens as they
//!    lack (capped by the long-prefill threshold, the token budget and
//!    `max_model_len`). Their KV is allocated now; when the pool is short, a
//!    victim is preempted (FCFS: the running tail; priority: the largest
//!    (priority, arrival)) until the allocation fits or the request itself is
//!    the victim.
//! 2. Only in a step that preempted nobody, waiting requests are admitted in
//!    queue order while budget, `max_num_seqs` and KV allow: a prefix-cache
//!    lookup, the full-sequence admission gate, then their first chunk. Any
//!    failure to fit ends the loop (head-of-line blocking); waiting never
//!    preempts.
//! 3. The output is built, then every scheduled request's
//!    `num_computed_tokens` advances optimistically by its tokens.

use crate::kv_cache::{ComputedBlocks, SlotRequest};
use crate::output::{
    CachedRequestData, NewRequestData, ReqHandle, ScheduledRequest, SchedulerOutput,
};
use crate::request::{RequestStatus, TokenId};
use crate::scheduler::{PauseState, Scheduler};
use std::collections::VecDeque;

/// Per-step working lists, kept between steps so a step allocates nothing
/// but its output.
#[derive(Debug, Default)]
pub(crate) struct StepScratch {
    /// (slot, tokens) in scheduling order.
    scheduled: Vec<(u32, usize)>,
    /// (slot, fresh blocks) of scheduled running requests.
    running_scheduled: Vec<(u32, usize)>,
    new_reqs: Vec<u32>,
    resumed_reqs: Vec<u32>,
    hit_blocks: ComputedBlocks,
    skipped: VecDeque<u32>,
    spec: Vec<(u32, Vec<TokenId>)>,
}

impl Scheduler {
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut s = std::mem::take(&mut self.scratch);
        s.scheduled.clear();
        s.running_scheduled.clear();
        s.new_reqs.clear();
        s.resumed_reqs.clear();
        s.spec.clear();

        let cfg = &self.config;
        let max_model_len = cfg.max_model_len;
        let lookahead = cfg.num_lookahead_tokens;
        let mut token_budget = cfg.max_num_scheduled_tokens();
        let mut input_budget = cfg.max_num_batched_tokens;
        // Input slots each scheduled request reserves for drafting.
        let draft_slots = cfg.num_draft_slots;
        if self.pause_state == PauseState::PausedAll {
            token_budget = 0;
        }
        // The threshold protects other requests from one long prefill; with a
        // single request at step start there is nobody to protect.
        let threshold = if self.running.len() + self.waiting.len() > 1 {
            cfg.long_prefill_token_threshold
        } else {
            0
        };
        let preempted_before = self.preempted_req_ids.len();

        // 1. Running requests.
        let mut i = 0;
        while i < self.running.len() && token_budget > 0 {
            if input_budget <= draft_slots {
                break;
            }
            let slot = self.running[i];
            let req = self.slots[slot as usize].req.as_ref().expect("live slot");
            let mut n = req.num_tokens_with_spec() - req.num_computed_tokens;
            if threshold > 0 && threshold < n {
                n = threshold;
            }
            n = n.min(token_budget).min(input_budget - draft_slots);
            // One position stays free for the token this step samples.
            n = n.min(max_model_len.saturating_sub(req.num_computed_tokens + 1));
            if n == 0 {
                i += 1;
                continue;
            }

            let new_blocks = loop {
                let req = self.slots[slot as usize].req.as_ref().expect("live slot");
                let request = SlotRequest {
                    num_new_tokens: n,
                    num_lookahead_tokens: lookahead,
                    has_scheduled_reqs: true,
                    ..SlotRequest::default()
                };
                if let Some(k) = self.kv.allocate_slots(slot as usize, req, request) {
                    break Some(k);
                }
                let vi = {
                    let slots = &self.slots;
                    let req = |slot: u32| slots[slot as usize].req.as_ref().expect("live slot");
                    self.policy.preemption_victim(&self.running, &req)
                };
                let victim = self.running.remove(vi);
                if vi < i {
                    i -= 1;
                }
                // Undo the victim's scheduling earlier in this step (never
                // under FCFS: its victim is the tail, not reached yet).
                if let Some(pos) = s.running_scheduled.iter().position(|&(v, _)| v == victim) {
                    s.running_scheduled.remove(pos);
                    let pos = s.scheduled.iter().position(|&(v, _)| v == victim);
                    let (_, restored) = s.scheduled.remove(pos.expect("scheduled entry"));
                    token_budget += restored;
                    input_budget += restored + draft_slots;
                    s.spec.retain(|(v, _)| *v != victim);
                }
                self.preempt(victim);
                if victim == slot {
                    break None;
                }
            };

            let Some(k) = new_blocks else {
                // It was the victim and preempted itself; `i` already points
                // at the next one (under FCFS there is none: it was the
                // tail), which may fit now.
                continue;
            };
            s.running_scheduled.push((slot, k));
            s.scheduled.push((slot, n));
            token_budget -= n;
            input_budget -= n + draft_slots;
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

        // 2. Waiting requests, only if nobody was preempted this step.
        let preempted_this_step = self.preempted_req_ids.len() > preempted_before;
        if !preempted_this_step && self.pause_state == PauseState::Unpaused {
            s.skipped.clear();
            while token_budget > 0 {
                if self.waiting.is_empty() || input_budget <= draft_slots {
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

                let cap = token_budget.min(input_budget - draft_slots);
                // num_tokens, not the prompt: a resumed request recomputes its
                // outputs too.
                let mut n = req.num_tokens() - computed;
                if threshold > 0 && threshold < n {
                    n = threshold;
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
                    new_computed_blocks: (!s.hit_blocks.is_empty()).then_some(&s.hit_blocks),
                    num_lookahead_tokens: lookahead,
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
                token_budget -= n;
                input_budget -= n + draft_slots;
            }
            // Skipped requests go back to the head in their original order.
            while let Some(slot) = s.skipped.pop_front() {
                let req = self.slots[slot as usize].req.as_ref().expect("live slot");
                self.waiting.prepend(slot, req);
            }
        }

        debug_assert!(self.running.len() <= self.config.max_num_seqs);
        let output = self.build_output(&s);
        if output.total_num_scheduled_tokens > 0 {
            self.num_executed_steps += 1;
        }

        // 3. Advance progress optimistically: the next step may schedule the
        // rest of a chunked prefill before this one's output is processed.
        for &(slot, n) in &s.scheduled {
            let req = self.req_mut(slot);
            req.num_computed_tokens += n;
            req.is_prefill_chunk = req.num_computed_tokens < req.num_tokens();
        }
        self.scratch = s;
        output
    }

    fn build_output(&mut self, s: &StepScratch) -> SchedulerOutput {
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
                    block_ids: self.kv.block_ids(slot as usize).to_vec(),
                    num_computed_tokens: req.num_computed_tokens,
                }
            })
            .collect();

        let mut cached = CachedRequestData::default();
        cached.reserve(s.running_scheduled.len() + s.resumed_reqs.len());
        for &(slot, fresh) in &s.running_scheduled {
            let req = self.req(slot);
            let table = self.kv.block_ids(slot as usize);
            cached.push(
                req.id.clone(),
                false,
                req.num_computed_tokens,
                req.num_output_tokens(),
                &table[table.len() - fresh..],
                None,
            );
        }
        for &slot in &s.resumed_reqs {
            let req = self.req(slot);
            cached.push(
                req.id.clone(),
                true,
                req.num_computed_tokens,
                req.num_output_tokens(),
                self.kv.block_ids(slot as usize),
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
