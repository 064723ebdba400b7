//! Reasoning parsers over HTTP, on the scripted engine (the model writes a
//! fixed text byte by byte, then EOS): the thinking comes back in
//! `message.reasoning` (streamed in `delta.reasoning`), the answer in
//! `content`; thinking that never ends is all reasoning; a tool call after
//! the thinking is parsed from the answer; a constraint holds for the
//! answer only; `include_reasoning: false` drops the thinking.

mod common;

use common::{Options, TestServer};
use serde_json::{json, Value};
use sluice_server::reasoning::ReasoningParserKind;
use sluice_server::tools::ToolParserKind;

async fn server(text: &str, parser: ReasoningParserKind, tools: bool) -> TestServer {
    TestServer::start_with(Options {
        text: Some(text.to_string()),
        configure: Box::new(move |c| {
            c.reasoning_parser = Some(parser);
            if tools {
                c.auto_tool_parser = Some(ToolParserKind::Hermes);
            }
        }),
        ..Options::default()
    })
    .await
}

async fn post(s: &TestServer, body: Value) -> (u16, Value) {
    s.post("/v1/chat/completions", &body).await
}

/// The streamed deltas' reasoning and content, each joined (`None` when no
/// delta carried one), and the finish reason.
async fn stream(s: &TestServer, mut body: Value) -> (Option<String>, Option<String>, Value) {
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", s.base()))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    let (mut reasoning, mut content, mut finish) = (None::<String>, None::<String>, Value::Null);
    for d in text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
    {
        let v: Value = serde_json::from_str(d).expect("a JSON chunk");
        let c = &v["choices"][0];
        if let Some(r) = c["delta"]["reasoning"].as_str() {
            reasoning.get_or_insert_with(String::new).push_str(r);
        }
        if let Some(t) = c["delta"]["content"].as_str() {
            content.get_or_insert_with(String::new).push_str(t);
        }
        if !c["finish_reason"].is_null() {
            finish = c["finish_reason"].clone();
        }
    }
    (reasoning, content, finish)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_and_answer_come_apart_whole_and_streamed() {
    for parser in [ReasoningParserKind::Qwen3, ReasoningParserKind::DeepseekR1] {
        let s = server("<think>The user greets me.</think>Hello!", parser, false).await;
        let (st, v) = post(&s, chat(json!({}))).await;
        assert_eq!(st, 200, "{v}");
        let m = &v["choices"][0]["message"];
        assert_eq!(m["reasoning"], "The user greets me.", "{parser:?} {v}");
        assert_eq!(m["content"], "Hello!");
        let (r, c, finish) = stream(&s, chat(json!({}))).await;
        assert_eq!(r.as_deref(), Some("The user greets me."), "{parser:?}");
        assert_eq!(c.as_deref(), Some("Hello!"));
        assert_eq!(finish, "stop");
        // include_reasoning: false drops the thinking, the answer stays.
        let (_, v) = post(&s, chat(json!({"include_reasoning": false}))).await;
        let m = &v["choices"][0]["message"];
        assert!(m.get("reasoning").is_none(), "{v}");
        assert_eq!(m["content"], "Hello!");
        let (r, c, _) = stream(&s, chat(json!({"include_reasoning": false}))).await;
        assert_eq!((r, c.as_deref()), (None, Some("Hello!")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_that_never_ends_is_all_reasoning() {
    let s = server(
        "<think>Let me think about this",
        ReasoningParserKind::Qwen3,
        false,
    )
    .await;
    let (_, v) = post(&s, chat(json!({}))).await;
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning"], "Let me think about this", "{v}");
    assert!(m["content"].is_null(), "{v}");
    let (r, c, _) = stream(&s, chat(json!({}))).await;
    assert_eq!(r.as_deref(), Some("Let me think about this"));
    // The role chunk's "" only: no answer text.
    assert_eq!(c.as_deref(), Some(""));
    // Cut by max_tokens inside the thinking: the same, finish "length".
    let (_, v) = post(&s, chat(json!({"max_tokens": 12}))).await;
    assert_eq!(v["choices"][0]["message"]["reasoning"], "<think>Let m"[7..]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Thinking off (Qwen3's enable_thinking): all of it is the answer, a
    // stray `</think>` dropped as vLLM's qwen3 parser drops it.
    let s = server("Plain answer</think>.", ReasoningParserKind::Qwen3, false).await;
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let (_, v) = post(&s, chat(off.clone())).await;
    let m = &v["choices"][0]["message"];
    assert!(m.get("reasoning").is_none(), "{v}");
    assert_eq!(m["content"], "Plain answer.");
    let (r, c, _) = stream(&s, chat(off)).await;
    assert_eq!((r, c.as_deref()), (None, Some("Plain answer.")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_after_thinking_is_parsed_from_the_answer() {
    let text = "<think>I need the weather.</think>\n<tool_call>\n{\"name\": \"get_weather\", \
                \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let s = server(text, ReasoningParserKind::Qwen3, true).await;
    let (st, v) = post(&s, chat(json!({"tools": tools, "max_tokens": 200}))).await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["reasoning"], "I need the weather.", "{v}");
    assert_eq!(c["finish_reason"], "tool_calls");
    let call = &c["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    // Streamed: the thinking as reasoning, the call as tool-call deltas.
    let (r, _, finish) = stream(&s, chat(json!({"tools": tools, "max_tokens": 200}))).await;
    assert_eq!(r.as_deref(), Some("I need the weather."));
    assert_eq!(finish, "tool_calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constraint_holds_for_the_answer_not_the_thinking() {
    // The thinking is free text no grammar would allow; the answer is held
    // to the choice, and the model's own "no" fits it.
    let s = server(
        "<think>Hmm, {not json</think>no",
        ReasoningParserKind::DeepseekR1,
        false,
    )
    .await;
    let body = chat(json!({"structured_outputs": {"choice": ["yes", "no"]}}));
    let (st, v) = post(&s, body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning"], "Hmm, {not json", "{v}");
    assert_eq!(m["content"], "no");
    // The model would rather say "maybe": the grammar, gated until the
    // thinking ends, makes the answer one of the choices.
    let s = server(
        "<think>ok</think>maybe",
        ReasoningParserKind::DeepseekR1,
        false,
    )
    .await;
    let (_, v) = post(&s, body).await;
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning"], "ok", "{v}");
    assert!(m["content"] == "yes" || m["content"] == "no", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reasoning_fields_are_400s_naming_them() {
    let s = server("x", ReasoningParserKind::Qwen3, false).await;
    for (body, param) in [
        (json!({"include_reasoning": "yes"}), "include_reasoning"),
        (json!({"chat_template_kwargs": [1]}), "chat_template_kwargs"),
    ] {
        let (st, v) = post(&s, chat(body)).await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}
