//! The scheduler: request bookkeeping around `schedule()` and
//! `update_from_output()` (in `schedule/` and `update.rs`).
//!
//! Requests live in slots addressed by `u32`, so the per-step loops index
//! arrays instead of hashing ids; `ids` maps caller ids to slots for the
//! calls that arrive by id (add, abort, lookups). Every live request is in
//! exactly one of `running` and `waiting`; finished requests are freed at
//! once and reported to the runner in the next `SchedulerOutput`.
//!
//! Not modelled (vLLM features without a counterpart here): KV connectors and
//! `kv_holding_waiting` (always empty without them), streaming-input sessions,
//! LoRA, multimodal encoder inputs, async scheduling.

use crate::block_hash::BlockHasher;
use crate::config::{ConfigError, SchedulerConfig};
use crate::error::FieldError;
use crate::kv_cache::KvCacheManager;
use crate::output::ReqHandle;
use crate::policy::{self, Policy, WaitingQueue};
use crate::request::{BlockId, NewRequest, Request, RequestId, RequestStatus, TokenId};
use crate::stats::SchedulerStats;
use std::collections::{HashMap, HashSet};

/// Whether new and running requests are being scheduled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PauseState {
    #[default]
    Unpaused,
    /// Running requests continue; nothing new is admitted.
    PausedNew,
    /// Nothing is scheduled at all.
    PausedAll,
}

/// Why `add_request` refused a request; `field` names the offending input.
pub type AddRequestError = FieldError;

#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) generation: u32,
    pub(crate) req: Option<Request>,
}

pub struct Scheduler {
    pub(crate) config: SchedulerConfig,
    pub(crate) slots: Vec<Slot>,
    free_slots: Vec<u32>,
    pub(crate) ids: HashMap<RequestId, u32>,
    pub(crate) running: Vec<u32>,
    pub(crate) waiting: Box<dyn WaitingQueue>,
    /// Orders `waiting` and picks preemption victims.
    pub(crate) policy: Box<dyn Policy>,
    /// Waiting requests some scan skipped (blocked); for stats only.
    pub(crate) deferred_waiting: HashSet<u32>,
    pub(crate) kv: KvCacheManager,
    pub(crate) finished_req_ids: Vec<RequestId>,
    pub(crate) preempted_req_ids: Vec<RequestId>,
    pub(crate) pause_state: PauseState,
    pub(crate) num_preemptions_total: u64,
    pub(crate) num_executed_steps: u64,
    pub(crate) scratch: crate::schedule::StepScratch,
}

impl Scheduler {
    /// A scheduler over a KV pool of `config.num_gpu_blocks` blocks. Checks
    /// only what makes scheduling undefined; call `SchedulerConfig::validate`
    /// first to apply vLLM's stricter engine checks.
    pub fn new(config: SchedulerConfig) -> Result<Self, ConfigError> {
        let policy = policy::from_config(config.policy);
        Self::with_policy(config, policy)
    }

    /// A scheduler under a policy of the caller's (`config.policy` is
    /// then only a label).
    pub fn with_policy(
        config: SchedulerConfig,
        policy: Box<dyn Policy>,
    ) -> Result<Self, ConfigError> {
        config.validate_basic()?;
        // Hashes are chained at the hash block size: every group's block
        // ends on one of them.
        let (_, hash_block_size) = config.block_layout();
        let hasher = config.enable_prefix_caching.then(|| {
            BlockHasher::new(
                config.prefix_caching_hash_algo,
                hash_block_size,
                config.hash_seed.as_deref(),
            )
        });
        let mut kv = KvCacheManager::with_groups(
            config.num_gpu_blocks,
            config.block_size,
            config.max_model_len,
            config.max_num_batched_tokens,
            config.watermark,
            hasher,
            &config.kv_cache_groups,
        )?;
        kv.set_kv_cache_events(config.enable_kv_cache_events);
        Ok(Scheduler {
            waiting: policy.new_queue(),
            policy,
            config,
            slots: Vec::new(),
            free_slots: Vec::new(),
            ids: HashMap::new(),
            running: Vec::new(),
            deferred_waiting: HashSet::new(),
            kv,
            finished_req_ids: Vec::new(),
            preempted_req_ids: Vec::new(),
            pause_state: PauseState::Unpaused,
            num_preemptions_total: 0,
            num_executed_steps: 0,
            scratch: Default::default(),
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Validates and queues a request; nothing is scheduled here.
    pub fn add_request(&mut self, new: NewRequest) -> Result<ReqHandle, AddRequestError> {
        let bad = |field, message: String| Err(FieldError::new(field, message));
        if self.ids.contains_key(&new.id) {
            return bad("request_id", format!("duplicate request id {:?}", &*new.id));
        }
        let prompt_len = new.prompt_token_ids.len();
        if prompt_len == 0 {
            return bad("prompt", "the prompt is empty".into());
        }
        if prompt_len >= self.config.max_model_len {
            return bad(
                "prompt",
                format!(
                    "the prompt ({prompt_len} tokens) must be shorter than max_model_len ({})",
                    self.config.max_model_len
                ),
            );
        }
        let params = &new.sampling_params;
        if params.max_tokens == 0 {
            return bad("max_tokens", "must be at least 1".into());
        }
        params.validate()?;
        if !new.arrival_time.is_finite() {
            return bad("arrival_time", "must be finite".into());
        }

        let mut req = Request::from_new(new, self.kv.hasher());
        req.reserve_for_outputs(self.config.max_model_len, self.config.block_layout().1);
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        self.ids.insert(req.id.clone(), slot);
        if req.status.is_blocked() {
            self.deferred_waiting.insert(slot);
        }
        self.waiting.add(slot, &req);
        entry.req = Some(req);
        Ok(ReqHandle {
            slot,
            generation: entry.generation,
        })
    }

    /// Aborts (or errors) requests from outside, one at a time in the given
    /// order. Unknown and already-finished ids are ignored. Their blocks are
    /// back in the pool at once; the ids reach the runner in the next output.
    /// Returns the ids actually finished.
    pub fn finish_requests<S: AsRef<str>>(
        &mut self,
        ids: &[S],
        status: RequestStatus,
    ) -> Vec<RequestId> {
        assert!(
            status.is_finished(),
            "finish_requests needs a finished status"
        );
        let mut done = Vec::new();
        for id in ids {
            let Some(&slot) = self.ids.get(id.as_ref()) else {
                continue;
            };
            let req = self.req(slot);
            if req.is_finished() {
                continue;
            }
            if req.status == RequestStatus::Running {
                if let Some(pos) = self.running.iter().position(|&s| s == slot) {
                    self.running.remove(pos);
                }
            } else {
                let req = self.slots[slot as usize].req.as_ref().expect("live slot");
                self.waiting.remove(slot, req);
                self.deferred_waiting.remove(&slot);
            }
            self.req_mut(slot).status = status;
            done.push(self.req(slot).id.clone());
            self.free_request(slot);
        }
        done
    }

    /// Drops a finished request: its blocks go back to the pool now, its id
    /// to the next output's `finished_req_ids`.
    pub(crate) fn free_request(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        let req = entry.req.take().expect("freeing an empty slot");
        debug_assert!(req.is_finished());
        entry.generation = entry.generation.wrapping_add(1);
        self.kv.free(slot as usize);
        self.ids.remove(&req.id);
        self.finished_req_ids.push(req.id);
        self.free_slots.push(slot);
    }

    /// Puts a running request back into `waiting` with no blocks; its
    /// outputs are kept, so it later recomputes prompt and outputs.
    pub(crate) fn preempt(&mut self, slot: u32) {
        self.kv.free(slot as usize);
        let req = self.slots[slot as usize].req.as_mut().expect("live slot");
        debug_assert_eq!(req.status, RequestStatus::Running);
        req.status = RequestStatus::Preempted;
        req.num_computed_tokens = 0;
        req.spec_token_ids.clear();
        req.num_preemptions += 1;
        self.waiting.prepend(slot, req);
        self.preempted_req_ids.push(req.id.clone());
        self.num_preemptions_total += 1;
    }

    pub(crate) fn req(&self, slot: u32) -> &Request {
        self.slots[slot as usize].req.as_ref().expect("live slot")
    }

    pub(crate) fn req_mut(&mut self, slot: u32) -> &mut Request {
        self.slots[slot as usize].req.as_mut().expect("live slot")
    }

    /// The live request behind a handle, if it has not been freed since.
    pub fn request(&self, handle: ReqHandle) -> Option<&Request> {
        let slot = self.slots.get(handle.slot as usize)?;
        (slot.generation == handle.generation)
            .then_some(slot.req.as_ref())
            .flatten()
    }

    pub fn get_request(&self, id: &str) -> Option<&Request> {
        self.ids.get(id).map(|&s| self.req(s))
    }

    pub fn handle_of(&self, id: &str) -> Option<ReqHandle> {
        self.ids.get(id).map(|&s| ReqHandle {
            slot: s,
            generation: self.slots[s as usize].generation,
        })
    }

    /// The block table of a live request (group 0's).
    pub fn block_ids(&self, id: &str) -> Option<&[BlockId]> {
        self.ids.get(id).map(|&s| self.kv.block_ids(s as usize))
    }

    /// The block table of a live request in KV cache group `group`.
    pub fn group_block_ids(&self, id: &str, group: crate::kv_cache::GroupId) -> Option<&[BlockId]> {
        self.ids
            .get(id)
            .map(|&s| self.kv.group_block_ids(group, s as usize))
    }

    pub fn kv_cache_manager(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Ids of the running requests, in running order.
    pub fn running_ids(&self) -> Vec<RequestId> {
        self.running
            .iter()
            .map(|&s| self.req(s).id.clone())
            .collect()
    }

    /// Ids of the waiting requests, in queue order.
    pub fn waiting_ids(&self) -> Vec<RequestId> {
        self.waiting
            .iter()
            .map(|s| self.req(s).id.clone())
            .collect()
    }

    /// Preemptions not yet reported in a `SchedulerOutput` (from
    /// `reset_prefix_cache`).
    pub fn pending_preempted_ids(&self) -> &[RequestId] {
        &self.preempted_req_ids
    }

    /// (running, waiting) counts.
    pub fn get_request_counts(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len())
    }

    pub fn get_num_unfinished_requests(&self) -> usize {
        match self.pause_state {
            PauseState::PausedAll => 0,
            // Only block-holding waiting requests count, and there are none.
            PauseState::PausedNew => self.running.len(),
            PauseState::Unpaused => self.running.len() + self.waiting.len(),
        }
    }

    pub fn has_unfinished_requests(&self) -> bool {
        self.get_num_unfinished_requests() > 0
    }

    /// Whether finished ids are waiting to be reported to the runner.
    pub fn has_finished_requests(&self) -> bool {
        !self.finished_req_ids.is_empty()
    }

    pub fn pause_state(&self) -> PauseState {
        self.pause_state
    }

    pub fn set_pause_state(&mut self, state: PauseState) {
        self.pause_state = state;
    }

    pub fn kv_cache_usage(&self) -> f64 {
        self.kv.usage()
    }

    /// Marks a request's grammar as compiled: the waiting loop stops skipping
    /// it. Returns false for unknown ids.
    pub fn set_grammar_ready(&mut self, id: &str) -> bool {
        let Some(&slot) = self.ids.get(id) else {
            return false;
        };
        let req = self.req_mut(slot);
        if req.status == RequestStatus::WaitingForGrammar {
            req.status = RequestStatus::Waiting;
        }
        true
    }

    /// Changes a live request's priority; a waiting request moves to where
    /// the new value puts it in the queue (a running one keeps running, and
    /// the value counts when victims are chosen). Returns whether the
    /// request was found.
    pub fn set_request_priority(&mut self, id: &str, priority: i64) -> bool {
        let Some(&slot) = self.ids.get(id) else {
            return false;
        };
        let Some(req) = self.slots[slot as usize].req.as_mut() else {
            return false;
        };
        if req.priority == priority {
            return true;
        }
        let queued = matches!(
            req.status,
            RequestStatus::Waiting | RequestStatus::WaitingForGrammar | RequestStatus::Preempted
        ) && !self.running.contains(&slot);
        let old_priority = std::mem::replace(&mut req.priority, priority);
        if queued {
            self.waiting.rekey(slot, old_priority, req);
        }
        true
    }

    /// Sets the draft tokens proposed for the next step (speculative
    /// decoding). Ignored for requests that are not running or still
    /// prefilling, as in vLLM.
    pub fn update_draft_token_ids(&mut self, drafts: &[(RequestId, Vec<TokenId>)]) {
        for (id, tokens) in drafts {
            let Some(&slot) = self.ids.get(&**id) else {
                continue;
            };
            let req = self.req_mut(slot);
            if req.status != RequestStatus::Running || req.is_prefill_chunk {
                continue;
            }
            req.spec_token_ids.clear();
            req.spec_token_ids.extend_from_slice(tokens);
        }
    }

    /// The KV cache events queued since the last call (vLLM's
    /// `take_events`, which vLLM calls at the end of `update_from_output`),
    /// in the order they happened. Always empty unless
    /// `SchedulerConfig::enable_kv_cache_events`; with prefix caching off
    /// the only possible event is `AllBlocksCleared` from a reset, as in
    /// vLLM.
    pub fn take_kv_cache_events(&mut self) -> Vec<crate::kv_events::KvCacheEvent> {
        self.kv.take_events()
    }

    /// Drops the prefix cache. With `reset_running_requests`, first preempts
    /// every running request (from the tail, so they keep their order in
    /// `waiting`). Returns whether the cache was cleared.
    pub fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> bool {
        if reset_running_requests {
            while let Some(slot) = self.running.pop() {
                self.preempt(slot);
            }
        }
        self.kv.reset_prefix_cache()
    }

    /// A snapshot for metrics; the prefix-cache counters restart.
    pub fn make_stats(&mut self) -> SchedulerStats {
        SchedulerStats {
            num_running_reqs: self.running.len(),
            num_waiting_reqs: self.waiting.len() - self.deferred_waiting.len(),
            num_skipped_waiting_reqs: self.deferred_waiting.len(),
            kv_cache_usage: self.kv.usage(),
            num_free_blocks: self.kv.num_free_blocks(),
            num_preemptions_total: self.num_preemptions_total,
            num_executed_steps: self.num_executed_steps,
            prefix_cache_stats: self.kv.take_prefix_cache_stats(),
        }
    }
}
