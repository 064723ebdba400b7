//! Property tests: random configurations and workloads driven through
//! `schedule` / `update_from_output` / aborts for thousands of steps,
//! checking the invariants of `docs/scheduler-semantics.md` §Invariants
//! (all but those marked † there) after every call.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use sluice_core::invariants::{check_output, check_state, Phase};
use sluice_core::{
    ModelRunnerOutput, NewRequest, RequestStatus, SamplingParams, Scheduler, SchedulerConfig,
    SchedulingPolicy,
};

#[derive(Clone, Debug)]
struct Req {
    arrival: u32,
    prompt: Vec<u32>,
    max_tokens: usize,
    priority: i64,
    eos: Option<u32>,
    stop: Vec<u32>,
}

#[derive(Clone, Debug)]
struct Workload {
    cfg: SchedulerConfig,
    reqs: Vec<Req>,
    /// (step, request index)
    aborts: Vec<(u32, usize)>,
    /// Token stream of the fake model.
    tokens: Vec<u32>,
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        2usize..80,
        1usize..200,
        1usize..12,
        8usize..160,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0usize), 1usize..48],
        any::<bool>(),
    )
        .prop_map(
            |(bs, blocks, budget, seqs, mml, chunked, caching, thr, prio)| SchedulerConfig {
                block_size: bs,
                num_gpu_blocks: blocks,
                max_num_batched_tokens: budget,
                max_num_seqs: seqs,
                max_model_len: mml,
                enable_chunked_prefill: chunked,
                enable_prefix_caching: caching,
                long_prefill_token_threshold: thr,
                policy: if prio {
                    SchedulingPolicy::Priority
                } else {
                    SchedulingPolicy::Fcfs
                },
                ..SchedulerConfig::default()
            },
        )
}

fn workload() -> impl Strategy<Value = Workload> {
    config().prop_flat_map(|cfg| {
        let mml = cfg.max_model_len;
        // A tiny vocabulary and shared prefixes make prefix hits common.
        let req = (
            0u32..40,
            prop::collection::vec(0u32..4, 1..mml.min(120)),
            1usize..24,
            0i64..3,
            prop::option::of(0u32..6),
            prop::collection::vec(0u32..8, 0..2),
            any::<bool>(),
        )
            .prop_map(
                |(arrival, prompt, max_tokens, priority, eos, stop, shared)| {
                    let mut prompt = prompt;
                    if shared {
                        let mut p: Vec<u32> = (0..16).collect();
                        p.extend(prompt);
                        prompt = p;
                    }
                    Req {
                        arrival,
                        prompt,
                        max_tokens,
                        priority,
                        eos,
                        stop,
                    }
                },
            );
        (
            Just(cfg),
            prop::collection::vec(req, 1..14),
            prop::collection::vec((0u32..60, 0usize..14), 0..5),
            prop::collection::vec(0u32..40, 64),
        )
            .prop_map(|(cfg, mut reqs, aborts, tokens)| {
                let mml = cfg.max_model_len;
                for r in &mut reqs {
                    r.prompt.truncate(mml - 1);
                }
                Workload {
                    cfg,
                    reqs,
                    aborts,
                    tokens,
                }
            })
    })
}

fn run(w: &Workload, steps: u32) -> Result<u64, String> {
    let mut s = Scheduler::new(w.cfg.clone()).map_err(|e| e.to_string())?;
    let mut tok = 0usize;
    let mut checked = 0u64;
    for step in 0..steps {
        for (i, r) in w.reqs.iter().enumerate().filter(|(_, r)| r.arrival == step) {
            let params = SamplingParams {
                eos_token_id: r.eos,
                stop_token_ids: r.stop.clone(),
                ..SamplingParams::greedy(r.max_tokens)
            };
            let mut new = NewRequest::new(format!("r{i}"), r.prompt.clone(), params);
            new.priority = r.priority;
            new.arrival_time = f64::from(step) * 1e6 + i as f64;
            s.add_request(new).map_err(|e| e.to_string())?;
            check_state(&s, Phase::Other)?;
        }
        for &(_, i) in w.aborts.iter().filter(|(at, _)| *at == step) {
            s.finish_requests(&[format!("r{i}")], RequestStatus::FinishedAborted);
            check_state(&s, Phase::Other)?;
        }
        let (run, wait) = s.get_request_counts();
        let pending = s.pending_preempted_ids().len();
        let out = s.schedule();
        check_state(&s, Phase::AfterSchedule)?;
        check_output(&s, &out, run + wait, pending)?;
        if !w.cfg.enable_chunked_prefill && w.cfg.long_prefill_token_threshold == 0 {
            for n in &out.scheduled_new_reqs {
                let e = out
                    .num_scheduled_tokens
                    .iter()
                    .find(|e| e.req_id == n.req_id)
                    .expect("scheduled");
                if e.num_tokens != n.prompt_token_ids.len() - n.num_computed_tokens {
                    return Err(format!(
                        "{}: a partial admission with chunking off",
                        n.req_id
                    ));
                }
            }
        }
        let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
        for e in &out.num_scheduled_tokens {
            let r = s.request(e.handle).ok_or("scheduled request vanished")?;
            if r.num_computed_tokens() >= r.num_tokens() {
                mro.push(&[w.tokens[tok % w.tokens.len()]]);
                tok += 1;
            } else {
                mro.push(&[]);
            }
        }
        s.update_from_output(&out, &mro);
        check_state(&s, Phase::AfterUpdate)?;
        checked += 1;
        // Occasionally reset the prefix cache, preempting everything.
        if step % 97 == 96 {
            if !s.reset_prefix_cache(true) {
                return Err("reset_prefix_cache failed with nothing running".into());
            }
            check_state(&s, Phase::Other)?;
        }
    }
    Ok(checked)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_for_random_workloads(w in workload()) {
        let steps = run(&w, 300);
        prop_assert!(steps.is_ok(), "{}", steps.unwrap_err());
    }
}

/// Everything eventually finishes when the pool can hold any one request.
#[test]
fn ample_pool_drains_every_workload() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..32 {
        let mut w = workload()
            .new_tree(&mut runner)
            .expect("strategy")
            .current();
        w.cfg.num_gpu_blocks = w.cfg.max_model_len / w.cfg.block_size + 2;
        w.cfg.max_num_batched_tokens = w.cfg.max_num_batched_tokens.max(w.cfg.max_model_len);
        w.aborts.clear();
        let mut s = Scheduler::new(w.cfg.clone()).expect("valid config");
        for (i, r) in w.reqs.iter().enumerate() {
            s.add_request(NewRequest::new(
                format!("r{i}"),
                r.prompt.clone(),
                SamplingParams::greedy(r.max_tokens),
            ))
            .expect("valid request");
        }
        let mut steps = 0;
        while s.has_unfinished_requests() {
            let out = s.schedule();
            let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
            for e in &out.num_scheduled_tokens {
                let r = s.request(e.handle).expect("live");
                mro.push(if r.num_computed_tokens() >= r.num_tokens() {
                    &[1]
                } else {
                    &[]
                });
            }
            s.update_from_output(&out, &mro);
            steps += 1;
            assert!(steps < 100_000, "workload does not drain: {w:?}");
        }
        assert_eq!(s.kv_cache_usage(), 0.0);
    }
}
