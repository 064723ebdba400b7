//! Exact errors: every wrong-typed field is named in the message and in
//! `param`, an unknown model is 404, trailing bytes are refused, token ids
//! get one vocabulary check on every endpoint, and the per-request limits
//! answer 400 naming the limit.

mod common;

use common::{Options, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    s.post(path, &body).await
}

/// The sampling fields both endpoints share, each with a value of the
/// wrong type.
const SAMPLING_FIELDS: &[(&str, &str)] = &[
    ("temperature", r#""hot""#),
    ("top_p", r#""all""#),
    ("top_k", "1.5"),
    ("min_p", "[1]"),
    ("seed", r#""x""#),
    ("presence_penalty", "{}"),
    ("frequency_penalty", "true"),
    ("repetition_penalty", r#""1""#),
    ("n", r#""two""#),
    ("stop", "5"),
    ("stop_token_ids", r#""1,2""#),
    ("ignore_eos", r#""yes""#),
    ("min_tokens", "-1.5"),
    ("include_stop_str_in_output", "1"),
    ("skip_special_tokens", r#""no""#),
    ("logit_bias", "[1, 2]"),
    ("priority", r#""high""#),
    ("stream", r#""true""#),
    ("stream_options", "3"),
];

const COMPLETION_FIELDS: &[(&str, &str)] = &[
    ("model", "5"),
    ("prompt", "{}"),
    ("max_tokens", r#""ten""#),
    ("logprobs", "true"),
    ("prompt_logprobs", r#""3""#),
    ("echo", r#""on""#),
    ("suffix", "7"),
];

const CHAT_FIELDS: &[(&str, &str)] = &[
    ("model", "[]"),
    ("messages", r#""hi""#),
    ("max_tokens", "1.5"),
    ("max_completion_tokens", r#""8""#),
    ("logprobs", "3"),
    ("top_logprobs", "true"),
    ("add_generation_prompt", r#""yes""#),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_error_names_its_field() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    let completion = r#"{"prompt": "Hi", "max_tokens": 2}"#;
    let chat = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}"#;
    let endpoints = [
        ("/v1/completions", completion, COMPLETION_FIELDS),
        ("/v1/chat/completions", chat, CHAT_FIELDS),
    ];
    for (path, base, own) in endpoints {
        for (field, bad) in SAMPLING_FIELDS.iter().chain(own.iter()) {
            let mut body: Value = serde_json::from_str(base).unwrap();
            body[*field] = serde_json::from_str(bad).unwrap();
            let (status, v) = post(&s, path, body.clone()).await;
            assert_eq!(status, 400, "{path} {body}: {v}");
            assert_eq!(v["error"]["param"], *field, "{path} {body}: {v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("{field}: expected ")),
                "{path} {body}: {message}"
            );
            for internal in [
                "invalid type",
                "line 1",
                "f64",
                "i64",
                "u32",
                "untagged",
                "`",
            ] {
                assert!(!message.contains(internal), "{path} {body}: {message}");
            }
        }
    }
    // Nested fields are named by their path.
    let (status, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": 5}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "messages[0].content", "{v}");
    s.shutdown().await;
}

/// Each case: endpoint, body, the field at fault, and the message the API
/// gives: the field's JSON path, the JSON type it takes (as the OpenAI API
/// reference types it) and what the body holds there.
const TYPE_ERROR_CASES: &[(&str, &str, &str, &str)] = &[
    // number
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "temperature": "hot"}"#,
        "temperature",
        r#"temperature: expected a number, got the string "hot""#,
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "top_p": [1]}"#,
        "top_p",
        "top_p: expected a number, got an array",
    ),
    // integer
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 1.5}"#,
        "max_tokens",
        "max_tokens: expected an integer, got the number 1.5",
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "n": "two"}"#,
        "n",
        r#"n: expected an integer, got the string "two""#,
    ),
    // boolean
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "stream": "true"}"#,
        "stream",
        r#"stream: expected a boolean, got the string "true""#,
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "logprobs": 3}"#,
        "logprobs",
        "logprobs: expected a boolean, got the number 3",
    ),
    // string
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "model": 5}"#,
        "model",
        "model: expected a string, got the number 5",
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": 7, "content": "Hi"}]}"#,
        "messages[0].role",
        "messages[0].role: expected a string, got the number 7",
    ),
    // array
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "stop_token_ids": "1,2"}"#,
        "stop_token_ids",
        r#"stop_token_ids: expected an array, got the string "1,2""#,
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": {"role": "user", "content": "Hi"}}"#,
        "messages",
        "messages: expected an array, got an object",
    ),
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "stop_token_ids": [1, "x"]}"#,
        "stop_token_ids[1]",
        r#"stop_token_ids[1]: expected an integer in [0, 4294967295], got the string "x""#,
    ),
    // object
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "stream_options": 3}"#,
        "stream_options",
        "stream_options: expected an object, got the number 3",
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "logit_bias": [1, 2]}"#,
        "logit_bias",
        "logit_bias: expected an object, got an array",
    ),
    // a choice of shapes, nested
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": 5}]}"#,
        "messages[0].content",
        "messages[0].content: expected a string or an array of content parts, got the number 5",
    ),
    (
        "/v1/completions",
        r#"{"prompt": {"text": "Hi"}}"#,
        "prompt",
        "prompt: expected a string, an array of strings, an array of token ids or an array of \
         arrays of token ids, got an object",
    ),
    // fields read after the typed parse
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "response_format": "json"}"#,
        "response_format",
        r#"response_format: expected an object, got the string "json""#,
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": true}}"#,
        "response_format.json_schema",
        "response_format.json_schema: expected an object, got true",
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}"#,
        "response_format.json_schema.schema",
        "response_format.json_schema.schema: expected a JSON schema (an object, or a string \
         holding one), got the number 3",
    ),
    (
        "/v1/completions",
        r#"{"prompt": "Hi", "structured_outputs": {"regex": 12}}"#,
        "structured_outputs.regex",
        "structured_outputs.regex: expected a string, got the number 12",
    ),
    (
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi"}], "tools": [5]}"#,
        "tools[0]",
        "tools[0]: expected an object, got the number 5",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_errors_are_in_the_apis_words() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    let client = reqwest::Client::new();
    for (path, body, param, message) in TYPE_ERROR_CASES {
        let r = client
            .post(format!("{}{path}", s.base()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], *param, "{path} {body}: {v}");
        assert_eq!(v["error"]["message"], *message, "{path} {body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["code"], 400, "{v}");
    }
    // Only a body that is not JSON says where it broke.
    for body in [r#"{"prompt": "Hi",}"#, r#"{"prompt": "Hi""#, "prompt=Hi"] {
        let r = client
            .post(format!("{}/v1/completions", s.base()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("malformed JSON body: ") && message.contains("at line 1 column"),
            "{body}: {message}"
        );
        assert_eq!(v["error"]["param"], Value::Null, "{body}: {v}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_is_404_everywhere() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    for (path, body) in [
        ("/v1/completions", json!({"model": "gpt-9", "prompt": "Hi"})),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "Hi"}]}),
        ),
        ("/tokenize", json!({"model": "gpt-9", "prompt": "Hi"})),
        ("/detokenize", json!({"model": "gpt-9", "tokens": [72]})),
    ] {
        let (status, v) = post(&s, path, body).await;
        assert_eq!(status, 404, "{path}: {v}");
        assert_eq!(v["error"]["type"], "NotFoundError", "{path}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_after_the_json_body_are_refused() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    for body in [
        r#"{"prompt": "Hi", "max_tokens": 2} {"prompt": "again"}"#,
        r#"{"prompt": "Hi", "max_tokens": 2}garbage"#,
    ] {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/completions", s.base()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains("trailing"),
            "{v}"
        );
    }
    // Trailing whitespace is fine.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base()))
        .header("content-type", "application/json")
        .body("{\"prompt\": \"Hi\", \"max_tokens\": 2}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_vocabulary_check_for_every_endpoint() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    let vocab = s.engine.vocab_size() as u32;
    for (id, ok) in [(vocab - 1, true), (vocab, false), (u32::MAX, false)] {
        let (d, dv) = post(&s, "/detokenize", json!({"tokens": [72, id]})).await;
        let (c, cv) = post(
            &s,
            "/v1/completions",
            json!({"prompt": [72, id], "max_tokens": 1}),
        )
        .await;
        let (st, sv) = post(
            &s,
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 1, "stop_token_ids": [id]}),
        )
        .await;
        let (lb, lv) = post(
            &s,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                   "logit_bias": {id.to_string(): 1.0}}),
        )
        .await;
        let expect = if ok { 200 } else { 400 };
        assert_eq!(d, expect, "detokenize {id}: {dv}");
        assert_eq!(c, expect, "prompt {id}: {cv}");
        assert_eq!(st, expect, "stop_token_ids {id}: {sv}");
        assert_eq!(lb, expect, "logit_bias {id}: {lv}");
        if !ok {
            assert_eq!(dv["error"]["param"], "tokens");
            assert_eq!(cv["error"]["param"], "prompt");
            assert_eq!(sv["error"]["param"], "stop_token_ids");
            assert_eq!(lv["error"]["param"], "logit_bias");
        }
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_limits_answer_400_naming_the_limit() {
    let s = TestServer::start_with(Options {
        limits: sluice_engine::RequestLimits {
            max_stop_strings: 4,
            max_stop_string_bytes: 8,
            max_logit_bias: 3,
            ..sluice_engine::RequestLimits::default()
        },
        configure: Box::new(|c| c.max_sequences_per_request = 6),
        ..Options::default()
    })
    .await;
    let cases = [
        (
            json!({"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
            "--max-stop-strings",
        ),
        (
            json!({"prompt": "Hi", "stop": "123456789"}),
            "stop",
            "--max-stop-string-bytes",
        ),
        (
            json!({"prompt": "Hi", "logit_bias": {"1": 1, "2": 1, "3": 1, "4": 1}}),
            "logit_bias",
            "--max-logit-bias",
        ),
        (
            json!({"prompt": "Hi", "n": 7}),
            "n",
            "--max-sequences-per-request",
        ),
        (
            json!({"prompt": ["a", "b", "c"], "n": 3}),
            "prompt",
            "--max-sequences-per-request",
        ),
    ];
    for (body, param, flag) in cases {
        let (status, v) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(flag),
            "{body}: {v}"
        );
    }
    // At the limits, accepted.
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2,
               "stop": ["w", "x", "y", "12345678"], "logit_bias": {"1": 1, "2": -1, "3": 0}}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 6);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tokens_past_the_bound_get_503() {
    let s = TestServer::start_with(Options {
        // One running request at a time, slow enough to stay running while
        // the test fills the queue behind it.
        max_num_seqs: 1,
        step_delay: Duration::from_millis(20),
        limits: sluice_engine::RequestLimits {
            max_waiting_tokens: Some(150),
            ..sluice_engine::RequestLimits::default()
        },
        ..Options::default()
    })
    .await;
    // A request that alone exceeds the bound can never fit: 400, not 503.
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 250, "n": 2}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-waiting-tokens"));
    // 2 + 100 tokens each: A runs, B waits (102 queued), C would make 204.
    let spawn = |base: String| {
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": "Hi", "max_tokens": 100, "ignore_eos": true}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let wait_for = |what: &'static str, cond: fn(&sluice_engine::EngineStats) -> bool| {
        let engine = s.engine.clone();
        async move {
            for _ in 0..3000 {
                if cond(&engine.stats()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("never {what}: {:?}", engine.stats());
        }
    };
    let a = spawn(s.base());
    wait_for("running", |st| st.num_running_reqs == 1).await;
    let b = spawn(s.base());
    wait_for("waiting", |st| st.num_waiting_reqs == 1).await;
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 100}),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-waiting-tokens"),
        "{v}"
    );
    assert_eq!(a.await.unwrap(), 200);
    assert_eq!(b.await.unwrap(), 200);
    s.shutdown().await;
}

/// Rules vLLM 0.33 enforces, and its leniencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_rules_and_leniencies() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    let refused = [
        (json!({"prompt": "Hi", "temperature": 2.5}), "temperature"),
        (json!({"prompt": "Hi", "n": 2, "temperature": 0}), "n"),
        (
            json!({"prompt": "Hi", "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (
            json!({"prompt": "Hi", "stream": true, "prompt_logprobs": 1}),
            "prompt_logprobs",
        ),
        (json!({"prompt": "Hi", "max_tokens": 300}), "max_tokens"),
        (
            json!({"prompt": "Hi", "logit_bias": {"1.5": 1}}),
            "logit_bias",
        ),
    ];
    for (body, param) in refused {
        let (status, v) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    // max_tokens past the prompt's room is clamped; biases are clamped.
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "0123456789", "max_tokens": 250, "ignore_eos": true,
               "logit_bias": {"65": 500}, "seed": -1}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 246, "{v}");
    // Bodies must be declared JSON.
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut r = reqwest::Client::new()
            .post(format!("{}/v1/completions", s.base()))
            .body(r#"{"prompt": "Hi"}"#);
        if let Some(ct) = content_type {
            r = r.header("content-type", ct);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 400, "{content_type:?}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("application/json"));
    }
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base()))
        .header("content-type", "application/json; charset=utf-8")
        .body(r#"{"prompt": "Hi", "max_tokens": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    s.shutdown().await;
}
