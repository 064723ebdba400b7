//! The discrete-event loop: the real scheduler on a virtual clock.
//!
//! Each engine step copies `sluice_core::replay`'s protocol: admit every
//! request whose `arrival_s` ≤ now (in arrival order, ties in listed
//! order), `schedule()`, advance the clock by the step-time model's time
//! for that output, sample one token for every request whose computed
//! tokens reach its known tokens, `update_from_output()`. When nothing is
//! running or waiting, the clock jumps to the next arrival instead of
//! stepping. Requests finish by `max_tokens = output_len` with EOS
//! ignored, so the decisions depend only on lengths, arrivals and the
//! scheduler config, and a run is deterministic for its inputs.
//!
//! Promise: the steps (and the requests admitted at each) equal those of a
//! replay of the trace that admits each request at the step the simulator
//! did (`SimResult::to_trace`), decision for decision, under the FCFS
//! policy. (Under the priority policy, requests arriving at the same
//! instant tie on arrival time and fall back to id order, where a replay's
//! synthetic arrival times keep listed order; every simulated request has
//! priority 0 for now.)

use crate::step::{StepShape, StepTimeModel};
use sluice_core::request::{NewRequest, RequestId};
use sluice_core::trace::{Trace, TraceRequest};
use sluice_core::{ModelRunnerOutput, SamplingParams, Scheduler, SchedulerConfig};
use std::collections::HashMap;
use std::sync::Arc;

/// One request to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRequest {
    pub id: String,
    pub arrival_s: f64,
    pub prompt: Vec<u32>,
    /// Output tokens it generates (its `max_tokens`).
    pub output_len: usize,
    /// Scheduling priority (lower runs first under the priority policy).
    pub priority: i32,
    /// A later turn of a conversation: sent `think_time_s` after request
    /// `after` (an index into the same list, earlier in it) finishes, or
    /// at `arrival_s` if that is later. Its prompt already holds the
    /// earlier turn's prompt and output (`output_token`), so prefix
    /// caching sees the conversation grow.
    pub after: Option<usize>,
    pub think_time_s: f64,
    /// Replay-style arrival: admitted at the start of its replica's engine
    /// step with this index instead of at a time (`sluice replay` traces).
    pub arrival_step: Option<u64>,
}

impl SimRequest {
    /// An open-loop request: arrives at `arrival_s`, priority 0.
    pub fn new(id: impl Into<String>, arrival_s: f64, prompt: Vec<u32>, output_len: usize) -> Self {
        SimRequest {
            id: id.into(),
            arrival_s,
            prompt,
            output_len,
            priority: 0,
            after: None,
            think_time_s: 0.0,
            arrival_step: None,
        }
    }
}

/// What happened to one request, in virtual seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestTimeline {
    pub id: String,
    pub arrival_s: f64,
    pub prompt_len: usize,
    pub output_len: usize,
    /// The engine step at whose start it was admitted.
    pub admitted_step: u64,
    /// The end of the step that produced each output token.
    pub token_times: Vec<f64>,
    pub finish_s: Option<f64>,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub num_cached_tokens: usize,
}

impl RequestTimeline {
    pub fn first_token_s(&self) -> Option<f64> {
        self.token_times.first().copied()
    }
}

/// One engine step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepLog {
    /// The replica that ran it (0 with one replica).
    pub replica: usize,
    pub start_s: f64,
    pub duration_s: f64,
    pub num_reqs: usize,
    pub num_tokens: usize,
    pub num_preempted: usize,
    /// Requests running / waiting right after `schedule()`.
    pub num_running: usize,
    pub num_waiting: usize,
    /// KV cache usage right after `schedule()` (0..1).
    pub kv_usage: f64,
    /// (request, tokens) in scheduled order; filled only with
    /// `Simulator::record_schedule`, since it costs an id clone per row.
    pub scheduled: Vec<(RequestId, usize)>,
    /// Preempted ids, with `record_schedule` only.
    pub preempted: Vec<RequestId>,
    /// Free KV blocks after `update_from_output()` (what replay logs).
    pub free_blocks: usize,
}

/// A finished simulation.
#[derive(Clone, Debug, Default)]
pub struct SimResult {
    pub config: SchedulerConfig,
    pub requests: Vec<RequestTimeline>,
    pub steps: Vec<StepLog>,
    pub preemptions: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// The clock when the last request finished.
    pub end_s: f64,
    /// Request indices in the order they were admitted.
    pub admission_order: Vec<usize>,
}

/// Why a simulation could not run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("request {index}: {message}")]
    BadRequest { index: usize, message: String },
    #[error("the step-time model returned {0} s (must be finite and ≥ 0)")]
    BadStepTime(f64),
    #[error("step {0} scheduled nothing and no request is left to arrive")]
    Stalled(u64),
    #[error("scheduler config: {0}")]
    Config(String),
}

/// The token a request samples as its `k`-th output: synthetic and fixed,
/// so a trace of the run can script the same outputs.
pub fn output_token(request_index: usize, k: usize) -> u32 {
    ((request_index as u64 * 7919 + k as u64) % 32_000) as u32
}

fn sampling_params(output_len: usize) -> SamplingParams {
    // What `vllm bench serve` sends: a fixed length, EOS ignored.
    SamplingParams {
        max_tokens: output_len,
        min_tokens: 0,
        temperature: 0.0,
        ignore_eos: true,
        eos_token_id: None,
        ..SamplingParams::default()
    }
}

/// A simulator: a scheduler config and a step-time model.
pub struct Simulator<M> {
    pub config: SchedulerConfig,
    pub model: M,
    pub record_schedule: bool,
}

impl<M: StepTimeModel> Simulator<M> {
    pub fn new(config: SchedulerConfig, model: M) -> Self {
        Simulator {
            config,
            model,
            record_schedule: false,
        }
    }

    /// Keeps each step's (request, tokens) list in `StepLog::scheduled`.
    pub fn record_schedule(mut self, on: bool) -> Self {
        self.record_schedule = on;
        self
    }

    fn check(&self, requests: &[SimRequest]) -> Result<(), SimError> {
        let max_len = self.config.max_model_len;
        for (index, r) in requests.iter().enumerate() {
            let bad = |message: String| Err(SimError::BadRequest { index, message });
            if !r.arrival_s.is_finite() || r.arrival_s < 0.0 {
                return bad(format!("arrival_s {} must be finite and ≥ 0", r.arrival_s));
            }
            if r.output_len == 0 {
                return bad("output_len must be at least 1".into());
            }
            if r.prompt.len() + r.output_len > max_len {
                return bad(format!(
                    "prompt ({}) + output ({}) exceeds max_model_len ({max_len})",
                    r.prompt.len(),
                    r.output_len
                ));
            }
        }
        Ok(())
    }

    /// Runs `requests` to completion.
    pub fn run(&self, requests: &[SimRequest]) -> Result<SimResult, SimError> {
        self.check(requests)?;
        let mut scheduler =
            Scheduler::new(self.config.clone()).map_err(|e| SimError::Config(e.to_string()))?;
        // Arrival order: time, then listed order (the sort is stable).
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by(|&a, &b| requests[a].arrival_s.total_cmp(&requests[b].arrival_s));
        let mut timelines: Vec<RequestTimeline> = requests
            .iter()
            .map(|r| RequestTimeline {
                id: r.id.clone(),
                arrival_s: r.arrival_s,
                prompt_len: r.prompt.len(),
                output_len: r.output_len,
                ..RequestTimeline::default()
            })
            .collect();
        let mut index: HashMap<RequestId, usize> = HashMap::with_capacity(requests.len());
        let mut result = SimResult {
            config: self.config.clone(),
            ..SimResult::default()
        };
        let (mut now, mut next, mut step) = (0.0f64, 0usize, 0u64);
        loop {
            if next < order.len() && !scheduler.has_unfinished_requests() {
                // Idle: nothing to step until the next arrival.
                now = now.max(requests[order[next]].arrival_s);
            }
            while let Some(&i) = order.get(next) {
                let r = &requests[i];
                if r.arrival_s > now {
                    break;
                }
                next += 1;
                let id: RequestId = r.id.as_str().into();
                let new = NewRequest {
                    id: id.clone(),
                    prompt_token_ids: r.prompt.clone(),
                    sampling_params: Arc::new(sampling_params(r.output_len)),
                    priority: 0,
                    arrival_time: r.arrival_s,
                    cache_salt: None,
                    needs_grammar: false,
                    num_external_computed_tokens: 0,
                };
                scheduler
                    .add_request(new)
                    .map_err(|e| SimError::BadRequest {
                        index: i,
                        message: e.to_string(),
                    })?;
                index.insert(id, i);
                timelines[i].admitted_step = step;
                result.admission_order.push(i);
            }
            if next >= order.len() && !scheduler.has_unfinished_requests() {
                break;
            }

            let out = scheduler.schedule();
            let shape = StepShape::from_output(&out, &scheduler);
            let dt = self.model.step_time(&shape);
            if !dt.is_finite() || dt < 0.0 {
                return Err(SimError::BadStepTime(dt));
            }
            let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
            for s in &out.num_scheduled_tokens {
                let sampled = scheduler
                    .request(s.handle)
                    .filter(|req| req.num_computed_tokens() >= req.num_tokens())
                    .and_then(|req| {
                        let i = *index.get(&s.req_id)?;
                        Some(output_token(i, req.num_output_tokens()))
                    });
                match sampled {
                    Some(tok) => mro.push(&[tok]),
                    None => mro.push(&[]),
                }
            }
            for n in &out.scheduled_new_reqs {
                if let Some(&i) = index.get(&n.req_id) {
                    if timelines[i].token_times.is_empty() && n.num_computed_tokens > 0 {
                        timelines[i].num_cached_tokens = n.num_computed_tokens;
                    }
                }
            }
            result.steps.push(StepLog {
                replica: 0,
                start_s: now,
                duration_s: dt,
                num_reqs: out.num_scheduled_tokens.len(),
                num_tokens: out.total_num_scheduled_tokens,
                num_preempted: out.preempted_req_ids.len(),
                num_running: scheduler.get_request_counts().0,
                num_waiting: scheduler.get_request_counts().1,
                kv_usage: scheduler.kv_cache_usage(),
                scheduled: if self.record_schedule {
                    out.num_scheduled_tokens
                        .iter()
                        .map(|s| (s.req_id.clone(), s.num_tokens))
                        .collect()
                } else {
                    Vec::new()
                },
                preempted: if self.record_schedule {
                    out.preempted_req_ids.clone()
                } else {
                    Vec::new()
                },
                free_blocks: 0,
            });
            now += dt;
            for o in scheduler.update_from_output(&out, &mro) {
                let Some(&i) = index.get(&o.req_id) else {
                    continue;
                };
                let t = &mut timelines[i];
                t.token_times.extend(o.new_token_ids.iter().map(|_| now));
                if o.finish_reason.is_some() {
                    t.finish_s = Some(now);
                    result.end_s = now;
                }
            }
            if let Some(last) = result.steps.last_mut() {
                last.free_blocks = scheduler.kv_cache_manager().num_free_blocks();
            }
            let stats = scheduler.make_stats();
            result.prefix_cache_queries += stats.prefix_cache_stats.queries;
            result.prefix_cache_hits += stats.prefix_cache_stats.hits;
            result.preemptions = stats.num_preemptions_total;
            if out.total_num_scheduled_tokens == 0 {
                match order.get(next) {
                    // Blocked until more work arrives; skip the dead time.
                    Some(&i) => now = now.max(requests[i].arrival_s),
                    None => return Err(SimError::Stalled(step)),
                }
            }
            step += 1;
        }
        result.requests = timelines;
        Ok(result)
    }
}

impl SimResult {
    /// The trace a replay of this run needs: each request arrives at the
    /// step the simulator admitted it, scripted with the outputs it sampled.
    /// Requests are listed in admission order, which is the order a
    /// replay admits within a step. `requests` must be the run's input.
    pub fn to_trace(&self, requests: &[SimRequest]) -> Trace {
        let trace_requests = self
            .admission_order
            .iter()
            .filter_map(|&i| Some((i, requests.get(i)?, self.requests.get(i)?)))
            .map(|(i, r, t)| TraceRequest {
                id: r.id.clone(),
                arrival_step: t.admitted_step,
                priority: 0,
                prompt: r.prompt.clone(),
                output: (0..r.output_len).map(|k| output_token(i, k)).collect(),
                max_tokens: r.output_len,
                min_tokens: 0,
                eos_token_id: None,
                ignore_eos: true,
                stop_token_ids: Vec::new(),
            })
            .collect();
        Trace {
            name: "simulated".into(),
            config: self.config.clone(),
            requests: trace_requests,
            aborts: Vec::new(),
            max_steps: self.steps.len() as u64 + 1,
        }
    }
}
