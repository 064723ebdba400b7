//! `sluice serve --executor simulated --profile P`: the real server and
//! engine with the forward pass replaced by a step-time model. A completion
//! runs to its max_tokens; its wall time is printed beside the profile's
//! prediction (a benchmark figure; the only bound asserted is one sleeping
//! cannot break: at least half the prediction). Bad flags exit 2, naming
//! the flag or file.
//!
//! The profile here is a roofline profile JSON with a fixed 20 ms per step
//! dwarfing the tiny model's compute.

mod common;

use common::spawn_serve;
use sluice_sim::steplog::StepRecord;
use sluice_sim::{Hardware, ModelShape, Roofline, StepTimeModel};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const HW: Hardware = Hardware {
    peak_flops: 1e15,
    hbm_bandwidth: 1e12,
    memory_bytes: 1e9,
    matmul_efficiency: 1.0,
    bandwidth_efficiency: 1.0,
    step_overhead_s: 0.02,
    activation_reserve_bytes: 0.0,
    ..Hardware::H100_SXM
};

/// The built-in tiny model's shape (sluice-model's `builtin::config("tiny")`).
const TINY: ModelShape = ModelShape {
    hidden: 128,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    intermediate: 256,
    vocab: 384,
    bytes_per_param: 2,
    num_experts: 0,
    experts_per_token: 0,
    tie_word_embeddings: true,
    stored_weight_bytes: None,
    kv_cache_dtype: sluice_model::kv_cache::KvCacheDtype::Auto,
};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-sim-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A simulated server on the fixed-step roofline profile, writing its
/// step log; `extra` flags after those. Returns it and the log's path.
fn spawn_simulated(name: &str, extra: &[&str]) -> (common::Serve, PathBuf) {
    let dir = temp_dir(name);
    let profile = dir.join("profile.json");
    let json = serde_json::json!({"kind": "roofline", "hardware": HW});
    std::fs::write(&profile, json.to_string()).unwrap();
    let log = dir.join("steps.jsonl");
    let mut args = vec![
        "--executor",
        "simulated",
        "--profile",
        profile.to_str().unwrap(),
        "--step-log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (spawn_serve(&args, &[]), log)
}

#[test]
fn a_simulated_server_completes_requests_at_the_profiles_pace() {
    let (mut serve, log) = spawn_simulated("serve", &[]);
    assert!(
        serve.log.iter().any(|l| l.contains("simulated executor")),
        "{:?}",
        serve.log
    );
    serve.drain_log();
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let max_tokens = 12;
    let t0 = Instant::now();
    let body: serde_json::Value = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&serde_json::json!({"prompt": "Simulate this", "max_tokens": max_tokens}))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json")
    });
    let elapsed = t0.elapsed().as_secs_f64();
    // EOS is never sampled: the request ends at max_tokens.
    assert_eq!(body["usage"]["completion_tokens"], max_tokens, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert!(serve.terminate_and_wait().success());
    let recs: Vec<StepRecord> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), max_tokens);
    let model = Roofline::new(TINY, HW);
    let predicted: f64 = recs.iter().map(|r| model.step_time(&r.shape())).sum();
    let stepped: f64 = recs.iter().map(|r| r.step_s).sum();
    println!(
        "simulated serve: {} steps, predicted {predicted:.4} s, engine steps {stepped:.4} s, \
         request wall time {elapsed:.4} s ({:+.1}% over the prediction)",
        recs.len(),
        (elapsed / predicted - 1.0) * 100.0
    );
    assert!(
        elapsed >= predicted * 0.5,
        "{elapsed} < half of {predicted}"
    );
    let _ = std::fs::remove_dir_all(log.parent().expect("the scratch directory"));
}

fn serve_fails(extra: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--port", "0", "--host", "127.0.0.1"])
        .args(extra)
        .output()
        .expect("sluice runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
    assert!(!err.contains("serving"), "{err}");
    err
}

#[test]
fn bad_simulation_flags_exit_2_naming_the_flag_or_file() {
    let err = serve_fails(&["--executor", "simulated"]);
    assert!(err.contains("--profile"), "{err}");
    let err = serve_fails(&[
        "--executor",
        "simulated",
        "--profile",
        "/no/such/profile.json",
    ]);
    assert!(err.contains("/no/such/profile.json"), "{err}");
    let dir = temp_dir("bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"peak_flops\": \"fast\"}").unwrap();
    let err = serve_fails(&[
        "--executor",
        "simulated",
        "--profile",
        bad.to_str().unwrap(),
    ]);
    assert!(err.contains("bad.json"), "{err}");
    let err = serve_fails(&["--profile", "h200"]);
    assert!(err.contains("--executor simulated"), "{err}");
    let err = serve_fails(&["--executor", "gpu"]);
    assert!(err.contains("--executor"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Speculative decoding on a simulated server: drafts are accepted as the
/// synthetic rates say (here always 2 of 4), so a request of 1 + 3m tokens
/// takes its prefill step and m verification steps, and the metrics count
/// them as vLLM does.
#[test]
fn a_simulated_server_verifies_drafts_at_the_synthetic_rates() {
    let (mut serve, log) = spawn_simulated(
        "spec",
        &[
            "--speculative-config",
            r#"{"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1, 1, 0, 0]}"#,
        ],
    );
    serve.drain_log();
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (body, metrics) = rt.block_on(async {
        let c = reqwest::Client::new();
        let body: serde_json::Value = c
            .post(format!("{url}/v1/completions"))
            .json(&serde_json::json!({"prompt": "Simulate this", "max_tokens": 31}))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json");
        let metrics = c
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        (body, metrics)
    });
    assert_eq!(body["usage"]["completion_tokens"], 31, "{body}");
    assert!(serve.terminate_and_wait().success());
    let steps = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(
        steps,
        1 + 10,
        "a prefill step and ten verifications of 3 tokens"
    );
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(
        line("vllm:spec_decode_num_accepted_tokens_total{"),
        20.0,
        "{metrics}"
    );
    assert_eq!(
        line("vllm:spec_decode_num_drafts_total{"),
        10.0,
        "{metrics}"
    );
}
