//! The cluster event loop: replicas behind a router, the client's
//! concurrency limit, conversation turns, replay-style arrivals and
//! prefill/decode disaggregation, on hand-computed cases.

use sluice_core::replay::replay;
use sluice_core::trace::{Trace, TraceRequest};
use sluice_core::SchedulerConfig;
use sluice_sim::{
    ConstantStepTime, PdConfig, RandomWorkload, RouterKind, SimError, SimRequest, Simulator,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn workload(n: usize, seed: u64) -> Vec<SimRequest> {
    RandomWorkload {
        num_prompts: n,
        input_len: 120,
        output_len: 12,
        range_ratio: 0.5,
        request_rate: 40.0,
        seed,
        ..RandomWorkload::default()
    }
    .generate()
    .unwrap()
}

#[test]
fn replicas_behind_round_robin_each_run_what_they_were_given() {
    // Replicas are independent engines: replica k's steps equal a one-
    // replica run of just the requests routed to it.
    let reqs = workload(30, 5);
    let config = SchedulerConfig {
        max_num_batched_tokens: 256,
        ..SchedulerConfig::default()
    };
    let sim = Simulator::new(config.clone(), ConstantStepTime(0.01))
        .with_replicas(3, Box::new(|| RouterKind::RoundRobin.build(0)));
    let res = sim.run(&reqs).unwrap();
    assert_eq!(res.replicas.len(), 3);
    for k in 0..3 {
        let mine: Vec<SimRequest> = reqs.iter().skip(k).step_by(3).cloned().collect();
        let alone = Simulator::new(config.clone(), ConstantStepTime(0.01))
            .run(&mine)
            .unwrap();
        let steps: Vec<_> = res.steps.iter().filter(|s| s.replica == k).collect();
        assert_eq!(steps.len(), alone.steps.len(), "replica {k}");
        for (a, b) in steps.iter().zip(&alone.steps) {
            assert!(close(a.start_s, b.start_s));
            assert_eq!((a.num_tokens, a.num_reqs), (b.num_tokens, b.num_reqs));
        }
        for (j, t) in res.requests.iter().enumerate().skip(k).step_by(3) {
            assert_eq!(t.replica, k, "request {j}");
            let solo = &alone.requests[(j - k) / 3];
            assert_eq!(t.token_times, solo.token_times);
        }
    }
}

#[test]
fn every_router_finishes_every_request_and_is_deterministic() {
    let reqs = workload(60, 9);
    for kind in RouterKind::ALL {
        let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.02))
            .with_replicas(4, Box::new(move || kind.build(1)));
        let a = sim.run(&reqs).unwrap();
        let b = sim.run(&reqs).unwrap();
        assert!(a.requests.iter().all(|t| t.finish_s.is_some()), "{kind}");
        assert_eq!(a.requests, b.requests, "{kind}");
        let used: std::collections::BTreeSet<usize> =
            a.requests.iter().map(|t| t.replica).collect();
        assert!(used.len() > 1, "{kind} used only {used:?}");
    }
}

#[test]
fn prefix_aware_routing_sends_a_conversation_back_to_its_cache() {
    // Two groups of requests with long shared prefixes, arriving spaced
    // out: prefix-aware routing keeps each group on one replica, so
    // nearly every later request hits; round-robin splits the groups.
    let prefix = |g: u32| (0..256).map(|t| 1000 * (g + 1) + t).collect::<Vec<u32>>();
    let reqs: Vec<SimRequest> = (0..40)
        .map(|i| {
            let mut p = prefix(i % 2);
            p.extend([i, i + 1, i + 2]);
            SimRequest::new(format!("{i}"), i as f64 * 0.5, p, 4)
        })
        .collect();
    let hits = |kind: RouterKind| {
        let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.01))
            .with_replicas(4, Box::new(move || kind.build(0)));
        let r = sim.run(&reqs).unwrap();
        r.requests
            .iter()
            .map(|t| t.num_cached_tokens)
            .sum::<usize>()
    };
    let aware = hits(RouterKind::PrefixAware);
    let rr = hits(RouterKind::RoundRobin);
    // 38 of 40 requests can hit all 256 prefix tokens.
    assert_eq!(aware, 38 * 256);
    assert!(rr < aware, "round-robin {rr} vs prefix-aware {aware}");
}

#[test]
fn max_concurrency_holds_requests_and_times_them_from_sending() {
    // One slot: each request is sent when the previous finishes. Steps
    // take 0.1 s; a 3-token output takes 3 steps.
    let reqs: Vec<SimRequest> = (0..3)
        .map(|i| SimRequest::new(format!("{i}"), 0.0, vec![1 + i, 2, 3], 3))
        .collect();
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1))
        .with_max_concurrency(Some(1));
    let res = sim.run(&reqs).unwrap();
    for (i, t) in res.requests.iter().enumerate() {
        let sent = 0.3 * i as f64;
        assert!(close(t.arrival_s, sent), "{i}: {}", t.arrival_s);
        assert!(close(t.first_token_s().unwrap() - t.arrival_s, 0.1));
        assert!(close(t.finish_s.unwrap(), sent + 0.3));
    }
    assert!(res.steps.iter().all(|s| s.num_reqs == 1));
}

#[test]
fn a_later_turn_follows_its_previous_turn_and_hits_its_cache() {
    let first = SimRequest::new("c0-t0", 0.0, (0..64).collect(), 8);
    let mut prompt = first.prompt.clone();
    prompt.extend((0..8).map(|k| sluice_sim::sim::output_token(0, k)));
    prompt.extend(500..520);
    let mut second = SimRequest::new("c0-t1", 0.0, prompt, 4);
    second.after = Some(0);
    second.think_time_s = 2.0;
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1));
    let res = sim.run(&[first, second]).unwrap();
    let (a, b) = (&res.requests[0], &res.requests[1]);
    assert!(close(a.finish_s.unwrap(), 0.8));
    assert!(close(b.arrival_s, 2.8));
    // The first turn's prompt and outputs (72 tokens) are cached in whole
    // blocks of 16: 64 tokens hit.
    assert_eq!(b.num_cached_tokens, 64);
}

#[test]
fn replay_style_arrivals_make_replays_decisions() {
    let reqs: Vec<SimRequest> = workload(25, 11)
        .into_iter()
        .map(|r| SimRequest {
            output_len: 60,
            ..r
        })
        .collect();
    let config = SchedulerConfig {
        max_num_batched_tokens: 200,
        num_gpu_blocks: 40,
        ..SchedulerConfig::default()
    };
    let trace_reqs: Vec<TraceRequest> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| TraceRequest {
            id: r.id.clone(),
            arrival_step: (i as u64 / 3) * 4,
            priority: 0,
            prompt: r.prompt.clone(),
            output: (0..r.output_len)
                .map(|k| sluice_sim::sim::output_token(i, k))
                .collect(),
            max_tokens: r.output_len,
            min_tokens: 0,
            eos_token_id: None,
            ignore_eos: true,
            stop_token_ids: Vec::new(),
            drafts: Vec::new(),
        })
        .collect();
    let by_step: Vec<SimRequest> = reqs
        .iter()
        .zip(&trace_reqs)
        .map(|(r, t)| SimRequest {
            arrival_step: Some(t.arrival_step),
            ..r.clone()
        })
        .collect();
    let sim = Simulator::new(config.clone(), ConstantStepTime(0.01)).record_schedule(true);
    let res = sim.run(&by_step).unwrap();
    let log = replay(Trace {
        name: "t".into(),
        config,
        requests: trace_reqs,
        aborts: Vec::new(),
        max_steps: 10_000,
        grouped: false,
    })
    .unwrap();
    let busy: Vec<_> = log.iter().filter(|r| !r.scheduled.is_empty()).collect();
    let sim_busy: Vec<_> = res
        .steps
        .iter()
        .filter(|s| !s.scheduled.is_empty())
        .collect();
    assert_eq!(busy.len(), sim_busy.len());
    for (i, (rec, st)) in busy.iter().zip(&sim_busy).enumerate() {
        assert_eq!(rec.scheduled, st.scheduled, "busy step {i}");
        assert_eq!(rec.preempted, st.preempted, "busy step {i}");
    }
    assert!(res.preemptions > 0, "the test must exercise preemption");
}

#[test]
fn prefill_decode_disaggregation_moves_the_kv_and_decodes_elsewhere() {
    // Steps take 0.1 s. The prefill replica prefills 64 tokens in step 0
    // (ends 0.1); the KV transfer takes 0.05 + 64 × 1000 B ÷ 1 MB/s =
    // 0.114 s; the decode replica recomputes the last prompt token and
    // samples the first token at 0.314, then two more at 0.414, 0.514.
    let pd = PdConfig {
        prefill: 1,
        decode: 1,
        kv_bytes_per_token: 1000.0,
        link_bandwidth: 1e6,
        transfer_latency_s: 0.05,
    };
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1))
        .with_pd(pd, Box::new(|| RouterKind::RoundRobin.build(0)));
    let res = sim
        .run(&[SimRequest::new("a", 0.0, (0..64).collect(), 3)])
        .unwrap();
    let t = &res.requests[0];
    assert_eq!((t.prefill_replica, t.replica), (Some(0), 1));
    assert!(close(t.kv_arrival_s.unwrap(), 0.214));
    assert_eq!(t.token_times.len(), 3);
    assert!(close(t.token_times[0], 0.314) && close(t.finish_s.unwrap(), 0.514));
    let decode_steps: Vec<_> = res.steps.iter().filter(|s| s.replica == 1).collect();
    assert_eq!(decode_steps[0].num_tokens, 1, "only the last prompt token");
    assert_eq!(res.num_prefill_replicas, 1);
}

#[test]
fn a_request_that_can_never_fit_is_a_stall_error() {
    // 5 blocks of 16 tokens (one is the null block) cannot hold 100.
    let config = SchedulerConfig {
        num_gpu_blocks: 5,
        max_num_batched_tokens: 64,
        ..SchedulerConfig::default()
    };
    let sim = Simulator::new(config, ConstantStepTime(0.1));
    let err = sim
        .run(&[SimRequest::new("big", 0.0, (0..100).collect(), 4)])
        .unwrap_err();
    assert!(matches!(err, SimError::Stalled { replica: 0, .. }), "{err}");
}

#[test]
fn bad_cluster_settings_are_errors() {
    let reqs = workload(2, 1);
    let mut zero = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1));
    zero.replicas = 0;
    assert!(zero.run(&reqs).is_err());
    let mut unrouted = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1));
    unrouted.replicas = 2;
    assert!(unrouted.run(&reqs).is_err(), "two replicas need a router");
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1))
        .with_max_concurrency(Some(0));
    assert!(sim.run(&reqs).is_err());
    let mut later = reqs.clone();
    later[0].after = Some(1);
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1));
    assert!(
        sim.run(&later).is_err(),
        "a turn must follow an earlier request"
    );
}
