//! Scheduling policies: who waits first and who is preempted.
//!
//! A policy makes exactly two decisions (vLLM's `SchedulingPolicy` and the
//! two places its scheduler reads it): the order of the waiting queue
//! ([`Policy::new_queue`], a [`WaitingQueue`]) and which running request
//! is preempted when the KV pool runs short ([`Policy::preemption_victim`]).
//! Everything else in a step is the same under every policy.
//!
//! `fcfs.rs` and `priority.rs` are vLLM's two; a third is one more file
//! implementing [`Policy`], handed to `Scheduler::with_policy`.

mod fcfs;
mod priority;

pub use fcfs::{Fcfs, FcfsQueue};
pub use priority::{Priority, PriorityKey, PriorityQueue};

use crate::config::SchedulingPolicy;
use crate::request::Request;
use std::fmt::Debug;

/// The waiting queue's order. Entries are scheduler slots; the queue reads
/// whatever keys it orders by from the request passed in.
pub trait WaitingQueue: Debug + Send {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds an arrival.
    fn add(&mut self, slot: u32, req: &Request);

    /// Puts a preempted (or skipped) request back: its policy's "front".
    fn prepend(&mut self, slot: u32, req: &Request);

    /// The request to admit next.
    fn peek(&self) -> Option<u32>;

    fn pop(&mut self) -> Option<u32>;

    /// Removes one request (`req` as it was queued), keeping the others'
    /// order.
    fn remove(&mut self, slot: u32, req: &Request);

    /// Moves a waiting request to where its new priority puts it: `req` is
    /// the request as it is now, `old_priority` its priority when queued.
    fn rekey(&mut self, slot: u32, old_priority: i64, req: &Request);

    /// Slots in queue order.
    fn iter(&self) -> Box<dyn Iterator<Item = u32> + '_>;
}

/// A scheduling policy (see the module docs).
pub trait Policy: Debug + Send {
    /// The name `--scheduling-policy` and logs use.
    fn name(&self) -> &'static str;

    /// An empty waiting queue in this policy's order.
    fn new_queue(&self) -> Box<dyn WaitingQueue>;

    /// The index in `running` (never empty) of the request to preempt;
    /// `req` reads a running slot's request.
    fn preemption_victim<'a>(&self, running: &[u32], req: &dyn Fn(u32) -> &'a Request) -> usize;
}

/// The policy a configuration names.
pub fn from_config(policy: SchedulingPolicy) -> Box<dyn Policy> {
    match policy {
        SchedulingPolicy::Fcfs => Box::new(Fcfs),
        SchedulingPolicy::Priority => Box::new(Priority),
    }
}
