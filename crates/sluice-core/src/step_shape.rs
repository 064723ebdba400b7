//! The shape of one engine step: what a step-time model (the simulator's,
//! `serve --step-log`'s records) sees of a `SchedulerOutput`.
//!
//! `StepShape` is computed from a `SchedulerOutput` right after
//! `schedule()`: one `RowShape` per scheduled request, in scheduled order.
//! A model only needs token counts and context lengths, never token ids,
//! which is what lets one model serve any workload.
//!
//! `ShapeTracker` computes the same shape from the `SchedulerOutput`s alone,
//! as a model runner must (it never sees the scheduler): what a simulated
//! executor times its steps by.
//!
//! Each row also says how much of its cached context lies in KV blocks an
//! earlier row of the same step reads too (`shared_context`): requests
//! that hit one prefix in the cache hold the same physical blocks, so the
//! attention of a step reads that KV once from memory where distinct
//! contexts are read once each (a CPU's caches, a GPU's cascade or
//! shared-prefix kernels). Only group 0's table is looked at (the full
//! attention group of a hybrid model); blocks are only ever shared through
//! the prefix cache.

use crate::block_pool::NULL_BLOCK;
use crate::output::SchedulerOutput;
use crate::request::{BlockId, RequestId};
use crate::scheduler::Scheduler;
use std::collections::{HashMap, HashSet};

/// One scheduled request within a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    /// Tokens this step computes for the request.
    pub new_tokens: usize,
    /// Tokens whose KV already exists before this step (prefix hits and
    /// earlier chunks included).
    pub context_before: usize,
    /// The row reaches the end of its known tokens, so the model samples
    /// (and runs the LM head) for it.
    pub samples: bool,
    /// Of `context_before`, the tokens in KV blocks that an earlier row of
    /// this step also reads (see the module docs).
    pub shared_context: usize,
}

impl RowShape {
    /// A decode row: one new token that is sampled from. Everything else
    /// (prompt chunks, recomputation after a preemption) is prefill.
    pub fn is_decode(&self) -> bool {
        self.new_tokens == 1 && self.samples && self.context_before > 0
    }
}

/// One `SchedulerOutput` summarised for a step-time model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    pub rows: Vec<RowShape>,
}

impl StepShape {
    /// The shape of `out`, which `scheduler` has just produced (the
    /// scheduler has already advanced each request's computed tokens by
    /// its scheduled tokens, as vLLM's `_update_after_schedule` does).
    pub fn from_output(out: &SchedulerOutput, scheduler: &Scheduler) -> StepShape {
        Self::from_output_sharing(out, scheduler, true)
    }

    /// As `from_output`, computing `shared_context` only if `sharing` (and
    /// prefix caching is on); 0 otherwise, which saves a pass over every
    /// row's block table for a caller that does not use it.
    pub fn from_output_sharing(
        out: &SchedulerOutput,
        scheduler: &Scheduler,
        sharing: bool,
    ) -> StepShape {
        let config = scheduler.config();
        let mut seen = HashSet::new();
        let mut sharing = (sharing && config.enable_prefix_caching)
            .then(|| SharedBlocks::new(config.block_size, &mut seen));
        let rows = out
            .num_scheduled_tokens
            .iter()
            .filter_map(|s| {
                let req = scheduler.request(s.handle)?;
                let computed = req.num_computed_tokens();
                let context_before = computed.saturating_sub(s.num_tokens);
                let shared_context = match (&mut sharing, scheduler.block_ids(&s.req_id)) {
                    (Some(sh), Some(table)) => sh.row(table, context_before),
                    _ => 0,
                };
                Some(RowShape {
                    new_tokens: s.num_tokens,
                    context_before,
                    samples: computed >= req.num_tokens(),
                    shared_context,
                })
            })
            .collect();
        StepShape { rows }
    }

    pub fn total_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.new_tokens).sum()
    }

    pub fn num_decode_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.is_decode()).count()
    }

    pub fn num_prefill_rows(&self) -> usize {
        self.rows.len() - self.num_decode_rows()
    }

    pub fn num_sampling_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.samples).count()
    }
}

/// The blocks the rows of one step read so far: what makes a later row's
/// blocks shared.
struct SharedBlocks<'a> {
    block_size: usize,
    seen: &'a mut HashSet<BlockId>,
}

impl SharedBlocks<'_> {
    /// Starts a step, with `seen` (emptied here) holding its blocks.
    fn new(block_size: usize, seen: &mut HashSet<BlockId>) -> SharedBlocks<'_> {
        seen.clear();
        SharedBlocks {
            block_size: block_size.max(1),
            seen,
        }
    }

    /// The tokens of a row's first `context` tokens (its cached context,
    /// laid out along `table`) whose blocks an earlier row read; records
    /// the row's blocks.
    fn row(&mut self, table: &[BlockId], context: usize) -> usize {
        let mut shared = 0;
        for (j, &id) in table.iter().enumerate() {
            let start = j * self.block_size;
            if start >= context {
                break;
            }
            if id != NULL_BLOCK && !self.seen.insert(id) {
                shared += self.block_size.min(context - start);
            }
        }
        shared
    }
}

/// Builds each step's `StepShape` from the `SchedulerOutput`s alone, the
/// way a model runner keeps its per-request state: a new request brings
/// its prompt, a cached (running or resumed) one its progress and output
/// count, a finished id drops it.
///
/// Promise: fed every `SchedulerOutput` of a scheduler in order, from its
/// first, `observe` returns what `StepShape::from_output` computes from the
/// scheduler at the same point, row for row (prefix hits, chunked prefill,
/// preemption and resumption included). That needs nothing but the prompt
/// length per request, because a cached request's entry carries its output
/// count: its known tokens are prompt + outputs. A request it has never
/// seen as new (fed from the middle of a run) is taken to sample.
///
/// With a block size (`with_block_size`) it also keeps each request's
/// group-0 block table, as a runner does, and computes `shared_context`
/// as `from_output` does under prefix caching; without one that is 0.
#[derive(Clone, Debug, Default)]
pub struct ShapeTracker {
    /// Prompt length of each request the runner holds.
    prompts: HashMap<RequestId, usize>,
    /// This step's (context before, known tokens) by request, reused.
    progress: HashMap<RequestId, (usize, usize)>,
    /// Tokens per KV block; 0 when shared blocks are not tracked.
    block_size: usize,
    /// Group 0's block table of each request the runner holds.
    tables: HashMap<RequestId, Vec<BlockId>>,
    /// The blocks this step's rows read so far, reused across steps.
    seen: HashSet<BlockId>,
}

impl ShapeTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker that also tracks block tables of `block_size`-token
    /// blocks, for `shared_context`.
    pub fn with_block_size(block_size: usize) -> Self {
        ShapeTracker {
            block_size,
            ..Self::default()
        }
    }

    /// Requests held (running or preempted, not yet finished).
    pub fn num_requests(&self) -> usize {
        self.prompts.len()
    }

    /// The shape of `out`, the scheduler's next output; updates the state.
    pub fn observe(&mut self, out: &SchedulerOutput) -> StepShape {
        for id in &out.finished_req_ids {
            self.prompts.remove(id);
            self.tables.remove(id);
        }
        self.progress.clear();
        let track = self.block_size > 0;
        for n in &out.scheduled_new_reqs {
            let len = n.prompt_token_ids.len();
            self.prompts.insert(n.req_id.clone(), len);
            self.progress
                .insert(n.req_id.clone(), (n.num_computed_tokens, len));
            if track {
                let table = n.block_ids.first().cloned().unwrap_or_default();
                self.tables.insert(n.req_id.clone(), table);
            }
        }
        for (i, c) in out.scheduled_cached_reqs.reqs.iter().enumerate() {
            if track {
                let added = out.scheduled_cached_reqs.new_block_ids(i);
                let added = added.map(|g| g.group(0)).unwrap_or(&[]);
                let table = self.tables.entry(c.req_id.clone()).or_default();
                if c.resumed {
                    table.clear();
                }
                table.extend_from_slice(added);
            }
            let known = match (self.prompts.get(&c.req_id), &c.all_token_ids) {
                (Some(&prompt), _) => prompt + c.num_output_tokens,
                (None, Some(all)) => {
                    // A resumed request never seen: its tokens say enough.
                    let prompt = all.len().saturating_sub(c.num_output_tokens);
                    self.prompts.insert(c.req_id.clone(), prompt);
                    all.len()
                }
                (None, None) => 0,
            };
            self.progress
                .insert(c.req_id.clone(), (c.num_computed_tokens, known));
        }
        let mut sharing = track.then(|| SharedBlocks::new(self.block_size, &mut self.seen));
        let rows = out
            .num_scheduled_tokens
            .iter()
            .map(|s| {
                let (context_before, known) =
                    self.progress.get(&s.req_id).copied().unwrap_or((0, 0));
                let shared_context = match (&mut sharing, self.tables.get(&s.req_id)) {
                    (Some(sh), Some(table)) => sh.row(table, context_before),
                    _ => 0,
                };
                RowShape {
                    new_tokens: s.num_tokens,
                    context_before,
                    samples: context_before + s.num_tokens >= known,
                    shared_context,
                }
            })
            .collect();
        StepShape { rows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::NewRequest;
    use crate::{ModelRunnerOutput, RequestStatus, SamplingParams, SchedulerConfig};
    use std::sync::Arc;

    /// A scheduler under pressure (a small pool, a small token budget,
    /// shared prefixes, aborts) and the tracker beside it: every step's
    /// shape must be the scheduler's own.
    #[test]
    fn the_tracker_sees_what_the_scheduler_saw() {
        let config = SchedulerConfig {
            num_gpu_blocks: 48,
            block_size: 16,
            max_num_batched_tokens: 96,
            max_num_seqs: 8,
            max_model_len: 400,
            enable_prefix_caching: true,
            long_prefill_token_threshold: 40,
            ..SchedulerConfig::default()
        };
        let mut sched = Scheduler::new(config).unwrap();
        let mut tracker = ShapeTracker::with_block_size(16);
        let mut rng = SplitMix(7);
        let shared: Vec<u32> = (0..48).collect();
        let (mut added, mut seen_preempt, mut seen_prefix, mut seen_chunk) = (0, 0, 0, 0);
        let mut seen_shared = 0;
        let mut live: Vec<RequestId> = Vec::new();
        for step in 0..2000 {
            if added < 60 && rng.next_u64().is_multiple_of(3) {
                let len = 8 + (rng.next_u64() % 180) as usize;
                let mut prompt = if added % 2 == 0 {
                    shared.clone()
                } else {
                    vec![]
                };
                prompt.extend((0..len).map(|i| 1000 + (added * 997 + i) as u32));
                let id: RequestId = format!("r{added}").into();
                let params = SamplingParams {
                    max_tokens: 1 + (rng.next_u64() % 40) as usize,
                    ignore_eos: true,
                    ..SamplingParams::default()
                };
                sched
                    .add_request(NewRequest {
                        id: id.clone(),
                        prompt_token_ids: prompt,
                        sampling_params: Arc::new(params),
                        priority: 0,
                        arrival_time: step as f64,
                        cache_salt: None,
                        needs_grammar: false,
                        num_external_computed_tokens: 0,
                    })
                    .unwrap();
                live.push(id);
                added += 1;
            }
            if step % 37 == 36 && !live.is_empty() {
                // An abort between steps: its id reaches the runner as
                // finished in the next output.
                let victim = live.remove((rng.next_u64() as usize) % live.len());
                sched.finish_requests(&[victim], RequestStatus::FinishedAborted);
            }
            if added >= 60 && !sched.has_unfinished_requests() {
                break;
            }
            let out = sched.schedule();
            let expected = StepShape::from_output(&out, &sched);
            let got = tracker.observe(&out);
            assert_eq!(got, expected, "step {step}");
            seen_preempt += out.preempted_req_ids.len();
            seen_prefix += out
                .scheduled_new_reqs
                .iter()
                .filter(|n| n.num_computed_tokens > 0)
                .count();
            seen_chunk += got.rows.iter().filter(|r| !r.samples).count();
            seen_shared += got.rows.iter().filter(|r| r.shared_context > 0).count();
            let mut mro = ModelRunnerOutput::with_capacity(got.rows.len());
            for row in &got.rows {
                if row.samples {
                    mro.push(&[7]);
                } else {
                    mro.push(&[]);
                }
            }
            for o in sched.update_from_output(&out, &mro) {
                if o.finish_reason.is_some() {
                    live.retain(|id| *id != o.req_id);
                }
            }
        }
        assert!(!sched.has_unfinished_requests(), "the run must end");
        // The last finished ids reach the runner with the next output.
        tracker.observe(&sched.schedule());
        assert!(seen_preempt > 0, "the test must exercise preemption");
        assert!(seen_prefix > 0, "the test must exercise prefix hits");
        assert!(seen_chunk > 0, "the test must exercise chunked prefill");
        assert!(seen_shared > 0, "the test must exercise shared blocks");
        assert_eq!(tracker.num_requests(), 0, "finished requests are dropped");
    }

    fn request(id: &str, prompt: Vec<u32>, max_tokens: usize) -> NewRequest {
        NewRequest {
            id: id.into(),
            prompt_token_ids: prompt,
            sampling_params: Arc::new(SamplingParams {
                max_tokens,
                ignore_eos: true,
                ..SamplingParams::default()
            }),
            priority: 0,
            arrival_time: 0.0,
            cache_salt: None,
            needs_grammar: false,
            num_external_computed_tokens: 0,
        }
    }

    /// Runs one step, sampling token 7 for each row that samples.
    fn step(sched: &mut Scheduler) -> StepShape {
        let out = sched.schedule();
        let shape = StepShape::from_output(&out, sched);
        let mut mro = ModelRunnerOutput::with_capacity(shape.rows.len());
        for row in &shape.rows {
            mro.push(if row.samples { &[7] } else { &[] });
        }
        sched.update_from_output(&out, &mro);
        shape
    }

    /// Two requests on one 40-token prefix, the second admitted after the
    /// first cached it: decoding together, the second row shares the
    /// prefix's two full blocks (32 tokens; the partial third block is its
    /// own), the first row nothing. Without prefix caching nothing is
    /// shared.
    #[test]
    fn rows_on_one_cached_prefix_share_its_full_blocks() {
        for caching in [true, false] {
            let config = SchedulerConfig {
                num_gpu_blocks: 64,
                block_size: 16,
                max_num_batched_tokens: 256,
                max_num_seqs: 4,
                max_model_len: 256,
                enable_prefix_caching: caching,
                ..SchedulerConfig::default()
            };
            let mut sched = Scheduler::new(config).unwrap();
            let prefix: Vec<u32> = (100..140).collect();
            let with_tail = |t: u32| {
                let mut p = prefix.clone();
                p.extend([t, t + 1, t + 2]);
                p
            };
            sched.add_request(request("a", with_tail(1), 20)).unwrap();
            let first = step(&mut sched);
            assert_eq!(first.rows.len(), 1);
            assert_eq!(first.rows[0].shared_context, 0);
            sched.add_request(request("b", with_tail(50), 20)).unwrap();
            let admit = step(&mut sched);
            let hit = if caching { 32 } else { 0 };
            // b's prefill row: its cached context is the hit, and those
            // blocks are a's too.
            assert_eq!(admit.rows[1].context_before, hit);
            assert_eq!(admit.rows[1].shared_context, hit);
            let both = step(&mut sched);
            assert!(both.rows.iter().all(|r| r.is_decode()));
            assert_eq!(both.rows[0].shared_context, 0);
            assert_eq!(both.rows[1].shared_context, hit);
        }
    }

    /// A deterministic generator for the test's arrivals and lengths.
    struct SplitMix(u64);

    impl SplitMix {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }
}
