//! `/metrics` against vLLM 0.33's own exposition: after a mix of requests
//! (completed ones, `n` = 2, a stream the client hangs up on, a 400, a 503
//! from the waiting limit, a 404, a 405), the text is parsed with a small
//! Prometheus text-format parser and compared with
//! `tests/data/vllm-metric-families.tsv` (every vLLM family present with
//! the same type and label keys, none invented) and with vLLM's real
//! exposition `tests/data/vllm-metrics-sample.txt` (HELP strings, bucket
//! bounds as `le` strings); then the counts must agree across families.

mod common;

use common::TEXT;
use futures::StreamExt;
use serde_json::{json, Value};
use sluice_engine::{Engine, EngineConfig, SchedulerConfig, ScriptedExecutor, SeqView, Tokenizer};
use sluice_server::{serve, ServerConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAX_MODEL_LEN: usize = 256;
const NUM_BLOCKS: usize = 512;

// ---------------------------------------------------------------------
// A small parser of the Prometheus text format.

#[derive(Clone, Debug, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: Option<String>,
    samples: Vec<Sample>,
}

impl Family {
    /// Label keys of the family's samples, `le` / `quantile` left out.
    fn label_keys(&self) -> BTreeSet<String> {
        self.samples
            .iter()
            .flat_map(|s| s.labels.keys())
            .filter(|k| *k != "le" && *k != "quantile")
            .cloned()
            .collect()
    }

    fn samples_named<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Sample> + 'a {
        let name = name.to_owned();
        self.samples.iter().filter(move |s| s.name == name)
    }
}

#[derive(Debug, Default)]
struct Exposition {
    order: Vec<String>,
    families: BTreeMap<String, Family>,
}

fn parse_value(v: &str) -> f64 {
    match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => v.parse().unwrap_or_else(|_| panic!("bad value {v:?}")),
    }
}

/// `{k="v",...}` with the text format's escapes; returns the labels and
/// what follows the closing brace.
fn parse_labels(s: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').expect("labels start with {");
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return (labels, r);
        }
        let eq = rest.find('=').expect("label =");
        let key = rest[..eq].to_string();
        assert!(
            key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "label name {key:?}"
        );
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .expect("label value quoted");
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().expect("unterminated label value") {
                (i, '"') => break i,
                (_, '\\') => match chars.next().expect("escape").1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        assert!(
            labels.insert(key.clone(), value).is_none(),
            "label {key} twice"
        );
        rest = &rest[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn parse(text: &str) -> Exposition {
    let mut e = Exposition::default();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            e.families.entry(name.to_string()).or_default().help = Some(help.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            let f = e.families.entry(name.to_string()).or_default();
            assert!(f.kind.is_empty(), "two TYPE lines for {name}");
            f.kind = kind.to_string();
            e.order.push(name.to_string());
            current = Some(name.to_string());
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line}");
        let name_end = line.find(['{', ' ']).expect("sample name");
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..])
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let value = parse_value(rest.trim());
        let family = current.as_ref().expect("a sample before any TYPE line");
        let f = e.families.get_mut(family).unwrap();
        let allowed: &[&str] = match f.kind.as_str() {
            "histogram" => &["_bucket", "_count", "_sum"],
            "summary" => &["_count", "_sum", ""],
            _ => &[""],
        };
        assert!(
            allowed.iter().any(|s| name == format!("{family}{s}")),
            "sample {name} in family {family} ({})",
            f.kind
        );
        f.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    e
}

impl Exposition {
    fn family(&self, name: &str) -> &Family {
        self.families
            .get(name)
            .unwrap_or_else(|| panic!("no family {name}"))
    }

    /// The value of the one sample `name` with `labels` (a subset).
    fn value(&self, family: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<&Sample> = self
            .family(family)
            .samples_named(name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert_eq!(matching.len(), 1, "{name} {labels:?}: {matching:?}");
        matching[0].value
    }

    fn sum_of(&self, family: &str, name: &str) -> f64 {
        self.family(family)
            .samples_named(name)
            .map(|s| s.value)
            .sum()
    }

    /// The `le` strings of a histogram's first child, in order.
    fn les(&self, family: &str) -> Vec<String> {
        let f = self.family(family);
        let first = f.samples.first().expect("a sample");
        let base: BTreeMap<_, _> = first.labels.iter().filter(|(k, _)| *k != "le").collect();
        f.samples_named(&format!("{family}_bucket"))
            .filter(|s| s.labels.iter().filter(|(k, _)| *k != "le").eq(base.clone()))
            .map(|s| s.labels["le"].clone())
            .collect()
    }
}

#[test]
fn the_parser_reads_vllms_own_exposition() {
    let e = parse(include_str!("data/vllm-metrics-sample.txt"));
    assert_eq!(e.family("vllm:request_success_total").kind, "counter");
    assert_eq!(
        e.les("vllm:request_params_n"),
        ["1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"]
    );
    let f = e.family("vllm:cache_config_info");
    assert_eq!(f.label_keys().len(), 38);
}

// ---------------------------------------------------------------------
// The reference.

struct TsvFamily {
    kind: String,
    labels: BTreeSet<String>,
    /// `n/a`: does not apply to sluice (must be absent).
    not_applicable: bool,
}

fn vllm_families() -> BTreeMap<String, TsvFamily> {
    let mut out = BTreeMap::new();
    for line in include_str!("data/vllm-metric-families.tsv").lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        assert!(cols.len() >= 3, "bad tsv line {line:?}");
        let labels = cols[2]
            .split(',')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        out.insert(
            cols[0].to_string(),
            TsvFamily {
                kind: cols[1].to_string(),
                labels,
                not_applicable: cols.get(3).is_some_and(|c| c.starts_with("n/a")),
            },
        );
    }
    out
}

// ---------------------------------------------------------------------
// The server: one sequence at a time (so a second request waits while the
// first runs), at most one waiting request, a scripted model writing TEXT.

struct Server {
    base: String,
    engine: Engine,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(configure: impl FnOnce(&mut ServerConfig)) -> Server {
    let script = |s: &SeqView<'_>| {
        std::thread::sleep(Duration::from_millis(4));
        vec![u32::from(TEXT.as_bytes()[s.output.len() % TEXT.len()])]
    };
    let tokenizer = Arc::new(Tokenizer::builtin());
    let sched = SchedulerConfig {
        max_model_len: MAX_MODEL_LEN,
        max_num_batched_tokens: 512,
        max_num_seqs: 1,
        ..SchedulerConfig::default()
    };
    let mut cfg = EngineConfig::new(sched).with_model_eos(&tokenizer, &[256]);
    cfg.max_waiting_requests = Some(1);
    let executor = ScriptedExecutor::new(NUM_BLOCKS, script).with_vocab_size(384);
    let engine = Engine::start(cfg, Box::new(executor), tokenizer).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = ServerConfig::new(addr, "test-model", MAX_MODEL_LEN);
    configure(&mut config);
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(engine.clone(), config, listener, async {
        let _ = rx.await;
    }));
    Server {
        base: format!("http://{addr}"),
        engine,
        stop,
        task,
    }
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn metrics_text(&self) -> String {
        let r = reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap();
        assert_eq!(
            r.headers()["content-type"],
            "text/plain; version=1.0.0; charset=utf-8"
        );
        r.text().await.unwrap()
    }

    /// Scrapes until `done` holds: stats are published after the step that
    /// sent a request's last output, and HTTP requests are counted once
    /// their response body is dropped, both a moment after the client has
    /// its answer.
    async fn metrics_when(&self, what: &str, done: impl Fn(&Exposition) -> bool) -> Exposition {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let e = parse(&self.metrics_text().await);
            if done(&e) {
                return e;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

fn completion_tokens(v: &Value) -> f64 {
    v["usage"]["completion_tokens"].as_f64().expect("usage")
}

/// Completion tokens of an SSE stream with `include_usage`.
fn stream_usage(body: &str) -> f64 {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| !v["usage"].is_null())
        .map(|v| completion_tokens(&v))
        .next_back()
        .expect("a usage chunk")
}

const FINISHED_REQUEST_HISTOGRAMS: [&str; 7] = [
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:request_num_preemptions",
    "vllm:request_time_per_output_token_seconds",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// One scenario read top to bottom: each check counts what the steps before
// it did to the same server.
#[allow(clippy::too_many_lines)]
async fn metrics_match_vllms_families_and_add_up() {
    let s = start(|_| {}).await;

    // Completed requests; the model never writes EOS and there are no stop
    // strings, so each completion runs to max_tokens.
    let mut seen_tokens = 0.0;
    let v: Value = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 5}),
        )
        .await
        .json()
        .await
        .unwrap();
    seen_tokens += completion_tokens(&v);
    let v: Value = s
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await
        .json()
        .await
        .unwrap();
    seen_tokens += completion_tokens(&v);
    let v: Value = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 3, "n": 2}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(completion_tokens(&v), 6.0);
    seen_tokens += completion_tokens(&v);
    let body = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 6, "stream": true,
                   "stream_options": {"include_usage": true}}),
        )
        .await
        .text()
        .await
        .unwrap();
    seen_tokens += stream_usage(&body);
    assert_eq!(seen_tokens, 21.0);

    // 5 completions of 4 requests.
    let e = s
        .metrics_when("the completed requests", |e| {
            e.sum_of("vllm:request_success_total", "vllm:request_success_total") == 5.0
        })
        .await;
    assert_eq!(
        e.value(
            "vllm:generation_tokens_total",
            "vllm:generation_tokens_total",
            &[]
        ),
        seen_tokens,
        "generation tokens == the completion tokens clients saw"
    );

    // A 400: never reaches the engine.
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "temperature": -1}),
        )
        .await;
    assert_eq!(r.status(), 400);

    // A long stream the client hangs up on, a request waiting behind it
    // (one sequence at a time), and a 503: the waiting limit is 1.
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 240, "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let mut hang_up = r.bytes_stream();
    hang_up.next().await.expect("a first chunk").unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", s.base);
    let waiting = tokio::spawn(async move {
        client
            .post(url)
            .json(&json!({"prompt": "Hello", "max_tokens": 3}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.engine.stats().num_waiting_reqs == 0 {
        assert!(
            !waiting.is_finished(),
            "the second request was answered without waiting"
        );
        assert!(Instant::now() < deadline, "the second request never waited");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let e = parse(&s.metrics_text().await);
    assert_eq!(
        e.value(
            "vllm:num_requests_waiting",
            "vllm:num_requests_waiting",
            &[]
        ),
        1.0
    );
    assert_eq!(
        e.sum_of(
            "vllm:num_requests_waiting_by_reason",
            "vllm:num_requests_waiting_by_reason"
        ),
        1.0
    );
    assert_eq!(
        e.value(
            "vllm:num_requests_running",
            "vllm:num_requests_running",
            &[]
        ),
        1.0
    );
    let r = s
        .post("/v1/completions", json!({"prompt": "Hi", "max_tokens": 3}))
        .await;
    assert_eq!(r.status(), 503);
    drop(hang_up);
    let v = waiting.await.unwrap();
    assert_eq!(completion_tokens(&v), 3.0);

    // Routing outcomes the HTTP families see.
    let r = reqwest::get(format!("{}/v1/nothing", s.base))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = reqwest::get(format!("{}/v1/completions", s.base))
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(
        reqwest::get(format!("{}/health", s.base))
            .await
            .unwrap()
            .status(),
        200
    );

    // 7 completions (one aborted) of 6 requests; 8 POST /v1/completions
    // answered (5 × 2xx, the 400, the 503) and the GET (405).
    let e = s
        .metrics_when("everything to finish and be counted", |e| {
            e.sum_of("vllm:request_success_total", "vllm:request_success_total") == 7.0
                && e.value(
                    "vllm:num_requests_running",
                    "vllm:num_requests_running",
                    &[],
                ) == 0.0
                && e.families.get("http_requests_total").is_some_and(|f| {
                    f.samples
                        .iter()
                        .filter(|s| s.labels["handler"] == "/v1/completions")
                        .map(|s| s.value)
                        .sum::<f64>()
                        == 8.0
                })
                && e.families
                    .get("http_requests_total")
                    .is_some_and(|f| f.samples.iter().any(|s| s.labels["handler"] == "none"))
        })
        .await;

    check_families(&e);
    check_against_vllms_exposition(&e);
    check_histograms(&e);

    // The consistency rules.
    let success = "vllm:request_success_total";
    let reason = |r: &str| e.value(success, success, &[("finished_reason", r)]);
    assert_eq!(reason("abort"), 1.0, "the hung-up stream");
    assert_eq!(reason("length"), 6.0);
    for r in ["stop", "error", "repetition"] {
        assert_eq!(reason(r), 0.0, "{r}");
    }
    let finished = e.sum_of(success, success);
    for h in FINISHED_REQUEST_HISTOGRAMS {
        assert_eq!(e.value(h, &format!("{h}_count"), &[]), finished, "{h}");
    }
    // Every completion was scheduled and produced a token (the aborted one
    // too: its client read a chunk), so every phase exists.
    for h in [
        "vllm:time_to_first_token_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
    ] {
        assert_eq!(e.value(h, &format!("{h}_count"), &[]), finished, "{h}");
    }
    let generation = e.value(
        "vllm:generation_tokens_total",
        "vllm:generation_tokens_total",
        &[],
    );
    assert_eq!(
        generation,
        e.value(
            "vllm:request_generation_tokens",
            "vllm:request_generation_tokens_sum",
            &[]
        )
    );
    assert!(
        generation > seen_tokens + 3.0,
        "the aborted stream's tokens"
    );
    // Once per request: 6 requests, n summing to 7.
    let n = "vllm:request_params_n";
    assert_eq!(e.value(n, &format!("{n}_count"), &[]), 6.0);
    assert_eq!(e.value(n, &format!("{n}_sum"), &[]), 7.0);
    // max_tokens as the engine got it: 5 + 4 + 3 + 3 + 6 + 240 + 3.
    let m = "vllm:request_params_max_tokens";
    assert_eq!(e.value(m, &format!("{m}_sum"), &[]), 264.0);
    // Every prompt started generating, so the prompt counter (counted at
    // the first token) matches the histogram.
    assert_eq!(
        e.value("vllm:prompt_tokens_total", "vllm:prompt_tokens_total", &[]),
        e.value(
            "vllm:request_prompt_tokens",
            "vllm:request_prompt_tokens_sum",
            &[]
        )
    );
    let by_source = "vllm:prompt_tokens_by_source_total";
    assert_eq!(
        e.sum_of(by_source, by_source),
        e.value("vllm:prompt_tokens_total", "vllm:prompt_tokens_total", &[])
    );
    let rejections = "vllm:admission_rejections_total";
    assert_eq!(
        e.value(rejections, rejections, &[("reason", "max_num_queued_reqs")]),
        1.0
    );
    assert_eq!(
        e.value(
            rejections,
            rejections,
            &[("reason", "max_num_queued_tokens")]
        ),
        0.0
    );
    assert_eq!(
        e.value("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc", &[]),
        0.0
    );
    let info = &e.family("vllm:cache_config_info").samples[0];
    assert_eq!(info.labels["num_gpu_blocks"], NUM_BLOCKS.to_string());
    assert_eq!(info.labels["block_size"], "16");
    assert_eq!(info.labels["engine"], "0");
    assert_eq!(info.value, 1.0);

    // HTTP: grouped statuses, route templates, `none` when unmatched,
    // excluded handlers absent.
    let http = "http_requests_total";
    let req = |handler: &str, method: &str, status: &str| {
        e.value(
            http,
            http,
            &[("handler", handler), ("method", method), ("status", status)],
        )
    };
    assert_eq!(req("/v1/completions", "POST", "2xx"), 5.0);
    assert_eq!(req("/v1/completions", "POST", "4xx"), 1.0);
    assert_eq!(req("/v1/completions", "POST", "5xx"), 1.0);
    assert_eq!(req("/v1/completions", "GET", "4xx"), 1.0);
    assert_eq!(req("/v1/chat/completions", "POST", "2xx"), 1.0);
    assert_eq!(req("none", "GET", "4xx"), 1.0);
    for s in &e.family(http).samples {
        let h = &s.labels["handler"];
        assert!(!h.contains("/metrics") && !h.contains("/health"), "{s:?}");
    }
    let total = e.sum_of(http, http);
    let highr = "http_request_duration_highr_seconds";
    assert_eq!(e.value(highr, &format!("{highr}_count"), &[]), total);
    let size = "http_request_size_bytes";
    assert_eq!(e.sum_of(size, &format!("{size}_count")), total);
    assert!(
        e.value(
            size,
            &format!("{size}_sum"),
            &[("handler", "/v1/chat/completions")]
        ) > 0.0
    );
    let size = "http_response_size_bytes";
    // The streams carry no Content-Length; the JSON answers do.
    assert!(
        e.value(
            size,
            &format!("{size}_sum"),
            &[("handler", "/v1/chat/completions")]
        ) > 0.0
    );
    s.shutdown().await;
}

/// The histograms on vLLM's `request_tokens` buckets (1-2-5 up to
/// max_model_len).
const REQUEST_TOKEN_HISTOGRAMS: [&str; 5] = [
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_prefill_kv_computed_tokens",
];

/// Every vLLM family present, with its type and label keys; nothing else.
fn check_families(e: &Exposition) {
    let reference = vllm_families();
    for (name, want) in &reference {
        let got = e.families.get(name);
        if want.not_applicable {
            assert!(got.is_none(), "{name} does not apply to sluice");
            continue;
        }
        if name.starts_with("process_") && !cfg!(target_os = "linux") {
            continue;
        }
        let got = got.unwrap_or_else(|| panic!("missing family {name}"));
        assert_eq!(got.kind, want.kind, "type of {name}");
        assert!(!got.samples.is_empty(), "{name} has no samples");
        assert_eq!(got.label_keys(), want.labels, "label keys of {name}");
    }
    for name in &e.order {
        assert!(
            reference.contains_key(name),
            "{name} is not a vLLM 0.33 family"
        );
    }
    // `engine="0"` wherever vLLM has it.
    for (name, f) in &e.families {
        // vLLM gives these two no `engine` label.
        let engineless =
            name.starts_with("vllm:admission_rejections") || name == "vllm:lora_requests_info";
        if name.starts_with("vllm:") && !engineless {
            for s in &f.samples {
                assert_eq!(
                    s.labels.get("engine").map(String::as_str),
                    Some("0"),
                    "{s:?}"
                );
            }
        }
    }
}

/// HELP strings and bucket bounds exactly as vLLM writes them.
fn check_against_vllms_exposition(e: &Exposition) {
    let vllm = parse(include_str!("data/vllm-metrics-sample.txt"));
    for (name, f) in &e.families {
        let Some(theirs) = vllm.families.get(name) else {
            continue;
        };
        assert_eq!(f.help, theirs.help, "HELP of {name}");
        if f.kind != "histogram" {
            continue;
        }
        // The request-token families follow max_model_len (vLLM's sample
        // was made with 2048, this server has 256).
        let ours = e.les(name);
        let token_family = REQUEST_TOKEN_HISTOGRAMS.contains(&name.as_str());
        let want: Vec<String> = vllm
            .les(name)
            .into_iter()
            .filter(|le| !token_family || le == "+Inf" || parse_value(le) <= MAX_MODEL_LEN as f64)
            .collect();
        assert_eq!(ours, want, "buckets of {name}");
    }
    // Every family of vLLM's exposition that applies is here.
    for name in &vllm.order {
        if !name.starts_with("python_") {
            assert!(e.families.contains_key(name), "missing {name}");
        }
    }
}

/// Buckets cumulative, ending with `+Inf` == `_count`, per child.
fn check_histograms(e: &Exposition) {
    for (name, f) in &e.families {
        if f.kind != "histogram" {
            continue;
        }
        let mut children: BTreeMap<Vec<(String, String)>, Vec<&Sample>> = BTreeMap::new();
        for s in f.samples_named(&format!("{name}_bucket")) {
            let key: Vec<_> = s
                .labels
                .iter()
                .filter(|(k, _)| *k != "le")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            children.entry(key).or_default().push(s);
        }
        assert!(!children.is_empty(), "{name} has no buckets");
        for (key, buckets) in children {
            let bounds: Vec<f64> = buckets
                .iter()
                .map(|b| parse_value(&b.labels["le"]))
                .collect();
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{name} bounds");
            assert_eq!(bounds.last(), Some(&f64::INFINITY), "{name} ends with +Inf");
            let counts: Vec<f64> = buckets.iter().map(|b| b.value).collect();
            assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{name} cumulative");
            let labels: Vec<(&str, &str)> =
                key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let count = e.value(name, &format!("{name}_count"), &labels);
            assert_eq!(counts.last(), Some(&count), "{name}: +Inf == _count");
        }
    }
}

/// A 401 is answered before the metrics layer, as vLLM's authentication
/// middleware answers before its instrumentator: not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_requests_are_not_counted() {
    let s = start(|c| c.api_keys = vec!["secret".into()]).await;
    let r = s
        .post("/v1/completions", json!({"prompt": "Hi", "max_tokens": 2}))
        .await;
    assert_eq!(r.status(), 401);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base))
        .bearer_auth("secret")
        .json(&json!({"prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let e = s
        .metrics_when("the authorized request", |e| {
            e.families
                .get("http_requests_total")
                .is_some_and(|f| !f.samples.is_empty())
        })
        .await;
    let f = e.family("http_requests_total");
    assert_eq!(f.samples.len(), 1, "{:?}", f.samples);
    assert_eq!(f.samples[0].labels["status"], "2xx");
    assert_eq!(f.samples[0].value, 1.0);
    s.shutdown().await;
}

/// What routers filter pods on: `vllm:cache_config_info`'s `block_size`
/// and `num_gpu_blocks` (llm-d's KV-cache scorer sizes its index from
/// them) with the engine's real values, and `vllm:lora_requests_info`
/// with no adapter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_info_families_routers_read_are_there() {
    let s = start(|_| {}).await;
    let e = parse(&s.metrics_text().await);
    let cache = e.family("vllm:cache_config_info");
    assert_eq!(cache.samples.len(), 1);
    let labels = &cache.samples[0].labels;
    let block_size = s.engine.config().scheduler.block_size;
    assert_eq!(labels["block_size"], block_size.to_string());
    assert_eq!(labels["num_gpu_blocks"], NUM_BLOCKS.to_string());
    assert_eq!(labels["enable_prefix_caching"], "True");
    assert_eq!(cache.samples[0].value, 1.0);

    let lora = e.family("vllm:lora_requests_info");
    assert_eq!(lora.kind, "gauge");
    assert_eq!(lora.samples.len(), 1);
    let l = &lora.samples[0].labels;
    assert_eq!(l.len(), 3, "{l:?}");
    assert_eq!(l["max_lora"], "0");
    assert_eq!(l["running_lora_adapters"], "");
    assert_eq!(l["waiting_lora_adapters"], "");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let t = lora.samples[0].value;
    assert!((now - 60.0..=now + 1.0).contains(&t), "a timestamp: {t}");
    s.shutdown().await;
}
