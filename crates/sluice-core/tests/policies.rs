//! The scheduling-policy seam with a third policy written here (shortest
//! prompt first: the waiting queue ordered by prompt length, the running
//! request with the longest prompt preempted), and the priority queue's
//! re-keying of a waiting request. Expected orders are worked out by hand.

use sluice_core::invariants::{check_state, Phase};
use sluice_core::policy::{Policy, WaitingQueue};
use sluice_core::request::NewRequest;
use sluice_core::{
    ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig, SchedulingPolicy,
};
use std::collections::BTreeMap;

#[derive(Debug)]
struct ShortestPromptFirst;

/// (prompt length, arrival order) → slot.
#[derive(Debug, Default)]
struct ByLength {
    queue: BTreeMap<(usize, u64), u32>,
    arrivals: u64,
    keys: BTreeMap<u32, (usize, u64)>,
}

impl WaitingQueue for ByLength {
    fn len(&self) -> usize {
        self.queue.len()
    }
    fn add(&mut self, slot: u32, req: &Request) {
        self.arrivals += 1;
        let key = (req.num_prompt_tokens(), self.arrivals);
        self.queue.insert(key, slot);
        self.keys.insert(slot, key);
    }
    fn prepend(&mut self, slot: u32, req: &Request) {
        self.add(slot, req);
    }
    fn peek(&self) -> Option<u32> {
        self.queue.values().next().copied()
    }
    fn pop(&mut self) -> Option<u32> {
        let (_, slot) = self.queue.pop_first()?;
        self.keys.remove(&slot);
        Some(slot)
    }
    fn remove(&mut self, slot: u32, _req: &Request) {
        if let Some(key) = self.keys.remove(&slot) {
            self.queue.remove(&key);
        }
    }
    fn rekey(&mut self, _slot: u32, _old_priority: i64, _req: &Request) {}
    fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        Box::new(self.queue.values().copied())
    }
}

impl Policy for ShortestPromptFirst {
    fn name(&self) -> &'static str {
        "shortest-prompt-first"
    }
    fn new_queue(&self) -> Box<dyn WaitingQueue> {
        Box::new(ByLength::default())
    }
    fn preemption_victim<'a>(&self, running: &[u32], req: &dyn Fn(u32) -> &'a Request) -> usize {
        let mut best = 0;
        for (i, &slot) in running.iter().enumerate() {
            if req(slot).num_prompt_tokens() > req(running[best]).num_prompt_tokens() {
                best = i;
            }
        }
        best
    }
}

fn add(s: &mut Scheduler, id: &str, len: usize, max_tokens: usize, priority: i64) {
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    };
    let prompt = (0..len as u32).map(|t| t + 1000 * len as u32).collect();
    let mut new = NewRequest::new(id, prompt, params);
    new.priority = priority;
    s.add_request(new).unwrap();
}

/// One step with every sampling row given token 7; returns the ids
/// scheduled, in order.
fn step(s: &mut Scheduler) -> (Vec<String>, Vec<String>) {
    let out = s.schedule();
    check_state(s, Phase::AfterSchedule).unwrap();
    let ids = out
        .num_scheduled_tokens
        .iter()
        .map(|r| r.req_id.to_string())
        .collect();
    let preempted = out
        .preempted_req_ids
        .iter()
        .map(|r| r.to_string())
        .collect();
    let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
    for r in &out.num_scheduled_tokens {
        let req = s.request(r.handle).unwrap();
        if req.num_computed_tokens() >= req.num_tokens() {
            mro.push(&[7]);
        } else {
            mro.push(&[]);
        }
    }
    s.update_from_output(&out, &mro);
    check_state(s, Phase::AfterUpdate).unwrap();
    (ids, preempted)
}

#[test]
fn a_third_policy_orders_admission_and_chooses_the_victim() {
    // 8 usable blocks of 4 tokens, three seats.
    let config = SchedulerConfig {
        num_gpu_blocks: 9,
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 3,
        max_model_len: 64,
        enable_prefix_caching: false,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::with_policy(config, Box::new(ShortestPromptFirst)).unwrap();
    add(&mut s, "long", 11, 20, 0);
    add(&mut s, "mid", 6, 20, 0);
    // Alone, "mid" goes before "long"; one seat is left for the others.
    assert_eq!(step(&mut s).0, ["mid", "long"]);
    add(&mut s, "short", 3, 20, 0);
    add(&mut s, "tiny", 2, 20, 0);
    let (ids, _) = step(&mut s);
    // Running first (mid, long), then admission by prompt length: tiny.
    assert_eq!(ids, ["mid", "long", "tiny"]);
    // Decoding fills blocks until the pool runs short. The victim is the
    // running request with the longest prompt, "long" — not the running
    // tail "tiny" that FCFS would preempt.
    let mut first_victim = None;
    for _ in 0..40 {
        let (_, preempted) = step(&mut s);
        if let Some(v) = preempted.first() {
            first_victim = Some(v.clone());
            break;
        }
    }
    assert_eq!(first_victim.as_deref(), Some("long"));
}

#[test]
fn a_waiting_request_moves_when_its_priority_changes() {
    let config = SchedulerConfig {
        num_gpu_blocks: 64,
        block_size: 4,
        max_num_seqs: 1,
        policy: SchedulingPolicy::Priority,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config).unwrap();
    add(&mut s, "a", 4, 1, 0);
    add(&mut s, "b", 4, 1, 5);
    add(&mut s, "c", 4, 1, 9);
    // "c" is raised above everyone (lower is first) while it waits.
    assert!(s.set_request_priority("c", -1));
    assert!(!s.set_request_priority("nobody", 0));
    let mut order = Vec::new();
    for _ in 0..6 {
        let (ids, _) = step(&mut s);
        order.extend(ids);
    }
    assert_eq!(order, ["c", "a", "b"]);
}

#[test]
fn under_fcfs_a_new_priority_keeps_the_arrival_order() {
    let config = SchedulerConfig {
        num_gpu_blocks: 64,
        block_size: 4,
        max_num_seqs: 1,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config).unwrap();
    add(&mut s, "a", 4, 1, 0);
    add(&mut s, "b", 4, 1, 0);
    assert!(s.set_request_priority("b", -10));
    let mut order = Vec::new();
    for _ in 0..4 {
        order.extend(step(&mut s).0);
    }
    assert_eq!(order, ["a", "b"]);
}
