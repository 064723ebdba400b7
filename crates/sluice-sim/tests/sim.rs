//! The simulator's promises: determinism, vLLM's metric arithmetic, a
//! sane roofline, and the same decisions as `sluice_core::replay`.

use sluice_core::replay::replay;
use sluice_core::SchedulerConfig;
use sluice_sim::step::RowShape;
use sluice_sim::{
    ConstantStepTime, Hardware, ModelShape, RandomWorkload, Roofline, SimReport, SimRequest,
    SimResult, Simulator, StepShape, StepTimeModel,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn roofline_7b_h100() -> Roofline {
    Roofline::new(ModelShape::QWEN2_5_7B, Hardware::H100_SXM)
}

#[test]
fn deterministic_for_a_seed() {
    let w = RandomWorkload {
        num_prompts: 60,
        input_len: 256,
        output_len: 32,
        range_ratio: 0.5,
        prefix_len: 32,
        num_prefix_groups: 3,
        request_rate: 20.0,
        seed: 42,
        ..RandomWorkload::default()
    };
    let reqs = w.generate().unwrap();
    assert_eq!(reqs, w.generate().unwrap());
    let other = RandomWorkload {
        seed: 43,
        ..w.clone()
    }
    .generate()
    .unwrap();
    assert_ne!(reqs, other);
    let sim = Simulator::new(SchedulerConfig::default(), roofline_7b_h100());
    let a = SimReport::from_result(&sim.run(&reqs).unwrap()).to_json();
    let b = SimReport::from_result(&sim.run(&reqs).unwrap()).to_json();
    assert_eq!(a, b);
    assert_eq!(a["completed"], 60);
}

#[test]
fn metrics_on_a_hand_computed_two_request_example() {
    // Every step takes 0.1 s. A (t=0, 4-token prompt, 3 outputs) prefills
    // in step 0 (first token at 0.1) and decodes in step 1 (0.2); B
    // (t=0.15, 4 tokens, 2 outputs) is admitted at step 2 (t=0.2), which
    // also decodes A's last token: A finishes at 0.3, B's first token is
    // at 0.3; step 3 decodes B's last token at 0.4.
    let reqs = vec![
        SimRequest::new("a", 0.0, vec![1, 2, 3, 4], 3),
        SimRequest::new("b", 0.15, vec![5, 6, 7, 8], 2),
    ];
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.1));
    let res = sim.run(&reqs).unwrap();
    let a = &res.requests[0];
    let b = &res.requests[1];
    assert_eq!(a.token_times.len(), 3);
    assert!(close(a.token_times[2], 0.3) && close(a.finish_s.unwrap(), 0.3));
    assert_eq!(b.admitted_step, 2);
    assert!(close(b.token_times[0], 0.3) && close(b.finish_s.unwrap(), 0.4));

    let r = SimReport::from_result(&res);
    assert_eq!(r.completed, 2);
    assert_eq!(r.num_steps, 4);
    assert!(close(r.duration_s, 0.4));
    assert_eq!((r.total_input_tokens, r.total_output_tokens), (8, 5));
    assert!(close(r.request_throughput, 5.0));
    assert!(close(r.output_throughput, 12.5));
    assert!(close(r.total_token_throughput, 32.5));
    // TTFT: A 0.1, B 0.15. E2EL: A 0.3, B 0.25. TPOT: A (0.3−0.1)/2,
    // B (0.25−0.15)/1, both 0.1. ITL: A [0.1, 0.1], B [0.1].
    assert!(close(r.ttft.mean_ms, 125.0) && close(r.ttft.median_ms, 125.0));
    assert!(close(r.ttft.p90_ms, 145.0) && close(r.ttft.p99_ms, 149.5));
    assert!(close(r.e2el.mean_ms, 275.0));
    assert!(close(r.tpot.mean_ms, 100.0) && close(r.tpot.p99_ms, 100.0));
    assert!(close(r.itl.mean_ms, 100.0) && close(r.itl.median_ms, 100.0));
    // Batch sizes per step: 1, 1, 2, 1.
    assert!(close(r.mean_batch_size, 1.25));
    assert_eq!(r.peak_batch_size, 2);
    assert_eq!(r.num_preemptions, 0);
    let j = r.to_json();
    assert_eq!(j["completed"], 2);
    assert!(close(j["mean_ttft_ms"].as_f64().unwrap(), 125.0));
    assert!(close(j["median_tpot_ms"].as_f64().unwrap(), 100.0));
    assert!(j.get("p99_itl_ms").is_some() && j.get("std_e2el_ms").is_some());
}

fn decode_step(batch: usize, context: usize) -> StepShape {
    StepShape {
        rows: vec![
            RowShape {
                new_tokens: 1,
                context_before: context,
                samples: true,
                shared_context: 0,
            };
            batch
        ],
    }
}

#[test]
fn roofline_decode_grows_with_batch_until_compute_bound() {
    let m = roofline_7b_h100();
    let sizes = [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
    ];
    let times: Vec<f64> = sizes
        .iter()
        .map(|&b| m.step_time(&decode_step(b, 16)))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // Small batches are weight-bandwidth-bound: nearly free to grow.
    assert!(times[6] < 1.2 * times[0], "{times:?}");
    // Large ones are compute-bound: time doubles with the batch.
    assert!(times[13] > 1.8 * times[12], "{times:?}");
    // Per-token cost falls all the way.
    let per_token: Vec<f64> = times.iter().zip(sizes).map(|(t, b)| t / b as f64).collect();
    assert!(per_token.windows(2).all(|w| w[0] >= w[1]), "{per_token:?}");
    // Longer contexts read more KV.
    assert!(m.step_time(&decode_step(64, 4096)) > m.step_time(&decode_step(64, 16)));
}

#[test]
fn h200_is_faster_than_a100() {
    let prefill = StepShape {
        rows: vec![RowShape {
            new_tokens: 2048,
            context_before: 0,
            samples: true,
            shared_context: 0,
        }],
    };
    for shape in [ModelShape::QWEN2_5_7B, ModelShape::LLAMA_3_1_70B] {
        let h200 = Roofline::new(shape, Hardware::H200);
        let a100 = Roofline::new(shape, Hardware::A100_80GB);
        for step in [decode_step(32, 1024), prefill.clone()] {
            assert!(h200.step_time(&step) < a100.step_time(&step));
        }
    }
}

/// Runs the workload in the simulator and replays the trace of the run:
/// every step must schedule the same (request, tokens) in the same order,
/// preempt the same requests and leave the same number of free blocks.
fn assert_decisions_equal_replay(config: SchedulerConfig, w: RandomWorkload) -> SimResult {
    let reqs = w.generate().unwrap();
    let sim = Simulator::new(config, roofline_7b_h100()).record_schedule(true);
    let res = sim.run(&reqs).unwrap();
    let log = replay(res.to_trace(&reqs)).unwrap();
    assert_eq!(log.len(), res.steps.len(), "step counts differ");
    for (i, (rec, st)) in log.iter().zip(&res.steps).enumerate() {
        assert_eq!(rec.scheduled, st.scheduled, "step {i}");
        assert_eq!(rec.preempted, st.preempted, "step {i}");
        assert_eq!(rec.free_blocks, st.free_blocks, "step {i}");
    }
    assert!(res.requests.iter().all(|t| t.finish_s.is_some()));
    res
}

#[test]
fn decisions_equal_replay_with_prefix_sharing_and_gaps() {
    let w = RandomWorkload {
        num_prompts: 80,
        input_len: 300,
        output_len: 24,
        range_ratio: 0.5,
        prefix_len: 64,
        num_prefix_groups: 4,
        // Slow enough that the engine goes idle between some arrivals.
        request_rate: 30.0,
        burstiness: 0.5,
        seed: 7,
        ..RandomWorkload::default()
    };
    let config = SchedulerConfig {
        max_num_batched_tokens: 512,
        ..SchedulerConfig::default()
    };
    let res = assert_decisions_equal_replay(config, w);
    assert!(
        res.prefix_cache_hits > 0,
        "the test must exercise prefix hits"
    );
    let idle = res
        .steps
        .windows(2)
        .any(|p| p[1].start_s > p[0].start_s + p[0].duration_s + 1e-12);
    assert!(idle, "the test must exercise an idle jump");
}

#[test]
fn decisions_equal_replay_under_preemption() {
    let w = RandomWorkload {
        num_prompts: 40,
        input_len: 200,
        output_len: 120,
        range_ratio: 0.3,
        seed: 3,
        ..RandomWorkload::default()
    };
    // 80 blocks of 16 tokens cannot hold 40 requests' growth.
    let config = SchedulerConfig {
        num_gpu_blocks: 80,
        max_num_batched_tokens: 1024,
        ..SchedulerConfig::default()
    };
    let res = assert_decisions_equal_replay(config, w);
    assert!(res.preemptions > 0, "the test must exercise preemption");
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let sim = Simulator::new(SchedulerConfig::default(), ConstantStepTime(0.01));
    let req = |arrival_s: f64, prompt: Vec<u32>, output_len: usize| {
        SimRequest::new("x", arrival_s, prompt, output_len)
    };
    assert!(sim.run(&[req(f64::NAN, vec![1], 1)]).is_err());
    assert!(sim.run(&[req(0.0, vec![], 1)]).is_err());
    assert!(sim.run(&[req(0.0, vec![1], 0)]).is_err());
    assert!(sim.run(&[req(0.0, vec![1; 4096], 1)]).is_err());
    assert!(
        Simulator::new(SchedulerConfig::default(), ConstantStepTime(f64::NAN))
            .run(&[req(0.0, vec![1], 1)])
            .is_err()
    );
    assert!(RandomWorkload {
        range_ratio: 1.5,
        ..RandomWorkload::default()
    }
    .generate()
    .is_err());
}

/// Speculative decoding with deterministic acceptance (vLLM's synthetic
/// rates [1, 1, 0, 0]: of 4 drafts exactly 2 are accepted): one request of
/// 1 + 3m tokens takes its prefill step plus m verification steps of
/// 5-token rows, against 3m decode steps without; rates of 0 accept none.
#[test]
fn speculation_accepts_as_the_synthetic_rates_say() {
    use sluice_sim::SimSpeculation;
    let config = SchedulerConfig {
        num_gpu_blocks: 256,
        max_model_len: 1024,
        ..SchedulerConfig::default()
    };
    let req = vec![SimRequest::new("r", 0.0, vec![1; 40], 1 + 3 * 20)];
    let steps_and_rows = |spec: Option<SimSpeculation>| {
        let mut sim = Simulator::new(config.clone(), ConstantStepTime(0.01)).record_schedule(true);
        if let Some(s) = spec {
            sim = sim.with_speculation(s, 7);
        }
        let r = sim.run(&req).unwrap();
        assert_eq!(r.requests[0].token_times.len(), 61);
        let widest = r.steps[1..].iter().map(|s| s.num_tokens).max().unwrap();
        (r.steps.len(), widest)
    };
    assert_eq!(steps_and_rows(None), (61, 1));
    let two_of_four = SimSpeculation::new(vec![4], &[1.0, 1.0, 0.0, 0.0], 1024);
    assert_eq!(steps_and_rows(Some(two_of_four)), (21, 5));
    let none = SimSpeculation::new(vec![4], &[0.0; 4], 1024);
    assert_eq!(steps_and_rows(Some(none)), (61, 5));
}
