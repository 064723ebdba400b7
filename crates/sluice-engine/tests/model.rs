//! The engine on a real model: sluice-model's runner on the tiny-qwen2
//! fixture, whose greedy outputs transformers recorded in reference.json.

use serde_json::Value;
use sluice_engine::{
    Engine, EngineConfig, FinishReason, GenerateRequest, SamplingParams, SchedulerConfig,
    ShutdownMode, StopReason, Tokenizer,
};
use sluice_model::{DType, KvCacheSize, LoadFormat, ModelExecutor, ModelSpec};
use std::path::PathBuf;
use std::sync::Arc;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/data/tiny-qwen2")
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap())
        .unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn start(num_blocks: usize) -> Engine {
    // One kernel thread: the test is about the engine, not the kernels.
    sluice_model::kernels::set_num_threads(1);
    let loaded = sluice_model::load_model(&ModelSpec {
        dir: Some(fixture()),
        builtin: None,
        load_format: LoadFormat::Auto,
        dtype: DType::F32,
        seed: 0,
        quantization: None,
    })
    .unwrap();
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    let sc = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 256,
        block_size: 16,
        ..SchedulerConfig::default()
    };
    let config =
        EngineConfig::new(sc).with_model_eos(&tokenizer, &loaded.generation_config.eos_token_ids);
    let exec = ModelExecutor::new(&loaded, 16, KvCacheSize::Blocks(num_blocks), 0).unwrap();
    Engine::start(config, Box::new(exec), Arc::new(tokenizer)).unwrap()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
}

#[tokio::test]
async fn concurrent_greedy_requests_match_transformers() {
    let engine = start(256);
    let r = reference();
    let prompts = r["prompts"].as_array().unwrap().clone();
    let mut tasks = Vec::new();
    for p in prompts {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = engine
                .generate(GenerateRequest::new(ids(&p["input_ids"]), greedy(32)))
                .unwrap();
            let mut tokens = Vec::new();
            let mut text = String::new();
            while let Some(o) = stream.next().await {
                tokens.extend(o.token_ids);
                text.push_str(&o.text);
            }
            (p, tokens, text)
        }));
    }
    let tokenizer = engine.tokenizer().clone();
    for t in tasks {
        let (p, tokens, text) = t.await.unwrap();
        assert_eq!(tokens, ids(&p["greedy_token_ids"]), "{}", p["name"]);
        // The streamed text is the whole decode, never split characters.
        assert_eq!(
            text,
            tokenizer.decode(&tokens, true).unwrap(),
            "{}",
            p["name"]
        );
    }
    engine.shutdown(ShutdownMode::Drain).await;
}

#[tokio::test]
async fn a_stop_string_in_real_model_output() {
    let engine = start(256);
    let r = reference();
    let p = &r["prompts"][0];
    let full = engine
        .tokenizer()
        .decode(&ids(&p["greedy_token_ids"]), true)
        .unwrap();
    // Stop in the middle of the greedy text, wherever tokens split it.
    let cut = full.char_indices().nth(6).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let params = SamplingParams {
        stop: vec![stop.clone()],
        ..greedy(32)
    };
    let mut stream = engine
        .generate(GenerateRequest::new(ids(&p["input_ids"]), params))
        .unwrap();
    let mut text = String::new();
    let mut finished = None;
    while let Some(o) = stream.next().await {
        text.push_str(&o.text);
        finished = o.finished.or(finished);
    }
    let f = finished.unwrap();
    assert_eq!(f.reason, FinishReason::Stop);
    assert_eq!(f.stop_reason, Some(StopReason::String(stop.clone())));
    assert_eq!(text, full[..full.find(&stop).unwrap()]);
}

#[tokio::test]
async fn dropping_streams_frees_the_model_runner_blocks() {
    let engine = start(64);
    let r = reference();
    let mut streams = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let mut s = engine
            .generate(GenerateRequest::new(ids(&p["input_ids"]), greedy(200)))
            .unwrap();
        s.next().await.unwrap();
        streams.push(s);
    }
    drop(streams);
    for _ in 0..2_000 {
        let s = engine.stats();
        if s.kv_cache_usage == 0.0 && s.num_running_reqs == 0 && s.num_waiting_reqs == 0 {
            // A fast machine may finish one (EOS) before its stream drops.
            let f = s.finished;
            assert_eq!(f.abort + f.stop + f.length, 6, "{f:?}");
            assert!(
                f.abort >= 1,
                "no request was aborted by its dropped stream: {f:?}"
            );
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("blocks not freed: {:?}", engine.stats());
}
