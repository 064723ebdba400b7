//! Small helpers that build a scheduler in one line and step it with a
//! scripted model, so scenarios read like the worked examples of
//! `docs/scheduler-semantics.md`.
#![allow(dead_code)]

use sluice_core::{
    ModelRunnerOutput, NewRequest, RequestStatus, SamplingParams, Scheduler, SchedulerConfig,
    SchedulerOutput, SchedulingPolicy,
};

pub fn config(block_size: usize, num_gpu_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size,
        num_gpu_blocks,
        max_num_batched_tokens: 1024,
        max_num_seqs: 16,
        max_model_len: 4096,
        enable_chunked_prefill: true,
        enable_prefix_caching: false,
        long_prefill_token_threshold: 0,
        policy: SchedulingPolicy::Fcfs,
        ..SchedulerConfig::default()
    }
}

pub fn sched(cfg: SchedulerConfig) -> Scheduler {
    Scheduler::new(cfg).expect("valid config")
}

/// Adds a request with `prompt` and greedy params producing `max_tokens`.
pub fn add(s: &mut Scheduler, id: &str, prompt: Vec<u32>, max_tokens: usize) {
    s.add_request(NewRequest::new(
        id,
        prompt,
        SamplingParams::greedy(max_tokens),
    ))
    .expect("valid request");
}

pub fn add_prio(
    s: &mut Scheduler,
    id: &str,
    prompt: Vec<u32>,
    max_tokens: usize,
    priority: i64,
    arrival: f64,
) {
    let mut r = NewRequest::new(id, prompt, SamplingParams::greedy(max_tokens));
    r.priority = priority;
    r.arrival_time = arrival;
    s.add_request(r).expect("valid request");
}

/// Runs the scripted model (every request that reaches its known tokens
/// samples `token`) and applies its output. Returns the step's output.
pub fn step_with(s: &mut Scheduler, token: u32) -> SchedulerOutput {
    let out = s.schedule();
    let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
    for e in &out.num_scheduled_tokens {
        let r = s.request(e.handle).expect("scheduled request is live");
        if r.num_computed_tokens() >= r.num_tokens() {
            mro.push(&[token]);
        } else {
            mro.push(&[]);
        }
    }
    s.update_from_output(&out, &mro);
    out
}

pub fn step(s: &mut Scheduler) -> SchedulerOutput {
    step_with(s, 1)
}

/// `(id, tokens)` pairs of a step, in scheduling order.
pub fn plan(out: &SchedulerOutput) -> Vec<(String, usize)> {
    out.num_scheduled_tokens
        .iter()
        .map(|e| (e.req_id.to_string(), e.num_tokens))
        .collect()
}

pub fn ids(v: &[sluice_core::RequestId]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

pub fn p(v: &[(&str, usize)]) -> Vec<(String, usize)> {
    v.iter().map(|(a, n)| (a.to_string(), *n)).collect()
}

pub fn prompt(start: u32, len: u32) -> Vec<u32> {
    (start..start + len).collect()
}

pub fn abort(s: &mut Scheduler, id: &str) -> Vec<String> {
    ids(&s.finish_requests(&[id], RequestStatus::FinishedAborted))
}
