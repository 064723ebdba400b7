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

mod output;
mod preemption;
mod running;
mod waiting;

use crate::kv_cache::ComputedBlocks;
use crate::kv_cache::FreshBlocks;
use crate::output::SchedulerOutput;
use crate::request::TokenId;
use crate::scheduler::{PauseState, Scheduler};
use std::collections::VecDeque;

/// Per-step working lists, kept between steps so a step allocates nothing
/// but its output.
#[derive(Debug, Default)]
pub(crate) struct StepScratch {
    /// (slot, tokens) in scheduling order.
    scheduled: Vec<(u32, usize)>,
    /// (slot, fresh blocks per group) of scheduled running requests.
    running_scheduled: Vec<(u32, FreshBlocks)>,
    new_reqs: Vec<u32>,
    resumed_reqs: Vec<u32>,
    hit_blocks: ComputedBlocks,
    skipped: VecDeque<u32>,
    spec: Vec<(u32, Vec<TokenId>)>,
    /// A running request continuing its prefill was scheduled this step
    /// (vLLM's `prefill_scheduled`): no placeholder padding then.
    prefill_scheduled: bool,
}

/// What is left of a step's budgets, and the per-step limits every pass
/// applies.
#[derive(Debug)]
struct Budget {
    /// Tokens still schedulable this step.
    token: usize,
    /// Input positions still free (tokens plus draft slots).
    input: usize,
    /// Input slots each scheduled request reserves for drafting.
    draft_slots: usize,
    /// The long-prefill cap (0 = off).
    threshold: usize,
    lookahead: usize,
    max_model_len: usize,
}

impl Budget {
    fn for_step(sched: &Scheduler) -> Budget {
        let cfg = &sched.config;
        let token = if sched.pause_state == PauseState::PausedAll {
            0
        } else {
            cfg.max_num_scheduled_tokens()
        };
        // The threshold protects other requests from one long prefill; with
        // a single request at step start there is nobody to protect.
        let threshold = if sched.running.len() + sched.waiting.len() > 1 {
            cfg.long_prefill_token_threshold
        } else {
            0
        };
        Budget {
            token,
            input: cfg.max_num_batched_tokens,
            draft_slots: cfg.num_draft_slots,
            threshold,
            lookahead: cfg.num_lookahead_tokens,
            max_model_len: cfg.max_model_len,
        }
    }
}

impl Scheduler {
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut s = std::mem::take(&mut self.scratch);
        s.scheduled.clear();
        s.running_scheduled.clear();
        s.new_reqs.clear();
        s.resumed_reqs.clear();
        s.spec.clear();
        s.prefill_scheduled = false;
        let mut budget = Budget::for_step(self);
        let preempted_before = self.preempted_req_ids.len();

        // 1. Running requests.
        self.schedule_running(&mut s, &mut budget);

        // 2. Waiting requests, only if nobody was preempted this step.
        let preempted_this_step = self.preempted_req_ids.len() > preempted_before;
        if !preempted_this_step && self.pause_state == PauseState::Unpaused {
            self.schedule_waiting(&mut s, &mut budget);
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
}
