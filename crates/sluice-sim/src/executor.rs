//! `SimulatedExecutor`: the model replaced by a step-time model, for
//! `sluice serve --executor simulated` — the real server, engine loop and
//! scheduler, with each forward pass a sleep of the time a
//! [`StepTimeModel`] predicts for it. It implements sluice-core's
//! `Executor`, so the engine drives it without depending on this crate.
//!
//! Per step it builds the step's `StepShape` from the `SchedulerOutput`
//! alone (`ShapeTracker`, which equals the scheduler's own view), asks the
//! model for the step's time, sleeps until the step start plus that time,
//! and returns one token for every row that samples.
//!
//! - The step start is the engine's (`Executor::begin_step`, called before
//!   `schedule()`), so scheduling and bookkeeping count inside the
//!   predicted time instead of on top of it; without that call, the start
//!   of `execute()`. A step that is already late does not sleep.
//!   Steps that schedule no token do not sleep.
//! - Tokens: uniform over `[0, vocab_size)`, never one of the excluded ids
//!   (the model's EOS ids) nor the request's own EOS / stop token ids, so a
//!   request ends at `max_tokens` (as llm-d-inference-sim's random mode
//!   does) unless a stop string happens to match the random text. A
//!   structured-output request samples uniformly among the tokens its
//!   grammar bitmask allows (its stop ids only when nothing else is
//!   allowed), so it ends when its grammar does.
//! - Deterministic per request: each request's generator is seeded from the
//!   executor's seed and the request's `seed` when it has one, else its
//!   engine id (the engine numbers requests in arrival order).
//! - Logprobs: a request that asks for them gets the sampled token with
//!   the uniform distribution's logprob, rank 1, as its only top entry;
//!   prompt logprobs are not produced.
//! - Steps outside the model's measured range
//!   (`StepTimeModel::outside_range`, a table profile's grid) are counted
//!   (`steps_outside_range`) and reported through the warning hook
//!   (`with_outside_range_warning`) at the 1st, 2nd, 4th, 8th, … such
//!   step: a server runs without end, so a report at exit would come too
//!   late and one per step would flood the log.

use crate::speculation::SimSpeculation;
use crate::step::{RowShape, ShapeTracker, StepShape, StepTimeModel};
use crate::workload::Rng;
use anyhow::{anyhow, bail, Result};
use sluice_core::kv_cache::KvCacheGroupSpec;
use sluice_core::{
    DraftTokenIds, Executor, ModelRunnerOutput, RequestId, SampleLogprobs, SchedulerOutput,
    TokenId, TokenLogprob,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Where a simulated executor reports (the server's log).
pub type Warning = Box<dyn Fn(&str) + Send>;

/// Below this much time left, the executor yields instead of sleeping:
/// `thread::sleep` overshoots by tens of microseconds or more.
const SPIN: Duration = Duration::from_micros(200);

struct SimRequest {
    rng: Rng,
    /// The request's EOS and stop ids, with the executor's excluded ids:
    /// sorted, deduplicated, all below the vocabulary size.
    banned: Vec<TokenId>,
    logprobs: Option<usize>,
}

/// A fake model that takes the time a step-time model says (see the module
/// docs).
pub struct SimulatedExecutor {
    model: Box<dyn StepTimeModel + Send>,
    num_kv_blocks: usize,
    vocab_size: usize,
    seed: u64,
    excluded: Vec<TokenId>,
    block_size: usize,
    /// The model's KV cache groups, what the engine gives the scheduler.
    kv_cache_groups: Vec<KvCacheGroupSpec>,
    tracker: ShapeTracker,
    reqs: HashMap<RequestId, SimRequest>,
    /// When the engine began the current step (`begin_step`), if it said.
    step_started: Option<Instant>,
    predicted_s: f64,
    steps: u64,
    /// Speculative decoding (`with_speculation`).
    speculation: Option<SimSpeculation>,
    /// The requests that sampled in the last step, and its batch size.
    sampled: Vec<RequestId>,
    last_batch: usize,
    /// Steps whose shape lay outside the model's measured range.
    outside: u64,
    warn_outside: Option<Warning>,
}

impl SimulatedExecutor {
    /// A pool of `num_kv_blocks` blocks (null block included) of
    /// `block_size` tokens, tokens drawn from `[0, vocab_size)`, generators
    /// seeded from `seed`.
    pub fn new(
        model: Box<dyn StepTimeModel + Send>,
        num_kv_blocks: usize,
        block_size: usize,
        vocab_size: usize,
        seed: u64,
    ) -> Self {
        // Block tables are tracked only for a model that prices shared
        // prefixes (the cost of a pass over them every step).
        let tracked = if model.prices_shared_context() {
            block_size
        } else {
            0
        };
        SimulatedExecutor {
            tracker: ShapeTracker::with_block_size(tracked),
            model,
            num_kv_blocks,
            vocab_size,
            seed,
            excluded: Vec::new(),
            block_size,
            kv_cache_groups: vec![KvCacheGroupSpec::FULL],
            reqs: HashMap::new(),
            step_started: None,
            predicted_s: 0.0,
            steps: 0,
            speculation: None,
            sampled: Vec::new(),
            last_batch: 0,
            outside: 0,
            warn_outside: None,
        }
    }

    /// Where to report steps outside the model's measured range (see the
    /// module docs); unreported unless set.
    pub fn with_outside_range_warning(mut self, warn: Warning) -> Self {
        self.warn_outside = Some(warn);
        self
    }

    /// Steps run so far whose shape lay outside the model's measured range.
    pub fn steps_outside_range(&self) -> u64 {
        self.outside
    }

    /// Counts `shape` if it lies outside the model's range, and reports at
    /// each power-of-two count.
    fn account_range(&mut self, shape: &StepShape) {
        if !self.model.outside_range(shape) {
            return;
        }
        self.outside += 1;
        if let (true, Some(warn)) = (self.outside.is_power_of_two(), &self.warn_outside) {
            let (prefill, decode): (Vec<&RowShape>, Vec<&RowShape>) =
                shape.rows.iter().partition(|r| !r.is_decode());
            warn(&format!(
                "simulated executor: {} of {} steps so far were outside the profile's measured \
                 grid, their times extrapolated; the latest: {} prefill tokens in {} rows, {} \
                 decode rows, {} context tokens",
                self.outside,
                self.steps,
                prefill.iter().map(|r| r.new_tokens).sum::<usize>(),
                prefill.len(),
                decode.len(),
                shape.rows.iter().map(|r| r.context_before).sum::<usize>(),
            ));
        }
    }

    /// Speculative decoding: after each step every request that sampled
    /// gets `spec`'s k drafts (random tokens from its own generator), and a
    /// verified run of drafts is accepted as `spec`'s rates say; the
    /// step-time model sees each verification as a row of k + 1 tokens.
    pub fn with_speculation(mut self, spec: SimSpeculation) -> Self {
        self.speculation = Some(spec);
        self
    }

    /// Tokens never sampled for any request (the model's EOS ids).
    pub fn with_excluded_tokens(mut self, ids: impl IntoIterator<Item = TokenId>) -> Self {
        self.excluded = ids.into_iter().collect();
        self
    }

    /// The simulated model's KV cache groups (a hybrid model's sliding
    /// groups beside its full one), which the engine hands the scheduler;
    /// one full group unless set.
    pub fn with_kv_cache_groups(mut self, groups: Vec<KvCacheGroupSpec>) -> Self {
        self.kv_cache_groups = groups;
        self
    }

    /// Σ of the predicted times of the steps run so far (seconds).
    pub fn predicted_seconds(&self) -> f64 {
        self.predicted_s
    }

    /// Steps run so far.
    pub fn num_steps(&self) -> u64 {
        self.steps
    }

    /// The engine began a step at `t`.
    fn begin_step_at(&mut self, t: Instant) {
        self.step_started = Some(t);
    }

    /// When this step started: the engine's mark if it marked this step,
    /// else `entered` (a mark is used once).
    fn step_start(&mut self, entered: Instant) -> Instant {
        match self.step_started.take() {
            Some(marked) if marked <= entered => marked,
            _ => entered,
        }
    }

    fn add_request(&mut self, id: &RequestId, params: &sluice_core::SamplingParams) {
        let request_seed = params.seed.unwrap_or_else(|| fnv1a(id.as_bytes()));
        let vocab = self.vocab_size;
        let mut banned: Vec<TokenId> = params
            .all_stop_token_ids()
            .chain(self.excluded.iter().copied())
            .filter(|&t| (t as usize) < vocab)
            .collect();
        banned.sort_unstable();
        banned.dedup();
        self.reqs.insert(
            id.clone(),
            SimRequest {
                rng: Rng::new(mix(self.seed, request_seed)),
                banned,
                logprobs: params.logprobs,
            },
        );
    }

    fn sample(&mut self, id: &RequestId, mask: Option<&[u32]>) -> Result<(TokenId, f32)> {
        let vocab = self.vocab_size;
        let req = self
            .reqs
            .get_mut(id)
            .ok_or_else(|| anyhow!("scheduled request {id} is unknown"))?;
        match mask {
            None => {
                let n = vocab.saturating_sub(req.banned.len());
                if n == 0 {
                    bail!("request {id}: every token id is an EOS or stop id");
                }
                let mut t = (req.rng.next_u64() % n as u64) as TokenId;
                // The k-th id that is not banned: step over each banned id
                // at or below it (they are sorted).
                for &b in &req.banned {
                    if b <= t {
                        t += 1;
                    } else {
                        break;
                    }
                }
                Ok((t, -(n as f32).ln()))
            }
            Some(mask) => {
                let allowed = |t: usize| {
                    mask.get(t / 32).is_some_and(|w| w & (1 << (t % 32)) != 0) && t < vocab
                };
                let count = |skip_banned: bool| {
                    (0..vocab.min(mask.len() * 32))
                        .filter(|&t| allowed(t))
                        .filter(|&t| !skip_banned || req.banned.binary_search(&(t as u32)).is_err())
                        .count()
                };
                // The grammar's stop tokens only when it allows nothing else.
                let skip_banned = count(true) > 0;
                let n = count(skip_banned);
                if n == 0 {
                    bail!("request {id}: its grammar allows no token");
                }
                let k = (req.rng.next_u64() % n as u64) as usize;
                let t = (0..vocab.min(mask.len() * 32))
                    .filter(|&t| allowed(t))
                    .filter(|&t| !skip_banned || req.banned.binary_search(&(t as u32)).is_err())
                    .nth(k)
                    .ok_or_else(|| anyhow!("request {id}: no token {k} in its grammar's mask"))?;
                Ok((t as TokenId, -(n as f32).ln()))
            }
        }
    }
}

impl Executor for SimulatedExecutor {
    fn num_kv_blocks(&self) -> usize {
        self.num_kv_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn begin_step(&mut self) {
        self.begin_step_at(Instant::now());
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.vocab_size)
    }

    fn kv_cache_groups(&self) -> Vec<KvCacheGroupSpec> {
        self.kv_cache_groups.clone()
    }

    fn execute(&mut self, so: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        let start = self.step_start(Instant::now());
        for id in &so.finished_req_ids {
            self.reqs.remove(id);
        }
        for n in &so.scheduled_new_reqs {
            self.add_request(&n.req_id, &n.sampling_params);
        }
        let shape = self.tracker.observe(so);
        let mut out = ModelRunnerOutput::with_capacity(shape.rows.len());
        if shape.rows.is_empty() {
            return Ok(out);
        }
        let masks: HashMap<&str, &[u32]> =
            so.grammar_bitmask.iter().flat_map(|m| m.rows()).collect();
        let mut logprobs = Vec::new();
        let mut any_logprobs = false;
        self.sampled.clear();
        self.last_batch = so.num_scheduled_tokens.len();
        let mut tokens = Vec::new();
        for (s, row) in so.num_scheduled_tokens.iter().zip(&shape.rows) {
            if !row.samples {
                out.push(&[]);
                continue;
            }
            let mask = masks.get(&*s.req_id).copied();
            // Verified drafts first: the accepted ones are output as they
            // are, then the token sampled after them.
            tokens.clear();
            if let Some(spec) = &self.speculation {
                let drafts = so.proposed_drafts_of(&s.req_id);
                if let Some(req) = self.reqs.get_mut(&s.req_id) {
                    let a = spec.accepted(drafts.len(), &mut req.rng);
                    tokens.extend_from_slice(&drafts[..a]);
                }
            }
            let (token, logprob) = self.sample(&s.req_id, mask)?;
            tokens.push(token);
            let lp = self.reqs.get(&s.req_id).and_then(|r| r.logprobs).map(|k| {
                let t = TokenLogprob {
                    token_id: token,
                    logprob,
                };
                SampleLogprobs {
                    sampled: t,
                    rank: 1,
                    top: vec![t; k.min(1)],
                }
            });
            any_logprobs |= lp.is_some();
            for &t in &tokens {
                logprobs.push(lp.clone().map(|mut l| {
                    l.sampled.token_id = t;
                    l.top.iter_mut().for_each(|e| e.token_id = t);
                    l
                }));
            }
            out.push(&tokens);
            self.sampled.push(s.req_id.clone());
        }
        if any_logprobs {
            out.logprobs = Some(logprobs);
        }
        let dt = self.model.step_time(&shape);
        if !dt.is_finite() || dt < 0.0 {
            bail!("the step-time model gave {dt} s for a step (must be finite and ≥ 0)");
        }
        self.predicted_s += dt;
        self.steps += 1;
        self.account_range(&shape);
        sleep_until(start + Duration::from_secs_f64(dt.min(1e6)));
        Ok(out)
    }

    fn take_draft_token_ids(&mut self) -> Option<DraftTokenIds> {
        let spec = self.speculation.as_ref()?;
        let k = spec.k_for(self.last_batch, 0);
        let mut all = DraftTokenIds::new();
        if k == 0 {
            return Some(all);
        }
        for id in std::mem::take(&mut self.sampled) {
            // A request the executor no longer holds gets none.
            let drafts: Vec<TokenId> = (0..k)
                .map_while(|_| self.sample(&id, None).ok().map(|(t, _)| t))
                .collect();
            if !drafts.is_empty() {
                all.push((id, drafts));
            }
        }
        Some(all)
    }
}

/// Sleeps until `deadline` without overshooting it by more than a yield.
fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::thread::yield_now();
        }
    }
}

/// FNV-1a: a stable hash of a request id (std's hasher is seeded per
/// process, so runs would differ).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Two seeds into one (a SplitMix64 finalizer over their combination).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::ConstantStepTime;
    use sluice_core::request::NewRequest;
    use sluice_core::{SamplingParams, Scheduler, SchedulerConfig};
    use std::sync::Arc;

    fn run(exec: &mut SimulatedExecutor, params: SamplingParams, steps: usize) -> Vec<TokenId> {
        let mut sched = Scheduler::new(SchedulerConfig {
            num_gpu_blocks: 64,
            ..SchedulerConfig::default()
        })
        .unwrap();
        sched
            .add_request(NewRequest {
                id: "7".into(),
                prompt_token_ids: vec![1, 2, 3],
                sampling_params: Arc::new(params),
                priority: 0,
                arrival_time: 0.0,
                cache_salt: None,
                needs_grammar: false,
                num_external_computed_tokens: 0,
            })
            .unwrap();
        let mut tokens = Vec::new();
        for _ in 0..steps {
            let so = sched.schedule();
            let out = exec.execute(&so).unwrap();
            for o in sched.update_from_output(&so, &out) {
                tokens.extend(o.new_token_ids);
            }
        }
        tokens
    }

    #[test]
    fn tokens_avoid_stop_ids_and_repeat_for_a_seed() {
        let params = SamplingParams {
            max_tokens: 200,
            eos_token_id: Some(2),
            stop_token_ids: vec![0, 5],
            ..SamplingParams::default()
        };
        let new = || {
            SimulatedExecutor::new(Box::new(ConstantStepTime(0.0)), 64, 16, 8, 42)
                .with_excluded_tokens([7, 99])
        };
        let a = run(&mut new(), params.clone(), 200);
        assert_eq!(a.len(), 200, "no stop id is ever sampled");
        assert!(a.iter().all(|t| [1, 3, 4, 6].contains(t)), "{a:?}");
        for t in [1, 3, 4, 6] {
            assert!(a.contains(&t), "uniform over the allowed ids: {a:?}");
        }
        assert_eq!(run(&mut new(), params.clone(), 200), a);
        let other = SimulatedExecutor::new(Box::new(ConstantStepTime(0.0)), 64, 16, 8, 43);
        assert_ne!(run(&mut other.with_excluded_tokens([7]), params, 200), a);
    }

    #[test]
    fn a_step_lasts_at_least_its_predicted_time() {
        let mut exec = SimulatedExecutor::new(Box::new(ConstantStepTime(0.02)), 64, 16, 100, 0);
        let t0 = Instant::now();
        let tokens = run(&mut exec, SamplingParams::greedy(3), 3);
        assert_eq!(tokens.len(), 3);
        assert_eq!(exec.num_steps(), 3);
        assert!((exec.predicted_seconds() - 0.06).abs() < 1e-12);
        assert!(t0.elapsed() >= Duration::from_millis(60));
    }

    /// Decode steps lie outside its range; the prefill step does not.
    struct DecodeOutside;
    impl StepTimeModel for DecodeOutside {
        fn step_time(&self, _step: &StepShape) -> f64 {
            0.0
        }
        fn outside_range(&self, step: &StepShape) -> bool {
            step.rows.iter().all(|r| r.is_decode())
        }
    }

    #[test]
    fn steps_outside_the_range_are_counted_and_reported_at_powers_of_two() {
        let said = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink = said.clone();
        let mut exec = SimulatedExecutor::new(Box::new(DecodeOutside), 64, 16, 100, 0)
            .with_outside_range_warning(Box::new(move |m| sink.lock().unwrap().push(m.into())));
        // One prefill step (inside), then 9 decode steps (outside).
        run(&mut exec, SamplingParams::greedy(10), 10);
        assert_eq!(exec.num_steps(), 10);
        assert_eq!(exec.steps_outside_range(), 9);
        let said = said.lock().unwrap();
        let counts: Vec<&str> = said.iter().map(|m| m.split(' ').nth(2).unwrap()).collect();
        assert_eq!(counts, ["1", "2", "4", "8"]);
        assert!(said[0].contains("1 of 2 steps so far"), "{}", said[0]);
        assert!(said[0].contains("0 prefill tokens in 0 rows, 1 decode rows, 3 context"));
    }

    #[test]
    fn a_step_starts_at_the_engines_mark_when_there_is_one() {
        let mut exec = SimulatedExecutor::new(Box::new(ConstantStepTime(0.05)), 64, 16, 100, 0);
        let mark = Instant::now();
        let now = mark + Duration::from_millis(40);
        // Never marked: the executor's own entry.
        assert_eq!(exec.step_start(now), now);
        exec.begin_step_at(mark);
        assert_eq!(exec.step_start(now), mark);
        // Not marked again since: stale, so the entry again.
        let later = now + Duration::from_millis(5);
        assert_eq!(exec.step_start(later), later);
    }

    #[test]
    fn uniform_sampling_skips_banned_ids_exactly() {
        let mut exec = SimulatedExecutor::new(Box::new(ConstantStepTime(0.0)), 64, 16, 5, 1);
        let id: RequestId = "a".into();
        let params = SamplingParams {
            eos_token_id: Some(0),
            stop_token_ids: vec![4, 2, 9],
            ..SamplingParams::default()
        };
        exec.add_request(&id, &params);
        assert_eq!(exec.reqs[&id].banned, vec![0, 2, 4]);
        let mut seen = [0usize; 5];
        for _ in 0..400 {
            let (t, lp) = exec.sample(&id, None).unwrap();
            seen[t as usize] += 1;
            assert!((lp - -(2f32).ln()).abs() < 1e-6);
        }
        assert_eq!((seen[0], seen[2], seen[4]), (0, 0, 0));
        assert!(seen[1] > 100 && seen[3] > 100, "{seen:?}");
        // A mask allowing only a stop id and 3: 3. Only the stop id: it.
        let (t, _) = exec.sample(&id, Some(&[0b11000])).unwrap();
        assert_eq!(t, 3);
        let (t, _) = exec.sample(&id, Some(&[0b10000])).unwrap();
        assert_eq!(t, 4);
        assert!(exec.sample(&id, Some(&[0])).is_err());
    }
}
