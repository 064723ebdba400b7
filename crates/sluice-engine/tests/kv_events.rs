//! The engine hands each step's KV cache events to its sink, once, with a
//! Unix timestamp; without events (the default), the sink is never called.

mod common;

use common::*;
use sluice_core::kv_events::KvCacheEvent;
use sluice_engine::{Engine, ScriptedExecutor, Tokenizer};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

type Batches = Arc<Mutex<Vec<(f64, Vec<KvCacheEvent>)>>>;

fn recording_sink(batches: &Batches) -> Box<dyn sluice_engine::KvEventSink> {
    let batches = batches.clone();
    Box::new(move |ts, events| {
        batches.lock().unwrap().push((ts, events));
    })
}

/// A 40-token prompt: two full blocks of 16 to cache.
const PROMPT: &str = "the quick brown fox jumps over the lazy d";

#[test]
fn no_events_no_batches() {
    let batches = Batches::default();
    let (mut core, engine) = core(config(scheduler_config()), 64, say("ok"));
    core.set_kv_event_sink(recording_sink(&batches));
    let mut stream = engine.generate(request(PROMPT, params(4))).unwrap();
    run_to_end(&mut core, &mut stream);
    assert!(batches.lock().unwrap().is_empty());
}

#[tokio::test]
async fn each_steps_events_reach_the_sink_with_a_unix_timestamp() {
    let batches = Batches::default();
    let sc = sluice_engine::SchedulerConfig {
        enable_prefix_caching: true,
        enable_kv_cache_events: true,
        ..scheduler_config()
    };
    let exec = ScriptedExecutor::new(64, say("ok")).with_vocab_size(384);
    let engine = Engine::start_with_kv_event_sink(
        config(sc),
        Box::new(exec),
        Arc::new(Tokenizer::builtin()),
        recording_sink(&batches),
    )
    .unwrap();
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    collect(engine.generate(request(PROMPT, params(4))).unwrap()).await;
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let batches = batches.lock().unwrap();
    assert!(!batches.is_empty());
    for (ts, events) in batches.iter() {
        assert!(
            !events.is_empty(),
            "a step without events publishes nothing"
        );
        assert!(before <= *ts && *ts <= after, "{before} <= {ts} <= {after}");
    }
    let stored: usize = batches
        .iter()
        .flat_map(|(_, e)| e)
        .map(|e| match e {
            KvCacheEvent::BlockStored { block_hashes, .. } => block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert!(stored >= 2, "the prompt's two full blocks were stored");
}
