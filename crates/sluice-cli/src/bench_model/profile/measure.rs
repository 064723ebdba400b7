//! Measures a profile's grid with the real scheduler and model runner:
//! every point is `--repeats` steps of exactly its shape, each timed as the
//! engine times a step (schedule + forward + update).
//!
//! How each shape is made:
//! - prefill `(c, x)`: a request of `x` tokens runs first (untimed), so that
//!   its blocks sit in the prefix cache; then a request of those `x` tokens
//!   plus `c` fresh ones is admitted, computing `c` new tokens on `x`
//!   cached in one step. The contexts stop where the largest chunk still
//!   fits the model length, so every point is one request's chunk (a step
//!   of several prefill rows is looked up as one chunk of their tokens; its
//!   attention is then priced as one longer row's).
//! - decode `(b, m)`: `b` requests of `m − 1` prompt tokens are prefilled in
//!   as few steps as the budget allows and decode once, then their next
//!   `--repeats` steps (all rows decoding) are timed; the mean context of
//!   those steps, `prompt + 1 + (repeats + 1) / 2`, is the axis value. From
//!   prompts of 512 tokens on, one set of requests serves every batch size,
//!   largest first (aborting the surplus after each), so the axis value is
//!   the middle of the contexts the batch sizes saw, `repeats · (batch
//!   sizes − 1) / 2` tokens later.
//! - decode on one prefix `(b, m)` (`decode.shared`): as decode, but the
//!   `b` prompts are one cached prefix (the prompt less its last token,
//!   run first, untimed) and a fresh token each, so every row after the first reads
//!   the prefix's full blocks from the cache, as requests on one system
//!   prompt do; the shared fraction of the rows' context is read off the
//!   scheduler's block tables. Each point is its own set of requests (no
//!   reuse across batch sizes).
//! - a speed probe: one decode row of a 1-token prompt (median of 5) before,
//!   between and after the parts; times apart by more than 15 % are
//!   warned of (the machine changed speed while it was measured).
//! - mixed: a decode batch plus an admitted prefill chunk in one step, at
//!   a few batch sizes and chunks. They choose the table's mixed-step rule
//!   (`sluice_sim::table`: additive, with `step_overhead_s` the median of
//!   `prefill + decode − mixed` over them, or merged), the one with the
//!   smaller worst error on them; the profile keeps them and the error.

use super::super::Bench;
use super::grid::Grid;
use anyhow::{bail, Result};
use sluice_core::{Executor, NewRequest, RequestStatus, SamplingParams, Scheduler};
use sluice_sim::step::StepShape;
use sluice_sim::table::{DecodeTable, PrefillTable, SharedDecode};
use sluice_sim::{MixedPoint, MixedRule, TableModel};
use std::time::Instant;

/// Decode points of prompts this long or longer share one set of requests
/// across batch sizes (`Bench::decode_column`): the repeated prefill would
/// dominate the measurement's cost, and the contexts' drift is small beside
/// the prompt.
const REUSE_MIN_PROMPT: usize = 512;

/// The most tokens one setup (untimed) step computes: large enough that a
/// decode batch is prefilled in a few steps (its rows then decode at nearly
/// one context), small enough for the runner's activations.
const SETUP_BUDGET: usize = 16_384;

/// Seconds to a tenth of a microsecond: the file stays readable, and no
/// step is timed that finely.
fn secs(t: f64) -> f64 {
    (t * 1e7).round() / 1e7
}

fn median(v: &[f64]) -> f64 {
    super::super::median(v.to_vec())
}

fn spread(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::MIN, f64::max);
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    max - min
}

/// The measured table and what the mixed steps said about it.
pub(super) struct Measured {
    pub table: TableModel,
    pub mixed: Vec<MixedPoint>,
    /// The table's prediction of each mixed point, under its rule.
    pub mixed_predicted: Vec<f64>,
    pub cost_s: f64,
    /// The reference step's time before, between and after the parts.
    pub speed_probe_s: Vec<f64>,
}

impl Bench {
    /// A scheduler over the executor's pool for one grid point.
    fn probe_scheduler(
        &self,
        prefix_caching: bool,
        budget: usize,
        seqs: usize,
    ) -> Result<Scheduler> {
        let mut c = self.sched_config.clone();
        c.enable_prefix_caching = prefix_caching;
        c.enable_chunked_prefill = true;
        c.long_prefill_token_threshold = 0;
        c.max_num_batched_tokens = budget.max(1);
        c.max_num_seqs = seqs.max(1);
        Scheduler::new(c).map_err(|e| anyhow::anyhow!("scheduler config: {e}"))
    }

    fn add(
        &mut self,
        sched: &mut Scheduler,
        prompt: Vec<u32>,
        max_tokens: usize,
    ) -> Result<String> {
        self.next_prompt += 1;
        let id = format!("p{}", self.next_prompt);
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(max_tokens)
        };
        sched
            .add_request(NewRequest::new(id.clone(), prompt, params))
            .map_err(|e| anyhow::anyhow!("request: {e}"))?;
        Ok(id)
    }

    /// One engine step; its wall time, rows and total scheduled tokens.
    fn probe_step(&mut self, sched: &mut Scheduler) -> Result<(f64, usize, usize)> {
        let (dt, rows, tokens, _) = self.engine_step(sched, false)?;
        Ok((dt, rows, tokens))
    }

    /// One engine step (schedule → execute → update); its wall time, rows,
    /// total scheduled tokens and, if `shaped`, its shape — computed inside
    /// the timed span, so a shaped step is for untimed use.
    fn engine_step(
        &mut self,
        sched: &mut Scheduler,
        shaped: bool,
    ) -> Result<(f64, usize, usize, Option<StepShape>)> {
        let t0 = Instant::now();
        let so = sched.schedule();
        let shape = shaped.then(|| StepShape::from_output(&so, sched));
        let out = self.exec.execute(&so)?;
        sched.update_from_output(&so, &out);
        let dt = t0.elapsed().as_secs_f64();
        let (rows, tokens) = (so.num_scheduled_tokens.len(), so.total_num_scheduled_tokens);
        Ok((dt, rows, tokens, shape))
    }

    /// Aborts what is left and hands the finished ids to the runner, so
    /// that it drops their state.
    fn probe_drain(&mut self, sched: &mut Scheduler, ids: &[String]) -> Result<()> {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        sched.finish_requests(&refs, RequestStatus::FinishedAborted);
        while sched.has_unfinished_requests() {
            self.probe_step(sched)?;
        }
        let so = sched.schedule();
        self.exec.execute(&so)?;
        Ok(())
    }

    /// Runs a request of `prefix` to completion, leaving its blocks cached.
    fn cache_prefix(&mut self, sched: &mut Scheduler, prefix: &[u32]) -> Result<()> {
        if prefix.is_empty() {
            return Ok(());
        }
        self.add(sched, prefix.to_vec(), 1)?;
        while sched.has_unfinished_requests() {
            self.probe_step(sched)?;
        }
        Ok(())
    }

    /// `n` fresh tokens.
    fn fresh(&mut self, n: usize) -> Vec<u32> {
        let mut p = self.prompt();
        while p.len() < n {
            p.extend(self.prompt());
        }
        p.truncate(n);
        p
    }

    /// Admits a request computing `c` tokens on the cached `prefix` in the
    /// next step.
    fn admit_chunk(&mut self, sched: &mut Scheduler, prefix: &[u32], c: usize) -> Result<String> {
        let mut prompt = prefix.to_vec();
        prompt.extend(self.fresh(c));
        self.add(sched, prompt, 1)
    }

    /// Prefill point `(c, x)`: `repeats` timed steps.
    fn prefill_point(&mut self, c: usize, x: usize, repeats: usize) -> Result<Vec<f64>> {
        let mut sched = self.probe_scheduler(true, c.max(x.min(SETUP_BUDGET)), 1)?;
        let prefix = self.fresh(x);
        self.cache_prefix(&mut sched, &prefix)?;
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let id = self.admit_chunk(&mut sched, &prefix, c)?;
            let (dt, _, tokens) = self.probe_step(&mut sched)?;
            if tokens != c {
                bail!(
                    "--profile: the prefill point ({c} tokens on {x} cached) scheduled {tokens} \
                     tokens (is the KV pool too small?)"
                );
            }
            times.push(dt);
            self.probe_drain(&mut sched, &[id])?;
        }
        Ok(times)
    }

    /// Starts `b` requests of `p` prompt tokens and runs them (untimed)
    /// through their prefill and a first step with every row decoding;
    /// `steps` more decode steps remain to them. Returns their ids.
    fn start_decoders(
        &mut self,
        sched: &mut Scheduler,
        b: usize,
        p: usize,
        steps: usize,
    ) -> Result<Vec<String>> {
        let prompts = (0..b).map(|_| self.fresh(p)).collect();
        Ok(self.start_prompts(sched, prompts, steps)?.0)
    }

    /// As `start_decoders`, for the given prompts. Returns their ids and
    /// the shape of the first step with every row decoding.
    fn start_prompts(
        &mut self,
        sched: &mut Scheduler,
        prompts: Vec<Vec<u32>>,
        steps: usize,
    ) -> Result<(Vec<String>, StepShape)> {
        let (b, p) = (prompts.len(), prompts.first().map_or(0, Vec::len));
        let mut ids = Vec::with_capacity(b);
        for prompt in prompts {
            ids.push(self.add(sched, prompt, steps + 2)?);
        }
        loop {
            let (_, rows, tokens, shape) = self.engine_step(sched, true)?;
            if let (true, Some(shape)) = (rows == b && tokens == b, shape) {
                return Ok((ids, shape));
            }
            if tokens == 0 {
                bail!(
                    "--profile: the decode point ({b} rows of {p} tokens) stalled (is the KV \
                     pool too small?)"
                );
            }
        }
    }

    /// Decode point `(b, p)`: `repeats` timed steps of `b` decode rows.
    fn decode_point(&mut self, b: usize, p: usize, repeats: usize) -> Result<Vec<f64>> {
        let budget = (b * p).clamp(b, SETUP_BUDGET.max(b));
        let mut sched = self.probe_scheduler(false, budget, b)?;
        let ids = self.start_decoders(&mut sched, b, p, repeats)?;
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let (dt, rows, tokens) = self.probe_step(&mut sched)?;
            if rows != b || tokens != b {
                bail!("--profile: the decode point ({b} rows of {p} tokens) ran {rows} rows, {tokens} tokens");
            }
            times.push(dt);
        }
        self.probe_drain(&mut sched, &ids)?;
        Ok(times)
    }

    /// Decode points `(b, p)` for every batch size, largest first, on one
    /// set of requests: after each batch size's timed steps the earliest
    /// admitted beyond the next size are aborted. Their contexts grow by `repeats`
    /// per batch size, little beside `p`. In `batches` order.
    fn decode_column(
        &mut self,
        batches: &[usize],
        p: usize,
        repeats: usize,
    ) -> Result<Vec<Vec<f64>>> {
        let b_max = *batches.last().expect("a batch size");
        let budget = (b_max * p).clamp(b_max, SETUP_BUDGET.max(b_max));
        let mut sched = self.probe_scheduler(false, budget, b_max)?;
        let ids = self.start_decoders(&mut sched, b_max, p, repeats * batches.len())?;
        let mut times = vec![Vec::new(); batches.len()];
        for (bi, &b) in batches.iter().enumerate().rev() {
            // Keep the last admitted: the first ones decoded while the rest
            // prefilled, so they are ahead (and would finish first).
            sched.finish_requests(&ids[..b_max - b], RequestStatus::FinishedAborted);
            for _ in 0..repeats {
                let (dt, rows, tokens) = self.probe_step(&mut sched)?;
                if rows != b || tokens != b {
                    bail!(
                        "--profile: the decode point ({b} rows of {p} tokens) ran {rows} rows, \
                         {tokens} tokens"
                    );
                }
                times[bi].push(dt);
            }
        }
        self.probe_drain(&mut sched, &ids)?;
        Ok(times)
    }

    /// Decode points `(b, p)` with every row on one cached prefix, for
    /// every batch size: a request of the first `p − 1` tokens runs first
    /// (untimed) so that its full blocks sit in the prefix cache; then, per
    /// batch size, `b` requests of those tokens and one fresh token each
    /// hit them, prefill the rest, decode once, and `repeats` steps of all
    /// rows decoding are timed. Returns the times (in `batches` order) and
    /// each batch size's shared fraction of the rows' context at the
    /// middle timed step (`SharedDecode::fraction`), from the scheduler's
    /// own block tables.
    fn decode_shared_column(
        &mut self,
        batches: &[usize],
        p: usize,
        repeats: usize,
    ) -> Result<(Vec<Vec<f64>>, Vec<f64>)> {
        let b_max = *batches.last().expect("a batch size");
        let budget = (b_max * p).clamp(b_max, SETUP_BUDGET.max(b_max));
        let mut sched = self.probe_scheduler(true, budget.max(p), b_max)?;
        let prefix = self.fresh(p.saturating_sub(1));
        self.cache_prefix(&mut sched, &prefix)?;
        let (mut times, mut fractions) = (Vec::new(), Vec::new());
        for &b in batches {
            let prompts = (0..b)
                .map(|_| {
                    let mut prompt = prefix.clone();
                    prompt.extend(self.fresh(1));
                    prompt
                })
                .collect();
            let (ids, first) = self.start_prompts(&mut sched, prompts, repeats)?;
            let shared: usize = first.rows.iter().map(|r| r.shared_context).sum();
            // Σ context at the middle timed step: each row's context
            // after the first all-decode step, plus (repeats + 1) / 2.
            let middle = (repeats as f64 + 1.0) / 2.0;
            let context: f64 = first
                .rows
                .iter()
                .map(|r| (r.context_before + r.new_tokens) as f64 + middle)
                .sum();
            fractions.push(secs(shared as f64 / context.max(1.0)));
            let mut t = Vec::with_capacity(repeats);
            for _ in 0..repeats {
                let (dt, rows, tokens) = self.probe_step(&mut sched)?;
                if rows != b || tokens != b {
                    bail!(
                        "--profile: the shared decode point ({b} rows of {p} tokens) ran {rows} \
                         rows, {tokens} tokens"
                    );
                }
                t.push(dt);
            }
            times.push(t);
            self.probe_drain(&mut sched, &ids)?;
        }
        Ok((times, fractions))
    }

    /// Mixed point: `b` decode rows of `p` prompt tokens plus a chunk of
    /// `c` fresh tokens in one step.
    fn mixed_point(&mut self, b: usize, p: usize, c: usize, repeats: usize) -> Result<Vec<f64>> {
        let budget = (b * p).clamp(b + c, SETUP_BUDGET.max(b + c));
        let mut sched = self.probe_scheduler(false, budget, b + 1)?;
        let mut ids = self.start_decoders(&mut sched, b, p, 2 * repeats)?;
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let chunk = self.admit_chunk(&mut sched, &[], c)?;
            let (dt, rows, tokens) = self.probe_step(&mut sched)?;
            if rows != b + 1 || tokens != b + c {
                bail!("--profile: the mixed point ({b} decode rows + {c} prefill tokens) ran {rows} rows, {tokens} tokens");
            }
            times.push(dt);
            // The chunk's request sampled its one token and finished.
            ids.push(chunk);
        }
        self.probe_drain(&mut sched, &ids)?;
        Ok(times)
    }

    /// Measures the whole grid, reporting progress on stderr.
    pub(super) fn measure_grid(&mut self, grid: &Grid, repeats: usize) -> Result<Measured> {
        let t0 = Instant::now();
        let mut probes = vec![self.speed_probe()?];
        let mut p_time = Vec::new();
        let mut p_spread = Vec::new();
        for &c in &grid.chunks {
            let (mut row, mut row_spread) = (Vec::new(), Vec::new());
            for &x in &grid.contexts {
                let t = self.prefill_point(c, x, repeats)?;
                row.push(secs(median(&t)));
                row_spread.push(secs(spread(&t)));
            }
            eprintln!("  prefill {c:>6} tokens: {}", ms_list(&row));
            p_time.push(row);
            p_spread.push(row_spread);
        }
        probes.push(self.speed_probe()?);
        let mut d_time = Vec::new();
        let mut d_spread = Vec::new();
        let nb = grid.batches.len();
        let mut columns = Vec::with_capacity(grid.prompts.len());
        for &p in &grid.prompts {
            let column = if p >= REUSE_MIN_PROMPT {
                self.decode_column(&grid.batches, p, repeats)?
            } else {
                let mut c = Vec::with_capacity(nb);
                for &b in &grid.batches {
                    c.push(self.decode_point(b, p, repeats)?);
                }
                c
            };
            columns.push(column);
        }
        for (bi, &b) in grid.batches.iter().enumerate() {
            let row: Vec<f64> = columns.iter().map(|c| secs(median(&c[bi]))).collect();
            eprintln!("  decode {b:>4} rows: {}", ms_list(&row));
            d_spread.push(columns.iter().map(|c| secs(spread(&c[bi]))).collect());
            d_time.push(row);
        }
        probes.push(self.speed_probe()?);
        let shared = self.measure_shared(grid, repeats)?;
        probes.push(self.speed_probe()?);
        let rows_context = |p: usize| {
            let r = repeats as f64;
            let reuse_drift = if p >= REUSE_MIN_PROMPT {
                (nb as f64 - 1.0) * r / 2.0
            } else {
                0.0
            };
            p as f64 + 1.0 + (r + 1.0) / 2.0 + reuse_drift
        };
        let mut table = TableModel {
            prefill: PrefillTable {
                chunk_tokens: grid.chunks.iter().map(|&c| c as f64).collect(),
                context: grid.contexts.iter().map(|&x| x as f64).collect(),
                time_s: p_time,
                spread_s: Some(p_spread),
            },
            decode: DecodeTable {
                batch_size: grid.batches.iter().map(|&b| b as f64).collect(),
                mean_context: grid.prompts.iter().map(|&p| rows_context(p)).collect(),
                time_s: d_time,
                spread_s: Some(d_spread),
                shared: Some(shared),
            },
            step_overhead_s: 0.0,
            mixed_rule: MixedRule::Additive,
        };
        let (mixed, mixed_predicted) = self.measure_mixed(grid, repeats, &mut table)?;
        probes.push(self.speed_probe()?);
        Ok(Measured {
            table,
            mixed,
            mixed_predicted,
            cost_s: t0.elapsed().as_secs_f64(),
            speed_probe_s: probes,
        })
    }

    /// The reference step of `MeasuredOn::speed_probe_s`: one decode row
    /// of a 1-token prompt, the median of 5.
    fn speed_probe(&mut self) -> Result<f64> {
        Ok(secs(median(&self.decode_point(1, 1, 5)?)))
    }

    /// The decode grid with every row on one cached prefix
    /// (`decode_shared_column`), reporting each batch size's row.
    fn measure_shared(&mut self, grid: &Grid, repeats: usize) -> Result<SharedDecode> {
        let nb = grid.batches.len();
        let (mut time_s, mut fraction) = (vec![Vec::new(); nb], vec![Vec::new(); nb]);
        for &p in &grid.prompts {
            let (t, f) = self.decode_shared_column(&grid.batches, p, repeats)?;
            for bi in 0..nb {
                time_s[bi].push(secs(median(&t[bi])));
                fraction[bi].push(f[bi]);
            }
        }
        for (bi, &b) in grid.batches.iter().enumerate() {
            eprintln!(
                "  decode {b:>4} rows on one prefix: {} (shared {})",
                ms_list(&time_s[bi]),
                fraction[bi]
                    .iter()
                    .map(|f| format!("{f:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        Ok(SharedDecode { time_s, fraction })
    }

    /// The mixed points. Sets `step_overhead_s` (the median of `prefill +
    /// decode − mixed`, for the additive rule) and `mixed_rule`: the rule
    /// with the smaller worst error on them. Returns the points and each
    /// one's prediction under the chosen rule.
    fn measure_mixed(
        &mut self,
        grid: &Grid,
        repeats: usize,
        table: &mut TableModel,
    ) -> Result<(Vec<MixedPoint>, Vec<f64>)> {
        let b_max = *grid.batches.last().expect("a batch size");
        let c_max = *grid.chunks.last().expect("a chunk");
        // Decode rows of a short context, so that the pool holds the
        // largest batch and the chunk beside it.
        let p = grid.prompts[grid.prompts.len().min(2) - 1];
        let m = p as f64 + 1.0 + (repeats as f64 + 1.0) / 2.0;
        let mut points: Vec<MixedPoint> = Vec::new();
        for b in [1, 4, 16, b_max] {
            for c in [16, 128, 512] {
                let (b, c) = (b.min(b_max), c.min(c_max));
                let seen = points
                    .iter()
                    .any(|q| (q.batch_size, q.chunk_tokens) == (b as f64, c as f64));
                if seen {
                    continue;
                }
                let t = median(&self.mixed_point(b, p, c, repeats)?);
                points.push(MixedPoint {
                    batch_size: b as f64,
                    mean_context: m,
                    chunk_tokens: c as f64,
                    context: 0.0,
                    time_s: secs(t),
                });
            }
        }
        let overheads: Vec<f64> = points
            .iter()
            .map(|q| {
                let pf = table.prefill_time(q.chunk_tokens, q.context);
                let d = table.decode_time(q.batch_size, q.mean_context);
                (pf + d - q.time_s).clamp(0.0, pf.min(d))
            })
            .collect();
        table.step_overhead_s = secs(median(&overheads));
        let predict = |t: &TableModel, rule: MixedRule| -> Vec<f64> {
            points
                .iter()
                .map(|q| {
                    let chunk = (q.chunk_tokens, q.context);
                    t.mixed_time(rule, chunk, (q.batch_size, q.mean_context))
                })
                .collect()
        };
        let worst = |pred: &[f64]| {
            pred.iter()
                .zip(&points)
                .fold(0.0f64, |w, (p, q)| w.max(((p - q.time_s) / q.time_s).abs()))
        };
        let (additive, merged) = (
            predict(table, MixedRule::Additive),
            predict(table, MixedRule::Merged),
        );
        let (rule, pred) = if worst(&merged) <= worst(&additive) {
            (MixedRule::Merged, merged)
        } else {
            (MixedRule::Additive, additive)
        };
        table.mixed_rule = rule;
        Ok((points, pred))
    }
}

/// Times in milliseconds, two decimals, space-separated.
pub(super) fn ms_list(v: &[f64]) -> String {
    v.iter()
        .map(|t| format!("{:.2}", t * 1e3))
        .collect::<Vec<_>>()
        .join(" ")
}
