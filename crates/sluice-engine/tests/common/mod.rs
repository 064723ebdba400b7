//! Helpers for engine tests: an engine on the scripted executor with the
//! built-in byte-level tokenizer (token id = byte), so a script spells its
//! output byte by byte.
#![allow(dead_code)]

use sluice_engine::{
    Engine, EngineConfig, EngineCore, Finished, GenerateRequest, RequestOutput, RequestStream,
    SamplingParams, SchedulerConfig, ScriptedExecutor, SeqView, TokenId, Tokenizer,
};
use std::sync::Arc;
use std::time::Duration;

/// The built-in tokenizer's EOS (`<|im_end|>`).
pub const EOS: TokenId = 258;
/// The model's second EOS (`<|endoftext|>`), a stop token by default.
pub const EOS2: TokenId = 256;

pub fn bytes(s: &str) -> Vec<TokenId> {
    s.bytes().map(u32::from).collect()
}

pub fn scheduler_config() -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 512,
        max_model_len: 512,
        block_size: 16,
        ..SchedulerConfig::default()
    }
}

pub fn config(scheduler: SchedulerConfig) -> EngineConfig {
    EngineConfig::new(scheduler).with_model_eos(&Tokenizer::builtin(), &[EOS, EOS2])
}

/// Emits `text` byte by byte, then EOS (EOS is always the runner-up, so
/// `min_tokens` masking shows).
pub fn say(text: &str) -> impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static {
    let text = text.as_bytes().to_vec();
    move |v| match text.get(v.output.len()) {
        Some(&b) => vec![u32::from(b), EOS],
        None => vec![EOS, u32::from(b'.')],
    }
}

/// Emits raw token ids, then EOS.
pub fn emit(tokens: Vec<TokenId>) -> impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static {
    move |v| match tokens.get(v.output.len()) {
        Some(&t) => vec![t, EOS],
        None => vec![EOS],
    }
}

pub fn start(
    config: EngineConfig,
    num_blocks: usize,
    script: impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static,
) -> Engine {
    let exec = ScriptedExecutor::new(num_blocks, script)
        .with_vocab_size(384)
        .with_block_size(config.scheduler.block_size);
    Engine::start(config, Box::new(exec), Arc::new(Tokenizer::builtin())).unwrap()
}

pub fn core(
    config: EngineConfig,
    num_blocks: usize,
    script: impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static,
) -> (EngineCore, Engine) {
    let exec = ScriptedExecutor::new(num_blocks, script)
        .with_vocab_size(384)
        .with_block_size(config.scheduler.block_size);
    EngineCore::new(config, Box::new(exec), Arc::new(Tokenizer::builtin())).unwrap()
}

pub fn request(prompt: &str, params: SamplingParams) -> GenerateRequest {
    GenerateRequest::new(bytes(prompt), params)
}

pub fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams::greedy(max_tokens)
}

/// One completion, collected.
#[derive(Debug, Default)]
pub struct Collected {
    pub text: String,
    pub chunks: Vec<String>,
    pub token_ids: Vec<TokenId>,
    pub num_logprobs: usize,
    pub finished: Option<Finished>,
}

fn collect_into(all: &mut Vec<Collected>, out: RequestOutput) {
    if all.len() <= out.index {
        all.resize_with(out.index + 1, Collected::default);
    }
    let c = &mut all[out.index];
    c.text.push_str(&out.text);
    c.chunks.push(out.text);
    c.token_ids.extend(out.token_ids);
    c.num_logprobs += out.logprobs.len();
    if out.finished.is_some() {
        assert!(c.finished.is_none(), "two final outputs for one completion");
        c.finished = out.finished;
    }
}

pub async fn collect(mut stream: RequestStream) -> Vec<Collected> {
    let mut all = Vec::new();
    while let Some(out) = stream.next().await {
        collect_into(&mut all, out);
    }
    all
}

/// Drives a core until the stream is finished.
pub fn run_to_end(core: &mut EngineCore, stream: &mut RequestStream) -> Vec<Collected> {
    let mut all = Vec::new();
    for _ in 0..100_000 {
        while let Some(out) = stream.try_next() {
            collect_into(&mut all, out);
        }
        if stream.is_finished() {
            return all;
        }
        core.step();
    }
    panic!("request did not finish");
}

/// Waits (bounded) until `cond` holds for the engine's stats.
pub async fn wait_for(
    engine: &Engine,
    what: &str,
    cond: impl Fn(&sluice_engine::EngineStats) -> bool,
) {
    for _ in 0..2_000 {
        if cond(&engine.stats()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}: {:?}", engine.stats());
}

/// A model that produces token `b'a'` only as fast as the test allows:
/// `gate.allow(k)` lets `k` more tokens through. The engine thread waits
/// inside `execute` meanwhile, like a slow model (bounded to 10 s).
#[derive(Clone, Default)]
pub struct Gate {
    allowed: Arc<std::sync::atomic::AtomicUsize>,
    produced: Arc<std::sync::atomic::AtomicUsize>,
}

impl Gate {
    pub fn allow(&self, k: usize) {
        self.allowed
            .fetch_add(k, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn script(&self) -> impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static {
        let gate = self.clone();
        move |_| {
            use std::sync::atomic::Ordering::SeqCst;
            for _ in 0..10_000 {
                if gate.produced.load(SeqCst) < gate.allowed.load(SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            gate.produced.fetch_add(1, SeqCst);
            vec![u32::from(b'a')]
        }
    }
}
