//! The step log: one `StepRecord` line per engine step that scheduled
//! tokens, whose token sums are what the scheduler scheduled and whose
//! times are positive; steps without tokens leave no line; a failing log
//! never stops serving.

mod common;

use common::*;
use sluice_core::StepRecord;
use sluice_engine::{SchedulerConfig, StepLog};
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// A writer the test can read back.
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

impl Shared {
    fn records(&self) -> Vec<StepRecord> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn chunking_config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 32,
        max_num_seqs: 8,
        ..scheduler_config()
    }
}

#[test]
fn every_scheduled_token_is_in_the_log_and_times_are_positive() {
    let buf = Shared::default();
    let (mut core, engine) = core(config(chunking_config()), 64, say("abcdefgh"));
    core.set_step_log(StepLog::new("mem", Box::new(buf.clone())));
    // Distinct first blocks: no prefix hits, every prompt token computed.
    let prompts = [
        "a long prompt that takes several chunks of thirty-two tokens to prefill",
        "short one",
        "Z third",
    ];
    let max_tokens = [6, 3, 8];
    let mut streams: Vec<_> = prompts
        .iter()
        .zip(max_tokens)
        .map(|(p, m)| {
            let mut params = params(m);
            params.ignore_eos = true;
            engine.generate(request(p, params)).unwrap()
        })
        .collect();
    for (stream, m) in streams.iter_mut().zip(max_tokens) {
        let out = run_to_end(&mut core, stream);
        assert_eq!(out[0].token_ids.len(), m);
    }
    drop(core); // flushes
    let recs = buf.records();
    assert!(!recs.is_empty());
    let prompt_tokens: usize = prompts.iter().map(|p| p.len()).sum();
    let decode_tokens: usize = max_tokens.iter().map(|m| m - 1).sum();
    let logged_prefill: usize = recs.iter().map(|r| r.prefill_tokens).sum();
    let logged_decode: usize = recs.iter().map(|r| r.decode_tokens).sum();
    assert_eq!(logged_prefill, prompt_tokens);
    assert_eq!(logged_decode, decode_tokens);
    // Chunked: the long prompt took steps that did not sample for it.
    assert!(recs.iter().any(|r| r.rows.iter().any(|row| row[2] == 0)));
    let mut last = None;
    for r in &recs {
        let rows: usize = r.rows.iter().map(|row| row[0]).sum();
        assert_eq!(r.prefill_tokens + r.decode_tokens, rows, "{r:?}");
        assert!(rows > 0 && rows <= 32, "{r:?}");
        assert_eq!(r.num_reqs, r.rows.len());
        assert_eq!(r.num_prefill_reqs + r.num_decode_reqs, r.num_reqs);
        assert!(r.forward_s > 0.0 && r.step_s >= r.forward_s, "{r:?}");
        assert!(r.t_s >= 0.0);
        if let Some((step, t)) = last {
            assert!(r.step > step && r.t_s >= t, "{r:?}");
        }
        last = Some((r.step, r.t_s));
        // The record is its shape's.
        assert_eq!(StepRecord::from_shape(&r.shape(), 16).rows, r.rows);
    }
}

#[test]
fn steps_without_tokens_leave_no_line_but_keep_their_index() {
    let buf = Shared::default();
    let (mut core, engine) = core(config(scheduler_config()), 64, say("abcdefgh"));
    core.set_step_log(StepLog::new("mem", Box::new(buf.clone())));
    let mut first = engine.generate(request("first", params(50))).unwrap();
    assert!(core.step() && core.step());
    let id = first.request_id().to_string();
    engine.abort(&id);
    // This step only tells the executor that the request finished.
    assert!(core.step());
    while first.try_next().is_some() {}
    assert_eq!(buf.records().len(), 0, "nothing flushed before 256 lines");
    let mut second = engine.generate(request("second", params(2))).unwrap();
    run_to_end(&mut core, &mut second);
    drop(core);
    let steps: Vec<u64> = buf.records().iter().map(|r| r.step).collect();
    assert_eq!(&steps[..2], &[0, 1], "{steps:?}");
    assert!(steps[2] >= 3, "the empty step 2 has no line: {steps:?}");
    assert!(buf.records().iter().all(|r| !r.rows.is_empty()));
}

/// Accepts nothing.
struct Broken;

impl Write for Broken {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("no space left on device"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Err(io::Error::other("no space left on device"))
    }
}

#[tokio::test]
async fn a_broken_log_does_not_stop_serving() {
    let exec = sluice_engine::ScriptedExecutor::new(64, say("fine")).with_vocab_size(384);
    let engine = sluice_engine::Engine::start_with_options(
        config(scheduler_config()),
        Box::new(exec),
        Arc::new(sluice_engine::Tokenizer::builtin()),
        sluice_engine::StartOptions {
            step_log: Some(StepLog::new("broken", Box::new(Broken))),
            ..Default::default()
        },
    )
    .unwrap();
    for _ in 0..2 {
        let out = collect(engine.generate(request("hello", params(10))).unwrap()).await;
        assert_eq!(out[0].text, "fine");
    }
    engine.shutdown(sluice_engine::ShutdownMode::Drain).await;
}
