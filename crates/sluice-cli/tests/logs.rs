//! What `sluice serve` logs on the built-in tiny model: the startup summary
//! (its KV cache figures checked against the server's own /metrics and
//! /v1/models and the flags given), one access line per request (its
//! status, and its token counts checked against the response's `usage`),
//! stats lines whose token counts add up to the responses' usage, JSON
//! lines with their keys, and the flags that silence them.

mod common;

use common::{spawn_serve, Serve};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// The environment of a server at the default level, whatever the
/// caller's `RUST_LOG`.
const NO_RUST_LOG: &[(&str, &str)] = &[("RUST_LOG", "")];

/// One HTTP exchange: (status, body).
fn request(url: &str, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::new();
        let mut req = match method {
            "GET" => client.get(format!("{url}{path}")),
            _ => client.post(format!("{url}{path}")),
        }
        .timeout(Duration::from_secs(60));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        (status, resp.text().await.expect("body"))
    })
}

/// A generation request's id and usage as its response tells them (a
/// stream's from its chunks).
#[derive(Debug)]
struct Answer {
    id: String,
    prompt_tokens: u64,
    completion_tokens: u64,
}

fn generate(url: &str, path: &str, body: Value) -> Answer {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let (status, text) = request(url, "POST", path, Some(body));
    assert_eq!(status, 200, "{text}");
    let last: Value = if stream {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str::<Value>(d).expect("a JSON chunk"))
            .next_back()
            .expect("chunks")
    } else {
        serde_json::from_str(&text).expect("JSON")
    };
    let usage = &last["usage"];
    Answer {
        id: last["id"].as_str().expect("an id").to_string(),
        prompt_tokens: usage["prompt_tokens"].as_u64().expect("usage"),
        completion_tokens: usage["completion_tokens"].as_u64().expect("usage"),
    }
}

/// Three requests: a completion, a streamed completion (usage in its last
/// chunk) and a chat completion with a client key.
fn three_requests(url: &str) -> Vec<Answer> {
    vec![
        generate(
            url,
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 5}),
        ),
        generate(
            url,
            "/v1/completions",
            json!({"prompt": "Hello there, world", "max_tokens": 7, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
        generate(
            url,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                   "user": "alice"}),
        ),
    ]
}

/// The label `name` of the `vllm:cache_config_info` sample in /metrics.
fn cache_config_label(url: &str, name: &str) -> u64 {
    cache_config_text(url, name).parse().expect("a number")
}

/// The label `name` of the `vllm:cache_config_info` sample, as written.
fn cache_config_text(url: &str, name: &str) -> String {
    let (status, text) = request(url, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .expect("vllm:cache_config_info in /metrics");
    let key = format!("{name}=\"");
    let rest = line
        .split(&key)
        .nth(1)
        .unwrap_or_else(|| panic!("{name} in {line}"));
    rest[..rest.find('"').expect("a closing quote")].to_string()
}

/// /v1/models' `max_model_len`.
fn served_max_model_len(url: &str) -> u64 {
    let (_, text) = request(url, "GET", "/v1/models", None);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    v["data"][0]["max_model_len"]
        .as_u64()
        .expect("max_model_len")
}

/// The whole log once the server has stopped.
fn stop(mut serve: Serve) -> Vec<String> {
    assert!(serve.terminate_and_wait().success());
    let mut log = std::mem::take(&mut serve.log);
    log.extend(serve.rest_of_log());
    log
}

/// The number after `key` in `line` (`key` ends where the number starts).
fn number_after(line: &str, key: &str) -> f64 {
    let rest = line
        .split(key)
        .nth(1)
        .unwrap_or_else(|| panic!("{key:?} in {line}"));
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("a number after {key:?} in {line}"))
}

#[test]
fn text_log_has_the_summary_one_access_line_per_request_and_stats() {
    let serve = spawn_serve(&["--log-stats-interval", "0.2"], NO_RUST_LOG);
    let url = serve.url.clone();
    let blocks = cache_config_label(&url, "num_gpu_blocks");
    let block_size = cache_config_label(&url, "block_size");
    let max_model_len = served_max_model_len(&url);
    let answers = three_requests(&url);
    let (status, _) = request(
        &url,
        "POST",
        "/v1/completions",
        Some(json!({"prompt": "Hello", "max_tokens": -1})),
    );
    assert_eq!(status, 400);
    let log = stop(serve);

    // The summary, before the listening line.
    let listening = log
        .iter()
        .position(|l| l.starts_with("sluice: serving \"tiny\" on http://"))
        .expect("the listening line");
    let summary = &log[..listening];
    let model = summary
        .iter()
        .find(|l| l.starts_with("sluice: model \"tiny\" "))
        .unwrap_or_else(|| panic!("a model line in {summary:#?}"));
    assert!(model.contains("Qwen2ForCausalLM"), "{model}");
    assert!(model.contains("weights F32 ×"), "{model}");
    let kernels = summary
        .iter()
        .find(|l| l.starts_with("sluice: kernels: "))
        .expect("a kernels line");
    // --threads 1 (spawn_serve's).
    assert!(kernels.contains("; threads 1;"), "{kernels}");
    assert!(kernels.contains("cpu features ["), "{kernels}");
    let kv = summary
        .iter()
        .find(|l| l.starts_with("sluice: KV cache: "))
        .expect("a KV cache line");
    assert_eq!(number_after(kv, "KV cache: ") as u64, blocks, "{kv}");
    assert_eq!(number_after(kv, " blocks × ") as u64, block_size, "{kv}");
    assert_eq!(
        number_after(kv, " tokens = ") as u64,
        blocks * block_size,
        "{kv}"
    );
    assert_eq!(
        number_after(kv, "max_model_len ") as u64,
        max_model_len,
        "{kv}"
    );
    // --kv-cache-memory 16MiB (spawn_serve's): as many blocks as fit, in
    // the default element type.
    assert!(kv.contains(", 16.0 MiB (float16);"), "{kv}");

    // One access line per request, with the response's usage.
    let access: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("sluice: \"POST /v1/"))
        .collect();
    assert_eq!(access.len(), 4, "{access:#?}");
    for a in &answers {
        let key = format!(" request_id={} ", a.id);
        let lines: Vec<&&String> = access.iter().filter(|l| l.contains(&key)).collect();
        assert_eq!(lines.len(), 1, "one line for {} in {access:#?}", a.id);
        let l = lines[0];
        assert!(l.contains(" HTTP/1.1\" 200 OK "), "{l}");
        assert!(
            l.contains(&format!(
                " prompt_tokens={} output_tokens={} ",
                a.prompt_tokens, a.completion_tokens
            )),
            "{l}"
        );
        assert!(l.contains(" ttft_ms="), "{l}");
        assert!(l.contains(" finish_reason=length"), "{l}");
    }
    let chat = access
        .iter()
        .find(|l| l.contains(&answers[2].id))
        .expect("the chat line");
    assert!(chat.starts_with("sluice: \"POST /v1/chat/completions HTTP/1.1\""));
    assert!(chat.contains(" client_key=\"alice\" "), "{chat}");
    let refused: Vec<&&String> = access
        .iter()
        .filter(|l| l.starts_with("sluice: \"POST /v1/completions HTTP/1.1\" 400 "))
        .collect();
    assert_eq!(refused.len(), 1, "{access:#?}");
    // The /metrics and /v1/models calls: /metrics is a probe (debug only),
    // /v1/models gets a short line.
    assert!(log.iter().all(|l| !l.contains("GET /metrics")), "{log:#?}");
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("sluice: \"GET /v1/models HTTP/1.1\" 200 OK duration_ms="))
            .count(),
        1,
        "{log:#?}"
    );

    // Stats lines in vLLM's words.
    let stats: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("sluice: Engine 000: Avg prompt throughput: "))
        .collect();
    assert!(!stats.is_empty(), "{log:#?}");
    for s in &stats {
        for part in [
            " tokens/s, Avg generation throughput: ",
            " tokens/s, Running: ",
            " reqs, Waiting: ",
            " reqs, KV cache usage: ",
            "%, Prefix cache hit rate: ",
            "%, Preempted: ",
        ] {
            assert!(s.contains(part), "{part:?} in {s}");
        }
    }
    assert!(
        stats
            .iter()
            .any(|s| number_after(s, "Avg generation throughput: ") > 0.0),
        "{stats:#?}"
    );
}

/// The JSON lines of `log` (every line must be one).
fn json_lines(log: &[String]) -> Vec<Value> {
    log.iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn json_log_lines_carry_their_fields_and_the_stats_add_up() {
    let serve = spawn_serve(
        &["--log-format", "json", "--log-stats-interval", "0.2"],
        NO_RUST_LOG,
    );
    let url = serve.url.clone();
    let blocks = cache_config_label(&url, "num_gpu_blocks");
    let block_size = cache_config_label(&url, "block_size");
    let answers = three_requests(&url);
    let (status, _) = request(&url, "GET", "/no/such/path", None);
    assert_eq!(status, 404);
    let log = json_lines(&stop(serve));

    for v in &log {
        let ts = v["ts"].as_str().unwrap_or_else(|| panic!("ts in {v}"));
        // `2026-12-02T05:34:24.123Z`
        assert_eq!(ts.len(), 24, "{ts}");
        assert_eq!(
            (&ts[10..11], &ts[19..20], &ts[23..]),
            ("T", ".", "Z"),
            "{ts}"
        );
        assert!(
            ["error", "warn", "info"].contains(&v["level"].as_str().unwrap_or("")),
            "{v}"
        );
        assert!(v["msg"].is_string(), "{v}");
    }
    let event = |name: &str| -> Vec<&Value> { log.iter().filter(|v| v["event"] == name).collect() };

    let kv = event("startup")
        .into_iter()
        .find(|v| v.get("kv_blocks").is_some())
        .expect("the KV cache record");
    assert_eq!(kv["kv_blocks"], blocks);
    assert_eq!(kv["block_size"], block_size);
    assert_eq!(kv["kv_tokens"], blocks * block_size);
    assert!(
        kv["kv_bytes"].as_u64().expect("kv_bytes") <= 16 << 20,
        "{kv}"
    );

    let access = event("access");
    assert_eq!(access.len(), 4, "{access:#?}");
    for a in &answers {
        let found: Vec<&&Value> = access
            .iter()
            .filter(|v| v["request_id"] == a.id.as_str())
            .collect();
        assert_eq!(found.len(), 1, "{access:#?}");
        let v = found[0];
        assert_eq!(v["status"], 200, "{v}");
        assert_eq!(v["method"], "POST", "{v}");
        assert_eq!(v["prompt_tokens"], a.prompt_tokens, "{v}");
        assert_eq!(v["output_tokens"], a.completion_tokens, "{v}");
        assert_eq!(v["finish_reason"], "length", "{v}");
        assert!(
            v["ttft_ms"].is_number() && v["duration_ms"].is_number(),
            "{v}"
        );
    }
    let missing = access
        .iter()
        .find(|v| v["path"] == "/no/such/path")
        .expect("the 404's line");
    assert_eq!(missing["status"], 404);
    assert!(missing.get("request_id").is_none(), "{missing}");

    // Every interval with tokens has its line (the last one at shutdown),
    // so the lines add up to the responses' usage.
    let stats = event("stats");
    let sum = |key: &str| -> u64 { stats.iter().map(|v| v[key].as_u64().unwrap_or(0)).sum() };
    let completion: u64 = answers.iter().map(|a| a.completion_tokens).sum();
    let prompt: u64 = answers.iter().map(|a| a.prompt_tokens).sum();
    assert_eq!(sum("generation_tokens"), completion, "{stats:#?}");
    assert_eq!(sum("prompt_tokens"), prompt, "{stats:#?}");
    for v in &stats {
        for key in [
            "generation_throughput",
            "prompt_throughput",
            "running",
            "waiting",
            "kv_cache_usage_pct",
            "prefix_cache_hit_rate_pct",
            "preempted",
        ] {
            assert!(v[key].is_number(), "{key} in {v}");
        }
    }
}

#[test]
fn the_disable_flags_silence_stats_and_access_lines() {
    for flags in [
        ["--disable-log-stats", "--disable-log-requests"],
        ["--disable-log-stats", "--disable-uvicorn-access-log"],
    ] {
        let mut args = vec!["--log-stats-interval", "0.2"];
        args.extend(flags);
        let serve = spawn_serve(&args, NO_RUST_LOG);
        let url = serve.url.clone();
        let answer = generate(
            &url,
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 3}),
        );
        assert_eq!(answer.completion_tokens, 3);
        let log = stop(serve);
        assert!(
            log.iter()
                .all(|l| !l.contains("Engine 000:") && !l.starts_with("sluice: \"")),
            "{flags:?}: {log:#?}"
        );
        assert!(log.iter().any(|l| l == "sluice: stopped"), "{log:#?}");
    }
}

#[test]
fn probes_are_logged_at_debug_only() {
    for (rust_log, expected) in [("", 0), ("sluice=debug", 1)] {
        let serve = spawn_serve(&[], &[("RUST_LOG", rust_log)]);
        let (status, _) = request(&serve.url, "GET", "/health", None);
        assert_eq!(status, 200);
        let log = stop(serve);
        let probes = log
            .iter()
            .filter(|l| l.starts_with("sluice: debug: \"GET /health HTTP/1.1\" 200 OK"))
            .count();
        assert_eq!(probes, expected, "RUST_LOG {rust_log:?}: {log:#?}");
        assert!(
            log.iter().all(|l| !l.starts_with("sluice: \"GET /health")),
            "{log:#?}"
        );
    }
    // --log-level wins over RUST_LOG.
    let serve = spawn_serve(&["--log-level", "info"], &[("RUST_LOG", "debug")]);
    request(&serve.url, "GET", "/health", None);
    let log = stop(serve);
    assert!(log.iter().all(|l| !l.contains("/health")), "{log:#?}");
}

/// `--kv-cache-dtype` sets what a block costs: spawn_serve's 16 MiB
/// budget holds ⌊2²⁴ ÷ (2 layers × K,V × 2 KV heads × 16 tokens × one head's row)⌋
/// blocks of tiny-qwen3 (head_dim 32), a row being 32 elements of 4 bytes
/// (float32), 2 (float16, bfloat16, and auto, which is float16) or one
/// q8_0 block of 34 bytes (llama.cpp's `block_q8_0`: an f16 scale and 32
/// bytes); /metrics and the startup line name the type stored.
#[test]
fn the_kv_cache_dtype_sets_the_pool_and_is_reported() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-model/tests/data/gguf/tiny-qwen3.Q8_0.gguf");
    for (flag, stored, row) in [
        ("float32", "float32", 128u64),
        ("bfloat16", "bfloat16", 64),
        ("auto", "float16", 64),
        ("q8_0", "q8_0", 34),
    ] {
        let mut serve = spawn_serve(
            &["--model", model.to_str().unwrap(), "--kv-cache-dtype", flag],
            &[],
        );
        let want = (16u64 << 20) / (2 * 2 * 2 * 16 * row);
        assert_eq!(
            cache_config_label(&serve.url, "num_gpu_blocks"),
            want,
            "{flag}"
        );
        assert_eq!(
            cache_config_text(&serve.url, "cache_dtype"),
            stored,
            "{flag}"
        );
        let line = serve
            .log
            .iter()
            .find(|l| l.contains("KV cache: "))
            .unwrap_or_else(|| panic!("{flag}: no KV cache line in {:?}", serve.log))
            .clone();
        assert!(line.contains(&format!("({stored});")), "{flag}: {line}");
        serve.terminate_and_wait();
    }
    // fp8 has no CPU kernel: refused at start-up, naming the flag.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--port", "0", "--model", model.to_str().unwrap()])
        .args(["--kv-cache-dtype", "fp8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kv-cache-dtype: fp8: the CPU runner"),
        "{err}"
    );
}
