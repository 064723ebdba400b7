//! Waiting queues: FCFS (a deque) and priority (an ordered set).
//!
//! Entries are scheduler slots. Under FCFS, preemption prepends, so victims
//! go back to the head in their original order. Under priority, every insert
//! (prepend included) is a plain insert ordered by (priority, arrival time,
//! request id); there is no "front" for preempted requests.

use crate::config::SchedulingPolicy;
use crate::request::{Request, RequestId};
use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};

/// The priority ordering key of vLLM's `Request.__lt__`.
#[derive(Clone, Debug)]
pub struct PriorityKey {
    priority: i64,
    arrival_time: f64,
    id: RequestId,
}

impl PriorityKey {
    fn of(req: &Request) -> Self {
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

#[derive(Clone, Debug)]
pub enum RequestQueue {
    Fcfs(VecDeque<u32>),
    Priority(BTreeMap<PriorityKey, u32>),
}

impl RequestQueue {
    pub fn new(policy: SchedulingPolicy) -> Self {
        match policy {
            SchedulingPolicy::Fcfs => RequestQueue::Fcfs(VecDeque::new()),
            SchedulingPolicy::Priority => RequestQueue::Priority(BTreeMap::new()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            RequestQueue::Fcfs(q) => q.len(),
            RequestQueue::Priority(q) => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds an arrival: the tail under FCFS.
    pub fn add(&mut self, slot: u32, req: &Request) {
        match self {
            RequestQueue::Fcfs(q) => q.push_back(slot),
            RequestQueue::Priority(q) => {
                q.insert(PriorityKey::of(req), slot);
            }
        }
    }

    /// Puts a request back in front: the head under FCFS.
    pub fn prepend(&mut self, slot: u32, req: &Request) {
        match self {
            RequestQueue::Fcfs(q) => q.push_front(slot),
            RequestQueue::Priority(q) => {
                q.insert(PriorityKey::of(req), slot);
            }
        }
    }

    pub fn peek(&self) -> Option<u32> {
        match self {
            RequestQueue::Fcfs(q) => q.front().copied(),
            RequestQueue::Priority(q) => q.first_key_value().map(|(_, &s)| s),
        }
    }

    pub fn pop(&mut self) -> Option<u32> {
        match self {
            RequestQueue::Fcfs(q) => q.pop_front(),
            RequestQueue::Priority(q) => q.pop_first().map(|(_, s)| s),
        }
    }

    /// Removes one request, keeping the others' order.
    pub fn remove(&mut self, slot: u32, req: &Request) {
        match self {
            RequestQueue::Fcfs(q) => {
                if let Some(pos) = q.iter().position(|&s| s == slot) {
                    q.remove(pos);
                }
            }
            RequestQueue::Priority(q) => {
                q.remove(&PriorityKey::of(req));
            }
        }
    }

    /// Slots in queue order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            RequestQueue::Fcfs(q) => Box::new(q.iter().copied()),
            RequestQueue::Priority(q) => Box::new(q.values().copied()),
        }
    }
}
