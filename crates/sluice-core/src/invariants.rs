//! The scheduler's invariants (`docs/scheduler-semantics.md` §Invariants;
//! those marked † there follow from the code's structure and are not
//! checked here), checked from outside: after every call by the property
//! tests, and at chosen points by the scenario tests.
//! Each check returns a message naming the first violation.

use crate::block_pool::NULL_BLOCK;
use crate::output::SchedulerOutput;
use crate::request::RequestStatus;
use crate::scheduler::Scheduler;
use std::collections::{HashMap, HashSet};

/// Which call the state follows: some invariants hold only after one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    AfterSchedule,
    AfterUpdate,
    /// After `add_request`, `finish_requests` or a reset.
    Other,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// Membership, token accounting and KV-block invariants of the whole state.
pub fn check_state(s: &Scheduler, phase: Phase) -> Result<(), String> {
    let cfg = &s.config;
    let mut seen = HashSet::new();
    for &slot in &s.running {
        ensure!(seen.insert(slot), "slot {slot} twice in running");
        let r = s.req(slot);
        ensure!(
            r.status == RequestStatus::Running,
            "{} in running with status {:?}",
            r.id,
            r.status
        );
    }
    for slot in s.waiting.iter() {
        ensure!(
            seen.insert(slot),
            "slot {slot} in running and waiting, or twice in waiting"
        );
        let r = s.req(slot);
        ensure!(
            matches!(r.status, RequestStatus::Waiting | RequestStatus::Preempted)
                || r.status.is_blocked(),
            "{} waiting with status {:?}",
            r.id,
            r.status
        );
        ensure!(
            r.num_computed_tokens == 0,
            "waiting {} has computed tokens",
            r.id
        );
        ensure!(
            s.kv.block_ids(slot as usize).is_empty(),
            "waiting {} holds blocks",
            r.id
        );
    }
    ensure!(
        seen.len() == s.ids.len(),
        "{} live requests but {} queued",
        s.ids.len(),
        seen.len()
    );
    for d in &s.deferred_waiting {
        ensure!(
            s.waiting.iter().any(|w| w == *d),
            "deferred slot {d} is not waiting"
        );
    }
    ensure!(
        s.running.len() <= cfg.max_num_seqs,
        "running {} > max_num_seqs",
        s.running.len()
    );
    ensure!(
        s.finished_req_ids.iter().all(|id| !s.ids.contains_key(id)),
        "a finished id is live"
    );

    for (id, &slot) in &s.ids {
        let r = s.req(slot);
        ensure!(&r.id == id, "id map points {id} at {}", r.id);
        ensure!(!r.is_finished(), "finished request {id} still live");
        ensure!(
            r.num_computed_tokens <= r.num_tokens_with_spec(),
            "{id}: computed past known tokens"
        );
        ensure!(
            r.num_tokens() == r.num_prompt_tokens + r.num_output_tokens(),
            "{id}: token count"
        );
        ensure!(
            r.num_output_tokens() <= r.max_tokens(),
            "{id}: more outputs than max_tokens"
        );
        ensure!(
            r.num_tokens() < cfg.max_model_len,
            "{id}: reached max_model_len unfinished"
        );
        check_tables(s, slot as usize, r, phase)?;
        let table = s.kv.block_ids(slot as usize);
        if r.status == RequestStatus::Running
            && phase == Phase::AfterUpdate
            && r.spec_token_ids.is_empty()
        {
            ensure!(
                r.num_computed_tokens < r.num_tokens(),
                "{id}: nothing left to compute"
            );
            if !r.is_prefill_chunk {
                ensure!(
                    r.num_computed_tokens == r.num_tokens() - 1,
                    "{id}: decode gap is not 1"
                );
            }
        }
        // One full-attention group: its registered blocks are the request's
        // hashes (other kinds leave entries null or unregistered).
        let plain = matches!(
            s.kv.coordinator(),
            crate::kv_cache::KvCacheCoordinator::Unitary(_)
        );
        if s.kv.hasher().is_some() && plain {
            let cached = s.kv.num_cached_blocks(slot as usize);
            ensure!(
                cached <= r.block_hashes.len(),
                "{id}: cached count past its hashes"
            );
            for (i, (blk, hash)) in table.iter().zip(&r.block_hashes).take(cached).enumerate() {
                ensure!(
                    s.kv.pool().block_hash(*blk) == Some(hash),
                    "{id}: cached block {i} does not carry the request's hash"
                );
            }
        }
    }

    check_blocks(s)?;
    if phase == Phase::AfterSchedule {
        ensure!(
            s.finished_req_ids.is_empty(),
            "finished ids not handed over"
        );
    }
    Ok(())
}

/// Each group's table of the request in `slot`: one entry per block of
/// its computed tokens once scheduled; the null block only where its kind
/// no longer reads the entry.
fn check_tables(
    s: &Scheduler,
    slot: usize,
    r: &crate::request::Request,
    phase: Phase,
) -> Result<(), String> {
    let cfg = &s.config;
    let id = &r.id;
    for g in 0..s.kv.num_groups() {
        let group = crate::kv_cache::GroupId(g as u32);
        let Some(m) = s.kv.coordinator().manager(group) else {
            continue;
        };
        let b = m.block_size();
        let table = m.block_ids(slot);
        // Entries become null only once out of the window, which only moves
        // forward while the request lives.
        let released = m.num_skipped_tokens(r.num_computed_tokens) / b;
        if let Some(j) = table
            .iter()
            .enumerate()
            .skip(released)
            .find(|(_, &blk)| blk == NULL_BLOCK)
            .map(|(j, _)| j)
        {
            return Err(format!(
                "{id}: null block at entry {j} of group {g}'s table, in its window"
            ));
        }
        if r.status != RequestStatus::Running
            || phase != Phase::AfterSchedule
            || !r.spec_token_ids.is_empty()
            || cfg.num_lookahead_tokens > 0
        {
            continue;
        }
        let want = r.num_computed_tokens.min(cfg.max_model_len).div_ceil(b);
        ensure!(
            table.len() == want,
            "{id}: group {g}'s table has {} blocks, want {want}",
            table.len()
        );
    }
    Ok(())
}

/// Blocks: conservation and reference counts, over every group's tables; a
/// block is in one group's tables at a time.
fn check_blocks(s: &Scheduler) -> Result<(), String> {
    let pool = s.kv.pool();
    pool.check_invariants()?;
    let mut refs: HashMap<u32, u32> = HashMap::new();
    let mut owner: HashMap<u32, crate::kv_cache::GroupId> = HashMap::new();
    for (group, _, table) in s.kv.tables() {
        for &blk in table.iter().filter(|&&b| b != NULL_BLOCK) {
            *refs.entry(blk).or_default() += 1;
            let g = *owner.entry(blk).or_insert(group);
            ensure!(
                g == group,
                "block {blk} in the tables of groups {} and {}",
                g.0,
                group.0
            );
        }
    }
    for blk in 1..pool.num_blocks() as u32 {
        let want = refs.get(&blk).copied().unwrap_or(0);
        ensure!(
            pool.ref_cnt(blk) == want,
            "block {blk}: ref_cnt {} but {want} tables",
            pool.ref_cnt(blk)
        );
    }
    ensure!(
        pool.num_free_blocks() + refs.len() == pool.num_blocks() - 1,
        "free {} + used {} != usable {}",
        pool.num_free_blocks(),
        refs.len(),
        pool.num_blocks() - 1
    );
    let usage = pool.usage();
    ensure!((0.0..=1.0).contains(&usage), "usage {usage} out of range");
    Ok(())
}

/// Per-step limits of one `schedule()` output, against the state right after.
/// `num_reqs_at_start` is running + waiting before the call;
/// `preempted_before` the preemptions already pending then (from a prefix
/// cache reset), which do not stop admissions.
pub fn check_output(
    s: &Scheduler,
    out: &SchedulerOutput,
    num_reqs_at_start: usize,
    preempted_before: usize,
) -> Result<(), String> {
    let cfg = &s.config;
    let total: usize = out.num_scheduled_tokens.iter().map(|e| e.num_tokens).sum();
    ensure!(
        total == out.total_num_scheduled_tokens,
        "total does not match entries"
    );
    ensure!(
        total <= cfg.max_num_scheduled_tokens(),
        "scheduled {total} past the budget"
    );
    ensure!(
        out.num_scheduled_tokens.iter().all(|e| e.num_tokens > 0),
        "a zero entry"
    );
    ensure!(
        out.num_scheduled_tokens.len() <= s.running.len(),
        "more scheduled than running"
    );
    let mut ids = HashSet::new();
    for e in &out.num_scheduled_tokens {
        ensure!(ids.insert(e.req_id.clone()), "{} scheduled twice", e.req_id);
        let r = s
            .request(e.handle)
            .ok_or_else(|| format!("{} not live", e.req_id))?;
        ensure!(
            r.status == RequestStatus::Running,
            "{} scheduled but not running",
            e.req_id
        );
        if cfg.long_prefill_token_threshold > 0
            && num_reqs_at_start >= 2
            && out.scheduled_spec_decode_tokens.is_empty()
        {
            ensure!(
                e.num_tokens <= cfg.long_prefill_token_threshold,
                "{} over the threshold",
                e.req_id
            );
        }
    }
    if out.preempted_req_ids.len() > preempted_before {
        ensure!(
            out.scheduled_new_reqs.is_empty(),
            "admitted in a step that preempted"
        );
        ensure!(
            !out.scheduled_cached_reqs.reqs.iter().any(|c| c.resumed),
            "resumed in a step that preempted"
        );
    }
    for p in out.preempted_req_ids.iter().skip(preempted_before) {
        ensure!(!ids.contains(p), "{p} both scheduled and preempted");
    }
    for n in &out.scheduled_new_reqs {
        ensure!(
            n.num_computed_tokens.is_multiple_of(s.kv.block_size()),
            "{}: hit not block-aligned",
            n.req_id
        );
        if !cfg.enable_prefix_caching {
            ensure!(
                n.num_computed_tokens == 0,
                "{}: hit with caching off",
                n.req_id
            );
        }
    }
    for (i, c) in out.scheduled_cached_reqs.reqs.iter().enumerate() {
        if let Some(blocks) = out.scheduled_cached_reqs.new_block_ids(i) {
            ensure!(
                blocks.iter().any(|g| !g.is_empty()),
                "{}: empty new_block_ids instead of None",
                c.req_id
            );
        }
    }
    Ok(())
}
