//! Anthropic's Messages API over HTTP, on the scripted engine (the model
//! writes a fixed text byte by byte): the message and its content blocks,
//! every `stop_reason`, the streamed events in Anthropic's order and
//! shapes, tool use with a parser, thinking with a reasoning parser,
//! `count_tokens`, the `x-api-key` header, and every refusal in
//! Anthropic's error shape.

mod common;

use common::{Options, TestServer, TEXT};
use serde_json::{json, Value};
use sluice_server::reasoning::ReasoningParserKind;
use sluice_server::tools::ToolParserKind;

async fn server(
    text: Option<&str>,
    configure: impl FnOnce(&mut sluice_server::ServerConfig) + Send + 'static,
) -> TestServer {
    TestServer::start_with(Options {
        model_name: "claude-local".into(),
        text: text.map(str::to_string),
        configure: Box::new(configure),
        ..Options::default()
    })
    .await
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    s.post(path, &body).await
}

fn body(extra: Value) -> Value {
    let mut b = json!({
        "model": "claude-local",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
    });
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

/// The streamed events as (event name, data), in order.
async fn events(s: &TestServer, mut b: Value) -> Vec<(String, Value)> {
    b["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages", s.base()))
        .json(&b)
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).expect("JSON data");
            let n = name.take().expect("every data line has its event line");
            assert_eq!(v["type"], n.as_str(), "data.type names the event");
            out.push((n, v));
        }
    }
    out
}

/// The stream folded as a client folds it: blocks by index, with their
/// deltas applied.
fn fold(events: &[(String, Value)]) -> (Vec<Value>, Value, Value) {
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let mut open: Option<usize> = None;
    let (mut stop, mut usage) = (Value::Null, Value::Null);
    for (name, v) in events {
        match name.as_str() {
            "content_block_start" => {
                assert!(open.is_none(), "a block starts while another is open");
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(i, blocks.len(), "blocks are numbered in order");
                blocks.push(v["content_block"].clone());
                partial.push(String::new());
                open = Some(i);
            }
            "content_block_delta" => {
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(open, Some(i), "a delta for the open block");
                let d = &v["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = format!(
                            "{}{}",
                            blocks[i]["text"].as_str().unwrap(),
                            d["text"].as_str().unwrap()
                        );
                        blocks[i]["text"] = json!(t);
                    }
                    "thinking_delta" => {
                        let t = format!(
                            "{}{}",
                            blocks[i]["thinking"].as_str().unwrap(),
                            d["thinking"].as_str().unwrap()
                        );
                        blocks[i]["thinking"] = json!(t);
                    }
                    "signature_delta" => blocks[i]["signature"] = d["signature"].clone(),
                    "input_json_delta" => partial[i].push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = v["index"].as_u64().unwrap() as usize;
                assert_eq!(open.take(), Some(i));
                if blocks[i]["type"] == "tool_use" {
                    blocks[i]["input"] = serde_json::from_str(&partial[i])
                        .expect("input_json_delta concatenates to JSON");
                }
            }
            "message_delta" => {
                stop = v["delta"].clone();
                usage = v["usage"].clone();
            }
            "message_start" | "ping" | "message_stop" => {}
            other => panic!("unknown event {other}"),
        }
    }
    assert!(open.is_none(), "every block is closed");
    (blocks, stop, usage)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reports_each_stop_reason() {
    let s = server(None, |_| {}).await;
    let (st, v) = post(&s, "/v1/messages", body(json!({"max_tokens": 9}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-local");
    assert!(v["id"].as_str().unwrap().starts_with("msg"), "{v}");
    assert_eq!(v["content"], json!([{"type": "text", "text": &TEXT[..9]}]));
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(v["usage"]["output_tokens"], 9);
    let prompt = v["usage"]["input_tokens"].as_u64().unwrap()
        + v["usage"]["cache_read_input_tokens"].as_u64().unwrap();

    // A stop sequence: the text before it, and which one matched.
    let (_, v) = post(
        &s,
        "/v1/messages",
        body(json!({"stop_sequences": ["lazy", "fox"]})),
    )
    .await;
    assert_eq!(v["content"][0]["text"], "The quick brown ");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "fox");

    // count_tokens renders the same prompt the message ran on.
    let mut count = body(json!({}));
    count.as_object_mut().unwrap().remove("max_tokens");
    let (st, c) = post(&s, "/v1/messages/count_tokens", count).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["input_tokens"].as_u64(), Some(prompt));
    assert_eq!(s.prompts.lock().unwrap()[0].len() as u64, prompt);
    s.shutdown().await;

    // The model's end of turn.
    let s = server(Some("Done."), |_| {}).await;
    let (_, v) = post(&s, "/v1/messages", body(json!({}))).await;
    assert_eq!(v["content"][0]["text"], "Done.");
    assert_eq!(v["stop_reason"], "end_turn");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_and_tool_results_reach_the_prompt() {
    let s = server(Some("ok"), |_| {}).await;
    let b = body(json!({
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C, sunny"}]}
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "none"}
    }));
    let (st, v) = post(&s, "/v1/messages", b).await;
    assert_eq!(st, 200, "{v}");
    let prompt: Vec<u8> = s.prompts.lock().unwrap()[0]
        .iter()
        .filter(|&&t| t < 256)
        .map(|&t| t as u8)
        .collect();
    let prompt = String::from_utf8(prompt).unwrap();
    assert!(prompt.contains("system\nYou are terse."), "{prompt}");
    assert!(prompt.contains("tool\n21 C, sunny"), "{prompt}");
    assert!(
        prompt.find("Weather?").unwrap() < prompt.find("21 C").unwrap(),
        "{prompt}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_events_come_in_anthropics_order_and_fold_to_the_message() {
    let s = server(None, |_| {}).await;
    let ev = events(&s, body(json!({"max_tokens": 12}))).await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..4],
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta"
        ]
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = &ev[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    let (blocks, stop, usage) = fold(&ev);
    assert_eq!(blocks, vec![json!({"type": "text", "text": &TEXT[..12]})]);
    assert_eq!(
        stop,
        json!({"stop_reason": "max_tokens", "stop_sequence": null})
    );
    assert_eq!(usage["output_tokens"], 12);
    let (_, v) = post(&s, "/v1/messages", body(json!({"max_tokens": 12}))).await;
    assert_eq!(json!(blocks), v["content"]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_then_a_tool_call_are_two_blocks_whole_and_streamed() {
    let text = "<think>The user wants the weather.</think>\
                <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let s = server(Some(text), |c| {
        c.reasoning_parser = Some(ReasoningParserKind::Qwen3);
        c.auto_tool_parser = Some(ToolParserKind::Hermes);
    })
    .await;
    let b = body(
        json!({"max_tokens": 200, "tools": [{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]}),
    );
    let (st, v) = post(&s, "/v1/messages", b.clone()).await;
    assert_eq!(st, 200, "{v}");
    let content = v["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{v}");
    assert_eq!(content[1]["type"], "tool_use", "{v}");
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["thinking"], "The user wants the weather.");
    assert!(content[0]["signature"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["name"], "get_weather");
    assert_eq!(content[1]["input"], json!({"city": "Paris"}));
    assert_eq!(v["stop_reason"], "tool_use");

    let (blocks, stop, _) = fold(&events(&s, b).await);
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(blocks[0]["thinking"], "The user wants the weather.");
    assert_eq!(blocks[1]["name"], "get_weather");
    assert_eq!(blocks[1]["input"], json!({"city": "Paris"}));
    assert_eq!(stop["stop_reason"], "tool_use");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_anthropic_errors_naming_the_field() {
    let s = server(None, |c| {
        c.api_keys = vec!["sk-local".into()];
        c.max_request_body_bytes = 4000;
    })
    .await;
    let client = reqwest::Client::new();
    let send = |b: Value, key: Option<&'static str>| {
        let mut r = client.post(format!("{}/v1/messages", s.base())).json(&b);
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        async move {
            let r = r.send().await.expect("sent");
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.expect("a JSON error"))
        }
    };
    let shape = |v: &Value, kind: &str| {
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        v["error"]["message"]
            .as_str()
            .expect("a message")
            .to_string()
    };
    // No key, a wrong key: 401; the right one in x-api-key: accepted.
    let (st, v) = send(body(json!({})), None).await;
    assert_eq!(st, 401);
    assert!(shape(&v, "authentication_error").contains("x-api-key"));
    let (st, _) = send(body(json!({})), Some("sk-wrong")).await;
    assert_eq!(st, 401);
    let (st, v) = send(body(json!({"max_tokens": 3})), Some("sk-local")).await;
    assert_eq!(st, 200, "{v}");
    // Bearer still works.
    let r = client
        .post(format!("{}/v1/messages/count_tokens", s.base()))
        .bearer_auth("sk-local")
        .json(&json!({"model": "claude-local", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let mut no_max = body(json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let cases = [
        (no_max, 400, "invalid_request_error", "max_tokens"),
        (
            body(json!({"model": "gpt-4"})),
            404,
            "not_found_error",
            "gpt-4",
        ),
        (
            body(json!({"temperature": "hot"})),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            body(json!({"stop_sequences": vec!["ab"; 300]})),
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        (
            body(
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            ),
            400,
            "invalid_request_error",
            "messages[0].content[0].type",
        ),
        (
            body(json!({"tools": [{"name": "f", "input_schema": {}}]})),
            400,
            "invalid_request_error",
            "tool",
        ),
        (
            body(json!({"pad": "x".repeat(5000)})),
            413,
            "request_too_large",
            "",
        ),
    ];
    for (b, status, kind, field) in cases {
        let (st, v) = send(b.clone(), Some("sk-local")).await;
        assert_eq!(st, status, "{v}");
        let m = shape(&v, kind);
        assert!(m.contains(field), "{field} in {m}");
    }
    // Not JSON at all.
    let r = client
        .post(format!("{}/v1/messages", s.base()))
        .header("x-api-key", "sk-local")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    shape(&r.json::<Value>().await.unwrap(), "invalid_request_error");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_anthropic_python_client() {
    let plain = server(None, |c| c.api_keys = vec!["sk-local".into()]).await;
    let tools = server(
        Some(
            "<think>I should look it up.</think>\
             <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ),
        |c| {
            c.reasoning_parser = Some(ReasoningParserKind::Qwen3);
            c.auto_tool_parser = Some(ToolParserKind::Hermes);
        },
    )
    .await;
    let args = [plain.base(), tools.base(), "claude-local".to_string()];
    common::run_python("anthropic", "anthropic_client.py", &args, &[]).await;
    plain.shutdown().await;
    tools.shutdown().await;
}
