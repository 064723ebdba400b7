//! One engine replica on the virtual clock: a real `Scheduler`, the
//! requests routed to it and not yet admitted, and the step in flight.
//!
//! A replica runs vLLM's step loop in two halves so that a cluster can
//! interleave replicas and arrivals in time order: `start_step` (at a step
//! boundary: admit what was routed here, `schedule()`, ask the step-time
//! model how long the step takes, sample its tokens) and `finish_step`
//! (when the step's time has passed: `update_from_output()`, stamp the
//! tokens, report what finished). The state a router sees (`ReplicaView`)
//! therefore changes only at step boundaries, as a real engine's does.

use crate::router::ReplicaView;
use crate::sim::{output_token, RequestTimeline, SimError, SimRequest, StepLog};
use crate::speculation::{verification_rng, SimSpeculation};
use crate::step::{StepShape, StepTimeModel};
use sluice_core::block_hash::BlockHash;
use sluice_core::kv_cache::GroupId;
use sluice_core::request::{NewRequest, RequestId};
use sluice_core::{ModelRunnerOutput, SamplingParams, Scheduler, SchedulerConfig, SchedulerOutput};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Which part of a request a replica serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The whole request (no disaggregation).
    Whole,
    /// Prefill on a prefill replica: `max_tokens = 1`, its token dropped
    /// (the client streams from the decode replica, as vLLM's P/D proxy).
    Prefill,
    /// Decode on a decode replica: the prompt's KV arrives from the
    /// prefill replica, the last prompt token is recomputed here.
    Decode,
}

/// A request routed to a replica, admitted at its next step boundary.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Routed {
    pub request: usize,
    pub phase: Phase,
}

/// Per-replica counters for the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaStats {
    pub steps: u64,
    pub preemptions: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
}

struct InFlight {
    out: SchedulerOutput,
    mro: ModelRunnerOutput,
    step_log: usize,
}

pub(crate) struct Replica {
    pub index: usize,
    scheduler: Scheduler,
    pub inbox: Vec<Routed>,
    /// Replay-style arrivals (request indices by `arrival_step`).
    pub step_arrivals: VecDeque<usize>,
    in_flight: Option<InFlight>,
    /// The time of this replica's next event: the end of the step in
    /// flight, or the boundary at which it starts one. `None` = idle.
    pub wake_s: Option<f64>,
    pub step: u64,
    ids: HashMap<RequestId, Routed>,
    pub stats: ReplicaStats,
    /// Speculative decoding and the seed of its acceptances.
    speculation: Option<(SimSpeculation, u64)>,
}

fn sampling_params(max_tokens: usize) -> SamplingParams {
    // What `vllm bench serve` sends: a fixed length, EOS ignored.
    SamplingParams {
        max_tokens,
        min_tokens: 0,
        temperature: 0.0,
        ignore_eos: true,
        eos_token_id: None,
        ..SamplingParams::default()
    }
}

impl Replica {
    pub fn new(index: usize, config: SchedulerConfig) -> Result<Replica, SimError> {
        Ok(Replica {
            index,
            scheduler: Scheduler::new(config).map_err(|e| SimError::Config(e.to_string()))?,
            inbox: Vec::new(),
            step_arrivals: VecDeque::new(),
            in_flight: None,
            wake_s: None,
            step: 0,
            ids: HashMap::new(),
            stats: ReplicaStats::default(),
            speculation: None,
        })
    }

    /// Drafts after every step, accepted as `spec` says (seeded by `seed`).
    pub fn with_speculation(mut self, spec: Option<(SimSpeculation, u64)>) -> Self {
        self.speculation = spec;
        self
    }

    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished_requests()
    }

    /// Makes the replica step at `now` if it is idle.
    pub fn wake(&mut self, now: f64) {
        if self.wake_s.is_none() {
            self.wake_s = Some(now);
        }
    }

    fn admit(
        &mut self,
        routed: Routed,
        requests: &[SimRequest],
        timelines: &mut [RequestTimeline],
        now: f64,
    ) -> Result<(), SimError> {
        let r = &requests[routed.request];
        let (max_tokens, external) = match routed.phase {
            Phase::Whole => (r.output_len, 0),
            Phase::Prefill => (1, 0),
            Phase::Decode => (r.output_len, r.prompt.len()),
        };
        if r.arrival_step.is_some() {
            // A step-arriving request arrives when its step starts.
            timelines[routed.request].arrival_s = now;
        }
        let id: RequestId = r.id.as_str().into();
        let new = NewRequest {
            id: id.clone(),
            prompt_token_ids: r.prompt.clone(),
            sampling_params: Arc::new(sampling_params(max_tokens)),
            priority: r.priority.into(),
            arrival_time: timelines[routed.request].arrival_s,
            cache_salt: None,
            needs_grammar: false,
            num_external_computed_tokens: external,
        };
        self.scheduler
            .add_request(new)
            .map_err(|e| SimError::BadRequest {
                index: routed.request,
                message: e.to_string(),
            })?;
        self.ids.insert(id, routed);
        let t = &mut timelines[routed.request];
        if routed.phase != Phase::Decode {
            t.admitted_step = self.step;
        }
        Ok(())
    }

    /// Step boundary at `now`: admits what was routed here, then schedules
    /// a step and puts it in flight (or goes idle). Returns the indices of
    /// the requests admitted, in admission order.
    #[allow(clippy::too_many_arguments)]
    pub fn start_step(
        &mut self,
        now: f64,
        requests: &[SimRequest],
        timelines: &mut [RequestTimeline],
        model: &dyn StepTimeModel,
        record_schedule: bool,
        steps: &mut Vec<StepLog>,
        admitted: &mut Vec<usize>,
    ) -> Result<(), SimError> {
        debug_assert!(self.in_flight.is_none());
        if !self.has_unfinished() {
            // Idle with replay-style arrivals pending: no time passes in
            // the empty steps before the next one.
            if let Some(&i) = self.step_arrivals.front() {
                self.step = self.step.max(requests[i].arrival_step.unwrap_or(0));
            }
        }
        while let Some(&i) = self.step_arrivals.front() {
            if requests[i].arrival_step.unwrap_or(0) > self.step {
                break;
            }
            self.step_arrivals.pop_front();
            self.inbox.push(Routed {
                request: i,
                phase: Phase::Whole,
            });
        }
        let inbox = std::mem::take(&mut self.inbox);
        for routed in &inbox {
            self.admit(*routed, requests, timelines, now)?;
            if routed.phase != Phase::Decode {
                admitted.push(routed.request);
            }
        }
        self.inbox = inbox;
        self.inbox.clear();
        if !self.has_unfinished() {
            self.wake_s = None;
            return Ok(());
        }

        let scheduler = &mut self.scheduler;
        let out = scheduler.schedule();
        let shape = StepShape::from_output_sharing(&out, scheduler, model.prices_shared_context());
        let ran = out.total_num_scheduled_tokens > 0;
        // Nothing runs: no forward pass, no time.
        let dt = if ran { model.step_time(&shape) } else { 0.0 };
        let outside_profile = ran && model.outside_range(&shape);
        if !dt.is_finite() || dt < 0.0 {
            return Err(SimError::BadStepTime(dt));
        }
        let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
        let mut tokens = Vec::new();
        for s in &out.num_scheduled_tokens {
            let sampled = scheduler
                .request(s.handle)
                .filter(|req| req.num_computed_tokens() >= req.num_tokens())
                .and_then(|req| Some((self.ids.get(&s.req_id)?.request, req.num_output_tokens())));
            tokens.clear();
            if let Some((request, done)) = sampled {
                // Accepted drafts (they are the request's own next tokens),
                // then the token sampled after them.
                let accepted = match &self.speculation {
                    Some((spec, seed)) => {
                        let drafts = out.proposed_drafts_of(&s.req_id).len();
                        spec.accepted(drafts, &mut verification_rng(*seed, request, done))
                    }
                    None => 0,
                };
                tokens.extend((0..=accepted).map(|j| output_token(request, done + j)));
            }
            mro.push(&tokens);
        }
        for n in &out.scheduled_new_reqs {
            if let Some(routed) = self.ids.get(&n.req_id) {
                let t = &mut timelines[routed.request];
                if routed.phase != Phase::Decode
                    && t.token_times.is_empty()
                    && n.num_computed_tokens > 0
                {
                    t.num_cached_tokens = n.num_computed_tokens;
                }
            }
        }
        let (num_running, num_waiting) = scheduler.get_request_counts();
        steps.push(StepLog {
            replica: self.index,
            start_s: now,
            duration_s: dt,
            num_reqs: out.num_scheduled_tokens.len(),
            num_tokens: out.total_num_scheduled_tokens,
            num_preempted: out.preempted_req_ids.len(),
            num_running,
            num_waiting,
            kv_usage: scheduler.kv_cache_usage(),
            outside_profile,
            scheduled: if record_schedule {
                out.num_scheduled_tokens
                    .iter()
                    .map(|s| (s.req_id.clone(), s.num_tokens))
                    .collect()
            } else {
                Vec::new()
            },
            preempted: if record_schedule {
                out.preempted_req_ids.clone()
            } else {
                Vec::new()
            },
            free_blocks: 0,
        });
        self.stats.steps += 1;
        self.step += 1;
        let in_flight = InFlight {
            out,
            mro,
            step_log: steps.len() - 1,
        };
        if in_flight.out.total_num_scheduled_tokens == 0 {
            // Blocked (nothing fits): settle the empty step now and sleep
            // until something is routed here.
            self.in_flight = Some(in_flight);
            self.finish_step(now, timelines, steps, &mut Vec::new());
            self.wake_s = None;
        } else {
            self.in_flight = Some(in_flight);
            self.wake_s = Some(now + dt);
        }
        Ok(())
    }

    /// The step in flight ends at `now`: `update_from_output()`, token
    /// times, and the (request, phase) pairs that finished, appended to
    /// `finished`. The replica stays awake at `now` to start its next step
    /// once the arrivals up to `now` are routed.
    pub fn finish_step(
        &mut self,
        now: f64,
        timelines: &mut [RequestTimeline],
        steps: &mut [StepLog],
        finished: &mut Vec<Routed>,
    ) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        for o in self.scheduler.update_from_output(&f.out, &f.mro) {
            let Some(&routed) = self.ids.get(&o.req_id) else {
                continue;
            };
            let t = &mut timelines[routed.request];
            if routed.phase != Phase::Prefill {
                t.token_times.extend(o.new_token_ids.iter().map(|_| now));
                t.replica = self.index;
            } else {
                t.prefill_replica = Some(self.index);
            }
            if o.finish_reason.is_some() {
                self.ids.remove(&o.req_id);
                finished.push(routed);
            }
        }
        if let Some((spec, _)) = &self.speculation {
            let batch = f.out.num_scheduled_tokens.len();
            let drafts: Vec<(RequestId, Vec<u32>)> = f
                .out
                .num_scheduled_tokens
                .iter()
                .filter_map(|s| {
                    let req = self.scheduler.request(s.handle)?;
                    let routed = self.ids.get(&s.req_id)?;
                    let k = spec.k_for(batch, req.num_tokens());
                    let done = req.num_output_tokens();
                    // Sampled this step: all but its newest token computed
                    // (a prefill chunk is refused by the scheduler).
                    (k > 0 && req.num_computed_tokens() + 1 >= req.num_tokens()).then(|| {
                        let d = (0..k)
                            .map(|j| output_token(routed.request, done + j))
                            .collect();
                        (s.req_id.clone(), d)
                    })
                })
                .collect();
            self.scheduler.update_draft_token_ids(&drafts);
        }
        if let Some(log) = steps.get_mut(f.step_log) {
            log.free_blocks = self.scheduler.kv_cache_manager().num_free_blocks();
        }
        let stats = self.scheduler.make_stats();
        self.stats.prefix_cache_queries += stats.prefix_cache_stats.queries;
        self.stats.prefix_cache_hits += stats.prefix_cache_stats.hits;
        self.stats.preemptions = stats.num_preemptions_total;
        self.wake_s = Some(now);
    }

    pub fn is_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }
}

impl ReplicaView for Replica {
    fn num_running(&self) -> usize {
        self.scheduler.get_request_counts().0
    }

    fn num_waiting(&self) -> usize {
        // Routed but not yet admitted counts as waiting: the client has
        // sent it.
        self.scheduler.get_request_counts().1 + self.inbox.len()
    }

    fn kv_usage(&self) -> f64 {
        self.scheduler.kv_cache_usage()
    }

    fn cached_prefix_blocks(&self, hashes: &[BlockHash]) -> usize {
        let pool = self.scheduler.kv_cache_manager().pool();
        hashes
            .iter()
            .take_while(|h| pool.get_cached_block(h, GroupId(0)).is_some())
            .count()
    }
}
