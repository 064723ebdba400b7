//! A request's life in the engine: concurrency, aborts, overload,
//! validation, n > 1, priorities, preemption, model errors, shutdown.

mod common;

use common::*;
use sluice_engine::{
    EngineError, FinishReason, GenerateRequest, SamplingParams, SchedulerConfig, SchedulingPolicy,
    ScriptedExecutor, SeqView, ShutdownMode, Tokenizer,
};
use std::sync::Arc;

/// Answers "p<i>" with "reply <i>" (read from the prompt), then EOS.
fn echo_script(v: &SeqView<'_>) -> Vec<u32> {
    let prompt = String::from_utf8_lossy(&v.prompt.iter().map(|&t| t as u8).collect::<Vec<_>>())
        .into_owned();
    let reply = format!("reply {}", &prompt[1..]);
    match reply.as_bytes().get(v.output.len()) {
        Some(&b) => vec![u32::from(b)],
        None => vec![EOS],
    }
}

/// Never stops by itself.
fn forever(_: &SeqView<'_>) -> Vec<u32> {
    vec![u32::from(b'a')]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_requests_each_get_their_own_output() {
    let engine = start(config(scheduler_config()), 512, echo_script);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let stream = engine
                .generate(request(&format!("p{i}"), params(50)))
                .unwrap();
            (i, collect(stream).await)
        }));
    }
    for t in tasks {
        let (i, out) = t.await.unwrap();
        assert_eq!(out[0].text, format!("reply {i}"));
        assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);
    }
    wait_for(&engine, "idle", |s| s.num_running_reqs == 0).await;
    let s = engine.stats();
    assert_eq!(s.finished.stop, 200);
    assert_eq!(s.kv_cache_usage, 0.0);
    assert_eq!(s.e2e_latency.count, 200);
    assert_eq!(s.time_to_first_token.count, 200);
    assert!(s.generation_tokens >= 200 * 7);
    assert!(s.inter_token_latency.count > 0);
    engine.shutdown(ShutdownMode::Drain).await;
}

#[tokio::test]
async fn dropping_a_stream_mid_generation_frees_its_blocks() {
    let gate = Gate::default();
    let engine = start(config(scheduler_config()), 64, gate.script());
    gate.allow(5);
    let mut stream = engine.generate(request("hello", params(400))).unwrap();
    for _ in 0..5 {
        let out = stream.next().await.unwrap();
        assert!(out.finished.is_none());
    }
    assert!(engine.stats().kv_cache_usage > 0.0);
    drop(stream);
    gate.allow(10_000);
    wait_for(&engine, "the aborted request's blocks", |s| {
        s.kv_cache_usage == 0.0 && s.num_running_reqs == 0 && s.finished.abort == 1
    })
    .await;
    // The engine serves on, and the id is free again.
    let out = collect(
        engine
            .generate(request("hi", params(2)).with_id("again"))
            .unwrap(),
    )
    .await;
    assert_eq!(out[0].text, "aa");
}

#[test]
fn dropping_a_waiting_request_removes_it_from_the_queue() {
    // One sequence at a time: the second request waits, then is dropped.
    let sc = SchedulerConfig {
        max_num_seqs: 1,
        ..scheduler_config()
    };
    let (mut core, engine) = core(config(sc), 64, forever);
    let running = engine.generate(request("a", params(400))).unwrap();
    core.step();
    let waiting = engine.generate(request("b", params(400))).unwrap();
    core.step();
    assert_eq!(core.scheduler().get_request_counts(), (1, 1));
    drop(waiting);
    core.step();
    assert_eq!(core.scheduler().get_request_counts(), (1, 0));
    assert!(core.scheduler().kv_cache_usage() > 0.0);
    drop(running);
    core.step();
    assert_eq!(core.scheduler().get_request_counts(), (0, 0));
    assert_eq!(core.scheduler().kv_cache_usage(), 0.0);
    assert_eq!(core.stats().finished.abort, 2);
}

#[tokio::test]
async fn explicit_abort_by_id_finishes_the_stream() {
    let gate = Gate::default();
    let engine = start(config(scheduler_config()), 64, gate.script());
    gate.allow(1);
    let mut stream = engine
        .generate(request("hello", params(400)).with_id("victim"))
        .unwrap();
    stream.next().await.unwrap();
    engine.abort("victim");
    gate.allow(10_000);
    let mut last = None;
    while let Some(o) = stream.next().await {
        last = o.finished;
    }
    assert_eq!(last.unwrap().reason, FinishReason::Abort);
    wait_for(&engine, "blocks back", |s| s.kv_cache_usage == 0.0).await;
}

#[test]
fn overload_refuses_new_requests_past_the_waiting_limit() {
    let mut cfg = config(scheduler_config());
    cfg.max_waiting_requests = Some(3);
    // A core nobody steps yet: everything accepted stays waiting.
    let (mut core, engine) = core(cfg, 64, say("ok"));
    let mut streams = Vec::new();
    for i in 0..3 {
        streams.push(
            engine
                .generate(request(&format!("r{i}"), params(4)))
                .unwrap(),
        );
    }
    match engine.generate(request("one too many", params(4))) {
        Err(EngineError::Overloaded { num_waiting, limit }) => {
            assert_eq!((num_waiting, limit), (3, 3));
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
    // Once the queue drains, requests are accepted again.
    for s in &mut streams {
        let out = run_to_end(&mut core, s);
        assert_eq!(out[0].text, "ok");
    }
    assert!(engine.generate(request("later", params(4))).is_ok());
}

#[tokio::test]
async fn validation_errors_name_the_field() {
    let sc = SchedulerConfig {
        max_model_len: 16,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        ..scheduler_config()
    };
    let engine = start(config(sc), 64, say("x"));
    let field = |req: GenerateRequest| match engine.generate(req) {
        Err(e) => e.field().unwrap_or("<none>").to_string(),
        Ok(_) => "<accepted>".into(),
    };
    assert_eq!(field(request(&"x".repeat(16), params(1))), "prompt");
    assert_eq!(field(GenerateRequest::new(vec![], params(1))), "prompt");
    assert_eq!(
        field(GenerateRequest::new(vec![1, 999], params(1))),
        "prompt"
    );
    assert_eq!(field(request("hi", params(0))), "max_tokens");
    let p = SamplingParams {
        min_tokens: 5,
        ..params(2)
    };
    assert_eq!(field(request("hi", p)), "min_tokens");
    let p = SamplingParams {
        temperature: -1.0,
        ..params(2)
    };
    assert_eq!(field(request("hi", p)), "temperature");
    let p = SamplingParams {
        logprobs: Some(50),
        ..params(2)
    };
    assert_eq!(field(request("hi", p)), "logprobs");
    let p = SamplingParams { n: 0, ..params(2) };
    assert_eq!(field(request("hi", p)), "n");
    let _live = engine
        .generate(request("hi", params(2)).with_id("dup"))
        .unwrap();
    assert_eq!(field(request("hi", params(2)).with_id("dup")), "request_id");
    let msg = engine
        .generate(request(&"x".repeat(16), params(1)))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("max_model_len"), "{msg}");
}

#[tokio::test]
async fn n_completions_share_the_prompt_blocks() {
    // Each completion spells its seed, so they differ.
    let engine = start(config(scheduler_config()), 64, |v: &SeqView<'_>| {
        let s = format!("s{}", v.params.seed.unwrap_or(99));
        match s.as_bytes().get(v.output.len()) {
            Some(&b) => vec![u32::from(b)],
            None => vec![EOS],
        }
    });
    let prompt = "x".repeat(40); // two full blocks of 16 and a partial one
    let p = SamplingParams {
        n: 3,
        seed: Some(7),
        ..params(10)
    };
    let mut stream = engine.generate(request(&prompt, p)).unwrap();
    assert_eq!(stream.n(), 3);
    let mut texts = vec![String::new(); 3];
    let mut finished = vec![None; 3];
    while let Some(o) = stream.next().await {
        texts[o.index].push_str(&o.text);
        if o.finished.is_some() {
            finished[o.index] = o.finished;
        }
    }
    assert_eq!(texts, ["s7", "s8", "s9"]);
    let cached: Vec<usize> = finished
        .iter()
        .map(|f| f.as_ref().unwrap().num_cached_tokens)
        .collect();
    // The first computes the prompt; the others find its full blocks.
    assert_eq!(cached, [0, 32, 32]);
    let u = stream.usage();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
        (40, 9, 32)
    );
    wait_for(&engine, "blocks back", |s| s.kv_cache_usage == 0.0).await;
    let s = engine.stats();
    assert!(s.prefix_cache_hits >= 64, "{s:?}");
}

#[test]
fn priority_policy_runs_the_urgent_request_first() {
    let sc = SchedulerConfig {
        max_num_seqs: 1,
        policy: SchedulingPolicy::Priority,
        ..scheduler_config()
    };
    let (mut core, engine) = core(config(sc), 64, say("abc"));
    let mut low = engine
        .generate(GenerateRequest {
            priority: 10,
            ..request("low", params(10))
        })
        .unwrap();
    let mut high = engine
        .generate(GenerateRequest {
            priority: -5,
            ..request("high", params(10))
        })
        .unwrap();
    // Both arrive before the first step: the urgent one is admitted first.
    let mut order = Vec::new();
    for _ in 0..100 {
        core.step();
        if high.try_next().is_some_and(|o| o.finished.is_some()) {
            order.push("high");
        }
        if low.try_next().is_some_and(|o| o.finished.is_some()) {
            order.push("low");
        }
        if order.len() == 2 {
            break;
        }
    }
    assert_eq!(order, ["high", "low"]);
}

#[tokio::test]
async fn preempted_requests_resume_and_finish_correctly() {
    // 12 usable blocks of 4 tokens for 6 requests of 4 + 20 tokens: the
    // pool runs out and the scheduler preempts.
    let sc = SchedulerConfig {
        block_size: 4,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 48,
        ..scheduler_config()
    };
    let text = "abcdefghijklmnopqrst";
    let engine = start(config(sc), 13, say(text));
    let streams: Vec<_> = (0..6)
        .map(|i| {
            engine
                .generate(request(&format!("pr{i}!"), params(30)))
                .unwrap()
        })
        .collect();
    for s in streams {
        let out = collect(s).await;
        assert_eq!(out[0].text, text);
    }
    wait_for(&engine, "blocks back", |s| s.kv_cache_usage == 0.0).await;
    let s = engine.stats();
    assert!(s.num_preemptions > 0, "no preemption happened: {s:?}");
}

#[test]
fn a_pool_smaller_than_one_sequence_is_refused_at_start() {
    let exec = ScriptedExecutor::new(8, forever);
    let err = sluice_engine::Engine::start(
        config(scheduler_config()),
        Box::new(exec),
        Arc::new(Tokenizer::builtin()),
    )
    .unwrap_err();
    assert_eq!(err.field(), Some("max_model_len"));
}

#[test]
fn an_executor_with_another_block_size_is_refused_naming_both() {
    let exec = ScriptedExecutor::new(64, forever).with_block_size(32);
    let err = sluice_engine::Engine::start(
        config(scheduler_config()),
        Box::new(exec),
        Arc::new(Tokenizer::builtin()),
    )
    .unwrap_err();
    assert_eq!(err.field(), Some("block_size"));
    let message = err.to_string();
    assert!(
        message.contains("(16)") && message.contains("(32)"),
        "{message}"
    );
}

#[tokio::test]
async fn a_model_error_fails_requests_in_flight_and_the_engine_serves_on() {
    let exec = ScriptedExecutor::new(64, say("abcdef")).fail_at_step(2);
    let engine = sluice_engine::Engine::start(
        config(scheduler_config()),
        Box::new(exec),
        Arc::new(Tokenizer::builtin()),
    )
    .unwrap();
    let out = collect(engine.generate(request("hi", params(10))).unwrap()).await;
    let f = out[0].finished.as_ref().unwrap();
    assert_eq!(f.reason, FinishReason::Error);
    assert!(f.error.as_deref().unwrap().contains("scripted failure"));
    wait_for(&engine, "blocks back", |s| s.kv_cache_usage == 0.0).await;
    let out = collect(engine.generate(request("hi", params(10))).unwrap()).await;
    assert_eq!(out[0].text, "abcdef");
}

#[tokio::test]
async fn drain_shutdown_finishes_in_flight_requests_and_refuses_new_ones() {
    let engine = start(config(scheduler_config()), 64, say("abcdef"));
    let streams: Vec<_> = (0..4)
        .map(|i| {
            engine
                .generate(request(&format!("r{i}"), params(10)))
                .unwrap()
        })
        .collect();
    let shutdown = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.shutdown(ShutdownMode::Drain).await })
    };
    for s in streams {
        let out = collect(s).await;
        assert_eq!(out[0].text, "abcdef");
        assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);
    }
    shutdown.await.unwrap();
    assert!(!engine.is_alive());
    assert!(matches!(
        engine.generate(request("late", params(1))),
        Err(EngineError::Dead | EngineError::ShuttingDown)
    ));
}

#[tokio::test]
async fn abort_shutdown_ends_every_stream_with_abort() {
    let gate = Gate::default();
    let engine = start(config(scheduler_config()), 64, gate.script());
    gate.allow(1);
    let mut stream = engine.generate(request("hi", params(400))).unwrap();
    stream.next().await.unwrap();
    let shutdown = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.shutdown(ShutdownMode::Abort).await })
    };
    gate.allow(10_000);
    shutdown.await.unwrap();
    let mut last = None;
    while let Some(o) = stream.next().await {
        last = o.finished;
    }
    assert_eq!(last.unwrap().reason, FinishReason::Abort);
    assert!(!engine.is_accepting());
}

#[test]
fn the_engine_thread_sleeps_when_idle_and_wakes_for_work() {
    // No runtime at all: the blocking API works from plain threads.
    let engine = start(config(scheduler_config()), 64, say("zz"));
    for _ in 0..3 {
        let mut s = engine.generate(request("hi", params(5))).unwrap();
        let mut text = String::new();
        while let Some(o) = s.blocking_next() {
            text.push_str(&o.text);
        }
        assert_eq!(text, "zz");
        // Idle between requests (after the step that reports the finished
        // request to the executor): the step counter stands still.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let steps = engine.stats().num_steps;
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(engine.stats().num_steps, steps);
    }
    engine.shutdown_blocking(ShutdownMode::Drain);
}

#[test]
fn handles_and_streams_can_cross_threads() {
    // What an async server needs: a shared handle, streams it can move into
    // a response body.
    fn shared<T: Send + Sync + Clone + 'static>() {}
    fn movable<T: Send + Unpin + 'static>() {}
    shared::<sluice_engine::Engine>();
    movable::<sluice_engine::RequestStream>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_load_with_clients_going_away_leaks_nothing() {
    // 400 requests on a small pool (preemptions happen), every third one
    // dropped after its first output, some with stop strings, some n = 2.
    let sc = SchedulerConfig {
        max_num_seqs: 32,
        max_num_batched_tokens: 128,
        max_model_len: 128,
        block_size: 4,
        ..scheduler_config()
    };
    let engine = start(config(sc), 80, echo_script);
    let mut tasks = Vec::new();
    for i in 0..400usize {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let params = SamplingParams {
                n: 1 + i % 2,
                stop: if i % 5 == 0 {
                    vec!["ly".into()]
                } else {
                    vec![]
                },
                ..params(40)
            };
            let mut stream = engine.generate(request(&format!("p{i}"), params)).unwrap();
            if i % 3 == 0 {
                stream.next().await;
                return;
            }
            let n = stream.n();
            let mut texts = vec![String::new(); n];
            while let Some(o) = stream.next().await {
                texts[o.index].push_str(&o.text);
            }
            let want = if i % 5 == 0 {
                "rep".to_string()
            } else {
                format!("reply {i}")
            };
            assert!(texts.iter().all(|t| *t == want), "{i}: {texts:?}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    wait_for(&engine, "everything released", |s| {
        s.kv_cache_usage == 0.0 && s.num_running_reqs == 0 && s.num_waiting_reqs == 0
    })
    .await;
    let s = engine.stats();
    let finished = s.finished.stop + s.finished.length + s.finished.abort;
    assert_eq!(finished, 600, "{:?}", s.finished);
    assert_eq!(s.finished.error, 0);
    engine.shutdown(ShutdownMode::Drain).await;
}
