//! First come, first served (vLLM's `SchedulingPolicy.FCFS`): arrivals
//! queue at the tail, a preempted request goes back to the head (so
//! victims return in their original order), and the running tail — the
//! latest admitted — is the one preempted.

use super::{Policy, WaitingQueue};
use crate::request::Request;
use std::collections::VecDeque;

#[derive(Clone, Copy, Debug, Default)]
pub struct Fcfs;

impl Policy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }

    fn new_queue(&self) -> Box<dyn WaitingQueue> {
        Box::new(FcfsQueue::default())
    }

    fn preemption_victim<'a>(&self, running: &[u32], _req: &dyn Fn(u32) -> &'a Request) -> usize {
        running.len() - 1
    }
}

/// A deque of slots.
#[derive(Clone, Debug, Default)]
pub struct FcfsQueue(VecDeque<u32>);

impl WaitingQueue for FcfsQueue {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn add(&mut self, slot: u32, _req: &Request) {
        self.0.push_back(slot);
    }

    fn prepend(&mut self, slot: u32, _req: &Request) {
        self.0.push_front(slot);
    }

    fn peek(&self) -> Option<u32> {
        self.0.front().copied()
    }

    fn pop(&mut self) -> Option<u32> {
        self.0.pop_front()
    }

    fn remove(&mut self, slot: u32, _req: &Request) {
        if let Some(pos) = self.0.iter().position(|&s| s == slot) {
            self.0.remove(pos);
        }
    }

    /// Arrival order has no keys to change.
    fn rekey(&mut self, _slot: u32, _old_priority: i64, _req: &Request) {}

    fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        Box::new(self.0.iter().copied())
    }
}
