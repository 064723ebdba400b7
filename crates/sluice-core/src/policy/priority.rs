//! Priority scheduling (vLLM's `SchedulingPolicy.PRIORITY`): the waiting
//! queue is ordered by (priority, arrival time, request id), lowest first,
//! as vLLM's `Request.__lt__`; every insert, a preempted request's
//! included, is a plain insert (there is no "front"); the running request
//! with the largest (priority, arrival time) is preempted, ties to the
//! first in running order (Python's `max`).

use super::{Policy, WaitingQueue};
use crate::request::{Request, RequestId};
use std::cmp::Ordering;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, Default)]
pub struct Priority;

impl Policy for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }

    fn new_queue(&self) -> Box<dyn WaitingQueue> {
        Box::new(PriorityQueue::default())
    }

    fn preemption_victim<'a>(&self, running: &[u32], req: &dyn Fn(u32) -> &'a Request) -> usize {
        let mut best = 0;
        for (idx, &slot) in running.iter().enumerate().skip(1) {
            let (r, b) = (req(slot), req(running[best]));
            let larger = r
                .priority
                .cmp(&b.priority)
                .then(r.arrival_time.total_cmp(&b.arrival_time))
                .is_gt();
            if larger {
                best = idx;
            }
        }
        best
    }
}

/// The priority ordering key of vLLM's `Request.__lt__`.
#[derive(Clone, Debug)]
pub struct PriorityKey {
    priority: i64,
    arrival_time: f64,
    id: RequestId,
}

impl PriorityKey {
    pub fn of(req: &Request) -> Self {
        PriorityKey {
            priority: req.priority,
            arrival_time: req.arrival_time,
            id: req.id.clone(),
        }
    }
}

impl PartialEq for PriorityKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for PriorityKey {}
impl PartialOrd for PriorityKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for PriorityKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(self.arrival_time.total_cmp(&other.arrival_time))
            .then_with(|| self.id.cmp(&other.id))
    }
}

/// Slots ordered by their requests' keys.
#[derive(Clone, Debug, Default)]
pub struct PriorityQueue(BTreeMap<PriorityKey, u32>);

impl WaitingQueue for PriorityQueue {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn add(&mut self, slot: u32, req: &Request) {
        self.0.insert(PriorityKey::of(req), slot);
    }

    fn prepend(&mut self, slot: u32, req: &Request) {
        self.0.insert(PriorityKey::of(req), slot);
    }

    fn peek(&self) -> Option<u32> {
        self.0.first_key_value().map(|(_, &s)| s)
    }

    fn pop(&mut self) -> Option<u32> {
        self.0.pop_first().map(|(_, s)| s)
    }

    fn remove(&mut self, _slot: u32, req: &Request) {
        self.0.remove(&PriorityKey::of(req));
    }

    fn rekey(&mut self, slot: u32, old_priority: i64, req: &Request) {
        let old = PriorityKey {
            priority: old_priority,
            ..PriorityKey::of(req)
        };
        if self.0.remove(&old).is_some() {
            self.0.insert(PriorityKey::of(req), slot);
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        Box::new(self.0.values().copied())
    }
}
