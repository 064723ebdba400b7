//! The discrete-event loop: the real scheduler on a virtual clock, one
//! scheduler per replica.
//!
//! Events, in time order: request arrivals (open-loop times; a later
//! conversation turn `think_time_s` after its previous turn finished; a
//! request held by `--max-concurrency` when a slot frees; a request's KV
//! reaching its decode replica under P/D disaggregation) and replica step
//! boundaries. At equal times arrivals come first, then replicas by index.
//! An arrival is routed at once (the router sees every replica as of its
//! last step boundary) and joins that replica's inbox; a replica admits its
//! inbox at its next step boundary, `schedule()`s, advances by the
//! step-time model's time for that output, and at the end of the step calls
//! `update_from_output()` with one synthetic token for every request whose
//! computed tokens reach its known tokens. An idle replica sleeps until
//! something is routed to it. Requests finish by `max_tokens =
//! output_len` with EOS ignored, so decisions depend only on lengths,
//! arrivals and the scheduler config, and a run is deterministic for its
//! inputs (routers draw from their own seeded generators).
//!
//! Promise: with one replica, the steps (and the requests admitted at
//! each) equal those of a replay of the trace that admits each request at
//! the step the simulator did (`SimResult::to_trace`), decision for
//! decision, under the FCFS policy. (Under the priority policy, requests
//! arriving at the same instant tie on arrival time and fall back to id
//! order, where a replay's synthetic arrival times keep listed order.)
//!
//! P/D disaggregation (`PdConfig`) follows vLLM's proxy: the request runs
//! first on a prefill replica with `max_tokens = 1` (its token dropped),
//! then, after the KV transfer time, on a decode replica, whose scheduler
//! counts the transferred prompt KV as computed
//! (`num_external_computed_tokens`) and recomputes only the last prompt
//! token; the client's tokens, TTFT included, come from the decode replica.

pub use crate::replica::ReplicaStats;
use crate::replica::{Phase, Replica, Routed};
use crate::router::{ReplicaView, RouteRequest, Router};
use crate::speculation::SimSpeculation;
use crate::step::StepTimeModel;
use sluice_core::block_hash::{BlockHash, BlockHasher};
use sluice_core::kv_cache::KvCacheGroupSpec;
use sluice_core::request::RequestId;
use sluice_core::trace::{Trace, TraceRequest};
use sluice_core::SchedulerConfig;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

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
    /// When the client sent it (after any `--max-concurrency` wait; for a
    /// later turn, its previous turn's finish plus the think time).
    pub arrival_s: f64,
    pub prompt_len: usize,
    pub output_len: usize,
    /// The engine step (of its replica) at whose start it was admitted.
    pub admitted_step: u64,
    /// The end of the step that produced each output token.
    pub token_times: Vec<f64>,
    pub finish_s: Option<f64>,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub num_cached_tokens: usize,
    /// The replica that produced its tokens (the decode replica under P/D).
    pub replica: usize,
    /// Under P/D: the prefill replica, and when its KV reached the decode
    /// replica.
    pub prefill_replica: Option<usize>,
    pub kv_arrival_s: Option<f64>,
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
    /// The step-time model had no measurement around this step's shape
    /// (`StepTimeModel::outside_range`): its time is extrapolated.
    pub outside_profile: bool,
}

/// A finished simulation.
#[derive(Clone, Debug, Default)]
pub struct SimResult {
    pub config: SchedulerConfig,
    pub requests: Vec<RequestTimeline>,
    /// Every replica's steps, in the order they started.
    pub steps: Vec<StepLog>,
    pub preemptions: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// The clock when the last request finished.
    pub end_s: f64,
    /// Request indices in the order they were admitted (first admission;
    /// the prefill replica's under P/D).
    pub admission_order: Vec<usize>,
    /// Per replica, by index (prefill replicas first under P/D).
    pub replicas: Vec<ReplicaStats>,
    /// Under P/D, how many of `replicas` are prefill replicas.
    pub num_prefill_replicas: usize,
}

/// Why a simulation could not run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("request {index}: {message}")]
    BadRequest { index: usize, message: String },
    #[error("the step-time model returned {0} s (must be finite and ≥ 0)")]
    BadStepTime(f64),
    #[error(
        "replica {replica} is stuck at step {step}: requests are waiting that \
         can never be scheduled (is the KV cache big enough?)"
    )]
    Stalled { replica: usize, step: u64 },
    #[error("scheduler config: {0}")]
    Config(String),
}

/// The token a request samples as its `k`-th output: synthetic and fixed,
/// so a trace of the run can script the same outputs.
pub fn output_token(request_index: usize, k: usize) -> u32 {
    ((request_index as u64 * 7919 + k as u64) % 32_000) as u32
}

/// Prefill/decode disaggregation: `prefill` replicas prefill, `decode`
/// replicas decode, and a request's KV moves between them in
/// `transfer_latency_s + prompt_len × kv_bytes_per_token ÷ link_bandwidth`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PdConfig {
    pub prefill: usize,
    pub decode: usize,
    /// KV bytes of one token, all layers (what crosses the link).
    pub kv_bytes_per_token: f64,
    /// Bytes per second between a prefill and a decode replica.
    pub link_bandwidth: f64,
    pub transfer_latency_s: f64,
}

impl PdConfig {
    pub fn transfer_s(&self, prompt_len: usize) -> f64 {
        self.transfer_latency_s + prompt_len as f64 * self.kv_bytes_per_token / self.link_bandwidth
    }
}

/// Makes a fresh router for each run (and each pool), so runs repeat.
pub type RouterFactory = Box<dyn Fn() -> Box<dyn Router>>;

/// A simulator: a scheduler config (per replica), a step-time model, and
/// how the cluster is laid out.
pub struct Simulator<M> {
    pub config: SchedulerConfig,
    pub model: M,
    pub record_schedule: bool,
    pub replicas: usize,
    router: Option<RouterFactory>,
    pub max_concurrency: Option<usize>,
    pub pd: Option<PdConfig>,
    /// Speculative decoding and the seed of its acceptances.
    pub speculation: Option<(SimSpeculation, u64)>,
    progress: Option<Box<dyn Fn(usize)>>,
}

/// A pending arrival on the event queue.
#[derive(Clone, Copy, Debug)]
enum Arrival {
    /// The client wants to send request `i` (subject to max concurrency).
    Client(usize),
    /// Request `i`'s KV reached the decode pool.
    KvReady(usize),
}

/// Min-heap entry: time, then push order (which keeps listed order for
/// simultaneous open-loop arrivals).
struct Event {
    time: f64,
    seq: u64,
    arrival: Arrival,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap.
        other
            .time
            .total_cmp(&self.time)
            .then(other.seq.cmp(&self.seq))
    }
}

/// The mutable state of one run.
struct Run<'a, M> {
    sim: &'a Simulator<M>,
    requests: &'a [SimRequest],
    timelines: Vec<RequestTimeline>,
    replicas: Vec<Replica>,
    steps: Vec<StepLog>,
    admission_order: Vec<usize>,
    events: BinaryHeap<Event>,
    seq: u64,
    /// Later turns waiting on each request, by the request they follow.
    dependents: HashMap<usize, Vec<usize>>,
    /// Requests the client holds back for `max_concurrency`.
    held: VecDeque<usize>,
    in_flight_clients: usize,
    /// The main router (the prefill pool's under P/D) and the decode pool's.
    router: Option<Box<dyn Router>>,
    decode_router: Option<Box<dyn Router>>,
    wants_hashes: bool,
    hasher: Option<BlockHasher>,
    hashes: Vec<BlockHash>,
    finished: Vec<Routed>,
    num_finished: usize,
}

impl<M: StepTimeModel> Simulator<M> {
    pub fn new(config: SchedulerConfig, model: M) -> Self {
        Simulator {
            config,
            model,
            record_schedule: false,
            replicas: 1,
            router: None,
            max_concurrency: None,
            pd: None,
            speculation: None,
            progress: None,
        }
    }

    /// Speculative decoding on every replica: drafts after each step,
    /// accepted as `spec` says, the acceptances drawn from `seed`.
    pub fn with_speculation(mut self, spec: SimSpeculation, seed: u64) -> Self {
        self.speculation = Some((spec, seed));
        self
    }

    /// Calls `report(finished requests)` every 1,000 finished requests and
    /// at the end (for a progress bar).
    pub fn with_progress(mut self, report: Box<dyn Fn(usize)>) -> Self {
        self.progress = Some(report);
        self
    }

    /// Keeps each step's (request, tokens) list in `StepLog::scheduled`.
    pub fn record_schedule(mut self, on: bool) -> Self {
        self.record_schedule = on;
        self
    }

    /// `n` identical replicas behind the routers `router` makes.
    pub fn with_replicas(mut self, n: usize, router: RouterFactory) -> Self {
        self.replicas = n;
        self.router = Some(router);
        self
    }

    /// At most `n` requests in flight from the client at once
    /// (`vllm bench serve --max-concurrency`): a request due while `n` are
    /// in flight is sent when one finishes, and its latencies count from
    /// then, as vLLM's client measures them.
    pub fn with_max_concurrency(mut self, n: Option<usize>) -> Self {
        self.max_concurrency = n;
        self
    }

    /// Prefill/decode disaggregation; the routers route within each pool.
    pub fn with_pd(mut self, pd: PdConfig, router: RouterFactory) -> Self {
        self.replicas = pd.prefill + pd.decode;
        self.pd = Some(pd);
        self.router = Some(router);
        self
    }

    fn check(&self, requests: &[SimRequest]) -> Result<(), SimError> {
        let max_len = self.config.max_model_len;
        if self.replicas == 0 {
            return Err(SimError::Config("at least one replica is needed".into()));
        }
        if self.replicas > 1 && self.router.is_none() {
            return Err(SimError::Config("several replicas need a router".into()));
        }
        if let Some(pd) = &self.pd {
            if pd.prefill == 0 || pd.decode == 0 {
                return Err(SimError::Config(
                    "P/D needs at least one prefill and one decode replica".into(),
                ));
            }
            if !(pd.link_bandwidth > 0.0 && pd.link_bandwidth.is_finite()) {
                return Err(SimError::Config(
                    "P/D: the KV link bandwidth must be positive".into(),
                ));
            }
        }
        if self.max_concurrency == Some(0) {
            return Err(SimError::Config(
                "max concurrency must be at least 1".into(),
            ));
        }
        let by_step = requests.iter().filter(|r| r.arrival_step.is_some()).count();
        if by_step > 0 && (by_step < requests.len() || self.replicas > 1) {
            return Err(SimError::Config(
                "requests that arrive by engine step (a replay trace) run alone on one \
                 replica: give every request an arrival step and use one replica"
                    .into(),
            ));
        }
        for (index, r) in requests.iter().enumerate() {
            let bad = |message: String| Err(SimError::BadRequest { index, message });
            if !r.arrival_s.is_finite() || r.arrival_s < 0.0 {
                return bad(format!("arrival_s {} must be finite and ≥ 0", r.arrival_s));
            }
            if !r.think_time_s.is_finite() || r.think_time_s < 0.0 {
                return bad(format!(
                    "think_time_s {} must be finite and ≥ 0",
                    r.think_time_s
                ));
            }
            if r.prompt.is_empty() {
                return bad("the prompt is empty".into());
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
            if let Some(a) = r.after {
                if a >= index {
                    return bad(format!(
                        "`after` is {a}: a later turn must follow an earlier request"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Runs `requests` to completion.
    pub fn run(&self, requests: &[SimRequest]) -> Result<SimResult, SimError> {
        self.check(requests)?;
        let replicas = (0..self.replicas)
            .map(|k| {
                Replica::new(k, self.config.clone())
                    .map(|r| r.with_speculation(self.speculation.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let router = self.router.as_ref().map(|f| f());
        let decode_router = self.pd.and(self.router.as_ref()).map(|f| f());
        let wants_hashes = self.config.enable_prefix_caching
            && (router.as_ref().is_some_and(|r| r.wants_block_hashes())
                || decode_router
                    .as_ref()
                    .is_some_and(|r| r.wants_block_hashes()));
        let hasher = wants_hashes.then(|| {
            // Chained at the hash block size, as the scheduler's.
            BlockHasher::new(
                self.config.prefix_caching_hash_algo,
                self.config.block_layout().1,
                self.config.hash_seed.as_deref(),
            )
        });
        let mut run = Run {
            sim: self,
            requests,
            timelines: requests
                .iter()
                .map(|r| RequestTimeline {
                    id: r.id.clone(),
                    arrival_s: r.arrival_s,
                    prompt_len: r.prompt.len(),
                    output_len: r.output_len,
                    ..RequestTimeline::default()
                })
                .collect(),
            replicas,
            steps: Vec::new(),
            admission_order: Vec::with_capacity(requests.len()),
            events: BinaryHeap::with_capacity(requests.len()),
            seq: 0,
            dependents: HashMap::new(),
            held: VecDeque::new(),
            in_flight_clients: 0,
            router,
            decode_router,
            wants_hashes,
            hasher,
            hashes: Vec::new(),
            finished: Vec::new(),
            num_finished: 0,
        };
        run.seed_arrivals();
        run.event_loop()?;
        if let Some(report) = &self.progress {
            report(run.num_finished);
        }
        Ok(run.into_result())
    }
}

impl<M: StepTimeModel> Run<'_, M> {
    fn push(&mut self, time: f64, arrival: Arrival) {
        self.events.push(Event {
            time,
            seq: self.seq,
            arrival,
        });
        self.seq += 1;
    }

    fn seed_arrivals(&mut self) {
        let requests = self.requests;
        if requests.iter().any(|r| r.arrival_step.is_some()) {
            let mut order: Vec<usize> = (0..requests.len()).collect();
            order.sort_by_key(|&i| requests[i].arrival_step.unwrap_or(0));
            self.replicas[0].step_arrivals = order.into();
            self.replicas[0].wake(0.0);
            return;
        }
        // Arrival order: time, then listed order (the sort is stable).
        let mut order: Vec<usize> = (0..requests.len())
            .filter(|&i| requests[i].after.is_none())
            .collect();
        order.sort_by(|&a, &b| requests[a].arrival_s.total_cmp(&requests[b].arrival_s));
        for i in order {
            self.push(requests[i].arrival_s, Arrival::Client(i));
        }
        for (i, r) in requests.iter().enumerate() {
            if let Some(a) = r.after {
                self.dependents.entry(a).or_default().push(i);
            }
        }
    }

    fn event_loop(&mut self) -> Result<(), SimError> {
        loop {
            let next_replica = self
                .replicas
                .iter()
                .filter_map(|r| r.wake_s.map(|t| (t, r.index)))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let next_arrival = self.events.peek().map(|e| e.time);
            match (next_arrival, next_replica) {
                (None, None) => break,
                (Some(ta), Some((tr, _))) if ta <= tr => self.arrive()?,
                (Some(_), None) => self.arrive()?,
                (_, Some((t, k))) => self.replica_event(k, t)?,
            }
        }
        if let Some(r) = self.replicas.iter().find(|r| r.has_unfinished()) {
            return Err(SimError::Stalled {
                replica: r.index,
                step: r.step,
            });
        }
        Ok(())
    }

    fn arrive(&mut self) -> Result<(), SimError> {
        let Some(e) = self.events.pop() else {
            return Ok(());
        };
        match e.arrival {
            Arrival::Client(i) => {
                if let Some(max) = self.sim.max_concurrency {
                    if self.in_flight_clients >= max {
                        self.held.push_back(i);
                        return Ok(());
                    }
                }
                self.send(i, e.time);
            }
            Arrival::KvReady(i) => {
                self.timelines[i].kv_arrival_s = Some(e.time);
                self.route(i, Phase::Decode, e.time);
            }
        }
        Ok(())
    }

    /// The client sends request `i` at `now`.
    fn send(&mut self, i: usize, now: f64) {
        self.in_flight_clients += 1;
        self.timelines[i].arrival_s = now;
        let phase = if self.sim.pd.is_some() {
            Phase::Prefill
        } else {
            Phase::Whole
        };
        self.route(i, phase, now);
    }

    fn route(&mut self, i: usize, phase: Phase, now: f64) {
        let (lo, hi) = match (&self.sim.pd, phase) {
            (Some(pd), Phase::Decode) => (pd.prefill, pd.prefill + pd.decode),
            (Some(pd), _) => (0, pd.prefill),
            (None, _) => (0, self.replicas.len()),
        };
        let router = if phase == Phase::Decode {
            self.decode_router.as_mut()
        } else {
            self.router.as_mut()
        };
        let k = match router {
            Some(router) if hi - lo > 1 => {
                self.hashes.clear();
                if let (true, Some(h)) = (self.wants_hashes, &self.hasher) {
                    h.extend(&self.requests[i].prompt, None, &mut self.hashes);
                }
                let views: Vec<&dyn ReplicaView> = self.replicas[lo..hi]
                    .iter()
                    .map(|r| r as &dyn ReplicaView)
                    .collect();
                let request = RouteRequest {
                    index: i,
                    prompt_len: self.requests[i].prompt.len(),
                    block_hashes: &self.hashes,
                };
                lo + router.route(&request, &views).min(hi - lo - 1)
            }
            _ => lo,
        };
        let replica = &mut self.replicas[k];
        replica.inbox.push(Routed { request: i, phase });
        replica.wake(now);
    }

    fn replica_event(&mut self, k: usize, now: f64) -> Result<(), SimError> {
        let replica = &mut self.replicas[k];
        if replica.is_in_flight() {
            let mut finished = std::mem::take(&mut self.finished);
            replica.finish_step(now, &mut self.timelines, &mut self.steps, &mut finished);
            for routed in finished.drain(..) {
                self.on_finished(routed, now);
            }
            self.finished = finished;
            return Ok(());
        }
        replica.start_step(
            now,
            self.requests,
            &mut self.timelines,
            &self.sim.model,
            self.sim.record_schedule,
            &mut self.steps,
            &mut self.admission_order,
        )
    }

    fn on_finished(&mut self, routed: Routed, now: f64) {
        let i = routed.request;
        if routed.phase == Phase::Prefill {
            if let Some(pd) = self.sim.pd {
                let at = now + pd.transfer_s(self.requests[i].prompt.len());
                self.push(at, Arrival::KvReady(i));
            }
            return;
        }
        self.timelines[i].finish_s = Some(now);
        self.num_finished += 1;
        if self.num_finished.is_multiple_of(1000) {
            if let Some(report) = &self.sim.progress {
                report(self.num_finished);
            }
        }
        // Saturating: replay-style requests are admitted by step, never
        // sent by the client.
        self.in_flight_clients = self.in_flight_clients.saturating_sub(1);
        if let Some(next) = self.dependents.remove(&i) {
            for d in next {
                let at = (now + self.requests[d].think_time_s).max(self.requests[d].arrival_s);
                self.push(at, Arrival::Client(d));
            }
        }
        if let Some(h) = self.held.pop_front() {
            self.send(h, now);
        }
    }

    fn into_result(self) -> SimResult {
        let end_s = self
            .timelines
            .iter()
            .filter_map(|t| t.finish_s)
            .fold(0.0, f64::max);
        let stats: Vec<ReplicaStats> = self.replicas.iter().map(|r| r.stats.clone()).collect();
        SimResult {
            config: self.sim.config.clone(),
            requests: self.timelines,
            steps: self.steps,
            preemptions: stats.iter().map(|s| s.preemptions).sum(),
            prefix_cache_queries: stats.iter().map(|s| s.prefix_cache_queries).sum(),
            prefix_cache_hits: stats.iter().map(|s| s.prefix_cache_hits).sum(),
            end_s,
            admission_order: self.admission_order,
            replicas: stats,
            num_prefill_replicas: self.sim.pd.map_or(0, |pd| pd.prefill),
        }
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
                drafts: Vec::new(),
            })
            .collect();
        Trace {
            name: "simulated".into(),
            config: self.config.clone(),
            requests: trace_requests,
            aborts: Vec::new(),
            max_steps: self.steps.len() as u64 + 1,
            // Groups beyond the one full-attention group are the config's;
            // a log of several lists per request only then.
            grouped: self.config.kv_cache_groups != [KvCacheGroupSpec::FULL],
        }
    }
}
