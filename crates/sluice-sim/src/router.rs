//! Routers: which replica of a cluster gets an arriving request.
//!
//! A router sees each replica through `ReplicaView` (its load as of its
//! last step boundary, and what its prefix cache holds) and the request's
//! block hashes, and returns a replica index. Each policy is one type
//! implementing `Router`; `RouterKind` names them for the CLI.
//!
//! (Interface fixed here; the policies are filled in by the router work.)

use sluice_core::block_hash::BlockHash;

/// What a router may know of one replica.
pub trait ReplicaView {
    /// Requests running on the replica.
    fn num_running(&self) -> usize;
    /// Requests waiting on the replica (routed but not yet running).
    fn num_waiting(&self) -> usize;
    /// KV cache usage, 0..1.
    fn kv_usage(&self) -> f64;
    /// How many leading blocks of `hashes` its prefix cache holds.
    fn cached_prefix_blocks(&self, hashes: &[BlockHash]) -> usize;
}

/// The request being routed.
pub struct RouteRequest<'a> {
    pub index: usize,
    pub prompt_len: usize,
    /// The prompt's full-block hashes, chained as the scheduler computes
    /// them (empty when prefix caching is off).
    pub block_hashes: &'a [BlockHash],
}

/// A routing policy.
pub trait Router {
    /// The replica (an index into `replicas`, which is never empty) that
    /// gets `request`.
    fn route(&mut self, request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize;

    /// Whether `route` reads `RouteRequest::block_hashes` (hashing every
    /// prompt costs; only prefix-aware routing needs it).
    fn wants_block_hashes(&self) -> bool {
        false
    }
}
