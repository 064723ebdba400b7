//! Nothing a client sends may panic the server or leak KV blocks: hundreds
//! of randomly mangled request bodies (wrong types, out-of-range numbers,
//! huge values, unknown fields, broken JSON) get a 200 or a 4xx with an
//! OpenAI error object, and the KV cache is empty afterwards.

mod common;

use common::TestServer;
use serde_json::{json, Value};
use std::time::Duration;

/// Deterministic xorshift, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, v: &'a [Value]) -> &'a Value {
        &v[(self.next() % v.len() as u64) as usize]
    }
}

fn values() -> Vec<Value> {
    vec![
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1),
        json!(3),
        json!(0.5),
        json!(-0.5),
        json!(1e300),
        json!(-1e300),
        json!(i64::MAX),
        json!(u64::MAX),
        json!("x"),
        json!(""),
        json!([]),
        json!([1, 2, 3]),
        json!([[1], [2, 3]]),
        json!(["a", "b"]),
        json!({}),
        json!({"include_usage": true}),
        json!({"5": 10.0}),
        json!([{"role": "user", "content": "hi"}]),
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
        json!([{"role": "user", "content": [{"type": "image_url"}]}]),
    ]
}

const FIELDS: &[&str] = &[
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "n",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "logit_bias",
    "priority",
    "stop_token_ids",
    "echo",
    "prompt_logprobs",
    "model",
    "tools",
    "response_format",
    "unknown_field",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bodies_never_crash_or_leak() {
    let server = TestServer::start("m", None, Duration::ZERO).await;
    let client = reqwest::Client::new();
    let vals = values();
    let mut rng = Rng(0x5eed);
    let mut ok = 0;
    for case in 0..400 {
        let path = if case % 2 == 0 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let mut body = serde_json::Map::new();
        // Usually a valid core, so mangled fields are reached.
        if !rng.next().is_multiple_of(4) {
            if case % 2 == 0 {
                body.insert("prompt".into(), json!("Hello"));
            } else {
                body.insert(
                    "messages".into(),
                    json!([{"role": "user", "content": "Hello"}]),
                );
            }
            body.insert("max_tokens".into(), json!(4));
        }
        for _ in 0..(1 + rng.next() % 4) {
            let f = FIELDS[(rng.next() % FIELDS.len() as u64) as usize];
            body.insert(f.into(), rng.pick(&vals).clone());
        }
        let raw = if rng.next().is_multiple_of(10) {
            // Broken JSON.
            let s = Value::Object(body.clone()).to_string();
            s[..s.len() / 2].to_string()
        } else {
            Value::Object(body.clone()).to_string()
        };
        let resp = client
            .post(format!("{}{path}", server.base()))
            .header("content-type", "application/json")
            .body(raw.clone())
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap_or_else(|e| panic!("case {case}: no response to {raw}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        match status {
            200 => ok += 1,
            400..=499 => {
                let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| {
                    panic!("case {case}: {status} without a JSON error: {text}")
                });
                assert!(v["error"]["message"].is_string(), "case {case}: {text}");
            }
            _ => panic!("case {case}: status {status} for {raw}: {text}"),
        }
    }
    assert!(ok > 20, "too few valid cases ({ok}) to exercise generation");
    assert!(server.engine.is_alive());
    // Every request ended: nothing holds KV.
    let mut st = server.engine.stats();
    for _ in 0..200 {
        if st.num_running_reqs == 0 && st.num_waiting_reqs == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        st = server.engine.stats();
    }
    assert_eq!(
        (st.num_running_reqs, st.num_waiting_reqs, st.kv_cache_usage),
        (0, 0, 0.0)
    );
    server.shutdown().await;
}
