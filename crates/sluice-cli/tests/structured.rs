//! Structured outputs and tool calling on the real model over HTTP:
//! `sluice serve --model SmolLM2-135M-Instruct.Q4_1.gguf
//! --enable-auto-tool-choice --tool-call-parser hermes`. Checks that every
//! JSON-schema-constrained answer (10 schemas, 30 requests, through
//! `response_format`, `structured_outputs.json` and `guided_json`, greedy
//! and seeded sampling, chat and completions) validates against its schema
//! and ends with `finish_reason: "stop"`; that regex, choice, `json_object`
//! and Lark-grammar constraints hold, with `n > 1` and streamed; that bad
//! constraints and tool choices are 400s naming the field; and, through the
//! official `openai` Python client (tests/openai_tools.py), that forced and
//! named tool calls come back well-formed, streamed and not.
//!
//! The bounds on time here are hang detectors only.

mod common;

use common::Serve;
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The real model, with the hermes tool parser unless `auto_tools` is
/// false. 512 KV blocks of 16 (`--num-gpu-blocks-override` replaces the
/// helper's 16 MiB) so that a few dozen requests run at once.
fn serve(auto_tools: bool) -> Serve {
    let model = common::smollm2();
    let mut args = vec![
        "--model",
        model.to_str().unwrap(),
        "--max-model-len",
        "1024",
        "--num-gpu-blocks-override",
        "512",
    ];
    if auto_tools {
        args.extend(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
    }
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut s = common::spawn_serve(&args, &[]);
    s.drain_log();
    s
}

fn client() -> reqwest::Client {
    // A hang detector, far above what a request takes even on a loaded
    // machine.
    reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

async fn post(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    (status, v)
}

/// The choices' texts and finish reasons (chat or completions).
fn texts(v: &Value) -> Vec<(String, String)> {
    v["choices"]
        .as_array()
        .unwrap_or_else(|| panic!("no choices: {v}"))
        .iter()
        .map(|c| {
            let t = c["message"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .unwrap_or_else(|| panic!("no text: {c}"));
            (
                t.to_string(),
                c["finish_reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("{schema}: {e}"))
}

fn assert_valid(schema: &Value, text: &str, what: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {text:?} is not JSON: {e}"));
    let errors: Vec<String> = validator(schema)
        .iter_errors(&v)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{what}: {text:?}: {errors:?}");
}

/// The ten schemas (tests/data/structured_schemas.json, which
/// examples/structured_engine_bench.rs also runs), each with a prompt that asks
/// for it.
fn schemas() -> Vec<(String, Value)> {
    let all: Value = serde_json::from_str(include_str!("data/structured_schemas.json")).unwrap();
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

/// Request `i` for schema `schema`: the field, endpoint and sampling vary
/// with `i`.
fn schema_request(i: usize, prompt: &str, schema: &Value) -> (&'static str, Value) {
    let chat = i.is_multiple_of(2);
    let mut body = if chat {
        json!({"messages": [{"role": "user", "content": prompt}]})
    } else {
        json!({"prompt": format!("{prompt}\n")})
    };
    body["max_tokens"] = json!(200);
    // Explicit whitespace patterns through every field that takes one: one
    // space at most, or none.
    let ws = if (i / 3).is_multiple_of(2) {
        "[ ]?"
    } else {
        ""
    };
    match i % 3 {
        0 => {
            body["response_format"] = json!({"type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": true}});
            // `structured_outputs` with no kind is a 400 (as in vLLM): the
            // whitespace comes through the older field.
            body["guided_whitespace_pattern"] = json!(ws);
        }
        1 => {
            body["structured_outputs"] = json!({"json": schema, "whitespace_pattern": ws});
        }
        _ => {
            body["guided_json"] = schema.clone();
            body["guided_whitespace_pattern"] = json!(ws);
        }
    }
    if i % 4 == 3 {
        body["temperature"] = json!(0.8);
        body["seed"] = json!(i);
    } else {
        body["temperature"] = json!(0);
    }
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    (path, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_json_schema_requests_validate_on_both_endpoints() {
    let s = serve(true);
    let schemas = schemas();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let (prompt, schema) = schemas[i % schemas.len()].clone();
        let (path, body) = schema_request(i, &prompt, &schema);
        let url = s.url.clone();
        tasks.push(tokio::spawn(async move {
            let (status, v) = post(&url, path, &body).await;
            (i, path, body, schema, status, v)
        }));
    }
    for t in tasks {
        let (i, path, body, schema, status, v) = t.await.unwrap();
        assert_eq!(status, 200, "request {i} {path} {body}: {v}");
        let what = format!("request {i} ({path}, {body})");
        for (text, finish) in texts(&v) {
            assert_eq!(finish, "stop", "{what}: {text:?}");
            assert_valid(&schema, &text, &what);
        }
    }
}

fn chat(prompt: &str) -> Value {
    json!({"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 64})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_choice_json_object_and_grammar_constraints_hold() {
    let s = serve(true);
    let url = &s.url;
    // Regexes (the whole text must match, anchored).
    for (prompt, re, field) in [
        (
            "What is the IP address of the local host?",
            r"[0-9]{1,3}(\.[0-9]{1,3}){3}",
            "structured_outputs",
        ),
        (
            "Give a US phone number.",
            r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
            "guided",
        ),
        (
            "Name a fruit.",
            r"(apple|banana|cherry)!",
            "structured_outputs",
        ),
        ("What time is it?", r"[0-2][0-9]:[0-5][0-9]", "guided"),
    ] {
        let mut body = chat(prompt);
        if field == "guided" {
            body["guided_regex"] = json!(re);
        } else {
            body["structured_outputs"] = json!({"regex": re});
        }
        let (status, v) = post(url, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{body}: {v}");
        let (text, finish) = texts(&v).remove(0);
        let anchored = regex_lite(&format!("^(?:{re})$"));
        assert!(anchored.is_match(&text), "{re}: {text:?}");
        assert_eq!(finish, "stop", "{re}: {text:?}");
    }
    // Choices, on both endpoints.
    for (path, prompt, options) in [
        (
            "/v1/chat/completions",
            "Is the sky blue?",
            vec!["yes", "no"],
        ),
        (
            "/v1/chat/completions",
            "What is the capital of France?",
            vec!["Paris", "London", "Berlin"],
        ),
        (
            "/v1/completions",
            "The best programming language is",
            vec![" Rust", " Python", " C"],
        ),
    ] {
        let mut body = if path == "/v1/completions" {
            json!({"prompt": prompt, "temperature": 0, "max_tokens": 16})
        } else {
            chat(prompt)
        };
        body["structured_outputs"] = json!({"choice": options});
        let (status, v) = post(url, path, &body).await;
        assert_eq!(status, 200, "{body}: {v}");
        let (text, finish) = texts(&v).remove(0);
        assert!(options.contains(&text.as_str()), "{options:?}: {text:?}");
        assert_eq!(finish, "stop");
    }
    // json_object, through both fields.
    for extra in [
        json!({"response_format": {"type": "json_object"}}),
        json!({"structured_outputs": {"json_object": true, "whitespace_pattern": "[ ]?"}}),
    ] {
        let mut body = chat("Describe a dog as a JSON object.");
        body["max_tokens"] = json!(200);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, v) = post(url, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{body}: {v}");
        let (text, finish) = texts(&v).remove(0);
        if finish == "stop" {
            let o: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{body}: {text:?}: {e}"));
            assert!(o.is_object(), "{text:?}");
        } else {
            // An unbounded object may run into max_tokens; what there is
            // must still be a JSON object's beginning.
            assert_eq!(finish, "length");
            assert!(text.trim_start().starts_with('{'), "{text:?}");
        }
    }
    // A Lark grammar.
    let grammar = r#"
start: greeting " " name "!"
greeting: "Hello" | "Hi"
name: /[A-Z][a-z]{1,8}/
"#;
    for field in ["structured_outputs", "guided_grammar"] {
        let mut body = chat("Greet someone.");
        if field == "guided_grammar" {
            body["guided_grammar"] = json!(grammar);
        } else {
            body["structured_outputs"] = json!({"grammar": grammar});
        }
        let (status, v) = post(url, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{body}: {v}");
        let (text, finish) = texts(&v).remove(0);
        assert!(
            regex_lite("^(Hello|Hi) [A-Z][a-z]{1,8}!$").is_match(&text),
            "{text:?}"
        );
        assert_eq!(finish, "stop");
    }
}

/// A full-match check for the few regexes above, through `jsonschema`'s
/// `pattern` (ECMA 262 regexes, a superset of what the tests use), so the
/// check needs no other regex crate.
struct Pattern(jsonschema::Validator);

impl Pattern {
    fn is_match(&self, text: &str) -> bool {
        self.0.is_valid(&json!(text))
    }
}

fn regex_lite(re: &str) -> Pattern {
    Pattern(validator(&json!({"type": "string", "pattern": re})))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_and_streamed_output_stay_constrained() {
    let s = serve(true);
    let url = &s.url;
    let (_, schema) = schemas()[0].clone();
    // n = 3, sampled (n > 1 needs sampling), on both endpoints.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let mut body = if path == "/v1/completions" {
            json!({"prompt": "Describe a person as JSON.\n"})
        } else {
            json!({"messages": [{"role": "user", "content": "Describe a person as JSON."}]})
        };
        body["n"] = json!(3);
        body["temperature"] = json!(1.0);
        body["seed"] = json!(7);
        body["max_tokens"] = json!(200);
        body["structured_outputs"] = json!({"json": schema, "whitespace_pattern": "[ ]?"});
        let (status, v) = post(url, path, &body).await;
        assert_eq!(status, 200, "{body}: {v}");
        let choices = texts(&v);
        assert_eq!(choices.len(), 3, "{v}");
        for (text, finish) in choices {
            assert_eq!(finish, "stop", "{path}: {text:?}");
            assert_valid(&schema, &text, path);
        }
    }
    // Streamed: the concatenated deltas validate, on both endpoints; and a
    // streamed choice.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let mut body = if path == "/v1/completions" {
            json!({"prompt": "Describe a person as JSON.\n"})
        } else {
            json!({"messages": [{"role": "user", "content": "Describe a person as JSON."}]})
        };
        body["stream"] = json!(true);
        body["temperature"] = json!(0);
        body["max_tokens"] = json!(200);
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}});
        body["guided_whitespace_pattern"] = json!("[ ]?");
        let (text, finish, chunks) = stream(url, path, &body).await;
        assert!(chunks > 2, "{path}: one chunk per few tokens, got {chunks}");
        assert_eq!(finish, "stop", "{path}: {text:?}");
        assert_valid(&schema, &text, &format!("{path} streamed"));
        // The same as the non-streamed answer (greedy).
        body.as_object_mut().unwrap().remove("stream");
        let (_, v) = post(url, path, &body).await;
        assert_eq!(texts(&v)[0].0, text, "{path}");
    }
    let mut body = chat("Is the sky blue?");
    body["stream"] = json!(true);
    body["guided_choice"] = json!(["yes", "no", "maybe"]);
    let (text, finish, _) = stream(url, "/v1/chat/completions", &body).await;
    assert!(["yes", "no", "maybe"].contains(&text.as_str()), "{text:?}");
    assert_eq!(finish, "stop");
}

/// Reads an SSE stream: the concatenated text deltas of choice 0, its
/// finish reason, and the number of data chunks.
async fn stream(url: &str, path: &str, body: &Value) -> (String, String, usize) {
    let r = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{body}");
    let mut bytes = r.bytes_stream();
    let mut buf = String::new();
    while let Some(b) = bytes.next().await {
        buf.push_str(&String::from_utf8_lossy(&b.unwrap()));
    }
    let (mut text, mut finish, mut chunks) = (String::new(), String::new(), 0);
    for line in buf.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        chunks += 1;
        let v: Value = serde_json::from_str(data).unwrap();
        for c in v["choices"].as_array().unwrap() {
            if let Some(t) = c["delta"]["content"].as_str().or(c["text"].as_str()) {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (text, finish, chunks)
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}})
}

async fn assert_400(url: &str, path: &str, body: Value, param: &str, text: &str) {
    let (status, v) = post(url, path, &body).await;
    assert_eq!(status, 400, "{body}: {v}");
    assert_eq!(v["error"]["param"], param, "{body}: {v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(text), "{body}: {msg:?} lacks {text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_and_tool_choices_are_400s_naming_the_field() {
    let s = serve(true);
    let url = &s.url;
    let c = "/v1/chat/completions";
    let with = |extra: Value| {
        let mut b = chat("Hi");
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // Schemas that do not compile, on each field and both endpoints.
    assert_400(
        url,
        c,
        with(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "strin"}}}})),
        "response_format",
        "Invalid json constraint",
    )
    .await;
    assert_400(
        url,
        c,
        with(json!({"structured_outputs": {"json": {"type": "strin"}}})),
        "structured_outputs.json",
        "Invalid json constraint",
    )
    .await;
    assert_400(
        url,
        "/v1/completions",
        json!({"prompt": "Hi", "guided_json": {"type": "object", "properties": {"a": {"type": 7}}}}),
        "guided_json",
        "Invalid json constraint",
    )
    .await;
    // A regex that does not compile.
    assert_400(
        url,
        c,
        with(json!({"structured_outputs": {"regex": "a(b"}})),
        "structured_outputs.regex",
        "Invalid regex constraint",
    )
    .await;
    assert_400(
        url,
        "/v1/completions",
        json!({"prompt": "Hi", "guided_regex": "[z-a]"}),
        "guided_regex",
        "Invalid regex constraint",
    )
    .await;
    // A grammar that does not compile.
    assert_400(
        url,
        c,
        with(json!({"structured_outputs": {"grammar": "start: undefined_rule"}})),
        "structured_outputs.grammar",
        "Invalid grammar constraint",
    )
    .await;
    // Two constraints at once.
    assert_400(
        url,
        c,
        with(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})),
        "structured_outputs",
        "only use one kind",
    )
    .await;
    assert_400(
        url,
        "/v1/completions",
        json!({"prompt": "Hi", "guided_regex": "a", "structured_outputs": {"choice": ["b"]}}),
        "structured_outputs",
        "only use one kind",
    )
    .await;
    // A named tool_choice for a function that is not in tools.
    let (status, v) = post(
        url,
        c,
        &with(json!({"tools": [weather_tool()],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}}})),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tool_choice", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not match any of the specified `tools`"),
        "{v}"
    );
    // tool_choice without tools.
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let (status, v) = post(url, c, &with(json!({"tool_choice": choice}))).await;
        assert_eq!(status, 400, "{choice}: {v}");
        assert_eq!(v["error"]["param"], "tool_choice", "{choice}: {v}");
    }
    // A server without --enable-auto-tool-choice refuses "auto", and still
    // takes "none".
    let plain = serve(false);
    let (status, v) = post(
        &plain.url,
        c,
        &with(json!({"tools": [weather_tool()], "tool_choice": "auto"})),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tool_choice", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--enable-auto-tool-choice"),
        "{v}"
    );
    let (status, v) = post(
        &plain.url,
        c,
        &with(json!({"tools": [weather_tool()], "tool_choice": "none"})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let calls = &v["choices"][0]["message"]["tool_calls"];
    assert!(
        calls.is_null() || calls == &json!([]),
        "tool_choice none: no calls: {v}"
    );
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with the openai package: run `.ci/test` (it creates .venv with `pip \
         install openai`) or set SLUICE_PYTHON"
    );
    venv
}

#[test]
fn tool_calls_through_the_official_openai_client() {
    let python = python();
    let s = serve(true);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_tools.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(format!("{}/v1", s.url))
        .arg("SmolLM2-135M-Instruct.Q4_1")
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "openai tool-call checks failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Structured outputs as a user meets them (tools/structured_eval.py through
/// the official `openai` client): 8 schemas × 2 prompts × 3 seeds,
/// `response_format` json_schema with `strict: true`, temperature 0.7, 200
/// tokens, the server's defaults (whitespace bounded as llama.cpp bounds
/// it). At least 90 % of the answers parse, validate against their schema
/// read strictly (no keys an object does not name) and end by themselves.
/// Measured: 47 of 48 (llama-server on the same file and requests: 44; the
/// unbounded whitespace and open objects of before: 31).
#[test]
fn strict_json_schema_answers_validate_nine_times_in_ten() {
    let python = python();
    let s = serve(false);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/structured_eval.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", s.url), "--min-valid", "0.9"])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "structured_eval.py failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
