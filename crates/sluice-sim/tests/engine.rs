//! The engine on `SimulatedExecutor`: requests run to `max_tokens` (the
//! random tokens avoid every EOS id), and each logged step lasts at least
//! the step-time model's time, counted from the engine's step start.

use sluice_engine::{
    Engine, EngineConfig, FinishReason, GenerateRequest, RequestStream, SamplingParams,
    SchedulerConfig, StartOptions, StepLog, TokenId, Tokenizer,
};
use sluice_sim::steplog::StepRecord;
use sluice_sim::{ConstantStepTime, SimulatedExecutor};
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The built-in tokenizer's EOS (`<|im_end|>`).
const EOS: TokenId = 258;
/// The model's second EOS (`<|endoftext|>`), a stop token by default.
const EOS2: TokenId = 256;

fn config() -> EngineConfig {
    let scheduler = SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 512,
        max_model_len: 512,
        block_size: 16,
        ..SchedulerConfig::default()
    };
    EngineConfig::new(scheduler).with_model_eos(&Tokenizer::builtin(), &[EOS, EOS2])
}

fn request(prompt: &str, max_tokens: usize) -> GenerateRequest {
    let ids = prompt.bytes().map(u32::from).collect();
    GenerateRequest::new(ids, SamplingParams::greedy(max_tokens))
}

/// Each completion's tokens and finish reason.
async fn collect(mut stream: RequestStream) -> (Vec<TokenId>, Option<FinishReason>) {
    let (mut tokens, mut reason) = (Vec::new(), None);
    while let Some(out) = stream.next().await {
        tokens.extend(out.token_ids);
        if let Some(f) = out.finished {
            reason = Some(f.reason);
        }
    }
    (tokens, reason)
}

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
    let exec = SimulatedExecutor::new(Box::new(ConstantStepTime(STEP_S)), 64, 16, 384, 5)
        .with_excluded_tokens([EOS, EOS2]);
    let log = Shared::default();
    let options = StartOptions {
        step_log: Some(StepLog::new("mem", Box::new(log.clone()))),
        ..StartOptions::default()
    };
    let engine = Engine::start_with_options(
        config(),
        Box::new(exec),
        Arc::new(Tokenizer::builtin()),
        options,
    )
    .unwrap();
    let t0 = Instant::now();
    let lens = [5usize, 12, 20];
    let streams: Vec<_> = lens
        .iter()
        .map(|&m| engine.generate(request("simulate me", m)).unwrap())
        .collect();
    for (stream, m) in streams.into_iter().zip(lens) {
        let (tokens, reason) = collect(stream).await;
        assert_eq!(tokens.len(), m);
        assert!(tokens.iter().all(|&t| t < 384 && t != EOS && t != EOS2));
        assert_eq!(reason, Some(FinishReason::Length));
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
