//! Structured outputs and tool calling over HTTP, on the scripted engine (the
//! model writes a fixed text byte by byte, then EOS; the grammar's mask
//! decides what it may write): the request fields become constraints, bad
//! ones are 400s naming the field, forced tool choices come back as
//! `tool_calls` (streaming and not), and `auto` goes through the server's
//! tool parser.

mod common;

use common::{Options, TestServer};
use serde_json::{json, Value};
use sluice_server::tools::ToolParserKind;

async fn server(text: Option<&str>, parser: Option<ToolParserKind>) -> TestServer {
    TestServer::start_with(Options {
        text: text.map(str::to_string),
        configure: Box::new(move |c| c.auto_tool_parser = parser),
        ..Options::default()
    })
    .await
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    s.post(path, &body).await
}

async fn post_stream(s: &TestServer, path: &str, body: Value) -> Vec<Value> {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.base()))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("a JSON chunk"))
        .collect()
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
         "parameters": {"type": "object", "required": ["city"],
                        "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time",
         "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
    ])
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_hold_on_both_endpoints() {
    // The model would write the pangram; the grammar decides.
    let s = server(None, None).await;
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 32, "structured_outputs": {"choice": ["The quick", "no"]}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "The quick");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "max_tokens": 32, "guided_regex": "The (quick|slow)"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "The quick");
    s.shutdown().await;

    let s = server(Some(r#"{"answer": "yes", "n": 3}"#), None).await;
    let schema = json!({"type": "object", "required": ["answer", "n"],
        "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}}});
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": user("Hi"), "max_tokens": 64,
               "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let content: Value =
        serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"answer": "yes", "n": 3}));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_and_tool_fields_are_400s_naming_the_field() {
    let s = server(None, None).await;
    let cases = [
        (
            json!({"messages": user("Hi"), "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "strin"}}}}),
            "response_format",
        ),
        (
            json!({"messages": user("Hi"), "structured_outputs": {"regex": "(unclosed"}}),
            "structured_outputs.regex",
        ),
        (
            json!({"messages": user("Hi"), "structured_outputs": {"grammar": "start: nothing_defined"}}),
            "structured_outputs.grammar",
        ),
        (
            json!({"messages": user("Hi"), "structured_outputs": {"regex": "a", "choice": ["b"]}}),
            "structured_outputs",
        ),
        (
            json!({"messages": user("Hi"), "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": user("Hi"), "tools": weather_tools(),
            "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            json!({"messages": user("Hi"), "tools": weather_tools()}),
            "tool_choice",
        ),
        (json!({"messages": user("Hi"), "tools": []}), "tools"),
    ];
    for (body, field) in cases {
        let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{body}: {v}");
    }
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "guided_json": {"type": "strin"}}),
    )
    .await;
    assert_eq!(
        (st, &v["error"]["param"]),
        (400, &json!("guided_json")),
        "{v}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_tool_choices_return_tool_calls() {
    let s = server(
        Some(r#"[{"name": "get_weather", "parameters": {"city": "Paris"}}]"#),
        None,
    )
    .await;
    let body =
        json!({"messages": user("Weather?"), "tools": weather_tools(), "tool_choice": "required"});
    let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "");
    let call = &choice["message"]["tool_calls"][0];
    assert!(
        call["id"].as_str().unwrap().starts_with("chatcmpl-tool-"),
        "{call}"
    );
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));

    // Streaming: the deltas add up to the same call.
    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let chunks = post_stream(&s, "/v1/chat/completions", stream_body).await;
    let (mut name, mut arguments, mut finish) = (String::new(), String::new(), Value::Null);
    for c in &chunks {
        for d in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(d["index"], 0);
            name.push_str(d["function"]["name"].as_str().unwrap_or(""));
            arguments.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
        if !c["choices"][0]["finish_reason"].is_null() {
            finish = c["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!(name, "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(finish, "tool_calls");
    s.shutdown().await;

    // A named function: the whole output is its arguments; finish "stop".
    let s = server(Some(r#"{"city": "Oslo"}"#), None).await;
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": user("Weather?"), "tools": weather_tools(),
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], r#"{"city": "Oslo"}"#);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tool_choice_goes_through_the_parser() {
    let text = r#"Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>"#;
    let s = server(Some(text), Some(ToolParserKind::Hermes)).await;
    let body = json!({"messages": user("Weather?"), "tools": weather_tools()});
    let (st, v) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "Let me look.", "{v}");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(
        m["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"city": "Rome"}));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let chunks = post_stream(&s, "/v1/chat/completions", stream_body).await;
    let (mut content, mut arguments) = (String::new(), String::new());
    for c in &chunks {
        let d = &c["choices"][0]["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            arguments.push_str(t["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(content, "Let me look.");
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"city": "Rome"})
    );

    // tool_choice "none": the text as it is, no calls.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": user("Weather?"), "tools": weather_tools(), "tool_choice": "none"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], text);
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    s.shutdown().await;
}
