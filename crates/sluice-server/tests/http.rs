//! The HTTP API over a real loopback socket with a real client (reqwest),
//! on an engine with a scripted model and the built-in byte-level tokenizer:
//! the model "writes" a fixed text, one byte token at a time.

mod common;

use common::{Options, TestServer, MAX_MODEL_LEN};
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

struct Server(TestServer);

impl Server {
    async fn start(max_waiting: Option<usize>, step_delay: Duration) -> Server {
        Server(TestServer::start("test-model", max_waiting, step_delay).await)
    }

    fn base(&self) -> String {
        self.0.base()
    }

    fn engine(&self) -> &sluice_engine::Engine {
        &self.0.engine
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}{path}", self.base()))
            .json(&body)
            .send()
            .await
            .expect("request sent")
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(format!("{}{path}", self.base()))
            .await
            .expect("request sent")
    }

    async fn shutdown(self) {
        self.0.shutdown().await
    }
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(|s| s.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_non_streaming() {
    let s = Server::start(None, Duration::ZERO).await;
    let r = s
        .post(
            "/v1/completions",
            json!({"model": "test-model", "prompt": "Hi", "max_tokens": 9}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "The quick");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 9);
    assert_eq!(v["usage"]["total_tokens"], 11);

    // Token-id prompts, several prompts, n > 1.
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": [[72, 105], [72]], "max_tokens": 3, "n": 2}),
        )
        .await;
    let v: Value = r.json().await.unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], "The");
    }
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streaming_with_usage() {
    let s = Server::start(None, Duration::ZERO).await;
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 15, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let body = r.text().await.unwrap();
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).and_then(|ch| ch["text"].as_str()))
        .collect();
    assert_eq!(text, "The quick brown");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 15);
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter(|c| !c["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["finish_reason"], "length");
    s.shutdown().await;
}

/// As vLLM does, a streamed completion sends a chunk for every step that
/// made a token, also when the token's text is not shown yet (here the
/// first byte of a two- and a three-byte character): a client times its
/// first chunk as TTFT and the gaps between chunks as ITL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_without_text_still_stream_a_chunk() {
    let s = Server(
        TestServer::start_with(Options {
            text: Some("aé€b".into()),
            ..Options::default()
        })
        .await,
    );
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 20, "stream": true,
                   "stream_options": {"include_usage": true}}),
        )
        .await;
    let body = r.text().await.unwrap();
    let data = sse_data(&body);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let texts: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).and_then(|ch| ch["text"].as_str()))
        .collect();
    assert_eq!(texts.concat(), "aé€b");
    // a, C3, A9, E2, 82, AC, b, then EOS: eight tokens, eight chunks.
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 8, "{body}");
    assert_eq!(texts.len(), 8, "{texts:?}");
    assert_eq!(texts[..4], ["a", "", "é", ""], "{texts:?}");

    // Chat content streams the same way, after the role chunk.
    let r = s
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20,
                   "stream": true}),
        )
        .await;
    let body = r.text().await.unwrap();
    let data = sse_data(&body);
    let contents: Vec<String> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .skip(1)
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(contents.concat(), "aé€b");
    assert_eq!(contents.len(), 8, "{contents:?}");
    assert_eq!(contents[..4], ["a", "", "é", ""], "{contents:?}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_text() {
    let s = Server::start(None, Duration::ZERO).await;
    let v: Value = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 40, "stop": ["fox"]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], "The quick brown ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], "fox");
    let v: Value = s
        .post("/v1/completions", json!({"prompt": "Hi", "max_tokens": 40, "stop": "fox", "include_stop_str_in_output": true}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["text"], "The quick brown fox");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_non_streaming_and_streaming() {
    let s = Server::start(None, Duration::ZERO).await;
    let msgs =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]);
    let v: Value = s
        .post("/v1/chat/completions", json!({"model": "test-model", "messages": msgs, "max_tokens": 5, "logprobs": true, "top_logprobs": 2}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "The q");
    let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(lp.len(), 5);
    assert_eq!(lp[0]["token"], "T");
    assert!(lp[0]["top_logprobs"].as_array().unwrap().len() <= 2);

    let r = s
        .post(
            "/v1/chat/completions",
            json!({"messages": msgs, "max_completion_tokens": 9, "stream": true}),
        )
        .await;
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "The quick");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_openai_errors_with_the_right_status() {
    let s = Server::start(None, Duration::ZERO).await;
    let long = "x".repeat(MAX_MODEL_LEN + 10);
    let cases = [
        (
            json!({"prompt": "Hi", "max_tokens": -1}),
            400,
            Some("max_tokens"),
        ),
        (json!({"prompt": long}), 400, Some("prompt")),
        (
            json!({"prompt": "Hi", "max_tokens": 1000}),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"prompt": "Hi", "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (
            json!({"prompt": "Hi", "max_tokens": "ten"}),
            400,
            Some("max_tokens"),
        ),
        (json!({"prompt": [1, 99999]}), 400, Some("prompt")),
        (json!({"max_tokens": 3}), 400, Some("prompt")),
    ];
    for (body, status, param) in cases {
        let r = s.post("/v1/completions", body.clone()).await;
        assert_eq!(r.status(), status, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}: {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{body}: {v}");
        assert_eq!(v["error"]["code"], status);
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // An unknown model is 404 NotFoundError, as vLLM answers.
    let r = s
        .post("/v1/completions", json!({"model": "nope", "prompt": "Hi"}))
        .await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "NotFoundError", "{v}");
    assert_eq!(v["error"]["param"], "model", "{v}");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base()))
        .header("content-type", "application/json")
        .body("{\"prompt\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("malformed JSON"));
    let r = s
        .post("/v1/chat/completions", json!({"messages": []}))
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(s.get("/v1/nothing").await.status(), 404);
    // Nothing leaked.
    assert_eq!(s.engine().stats().kv_cache_usage, 0.0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gets_503_with_retry_after() {
    let s = Server::start(Some(0), Duration::ZERO).await;
    let r = s.post("/v1/completions", json!({"prompt": "Hi"})).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 503);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_endpoints() {
    let s = Server::start(None, Duration::ZERO).await;
    let v: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "test-model");
    assert_eq!(v["data"][0]["max_model_len"], MAX_MODEL_LEN);
    assert_eq!(s.get("/health").await.status(), 200);
    assert_eq!(s.get("/ready").await.status(), 200);
    let v: Value = s.get("/version").await.json().await.unwrap();
    assert!(v["version"].is_string());
    let v: Value = s
        .post("/tokenize", json!({"prompt": "Hi"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["tokens"], json!([72, 105]));
    assert_eq!(v["count"], 2);
    let v: Value = s
        .post("/detokenize", json!({"tokens": [72, 105]}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["prompt"], "Hi");
    assert_eq!(
        s.post("/detokenize", json!({"tokens": [100000]}))
            .await
            .status(),
        400
    );

    s.post("/v1/completions", json!({"prompt": "Hi", "max_tokens": 4}))
        .await;
    let text = s.get("/metrics").await.text().await.unwrap();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    ] {
        assert!(text.contains(name), "missing {name}");
    }
    assert!(
        text.contains("vllm:generation_tokens_total{engine=\"0\",model_name=\"test-model\"} 4.0"),
        "{text}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_and_frees_kv() {
    let s = Server::start(None, Duration::from_millis(5)).await;
    let r = s
        .post(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 200, "stream": true}),
        )
        .await;
    let mut body = r.bytes_stream();
    let first = body.next().await.expect("a first chunk").expect("bytes");
    assert!(!first.is_empty());
    // The engine publishes a step's stats after its outputs, so a loaded
    // machine can deliver the first chunk before the stats that show the
    // request running: wait for them (200 tokens at 5 ms a step is 1 s).
    let mut seen = false;
    for _ in 0..100 {
        let st = s.engine().stats();
        if st.num_running_reqs + st.num_waiting_reqs > 0 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(seen, "the request never showed as running");
    drop(body);
    // The engine notices the dropped stream and frees the request.
    let mut freed = false;
    for _ in 0..500 {
        let st = s.engine().stats();
        if st.num_running_reqs == 0 && st.num_waiting_reqs == 0 && st.kv_cache_usage == 0.0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        freed,
        "the aborted request still holds KV: {:?}",
        s.engine().stats()
    );
    assert_eq!(s.engine().stats().finished.abort, 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_requests_in_flight_finish() {
    let s = Server::start(None, Duration::from_millis(2)).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", s.base());
    let inflight = tokio::spawn(async move {
        client
            .post(url)
            .json(&json!({"prompt": "Hi", "max_tokens": 50}))
            .send()
            .await
            .expect("sent")
            .json::<Value>()
            .await
            .expect("json")
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let engine = s.engine().clone();
    s.shutdown().await;
    let v = inflight.await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 50);
    assert!(!engine.is_alive());
}
