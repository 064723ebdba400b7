//! Structured-output performance on the real SmolLM2-135M-Instruct Q4_1
//! model, the engine driven in process (the server does not expose the
//! grammar-mask stats over HTTP). A benchmark, not a test:
//!
//! ```text
//! cargo run --release -p sluice-cli --example structured_engine_bench [-- MODEL.gguf [THREADS]]
//! ```
//!
//! (the model defaults to `$SLUICE_SMOLLM2_GGUF`, else
//! `.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`; threads to all cores).
//!
//! Measures, in one run:
//! - aggregate output tokens/s (completion tokens / wall time) of 32
//!   concurrent JSON-schema-constrained requests against the same 32
//!   unconstrained (same chat prompts, greedy, max_tokens 96, EOS honoured),
//!   interleaved, median of 3 rounds each; and, since constrained answers
//!   end early (the JSON closes, then EOS), against unconstrained requests
//!   each exactly as long as its constrained twin (EOS ignored);
//! - grammar mask time per step (`grammar_mask_seconds /
//!   grammar_mask_steps`) with 1 and with 32 constrained requests, beside
//!   the mean step time (wall / engine steps) of the same run;
//! - grammar compile time of the 10 schemas of tests/structured.rs (first
//!   and cached), through `Engine::compile_constraint`.

use sluice_engine::{
    ChatMessage, Engine, EngineConfig, GenerateRequest, SamplingParams, SchedulerConfig,
    ShutdownMode, Tokenizer,
};
use sluice_model::{DType, KvCacheSize, LoadFormat, ModelExecutor, ModelSpec};
use sluice_structured::{Constraint, JsonFormat};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const MAX_TOKENS: usize = 96;
const CONCURRENCY: usize = 32;
const ROUNDS: usize = 3;

fn model_path() -> PathBuf {
    if let Some(p) = std::env::args().nth(1) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("SLUICE_SMOLLM2_GGUF") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn start() -> Engine {
    let threads = std::env::args()
        .nth(2)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    sluice_model::kernels::set_num_threads(threads);
    let path = model_path();
    let loaded = sluice_model::load_model(&ModelSpec {
        dir: Some(path.clone()),
        builtin: None,
        load_format: LoadFormat::Auto,
        dtype: DType::Auto,
        seed: 0,
        quantization: None,
    })
    .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let gguf = loaded.gguf.as_ref().expect("a GGUF file");
    let tokenizer = Tokenizer::from_gguf_vocab(&gguf.vocab).unwrap();
    let sc = SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 2048,
        max_model_len: 512,
        block_size: 16,
        ..SchedulerConfig::default()
    };
    let config =
        EngineConfig::new(sc).with_model_eos(&tokenizer, &loaded.generation_config.eos_token_ids);
    let exec = ModelExecutor::new(&loaded, 16, KvCacheSize::Blocks(1024), 0).unwrap();
    eprintln!("{} on {threads} threads", path.display());
    Engine::start(config, Box::new(exec), Arc::new(tokenizer)).unwrap()
}

/// The 10 (prompt, schema) pairs of tests/structured.rs.
fn schemas() -> Vec<(String, serde_json::Value)> {
    let all: serde_json::Value =
        serde_json::from_str(include_str!("../tests/data/structured_schemas.json")).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["prompt"].as_str().unwrap().to_string(),
                s["schema"].clone(),
            )
        })
        .collect()
}

fn constraint(schema: &serde_json::Value) -> Constraint {
    Constraint::Json {
        schema: schema.clone(),
        format: JsonFormat::pattern("[ ]?"),
    }
}

/// One batch run: `k` requests at once (prompt and schema `i % 10`), with
/// or without the constraint; `lens` (unconstrained only) gives request
/// `i` exactly `lens[i]` tokens (EOS ignored). Returns (completion tokens,
/// wall seconds, engine steps, mask steps, mask rows, mask seconds) and
/// each request's completion length.
async fn batch(
    engine: &Engine,
    k: usize,
    constrained: bool,
    lens: Option<&[usize]>,
) -> ((usize, f64, u64, u64, u64, f64), Vec<usize>) {
    let schemas = schemas();
    let before = engine.stats();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..k {
        let (prompt, schema) = &schemas[i % schemas.len()];
        let ids = engine
            .tokenizer()
            .encode_chat(&[ChatMessage::new("user", prompt.clone())], true)
            .unwrap();
        let params = match lens {
            Some(l) => SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(l[i])
            },
            None => SamplingParams::greedy(MAX_TOKENS),
        };
        let mut req = GenerateRequest::new(ids, params);
        if constrained {
            req = req.with_constraint(constraint(schema));
        }
        let mut stream = engine.generate(req).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(o) = stream.next().await {
                n += o.token_ids.len();
            }
            n
        }));
    }
    let mut each = Vec::new();
    for t in tasks {
        each.push(t.await.unwrap());
    }
    let tokens = each.iter().sum();
    let wall = t0.elapsed().as_secs_f64();
    let after = engine.stats();
    (
        (
            tokens,
            wall,
            after.num_steps - before.num_steps,
            after.grammar_mask_steps - before.grammar_mask_steps,
            after.grammar_mask_rows - before.grammar_mask_rows,
            after.grammar_mask_seconds - before.grammar_mask_seconds,
        ),
        each,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let engine = start();

    // Compile times: the compiler's one-time setup (the tokenizer's
    // lexer tables, built on the first compile), then each schema first
    // (uncompiled) and again (cached).
    let t = Instant::now();
    engine
        .compile_constraint(&Constraint::Regex("x".into()))
        .unwrap();
    println!(
        "grammar compiler setup + first (regex) compile: {:.1} ms\n",
        t.elapsed().as_secs_f64() * 1e3
    );
    println!("grammar compile (Engine::compile_constraint, whitespace \"[ ]?\")");
    println!("{:<4} {:>12} {:>12}", "#", "first ms", "cached ms");
    let (mut first_all, mut cached_all) = (Vec::new(), Vec::new());
    for (i, (_, schema)) in schemas().iter().enumerate() {
        let c = constraint(schema);
        let t = Instant::now();
        engine.compile_constraint(&c).unwrap();
        let first = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        engine.compile_constraint(&c).unwrap();
        let cached = t.elapsed().as_secs_f64() * 1e3;
        println!("{i:<4} {first:>12.3} {cached:>12.4}");
        first_all.push(first);
        cached_all.push(cached);
    }
    println!(
        "median {:>10.3} {:>12.4}\n",
        median(first_all),
        median(cached_all)
    );

    // Warm-up: one of each (page in the weights, fill caches).
    batch(&engine, 4, false, None).await;
    batch(&engine, 4, true, None).await;

    // Throughput, interleaved rounds.
    let (mut free, mut json, mut matched) = (Vec::new(), Vec::new(), Vec::new());
    let mut json32 = (0u64, 0u64, 0u64, 0.0f64, 0.0f64);
    let mut free_steps = (0u64, 0.0f64);
    println!("{CONCURRENCY} concurrent requests, max_tokens {MAX_TOKENS}, greedy");
    println!(
        "{:<6} {:<12} {:>8} {:>8} {:>10}",
        "round", "kind", "tokens", "wall s", "tok/s"
    );
    for r in 0..ROUNDS {
        let ((n, w, steps, ..), _) = batch(&engine, CONCURRENCY, false, None).await;
        free_steps = (free_steps.0 + steps, free_steps.1 + w);
        println!(
            "{r:<6} {:<12} {n:>8} {w:>8.2} {:>10.1}",
            "free",
            n as f64 / w
        );
        free.push(n as f64 / w);
        let ((n, w, steps, ms, mr, msec), lens) = batch(&engine, CONCURRENCY, true, None).await;
        println!(
            "{r:<6} {:<12} {n:>8} {w:>8.2} {:>10.1}",
            "json_schema",
            n as f64 / w
        );
        json.push(n as f64 / w);
        // Unconstrained again, each request as long as its constrained
        // twin: the same work shape, so the difference is the grammar's.
        let ((n, w, ..), _) = batch(&engine, CONCURRENCY, false, Some(&lens)).await;
        println!(
            "{r:<6} {:<12} {n:>8} {w:>8.2} {:>10.1}",
            "free,matched",
            n as f64 / w
        );
        matched.push(n as f64 / w);
        json32 = (
            json32.0 + steps,
            json32.1 + ms,
            json32.2 + mr,
            json32.3 + msec,
            json32.4 + w,
        );
    }
    let (f, j, m) = (median(free), median(json), median(matched));
    println!(
        "median tok/s: unconstrained {f:.1}, constrained {j:.1}, ratio {:.3}",
        j / f
    );
    println!(
        "length-matched: unconstrained {m:.1}, constrained {j:.1}, ratio {:.3}",
        j / m
    );
    println!(
        "mean step (wall / engine steps): unconstrained {:.2} ms, constrained {:.2} ms\n",
        free_steps.1 / free_steps.0.max(1) as f64 * 1e3,
        json32.4 / json32.0.max(1) as f64 * 1e3
    );

    // Mask time per step with one constrained request.
    let mut one = (0u64, 0u64, 0u64, 0.0f64, 0.0f64);
    for _ in 0..ROUNDS {
        let ((_, w, steps, ms, mr, msec), _) = batch(&engine, 1, true, None).await;
        one = (
            one.0 + steps,
            one.1 + ms,
            one.2 + mr,
            one.3 + msec,
            one.4 + w,
        );
    }
    println!("grammar mask per step (engine stats, summed over {ROUNDS} runs)");
    println!(
        "{:<12} {:>8} {:>10} {:>10} {:>14} {:>14} {:>8}",
        "constrained", "steps", "maskSteps", "maskRows", "mask ms/step", "step ms", "mask %"
    );
    for (k, (steps, ms, mr, msec, wall)) in [(1, one), (CONCURRENCY, json32)] {
        let per = msec / ms.max(1) as f64 * 1e3;
        let step = wall / steps.max(1) as f64 * 1e3;
        println!(
            "{k:<12} {steps:>8} {ms:>10} {mr:>10} {per:>14.3} {step:>14.2} {:>7.1}%",
            per / step * 100.0
        );
    }
    engine.shutdown(ShutdownMode::Drain).await;
}
