//! The engine on `SimulatedExecutor`: requests run to `max_tokens` (the
//! random tokens avoid every EOS id), and each logged step lasts at least
//! the step-time model's time, counted from the engine's step start.

mod common;

use common::*;
use sluice_engine::{Engine, FinishReason, SimulatedExecutor, StartOptions, StepLog, Tokenizer};
use sluice_sim::steplog::StepRecord;
use sluice_sim::ConstantStepTime;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const STEP_S: f64 = 0.004;

#[tokio::test]
async fn requests_end_at_max_tokens_at_the_models_pace() {
    let exec = SimulatedExecutor::new(Box::new(ConstantStepTime(STEP_S)), 64, 384, 5)
        .with_excluded_tokens([EOS, EOS2]);
    let log = Shared::default();
    let options = StartOptions {
        step_clock: Some(exec.step_clock()),
        step_log: Some(StepLog::new("mem", Box::new(log.clone()))),
        ..StartOptions::default()
    };
    let engine = Engine::start_with_options(
        config(scheduler_config()),
        Box::new(exec),
        Arc::new(Tokenizer::builtin()),
        options,
    )
    .unwrap();
    let t0 = Instant::now();
    let lens = [5usize, 12, 20];
    let streams: Vec<_> = lens
        .iter()
        .map(|&m| engine.generate(request("simulate me", params(m))).unwrap())
        .collect();
    for (stream, m) in streams.into_iter().zip(lens) {
        let out = collect(stream).await;
        assert_eq!(out[0].token_ids.len(), m);
        assert!(out[0]
            .token_ids
            .iter()
            .all(|&t| t < 384 && t != EOS && t != EOS2));
        assert_eq!(
            out[0].finished.as_ref().unwrap().reason,
            FinishReason::Length
        );
    }
    let elapsed = t0.elapsed().as_secs_f64();
    engine.shutdown(sluice_engine::ShutdownMode::Drain).await;
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let recs: Vec<StepRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // One step per token of the longest, the others riding along; up to
    // two more if the engine stepped before the later requests arrived.
    assert!((20..=22).contains(&recs.len()), "{text}");
    let decoded: usize = recs.iter().map(|r| r.decode_tokens).sum();
    assert_eq!(decoded, lens.iter().map(|m| m - 1).sum::<usize>());
    for r in &recs {
        // Sleeping never ends early, and the sleep counts from the step start
        // that `step_s` counts from.
        assert!(r.step_s >= STEP_S, "{r:?}");
        assert!(r.forward_s <= r.step_s, "{r:?}");
    }
    let predicted = STEP_S * recs.len() as f64;
    let served: f64 = recs.iter().map(|r| r.step_s).sum();
    println!(
        "simulated engine: {} steps, predicted {predicted:.4} s, steps took {served:.4} s \
         ({:+.1}%), requests took {elapsed:.4} s",
        recs.len(),
        (served / predicted - 1.0) * 100.0
    );
    assert!(elapsed >= predicted);
}
