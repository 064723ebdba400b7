//! `sluice bench` against a real `sluice serve` (the built-in model on a
//! free port): the vLLM-style result file of a completions run, then a
//! chat run at a finite request rate that hangs up on some streams, both
//! followed by the KV-drain check. No timing is asserted.

use serde_json::Value;
mod common;

use std::path::Path;
use std::process::{Command, Output};

fn start_server() -> common::Serve {
    let mut serve = common::spawn_serve(&[], &[]);
    serve.drain_log();
    serve
}

fn bench(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("bench")
        .args(args)
        .output()
        .expect("sluice bench runs");
    assert!(
        out.status.success(),
        "sluice bench failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn only_json_file(dir: &Path) -> Value {
    let files: Vec<_> = std::fs::read_dir(dir)
        .expect("the result dir exists")
        .map(|e| e.expect("an entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    serde_json::from_str(&std::fs::read_to_string(&files[0]).expect("readable")).expect("JSON")
}

fn last_json_line(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().expect("a last line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
// One run read top to bottom: each check reads the same result file.
#[allow(clippy::too_many_lines)]
fn bench_writes_vllms_result_file_and_the_server_drains() {
    let server = start_server();
    let tmp = std::env::temp_dir().join(format!("sluice-bench-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let dir = tmp.join("completions");
    let out = bench(&[
        "--base-url",
        &server.url,
        "--num-prompts",
        "8",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--ignore-eos",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        dir.to_str().expect("utf-8 path"),
        "--check-kv-drain",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for label in [
        "============ Serving Benchmark Result ============",
        "Successful requests:",
        "Benchmark duration (s):",
        "Total generated tokens:",
        "Output token throughput (tok/s):",
        "Mean TTFT (ms):",
        "P99 TPOT (ms):",
        "Median ITL (ms):",
    ] {
        assert!(stdout.contains(label), "{label:?} missing from\n{stdout}");
    }

    let r = only_json_file(&dir);
    assert_eq!(r["completed"], 8, "{r}");
    assert_eq!(r["failed"], 0);
    assert_eq!(r["total_output_tokens"], 64);
    // The byte-level prompts are exact: 16 tokens each, as the server
    // counts them.
    assert_eq!(r["total_input_tokens"], 128);
    for key in [
        "date",
        "backend",
        "endpoint_type",
        "label",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "start_times",
        "queue_times",
        "generated_texts",
        "errors",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "std_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "std_itl_ms",
        "p99_itl_ms",
        "kv_drained",
    ] {
        assert!(r.get(key).is_some(), "result lacks {key:?}: {r}");
    }
    assert_eq!(r["backend"], "openai");
    assert_eq!(r["model_id"], "tiny");
    assert_eq!(r["request_rate"], "inf");
    assert_eq!(r["num_prompts"], 8);
    assert_eq!(r["kv_drained"], true);
    let ttfts = r["ttfts"].as_array().expect("ttfts");
    assert_eq!(ttfts.len(), 8);
    assert!(ttfts.iter().all(|t| t.as_f64().is_some_and(|t| t > 0.0)));
    let itls = r["itls"].as_array().expect("itls");
    assert_eq!(itls.len(), 8);
    for itl in itls {
        // One gap per output chunk after the first; the server may merge
        // tokens whose bytes are not yet whole characters into one chunk.
        let n = itl.as_array().expect("a list").len();
        assert!(n <= 7, "{itl}");
    }
    assert_eq!(
        r["output_lens"],
        serde_json::json!([8, 8, 8, 8, 8, 8, 8, 8])
    );
    assert!(r["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .all(|e| e == ""));
    // The JSON line on stdout is the result without per-request arrays.
    let line = last_json_line(&out);
    assert_eq!(line["completed"], 8);
    assert!(line.get("ttfts").is_none() && line.get("latencies").is_some());

    // Chat, Poisson arrivals, a concurrency limit, hang-ups, the server's
    // RSS; the hang-ups must not leak KV blocks.
    let dir = tmp.join("chat");
    let pid = server.child.id().to_string();
    let out = bench(&[
        "--base-url",
        &server.url,
        "--backend",
        "openai-chat",
        "--num-prompts",
        "8",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--request-rate",
        "100",
        "--max-concurrency",
        "2",
        "--disconnect-fraction",
        "0.5",
        "--percentile-metrics",
        "ttft,e2el,client_queue_time",
        "--metric-percentiles",
        "50,90",
        "--save-result",
        "--result-dir",
        dir.to_str().expect("utf-8 path"),
        "--result-filename",
        "chat.json",
        "--check-kv-drain",
        "--server-pid",
        &pid,
    ]);
    let r = only_json_file(&dir);
    assert!(dir.join("chat.json").exists());
    // Requests i with frac(i * 0.618...) < 0.5 hang up: 0, 2, 4, 5, 7.
    assert_eq!(r["disconnected"], 5, "{r}");
    assert_eq!(r["completed"], 3);
    assert_eq!(r["failed"], 0);
    assert_eq!(r["total_output_tokens"], 24);
    assert_eq!(r["backend"], "openai-chat");
    assert_eq!(r["max_concurrency"], 2);
    assert_eq!(r["request_rate"], 100.0);
    assert_eq!(r["kv_drained"], true);
    for key in [
        "p50_ttft_ms",
        "p90_ttft_ms",
        "mean_e2el_ms",
        "p90_e2el_ms",
        "mean_client_queue_time_ms",
    ] {
        assert!(r.get(key).is_some(), "result lacks {key:?}: {r}");
    }
    assert!(r.get("mean_tpot_ms").is_none(), "tpot was not selected");
    assert!(
        r.get("ttfts").is_none(),
        "no per-request arrays without --save-detailed"
    );
    assert!(r["server_rss_kib_after"].as_u64().is_some_and(|k| k > 0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Request rate configured (RPS):"),
        "{stdout}"
    );
    assert!(stdout.contains("P90 E2EL (ms):"), "{stdout}");

    let _ = std::fs::remove_dir_all(&tmp);
}
