//! `Engine::reset_prefix_cache`: the command reaches the engine thread, the
//! scheduler's answer comes back, and the cache is really empty afterwards
//! (a repeated prompt gets no cached tokens).

mod common;

use common::*;
use sluice_engine::{FinishReason, ShutdownMode};

/// 64 bytes: four full blocks of 16, so a repeat hits the cache.
const PROMPT: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

async fn cached_tokens(engine: &sluice_engine::Engine) -> usize {
    let mut stream = engine.generate(request(PROMPT, params(2))).unwrap();
    while stream.next().await.is_some() {}
    stream.usage().cached_tokens
}

#[tokio::test]
async fn an_idle_reset_empties_the_cache() {
    let engine = start(config(scheduler_config()), 64, say("ok"));
    assert_eq!(cached_tokens(&engine).await, 0, "a cold cache");
    assert!(
        cached_tokens(&engine).await > 0,
        "the repeat hits the cache"
    );
    assert!(engine.reset_prefix_cache(false).await.unwrap());
    assert_eq!(
        cached_tokens(&engine).await,
        0,
        "nothing cached after the reset"
    );
    // And the cache fills again.
    assert!(cached_tokens(&engine).await > 0);
    engine.shutdown(ShutdownMode::Drain).await;
}

/// Steps the core by hand, so that the command lands between two steps
/// with the request running, deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_requests_block_the_reset_unless_they_are_reset_too() {
    let (mut core, engine) = core(config(scheduler_config()), 64, |_| vec![u32::from(b'a')]);
    let mut stream = engine.generate(request(PROMPT, params(20))).unwrap();
    for _ in 0..5 {
        core.step();
    }
    assert_eq!(core.scheduler().running_ids().len(), 1);

    let reset = |running: bool| {
        let engine = engine.clone();
        tokio::spawn(async move { engine.reset_prefix_cache(running).await })
    };
    let step_until_answered = |core: &mut sluice_engine::EngineCore,
                               h: &tokio::task::JoinHandle<_>| {
        for _ in 0..10_000 {
            if h.is_finished() {
                return;
            }
            // Only drains the command when nothing else runs: the request
            // is running, so this also advances it by one token.
            core.step();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the reset was never answered");
    };

    let h = reset(false);
    step_until_answered(&mut core, &h);
    assert!(
        !h.await.unwrap().unwrap(),
        "its blocks are held: success is false"
    );

    let h = reset(true);
    step_until_answered(&mut core, &h);
    assert!(h.await.unwrap().unwrap(), "preempted first, then emptied");

    // The preempted request resumes (recomputed) and finishes as if nothing
    // had happened.
    let out = run_to_end(&mut core, &mut stream);
    assert_eq!(out[0].text, "a".repeat(20));
    let finished = out[0].finished.as_ref().unwrap();
    assert_eq!(finished.reason, FinishReason::Length);
}

#[tokio::test]
async fn a_stopped_engine_answers_dead() {
    let engine = start(config(scheduler_config()), 64, say("ok"));
    engine.shutdown(ShutdownMode::Drain).await;
    assert_eq!(
        engine.reset_prefix_cache(false).await,
        Err(sluice_engine::EngineError::Dead)
    );
}
