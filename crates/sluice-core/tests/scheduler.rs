//! Scheduler scenarios: each a small story with the decisions vLLM makes.

mod common;
use common::*;
use sluice_core::invariants::{check_state, Phase};
use sluice_core::{RequestStatus, SchedulingPolicy};

#[test]
fn running_before_waiting_and_head_of_line_blocking_without_chunking() {
    let mut cfg = config(16, 64);
    cfg.enable_chunked_prefill = false;
    cfg.max_num_batched_tokens = 256;
    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 100), 4);
    add(&mut s, "B", prompt(1000, 200), 2);
    add(&mut s, "C", prompt(2000, 50), 3);
    // B does not fit next to A; C behind it waits (strict head-of-line).
    assert_eq!(plan(&step(&mut s)), p(&[("A", 100)]));
    assert_eq!(plan(&step(&mut s)), p(&[("A", 1), ("B", 200), ("C", 50)]));
}

#[test]
fn chunked_prefill_cuts_the_head_prompt_to_the_budget() {
    let mut cfg = config(16, 64);
    cfg.max_num_batched_tokens = 64;
    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 100), 2);
    add(&mut s, "B", prompt(1000, 10), 2);
    assert_eq!(plan(&step(&mut s)), p(&[("A", 64)]));
    // A's remaining 36, then B's prompt with what is left.
    assert_eq!(plan(&step(&mut s)), p(&[("A", 36), ("B", 10)]));
    assert_eq!(plan(&step(&mut s)), p(&[("A", 1), ("B", 1)]));
}

#[test]
fn long_prefill_threshold_is_off_for_a_lone_request() {
    let mut cfg = config(16, 256);
    cfg.long_prefill_token_threshold = 128;
    let mut s = sched(cfg.clone());
    add(&mut s, "A", prompt(0, 500), 1);
    // Alone at step start: the whole budget.
    assert_eq!(plan(&step(&mut s)), p(&[("A", 500)]));

    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 500), 1);
    add(&mut s, "B", prompt(1000, 500), 1);
    assert_eq!(plan(&step(&mut s)), p(&[("A", 128), ("B", 128)]));
}

#[test]
fn threshold_chunks_even_with_chunked_prefill_off() {
    let mut cfg = config(16, 256);
    cfg.enable_chunked_prefill = false;
    cfg.long_prefill_token_threshold = 100;
    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 300), 1);
    add(&mut s, "B", prompt(1000, 300), 1);
    assert_eq!(plan(&step(&mut s)), p(&[("A", 100), ("B", 100)]));
    assert_eq!(plan(&step(&mut s)), p(&[("A", 100), ("B", 100)]));
}

#[test]
fn max_num_seqs_limits_running_not_scheduled() {
    let mut cfg = config(16, 64);
    cfg.max_num_seqs = 2;
    let mut s = sched(cfg);
    for (i, id) in ["A", "B", "C"].iter().enumerate() {
        add(&mut s, id, prompt(100 * i as u32, 10), 3);
    }
    assert_eq!(plan(&step(&mut s)), p(&[("A", 10), ("B", 10)]));
    assert_eq!(s.get_request_counts(), (2, 1));
}

/// `docs/scheduler-semantics.md` §Worked examples, E2: FCFS, caching off,
/// B = 4, N = 6.
#[test]
fn fcfs_preempts_the_running_tail_and_self_preemption_ends_the_loop() {
    let mut s = sched(config(4, 6));
    add(&mut s, "A", prompt(0, 8), 10);
    add(&mut s, "B", prompt(100, 8), 10);
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("A", 8), ("B", 8)]));
    assert_eq!(s.block_ids("A").unwrap(), &[1, 2]);
    assert_eq!(s.block_ids("B").unwrap(), &[3, 4]);

    // Step 1: A takes the last block; B needs one, is the tail, preempts itself.
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("A", 1)]));
    assert_eq!(ids(&out.preempted_req_ids), vec!["B"]);
    assert_eq!(
        out.scheduled_cached_reqs
            .new_block_ids(0)
            .map(|g| g.group(0)),
        Some(&[5][..])
    );
    assert_eq!(s.kv_cache_manager().num_free_blocks(), 2);
    // B's table [3, 4] was freed last block first: the head is 4, 3.
    let free: Vec<u32> = s.kv_cache_manager().pool().free_queue().iter().collect();
    assert_eq!(free, vec![4, 3]);

    // Step 2: B (9 tokens) needs 3 blocks to be admitted; only 2 are free.
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("A", 1)]));
    assert!(out.scheduled_cached_reqs.reqs.iter().all(|c| !c.resumed));
    assert_eq!(
        s.get_request("B").unwrap().status(),
        RequestStatus::Preempted
    );
    check_state(&s, Phase::AfterUpdate).unwrap();
}

#[test]
fn preempted_request_resumes_with_its_outputs_and_is_reported_resumed() {
    let mut s = sched(config(4, 6));
    add(&mut s, "A", prompt(0, 8), 3);
    add(&mut s, "B", prompt(100, 8), 3);
    step(&mut s);
    step(&mut s); // B preempted.
    let mut resumed_at = None;
    for i in 0..10 {
        let out = step(&mut s);
        if out.scheduled_cached_reqs.reqs.iter().any(|c| c.resumed) {
            resumed_at = Some((i, plan(&out)));
            break;
        }
    }
    // B recomputes its prompt and its one output: 9 tokens.
    let (_, plan) = resumed_at.expect("B resumes once A finished");
    assert_eq!(plan, p(&[("B", 9)]));
}

/// Priority preemption can undo a request already scheduled in this step.
#[test]
fn priority_preemption_undoes_a_victim_scheduled_earlier_in_the_step() {
    let mut cfg = config(4, 6);
    cfg.policy = SchedulingPolicy::Priority;
    let mut s = sched(cfg);
    // X is less urgent (priority 5) but arrived first; Y is urgent.
    add_prio(&mut s, "X", prompt(0, 8), 10, 5, 0.0);
    add_prio(&mut s, "Y", prompt(100, 8), 10, 0, 1.0);
    // The waiting heap admits Y first (priority order); both fit.
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("Y", 8), ("X", 8)]));
    // Running order is admission order: [Y, X]. Y takes the last free block,
    // X then needs one: the victim is max (priority, arrival) = X itself.
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("Y", 1)]));
    assert_eq!(ids(&out.preempted_req_ids), vec!["X"]);

    // Now make the less urgent request run first: Z (priority 9) is running
    // ahead of W (priority 1) and both need a block with only one free.
    let mut cfg = config(4, 6);
    cfg.policy = SchedulingPolicy::Priority;
    let mut s = sched(cfg);
    add_prio(&mut s, "Z", prompt(0, 8), 10, 9, 0.0);
    step(&mut s); // Z alone: blocks 1, 2.
    add_prio(&mut s, "W", prompt(100, 7), 10, 1, 1.0);
    // Z decodes (9 tokens, needs block 3); W is admitted with 7 tokens (2 blocks).
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("Z", 1), ("W", 7)]));
    assert_eq!(s.kv_cache_manager().num_free_blocks(), 0);
    // Running [Z, W]: Z (10 tokens) fits in its 3 blocks; W (8 tokens) fits in
    // its 2 blocks. One more step: Z needs nothing, W needs a third block.
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("Z", 1), ("W", 1)]));
    // Z now has 11 tokens (fits 3 blocks), W has 9 and needs block 3 of its
    // own: none is free. The victim is Z (priority 9), scheduled earlier this
    // step: its scheduling is undone and its blocks freed, and W fits.
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("W", 1)]));
    assert_eq!(ids(&out.preempted_req_ids), vec!["Z"]);
    assert_eq!(out.scheduled_cached_reqs.len(), 1);
    assert_eq!(out.scheduled_cached_reqs.reqs[0].req_id.as_ref(), "W");
    assert!(out.scheduled_cached_reqs.new_block_ids(0).is_some());
    assert!(out.scheduled_new_reqs.is_empty());
    check_state(&s, Phase::AfterUpdate).unwrap();
}

#[test]
fn full_sequence_gate_blocks_admission_even_for_a_small_chunk() {
    let mut cfg = config(4, 5); // 4 usable blocks = 16 tokens
    cfg.max_num_batched_tokens = 4;
    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 17), 1);
    // A's first chunk (4 tokens) would fit, but all 17 known tokens must.
    let out = step(&mut s);
    assert!(out.num_scheduled_tokens.is_empty());
    assert_eq!(s.get_request_counts(), (0, 1));
}

#[test]
fn no_admissions_in_a_step_that_preempted() {
    let mut s = sched(config(4, 6));
    add(&mut s, "A", prompt(0, 8), 10);
    add(&mut s, "B", prompt(100, 8), 10);
    step(&mut s);
    add(&mut s, "C", prompt(200, 1), 10);
    let out = step(&mut s);
    assert_eq!(ids(&out.preempted_req_ids), vec!["B"]);
    assert!(
        out.scheduled_new_reqs.is_empty(),
        "C must wait for the next step"
    );
}

#[test]
fn aborts_of_waiting_running_unknown_and_finished_requests() {
    let mut s = sched(config(16, 64));
    add(&mut s, "A", prompt(0, 20), 5);
    add(&mut s, "B", prompt(100, 20), 5);
    step(&mut s);
    add(&mut s, "W", prompt(200, 20), 5);
    let free_before = s.kv_cache_manager().num_free_blocks();
    assert_eq!(abort(&mut s, "A"), vec!["A"]); // running
    assert_eq!(s.kv_cache_manager().num_free_blocks(), free_before + 2);
    assert_eq!(abort(&mut s, "W"), vec!["W"]); // waiting
    assert!(abort(&mut s, "nope").is_empty()); // unknown
    assert!(abort(&mut s, "A").is_empty()); // already finished
    check_state(&s, Phase::Other).unwrap();
    let out = step(&mut s);
    assert_eq!(ids(&out.finished_req_ids), vec!["A", "W"]);
    assert_eq!(plan(&out), p(&[("B", 1)]));
    // Reported once only.
    assert!(step(&mut s).finished_req_ids.is_empty());
}

#[test]
fn finished_requests_free_blocks_in_scheduled_order() {
    // Caching off: each free prepends, so the last freed table is reused first.
    let mut s = sched(config(4, 32));
    add(&mut s, "A", prompt(0, 8), 1);
    add(&mut s, "B", prompt(100, 8), 1);
    let out = step(&mut s);
    assert_eq!(plan(&out), p(&[("A", 8), ("B", 8)]));
    assert_eq!(ids(&s.schedule().finished_req_ids), vec!["A", "B"]);
    // A freed [1, 2] -> head 2, 1; then B freed [3, 4] -> head 4, 3, 2, 1.
    let free: Vec<u32> = s
        .kv_cache_manager()
        .pool()
        .free_queue()
        .iter()
        .take(4)
        .collect();
    assert_eq!(free, vec![4, 3, 2, 1]);
}

#[test]
fn duplicate_and_invalid_requests_are_refused_with_the_field() {
    use sluice_core::{NewRequest, SamplingParams};
    let mut cfg = config(16, 64);
    cfg.max_model_len = 32;
    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 4), 1);
    let dup = s.add_request(NewRequest::new("A", vec![1], SamplingParams::greedy(1)));
    assert_eq!(dup.unwrap_err().field, "request_id");
    let empty = s.add_request(NewRequest::new("E", vec![], SamplingParams::greedy(1)));
    assert_eq!(empty.unwrap_err().field, "prompt");
    let long = s.add_request(NewRequest::new(
        "L",
        prompt(0, 32),
        SamplingParams::greedy(1),
    ));
    assert_eq!(long.unwrap_err().field, "prompt");
    let mut params = SamplingParams::greedy(2);
    params.min_tokens = 3;
    let bad = s.add_request(NewRequest::new("M", vec![1], params));
    assert_eq!(bad.unwrap_err().field, "min_tokens");
    assert_eq!(s.get_request_counts(), (0, 1));
}

#[test]
fn max_model_len_caps_generation() {
    let mut cfg = config(4, 64);
    cfg.max_model_len = 12;
    let mut s = sched(cfg);
    add(&mut s, "A", prompt(0, 10), 100);
    step(&mut s);
    let out = s.schedule();
    assert_eq!(plan(&out), p(&[("A", 1)]));
    let mut mro = sluice_core::ModelRunnerOutput::with_capacity(1);
    mro.push(&[5]);
    let res = s.update_from_output(&out, &mro);
    assert_eq!(
        res[0].finish_reason,
        Some(sluice_core::FinishReason::Length)
    );
}

#[test]
fn pause_states() {
    use sluice_core::PauseState;
    let mut s = sched(config(16, 64));
    add(&mut s, "A", prompt(0, 10), 5);
    step(&mut s);
    add(&mut s, "B", prompt(100, 10), 5);
    s.set_pause_state(PauseState::PausedNew);
    assert_eq!(
        plan(&step(&mut s)),
        p(&[("A", 1)]),
        "running continues, B waits"
    );
    s.set_pause_state(PauseState::PausedAll);
    assert!(step(&mut s).num_scheduled_tokens.is_empty());
    assert_eq!(s.get_num_unfinished_requests(), 0);
    s.set_pause_state(PauseState::Unpaused);
    assert_eq!(plan(&step(&mut s)), p(&[("A", 1), ("B", 10)]));
}

#[test]
fn blocked_requests_are_skipped_and_return_to_the_head_in_order() {
    use sluice_core::{NewRequest, SamplingParams};
    let mut s = sched(config(16, 64));
    for id in ["G1", "G2"] {
        let mut r = NewRequest::new(id, prompt(0, 10), SamplingParams::greedy(2));
        r.needs_grammar = true;
        s.add_request(r).unwrap();
    }
    add(&mut s, "C", prompt(50, 10), 2);
    assert_eq!(plan(&step(&mut s)), p(&[("C", 10)]));
    assert_eq!(ids(&s.waiting_ids()), vec!["G1", "G2"]);
    assert_eq!(s.make_stats().num_skipped_waiting_reqs, 2);
    assert!(s.set_grammar_ready("G2"));
    // G1 is still blocked and skipped; G2 is admitted behind it.
    assert_eq!(plan(&step(&mut s)), p(&[("C", 1), ("G2", 10)]));
    assert_eq!(ids(&s.waiting_ids()), vec!["G1"]);
}

#[test]
fn speculative_tokens_are_scheduled_and_rejections_roll_back() {
    let mut s = sched(config(4, 64));
    add(&mut s, "A", prompt(0, 6), 20);
    step(&mut s); // prefill, 7 tokens, computed 6
    s.update_draft_token_ids(&[("A".into(), vec![9, 9, 9])]);
    let out = s.schedule();
    assert_eq!(plan(&out), p(&[("A", 4)]));
    assert_eq!(out.scheduled_spec_decode_tokens[0].1, vec![9, 9, 9]);
    // The runner accepted one draft and sampled one bonus token: 2 tokens.
    let mut mro = sluice_core::ModelRunnerOutput::with_capacity(1);
    mro.push(&[9, 4]);
    s.update_from_output(&out, &mro);
    let a = s.get_request("A").unwrap();
    // 6 + 4 scheduled - 2 rejected = 8 computed; 9 tokens known.
    assert_eq!(a.num_computed_tokens(), 8);
    assert_eq!(a.num_tokens(), 9);
    check_state(&s, Phase::AfterUpdate).unwrap();
}

#[test]
fn kv_cache_usage_is_the_shared_pools_after_sliding_groups_free_blocks() {
    // `vllm:kv_cache_usage_perc` is vLLM's `BlockPool.get_usage`: 1 − free ÷
    // (blocks − the null block), over the one pool every group draws from.
    // A 32-token window beside a full group, blocks of 16, 101 blocks.
    use sluice_core::kv_cache::KvCacheGroupSpec;
    use sluice_core::SchedulerConfig;
    let hybrid = SchedulerConfig {
        kv_cache_groups: vec![KvCacheGroupSpec::sliding_window(32), KvCacheGroupSpec::FULL],
        ..config(16, 101)
    };
    let mut s = sched(hybrid);
    add(&mut s, "r", prompt(0, 256), 4);
    // The prefill takes 256 ÷ 16 = 16 blocks in each group: 32 of 100.
    step(&mut s);
    assert_eq!(s.make_stats().kv_cache_usage, 1.0 - 68.0 / 100.0);
    // The first decode: 256 computed tokens, so the window needs positions
    // 225.. (256 − 32 + 1); the sliding group frees blocks 0..=13 (225 ÷ 16
    // = 14 skipped) and both groups take block 16 for position 256: 17
    // full + 3 sliding = 20 of 100.
    step(&mut s);
    assert_eq!(s.make_stats().kv_cache_usage, 1.0 - 80.0 / 100.0);
    assert_eq!(s.kv_cache_usage(), 1.0 - 80.0 / 100.0);
    // One full group keeps all 17.
    let mut s = sched(config(16, 101));
    add(&mut s, "r", prompt(0, 256), 4);
    step(&mut s);
    step(&mut s);
    assert_eq!(s.make_stats().kv_cache_usage, 1.0 - 83.0 / 100.0);
}
