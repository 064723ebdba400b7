//! Replays a trace through the scheduler with a scripted model, producing
//! the decision log of `docs/scheduler-trace.md`.
//!
//! The step loop: arrivals (listed order), aborts (listed order, one call
//! each), `schedule()`, the scripted model (every request whose computed
//! tokens reach its known tokens samples its next `output` entry),
//! `update_from_output()`, the scripted drafts of the requests that sampled
//! (speculative decoding), then the step's record.
//!
//! With KV cache events on (`Replayer::with_options`), the events the
//! scheduler queued during a step are what `take_kv_cache_events` returns
//! right after it: vLLM publishes them at the end of `update_from_output`,
//! and aborts before `schedule()` free blocks without evicting any.

use crate::kv_events::KvCacheEvent;
use crate::output::{ModelRunnerOutput, SchedulerOutput, PLACEHOLDER_TOKEN_ID};
use crate::request::{BlockId, FinishReason, NewRequest, RequestId, RequestStatus};
use crate::sampling_params::SamplingParams;
use crate::scheduler::Scheduler;
use crate::trace::{Trace, TraceRequest};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// One line of the decision log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    pub scheduled: Vec<(RequestId, usize)>,
    pub new: Vec<RequestId>,
    pub resumed: Vec<RequestId>,
    pub preempted: Vec<RequestId>,
    pub cached_tokens: Vec<(RequestId, usize)>,
    pub finished: Vec<(RequestId, FinishReason)>,
    pub free_blocks: usize,
    /// Per request, the fresh blocks of each KV cache group in group order.
    pub new_blocks: Vec<(RequestId, Vec<Vec<BlockId>>)>,
    /// The trace names its KV cache groups: `new_blocks` is written as one
    /// list per group (otherwise as group 0's list alone).
    pub grouped: bool,
    /// Per request, the drafts scheduled for verification
    /// (`scheduled_spec_decode_tokens`), placeholders as `-1`.
    pub spec_tokens: Vec<(RequestId, Vec<i64>)>,
    /// The trace has `speculative_config`: `spec_tokens` is written.
    pub speculative: bool,
}

/// A JSON list of numbers (block ids, draft tokens), formatted like the
/// golden logs.
fn push_numbers<T: std::fmt::Display>(o: &mut String, items: &[T]) {
    o.push('[');
    for (i, b) in items.iter().enumerate() {
        if i > 0 {
            o.push_str(", ");
        }
        let _ = write!(o, "{b}");
    }
    o.push(']');
}

fn push_str(out: &mut String, s: &str) {
    // serde_json escapes exactly as JSON requires; writing to a String
    // cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

fn push_ids(out: &mut String, ids: &[RequestId]) {
    out.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_str(out, id);
    }
    out.push(']');
}

fn push_map<V>(
    out: &mut String,
    entries: &[(RequestId, V)],
    mut value: impl FnMut(&mut String, &V),
) {
    out.push('{');
    for (i, (id, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_str(out, id);
        out.push_str(": ");
        value(out, v);
    }
    out.push('}');
}

impl StepRecord {
    /// The record as one JSON line, formatted like the golden logs.
    pub fn to_json(&self) -> String {
        let mut o = String::with_capacity(256);
        let _ = write!(o, "{{\"step\": {}, \"scheduled\": ", self.step);
        push_map(&mut o, &self.scheduled, |o, n| {
            let _ = write!(o, "{n}");
        });
        o.push_str(", \"new\": ");
        push_ids(&mut o, &self.new);
        o.push_str(", \"resumed\": ");
        push_ids(&mut o, &self.resumed);
        o.push_str(", \"preempted\": ");
        push_ids(&mut o, &self.preempted);
        o.push_str(", \"cached_tokens\": ");
        push_map(&mut o, &self.cached_tokens, |o, n| {
            let _ = write!(o, "{n}");
        });
        o.push_str(", \"finished\": ");
        push_map(&mut o, &self.finished, |o, r| {
            push_str(o, r.as_str());
        });
        let _ = write!(
            o,
            ", \"free_blocks\": {}, \"new_blocks\": ",
            self.free_blocks
        );
        let grouped = self.grouped;
        push_map(&mut o, &self.new_blocks, |o, groups| {
            if !grouped {
                push_numbers(o, groups.first().map_or(&[], Vec::as_slice));
                return;
            }
            o.push('[');
            for (i, blocks) in groups.iter().enumerate() {
                if i > 0 {
                    o.push_str(", ");
                }
                push_numbers(o, blocks);
            }
            o.push(']');
        });
        if self.speculative {
            o.push_str(", \"spec_tokens\": ");
            push_map(&mut o, &self.spec_tokens, |o, tokens| {
                push_numbers(o, tokens)
            });
        }
        o.push('}');
        o
    }
}

/// Wall time of the two scheduler calls of one step.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTiming {
    pub step: u64,
    pub schedule_ns: u64,
    pub update_ns: u64,
    pub num_scheduled_reqs: usize,
}

/// A replay in progress.
pub struct Replayer {
    trace: Trace,
    scheduler: Scheduler,
    /// Requests by arrival step, in listed order.
    arrivals: Vec<(u64, usize)>,
    next_arrival: usize,
    aborts_by_step: HashMap<u64, Vec<String>>,
    step: u64,
    last_arrival: Option<u64>,
    outputs: HashMap<String, usize>,
    /// Per request (trace order), the steps in which it sampled so far:
    /// the index of the drafts it proposes next.
    samples: Vec<usize>,
}

/// Why a replay could not continue (a trace error the parser cannot see).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayError(pub String);

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplayError {}

fn sampling_params(r: &TraceRequest) -> SamplingParams {
    SamplingParams {
        max_tokens: r.max_tokens,
        // min_tokens is the sampler's business; the scripted model stands in
        // for the sampler, so the scheduler never sees it.
        min_tokens: 0,
        temperature: 0.0,
        ignore_eos: r.ignore_eos,
        eos_token_id: if r.ignore_eos { None } else { r.eos_token_id },
        stop_token_ids: r.stop_token_ids.clone(),
        ..SamplingParams::default()
    }
}

impl Replayer {
    pub fn new(trace: Trace) -> Result<Self, ReplayError> {
        Self::with_options(trace, false, None)
    }

    /// A replay with KV cache events on or off, and the block-hash seed
    /// (`PYTHONHASHSEED` in vLLM; `None` = unset) the trace cannot carry.
    pub fn with_options(
        mut trace: Trace,
        kv_cache_events: bool,
        hash_seed: Option<String>,
    ) -> Result<Self, ReplayError> {
        trace.config.enable_kv_cache_events = kv_cache_events;
        trace.config.hash_seed = hash_seed;
        let mut scheduler =
            Scheduler::new(trace.config.clone()).map_err(|e| ReplayError(format!("config.{e}")))?;
        if trace.grouped {
            // The trace names its groups: so do its events, as vLLM's.
            let c = &trace.config;
            scheduler
                .kv
                .name_groups_in_events(&c.kv_cache_groups, c.block_size);
        }
        let mut arrivals: Vec<(u64, usize)> = trace
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.arrival_step, i))
            .collect();
        arrivals.sort_by_key(|&(step, i)| (step, i));
        let mut aborts_by_step: HashMap<u64, Vec<String>> = HashMap::new();
        for a in &trace.aborts {
            aborts_by_step.entry(a.step).or_default().push(a.id.clone());
        }
        let outputs = trace
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i))
            .collect();
        let samples = vec![0; trace.requests.len()];
        Ok(Replayer {
            samples,
            last_arrival: arrivals.last().map(|&(s, _)| s),
            arrivals,
            next_arrival: 0,
            aborts_by_step,
            step: 0,
            scheduler,
            trace,
            outputs,
        })
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The KV cache events of the last step (empty with events off).
    pub fn take_kv_cache_events(&mut self) -> Vec<KvCacheEvent> {
        self.scheduler.take_kv_cache_events()
    }

    /// The number of the next step to run.
    pub fn next_step(&self) -> u64 {
        self.step
    }

    /// Whether another step would run (work remains and `max_steps` allows).
    pub fn has_next(&self) -> bool {
        if self.step >= self.trace.max_steps {
            return false;
        }
        let all_arrived = self.last_arrival.is_none_or(|last| self.step > last);
        !(all_arrived && self.scheduler.ids.is_empty())
    }

    /// Runs one step. Builds its record when `record` is set; fills `timing`
    /// with the wall time of `schedule()` and `update_from_output()`.
    pub fn step(
        &mut self,
        record: bool,
        timing: Option<&mut StepTiming>,
    ) -> Result<Option<StepRecord>, ReplayError> {
        let step = self.step;
        let mut finished: Vec<(RequestId, FinishReason)> = Vec::new();

        while let Some(&(arrival, idx)) = self.arrivals.get(self.next_arrival) {
            if arrival != step {
                break;
            }
            self.next_arrival += 1;
            let r = &self.trace.requests[idx];
            let new = NewRequest {
                id: r.id.as_str().into(),
                prompt_token_ids: r.prompt.clone(),
                sampling_params: Arc::new(sampling_params(r)),
                priority: r.priority,
                // Arrival order is (arrival step, listed order).
                arrival_time: arrival as f64 * 1_000_000.0 + idx as f64,
                cache_salt: None,
                needs_grammar: false,
                num_external_computed_tokens: 0,
            };
            self.scheduler
                .add_request(new)
                .map_err(|e| ReplayError(format!("requests[{idx}].{e}")))?;
        }
        if let Some(ids) = self.aborts_by_step.get(&step) {
            for id in ids {
                for done in self
                    .scheduler
                    .finish_requests(&[id], RequestStatus::FinishedAborted)
                {
                    finished.push((done, FinishReason::Abort));
                }
            }
        }

        let t0 = Instant::now();
        let out = self.scheduler.schedule();
        let t1 = Instant::now();
        let runner_out = self.scripted_model(&out)?;
        let t2 = Instant::now();
        let engine_outs = self.scheduler.update_from_output(&out, &runner_out);
        let t3 = Instant::now();
        if self.scheduler.config().num_speculative_tokens > 0 {
            self.propose_drafts(&out, &runner_out);
        }
        if let Some(t) = timing {
            *t = StepTiming {
                step,
                schedule_ns: (t1 - t0).as_nanos() as u64,
                update_ns: (t3 - t2).as_nanos() as u64,
                num_scheduled_reqs: out.num_scheduled_tokens.len(),
            };
        }
        for o in &engine_outs {
            if let Some(reason) = o.finish_reason {
                finished.push((o.req_id.clone(), reason));
            }
        }
        self.step += 1;
        Ok(record.then(|| self.record(step, &out, finished)))
    }

    /// The scripted drafter: every request that sampled this step proposes
    /// its next scripted drafts (none once they run out), handed to the
    /// scheduler as vLLM's engine does after `update_from_output()`.
    fn propose_drafts(&mut self, out: &SchedulerOutput, runner_out: &ModelRunnerOutput) {
        let mut drafts = Vec::new();
        for (index, s) in out.num_scheduled_tokens.iter().enumerate() {
            if runner_out.sampled(index).is_empty() {
                continue;
            }
            let i = self.outputs[&*s.req_id];
            let j = self.samples[i];
            self.samples[i] += 1;
            let proposed = self.trace.requests[i].drafts.get(j).cloned();
            drafts.push((s.req_id.clone(), proposed.unwrap_or_default()));
        }
        self.scheduler.update_draft_token_ids(&drafts);
    }

    /// The scripted model: a request whose computed tokens (after this
    /// step's) reach all its known tokens samples its next scripted output;
    /// with drafts scheduled, the target accepts the longest run of them
    /// that equals its next outputs and samples the output after that run.
    fn scripted_model(&self, out: &SchedulerOutput) -> Result<ModelRunnerOutput, ReplayError> {
        let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
        for s in &out.num_scheduled_tokens {
            let req = self
                .scheduler
                .request(s.handle)
                .ok_or_else(|| ReplayError(format!("scheduled request {} is gone", s.req_id)))?;
            if req.num_computed_tokens() >= req.num_tokens() {
                let k = req.num_output_tokens();
                let script = &self.trace.requests[self.outputs[&*s.req_id]].output;
                if script.get(k).is_none() {
                    return Err(ReplayError(format!(
                        "request {} needs output[{k}] but only {} outputs are scripted",
                        s.req_id,
                        script.len()
                    )));
                }
                let drafts = out.spec_tokens_of(&s.req_id);
                let accepted = drafts
                    .iter()
                    .zip(&script[k..])
                    .take_while(|(d, o)| d == o)
                    .count()
                    .min(script.len() - k - 1);
                mro.push(&script[k..=k + accepted]);
            } else {
                mro.push(&[]);
            }
        }
        Ok(mro)
    }

    fn record(
        &self,
        step: u64,
        out: &SchedulerOutput,
        finished: Vec<(RequestId, FinishReason)>,
    ) -> StepRecord {
        let sizes = self.scheduler.kv.group_block_sizes();
        let mut rec = StepRecord {
            step,
            scheduled: out
                .num_scheduled_tokens
                .iter()
                .map(|s| (s.req_id.clone(), s.num_tokens))
                .collect(),
            preempted: out.preempted_req_ids.clone(),
            finished,
            free_blocks: self.scheduler.kv.num_free_blocks(),
            grouped: self.trace.grouped,
            speculative: self.trace.config.num_speculative_tokens > 0,
            spec_tokens: out
                .scheduled_spec_decode_tokens
                .iter()
                .map(|(id, d)| {
                    let d = d.iter().map(|&t| {
                        if t == PLACEHOLDER_TOKEN_ID {
                            -1
                        } else {
                            i64::from(t)
                        }
                    });
                    (id.clone(), d.collect())
                })
                .collect(),
            ..StepRecord::default()
        };
        // Each group's entries past the prefix hit are this step's fresh
        // blocks (vLLM's oracle reads them the same way).
        let fresh = |tables: &mut dyn Iterator<Item = &[BlockId]>, hit: usize| {
            let lists: Vec<Vec<BlockId>> = tables
                .zip(&sizes)
                .map(|(t, &b)| t.get(hit / b..).unwrap_or(&[]).to_vec())
                .collect();
            lists.iter().any(|l| !l.is_empty()).then_some(lists)
        };
        for n in &out.scheduled_new_reqs {
            rec.new.push(n.req_id.clone());
            rec.cached_tokens
                .push((n.req_id.clone(), n.num_computed_tokens));
            let mut tables = n.block_ids.iter().map(Vec::as_slice);
            if let Some(lists) = fresh(&mut tables, n.num_computed_tokens) {
                rec.new_blocks.push((n.req_id.clone(), lists));
            }
        }
        let cached = &out.scheduled_cached_reqs;
        for (i, c) in cached.reqs.iter().enumerate() {
            let Some(blocks) = cached.new_block_ids(i) else {
                if c.resumed {
                    rec.resumed.push(c.req_id.clone());
                    rec.cached_tokens
                        .push((c.req_id.clone(), c.num_computed_tokens));
                }
                continue;
            };
            let hit = if c.resumed {
                rec.resumed.push(c.req_id.clone());
                rec.cached_tokens
                    .push((c.req_id.clone(), c.num_computed_tokens));
                c.num_computed_tokens
            } else {
                0
            };
            if let Some(lists) = fresh(&mut blocks.iter(), hit) {
                rec.new_blocks.push((c.req_id.clone(), lists));
            }
        }
        rec
    }
}

/// Replays a whole trace, returning its decision log.
pub fn replay(trace: Trace) -> Result<Vec<StepRecord>, ReplayError> {
    let mut r = Replayer::new(trace)?;
    let mut log = Vec::new();
    while r.has_next() {
        if let Some(rec) = r.step(true, None)? {
            log.push(rec);
        }
    }
    Ok(log)
}

/// Replays a whole trace with KV cache events on: its decision log and, for
/// each step that published any, `(step, events)`.
#[allow(clippy::type_complexity)]
pub fn replay_with_kv_events(
    trace: Trace,
    hash_seed: Option<String>,
) -> Result<(Vec<StepRecord>, Vec<(u64, Vec<KvCacheEvent>)>), ReplayError> {
    let mut r = Replayer::with_options(trace, true, hash_seed)?;
    let (mut log, mut events) = (Vec::new(), Vec::new());
    while r.has_next() {
        let step = r.next_step();
        if let Some(rec) = r.step(true, None)? {
            log.push(rec);
        }
        let ev = r.take_kv_cache_events();
        if !ev.is_empty() {
            events.push((step, ev));
        }
    }
    Ok((log, events))
}
