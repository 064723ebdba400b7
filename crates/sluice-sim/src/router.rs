//! Routers: which replica of a cluster gets an arriving request.
//!
//! A router sees each replica through `ReplicaView` (its load as of its
//! last step boundary, and what its prefix cache holds) and the request's
//! block hashes, and returns a replica index. Each policy is one type
//! implementing `Router`; `RouterKind` names them for the CLI
//! (`sluice simulate --router NAME`).
//!
//! Promises: every router returns an index below `replicas.len()`, is
//! deterministic for its seed and inputs, and does O(replicas) work per
//! call (`PrefixAware`'s pending window adds O(window × shared prefix))
//! without allocating once warm (the pending window allocates only while
//! it fills). Ties always break the same documented way.
//!
//! "Requests" of a replica below means running + waiting (its queue
//! depth). A router only sees what the view says: if requests routed to a
//! replica but not yet admitted by its scheduler are not counted in
//! `num_waiting`, load-based policies herd a burst onto one replica.
//!
//! ## Prefix-aware routing and what the view knows
//!
//! `PrefixAware` follows llm-d's precise prefix-cache scorer: that scorer
//! keeps an index of the blocks each pod holds, fed by the engine's KV
//! events (vLLM publishes `BlockStored` when it registers a full block in
//! its prefix cache, `BlockRemoved` when it evicts one), and scores a pod
//! by the number of consecutive leading block keys of the request it holds
//! (the chain stops at the first missing block). Here
//! `ReplicaView::cached_prefix_blocks` is that count, read from the
//! replica's real prefix cache at its last step boundary, i.e. a KV-event
//! view with no event latency. The scheduler registers a request's full
//! blocks when it schedules them (as vLLM does, before the forward pass),
//! so a request being prefilled contributes the blocks of the chunks
//! scheduled so far; a request routed but still waiting contributes
//! nothing. A burst of same-prefix requests that arrive before the first
//! of them is scheduled therefore all see no hit and spread by load.
//!
//! llm-d closes that blind spot with optional *speculative indexing*
//! (off by default): right after routing it adds the request's block keys
//! to the index for the chosen pod, with a time-to-live (30 s by default)
//! after which the speculative entries are dropped. `PrefixAware` can do
//! the same with a *pending window* (off by default, as in llm-d): it
//! remembers the block hashes of the last K requests it routed and where,
//! and takes a replica's prefix as the longer of what its cache holds and
//! what a remembered request routed there shares with this one. A window
//! of routings stands in for llm-d's TTL because a router is not told the
//! time. Remembered entries never see evictions; the window bounds how
//! stale they get.
//!
//! llm-d combines the prefix score with load scorers by weighted sum;
//! `PrefixAware` instead orders lexicographically: longest prefix, then
//! fewest requests, then lowest index.

use crate::workload::Rng;
use sluice_core::block_hash::BlockHash;
use std::fmt;
use std::str::FromStr;

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

/// Running + waiting: a replica's queue depth.
fn requests(r: &dyn ReplicaView) -> usize {
    r.num_running() + r.num_waiting()
}

/// Cycles through the replicas in order, one per call.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    pub fn new() -> Self {
        RoundRobin::default()
    }
}

impl Router for RoundRobin {
    fn route(&mut self, _request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize {
        // Reduced modulo the current count, so a shrinking list stays in range.
        let i = self.next % replicas.len().max(1);
        self.next = i + 1;
        i
    }
}

/// A uniformly random replica from a seeded stream.
#[derive(Clone, Debug)]
pub struct Random {
    rng: Rng,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Random {
            rng: Rng::new(seed),
        }
    }
}

impl Router for Random {
    fn route(&mut self, _request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize {
        self.rng
            .range_inclusive(0, replicas.len().saturating_sub(1))
    }
}

/// The replica with the fewest requests (running + waiting); ties go to
/// the lowest index.
#[derive(Clone, Debug, Default)]
pub struct LeastRequests;

impl Router for LeastRequests {
    fn route(&mut self, _request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize {
        let mut best = (usize::MAX, 0);
        for (i, r) in replicas.iter().enumerate() {
            let key = requests(*r);
            if key < best.0 {
                best = (key, i);
            }
        }
        best.1
    }
}

/// The replica with the lowest KV cache usage; ties go to fewer requests,
/// then the lowest index.
#[derive(Clone, Debug, Default)]
pub struct LeastKv;

impl Router for LeastKv {
    fn route(&mut self, _request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize {
        let mut best: Option<(f64, usize, usize)> = None;
        for (i, r) in replicas.iter().enumerate() {
            let (kv, n) = (r.kv_usage(), requests(*r));
            let better = match best {
                None => true,
                // total_cmp: a deterministic order even for a NaN usage.
                Some((bkv, bn, _)) => kv.total_cmp(&bkv).then(n.cmp(&bn)).is_lt(),
            };
            if better {
                best = Some((kv, n, i));
            }
        }
        best.map_or(0, |b| b.2)
    }
}

/// The power of two choices: two distinct replicas drawn uniformly from a
/// seeded stream, and the one with fewer requests; a tie goes to the first
/// drawn (so equal loads spread uniformly). With one replica, 0.
#[derive(Clone, Debug)]
pub struct PowerOfTwo {
    rng: Rng,
}

impl PowerOfTwo {
    pub fn new(seed: u64) -> Self {
        PowerOfTwo {
            rng: Rng::new(seed),
        }
    }

    /// Two distinct indices below `n` (n ≥ 2), uniform over ordered pairs.
    fn sample(&mut self, n: usize) -> (usize, usize) {
        let a = self.rng.range_inclusive(0, n - 1);
        let mut b = self.rng.range_inclusive(0, n - 2);
        if b >= a {
            b += 1;
        }
        (a, b)
    }
}

impl Router for PowerOfTwo {
    fn route(&mut self, _request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize {
        if replicas.len() < 2 {
            return 0;
        }
        let (a, b) = self.sample(replicas.len());
        if requests(replicas[b]) < requests(replicas[a]) {
            b
        } else {
            a
        }
    }
}

/// One remembered routing of `PrefixAware`'s pending window.
#[derive(Clone, Debug, Default)]
struct Pending {
    replica: usize,
    hashes: Vec<BlockHash>,
}

/// The replica holding the longest cached prefix of the request's blocks;
/// ties go to the fewest requests, then the lowest index (see the module
/// doc for what "cached" covers and the optional pending window).
#[derive(Clone, Debug, Default)]
pub struct PrefixAware {
    window: usize,
    /// A ring of the last `window` routings; `next` is the slot to reuse.
    pending: Vec<Pending>,
    next: usize,
    /// Per-replica longest pending prefix, reused between calls.
    scratch: Vec<usize>,
}

impl PrefixAware {
    /// Prefix from the replicas' caches only (llm-d's default).
    pub fn new() -> Self {
        PrefixAware::default()
    }

    /// Also counts the blocks of the last `window` requests it routed, as
    /// if already cached where they went (llm-d's speculative indexing,
    /// by count instead of TTL); 0 turns it off.
    pub fn with_pending_window(window: usize) -> Self {
        PrefixAware {
            window,
            ..PrefixAware::default()
        }
    }

    pub fn pending_window(&self) -> usize {
        self.window
    }

    fn remember(&mut self, replica: usize, hashes: &[BlockHash]) {
        if self.window == 0 || hashes.is_empty() {
            return;
        }
        if self.pending.len() < self.window {
            self.pending.push(Pending {
                replica,
                hashes: hashes.to_vec(),
            });
        } else {
            // Reuses the slot's buffer: no allocation once it is big enough.
            let slot = &mut self.pending[self.next];
            slot.replica = replica;
            slot.hashes.clear();
            slot.hashes.extend_from_slice(hashes);
            self.next = (self.next + 1) % self.window;
        }
    }
}

/// Leading blocks `a` and `b` share.
fn common_prefix(a: &[BlockHash], b: &[BlockHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Router for PrefixAware {
    fn wants_block_hashes(&self) -> bool {
        true
    }

    fn route(&mut self, request: &RouteRequest<'_>, replicas: &[&dyn ReplicaView]) -> usize {
        let hashes = request.block_hashes;
        let pending_on = self.window > 0 && !self.pending.is_empty() && !hashes.is_empty();
        if pending_on {
            self.scratch.clear();
            self.scratch.resize(replicas.len(), 0);
            for p in &self.pending {
                if let Some(best) = self.scratch.get_mut(p.replica) {
                    *best = (*best).max(common_prefix(&p.hashes, hashes));
                }
            }
        }
        let mut best: Option<(usize, usize, usize)> = None;
        for (i, r) in replicas.iter().enumerate() {
            let mut prefix = if hashes.is_empty() {
                0
            } else {
                r.cached_prefix_blocks(hashes)
            };
            if pending_on {
                prefix = prefix.max(self.scratch[i]);
            }
            let n = requests(*r);
            let better = match best {
                None => true,
                Some((bp, bn, _)) => prefix > bp || (prefix == bp && n < bn),
            };
            if better {
                best = Some((prefix, n, i));
            }
        }
        let chosen = best.map_or(0, |b| b.2);
        self.remember(chosen, hashes);
        chosen
    }
}

/// The routing policies by their CLI names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouterKind {
    RoundRobin,
    Random,
    LeastRequests,
    LeastKv,
    PowerOfTwo,
    PrefixAware,
}

impl RouterKind {
    /// Every policy, in the order the CLI lists them.
    pub const ALL: [RouterKind; 6] = [
        RouterKind::RoundRobin,
        RouterKind::Random,
        RouterKind::LeastRequests,
        RouterKind::LeastKv,
        RouterKind::PowerOfTwo,
        RouterKind::PrefixAware,
    ];

    /// The CLI name (`round-robin`, `least-kv`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RouterKind::RoundRobin => "round-robin",
            RouterKind::Random => "random",
            RouterKind::LeastRequests => "least-requests",
            RouterKind::LeastKv => "least-kv",
            RouterKind::PowerOfTwo => "power-of-two",
            RouterKind::PrefixAware => "prefix-aware",
        }
    }

    /// A fresh router of this kind; `seed` feeds the random ones.
    /// `prefix-aware` is built without a pending window (llm-d's default).
    pub fn build(self, seed: u64) -> Box<dyn Router> {
        match self {
            RouterKind::RoundRobin => Box::new(RoundRobin::new()),
            RouterKind::Random => Box::new(Random::new(seed)),
            RouterKind::LeastRequests => Box::new(LeastRequests),
            RouterKind::LeastKv => Box::new(LeastKv),
            RouterKind::PowerOfTwo => Box::new(PowerOfTwo::new(seed)),
            RouterKind::PrefixAware => Box::new(PrefixAware::new()),
        }
    }
}

impl fmt::Display for RouterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--router` value that names no policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown router `{0}`; expected one of: round-robin, random, least-requests, least-kv, power-of-two, prefix-aware")]
pub struct UnknownRouter(pub String);

impl FromStr for RouterKind {
    type Err = UnknownRouter;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RouterKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownRouter(s.to_string()))
    }
}
