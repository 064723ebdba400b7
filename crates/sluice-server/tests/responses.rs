//! OpenAI's Responses API over HTTP, on the scripted engine (the model
//! writes a fixed text byte by byte, one token per byte): output items,
//! status and usage; the store, `GET`, `DELETE` and `previous_response_id`
//! conversations; the typed stream events in order; reasoning and function
//! calls with their follow-up; background responses and cancelling them;
//! refusals naming the field. Then the official `openai` client and the
//! OpenAI Agents SDK against it (tests/openai_responses.py).

mod common;

use common::{Options, Reply, TestServer, TEXT};
use serde_json::{json, Value};
use sluice_server::reasoning::ReasoningParserKind;
use sluice_server::tools::ToolParserKind;
use std::sync::Arc;
use std::time::Duration;

const THINK: &str = "<think>The user wants the weather.</think>";
const CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

async fn server(opts: Options) -> TestServer {
    TestServer::start_with(Options {
        model_name: "sluice-test".into(),
        ..opts
    })
    .await
}

fn tools_server(text: String) -> Options {
    Options {
        text: Some(text),
        configure: Box::new(|c| {
            c.reasoning_parser = Some(ReasoningParserKind::Qwen3);
            c.auto_tool_parser = Some(ToolParserKind::Hermes);
        }),
        ..Options::default()
    }
}

async fn send(
    method: reqwest::Method,
    s: &TestServer,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    s.request(method, path, body.as_ref()).await
}

async fn create(s: &TestServer, body: Value) -> (u16, Value) {
    send(reqwest::Method::POST, s, "/v1/responses", Some(body)).await
}

async fn get(s: &TestServer, id: &str) -> (u16, Value) {
    send(
        reqwest::Method::GET,
        s,
        &format!("/v1/responses/{id}"),
        None,
    )
    .await
}

/// The text of the message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().clone())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

fn last_prompt(s: &TestServer) -> String {
    let prompts = s.prompts.lock().unwrap();
    let bytes: Vec<u8> = prompts
        .last()
        .unwrap()
        .iter()
        .filter(|&&t| t < 256)
        .map(|&t| t as u8)
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// The stream's events (name, data), checking that each data's `type` is
/// its event's name and that `sequence_number` counts from 0.
async fn stream_events(s: &TestServer, mut body: Value) -> Vec<(String, Value)> {
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/responses", s.base()))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    parse_events(&r.text().await.unwrap())
}

fn parse_events(text: &str) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(d).expect("JSON data");
            let n = name.take().expect("an event line before each data line");
            assert_eq!(v["type"], n.as_str());
            assert_eq!(v["sequence_number"], out.len(), "sequence numbers count up");
            out.push((n, v));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_has_its_message_status_and_usage() {
    let s = server(Options::default()).await;
    let (st, r) = create(
        &s,
        json!({"model": "sluice-test", "input": "Hi", "max_output_tokens": 9}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    let items = r["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{r}");
    assert_eq!(items[0]["type"], "message");
    assert_eq!(items[0]["role"], "assistant");
    assert_eq!(items[0]["status"], "completed");
    assert_eq!(items[0]["content"][0]["type"], "output_text");
    assert_eq!(output_text(&r), &TEXT[..9]);
    let u = &r["usage"];
    assert_eq!(u["output_tokens"], 9);
    let prompt = s.prompts.lock().unwrap()[0].len() as u64;
    assert_eq!(u["input_tokens"].as_u64(), Some(prompt));
    assert_eq!(u["total_tokens"].as_u64(), Some(prompt + 9));
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(r["max_output_tokens"], 9);
    assert_eq!(r["store"], true);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_carry_their_conversation_to_follow_ups() {
    let s = server(Options {
        text: Some("Done.".into()),
        ..Options::default()
    })
    .await;
    let (_, r1) = create(
        &s,
        json!({"input": "First question", "instructions": "Be kind."}),
    )
    .await;
    assert_eq!(r1["status"], "completed", "{r1}");
    let id1 = r1["id"].as_str().unwrap().to_string();
    let (st, got) = get(&s, &id1).await;
    assert_eq!(st, 200);
    assert_eq!(got, r1, "GET returns the response as it was answered");

    let (_, r2) = create(
        &s,
        json!({"input": "Second question", "previous_response_id": id1}),
    )
    .await;
    assert_eq!(r2["previous_response_id"], id1.as_str());
    let p = last_prompt(&s);
    let (q1, a1, q2) = (
        p.find("First question"),
        p.find("Done."),
        p.find("Second question"),
    );
    assert!(
        q1 < a1 && a1 < q2 && q1.is_some(),
        "the conversation in order: {p}"
    );
    assert!(
        !p.contains("Be kind."),
        "instructions are not carried over: {p}"
    );

    // A chain of two: the first exchange is still there.
    let id2 = r2["id"].as_str().unwrap();
    let (_, _) = create(&s, json!({"input": "Third", "previous_response_id": id2})).await;
    let p = last_prompt(&s);
    assert!(
        p.contains("First question") && p.contains("Second question") && p.contains("Third"),
        "{p}"
    );

    // Missing ids name the field; store: false keeps nothing.
    let (st, e) = create(
        &s,
        json!({"input": "x", "previous_response_id": "resp_nope"}),
    )
    .await;
    assert_eq!(st, 404, "{e}");
    assert_eq!(e["error"]["param"], "previous_response_id");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resp_nope"));
    let (_, r) = create(&s, json!({"input": "x", "store": false})).await;
    assert_eq!(r["store"], false);
    let (st, _) = get(&s, r["id"].as_str().unwrap()).await;
    assert_eq!(st, 404);

    // DELETE forgets it.
    let (st, d) = send(
        reqwest::Method::DELETE,
        &s,
        &format!("/v1/responses/{id1}"),
        None,
    )
    .await;
    assert_eq!((st, &d["deleted"]), (200, &json!(true)), "{d}");
    let (st, e) = get(&s, &id1).await;
    assert_eq!(st, 404);
    assert_eq!(e["error"]["param"], "response_id");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_events_come_in_order_and_end_with_the_response() {
    let s = server(Options::default()).await;
    let body = json!({"input": "Hi", "max_output_tokens": 6});
    let ev = stream_events(&s, body.clone()).await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(["response.output_text.delta"; 6]);
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, want);
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, &TEXT[..6]);
    let added = &ev[2].1["item"];
    let done = &ev[ev.len() - 2].1["item"];
    assert_eq!(added["id"], done["id"], "one item, one id");
    assert_eq!(added["status"], "in_progress");
    assert_eq!(done["status"], "completed");
    let final_r = &ev.last().unwrap().1["response"];
    assert_eq!(final_r["status"], "incomplete");
    assert_eq!(final_r["output"], json!([done]));
    assert_eq!(ev[0].1["response"]["id"], final_r["id"]);
    // The same as the awaited response, and stored the same.
    let (_, r) = create(&s, body).await;
    assert_eq!(output_text(&r), output_text(final_r));
    let (_, got) = get(&s, final_r["id"].as_str().unwrap()).await;
    assert_eq!(&got, final_r);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_then_a_call_are_two_items_and_the_output_is_followed_up() {
    let s = server(tools_server(format!("{THINK}{CALL}"))).await;
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = json!({"input": "Weather in Paris?", "tools": tools, "max_output_tokens": 200});
    for streamed in [false, true] {
        let r = if streamed {
            let ev = stream_events(&s, body.clone()).await;
            let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
            assert!(
                names.contains(&"response.reasoning_text.delta"),
                "{names:?}"
            );
            assert!(
                names.contains(&"response.function_call_arguments.delta"),
                "{names:?}"
            );
            assert!(
                names.contains(&"response.function_call_arguments.done"),
                "{names:?}"
            );
            ev.last().unwrap().1["response"].clone()
        } else {
            create(&s, body.clone()).await.1
        };
        let items = r["output"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{r}");
        assert_eq!(items[0]["type"], "reasoning");
        assert_eq!(
            items[0]["content"][0]["text"],
            "The user wants the weather."
        );
        assert_eq!(items[1]["type"], "function_call");
        assert_eq!(items[1]["name"], "get_weather");
        let args: Value = serde_json::from_str(items[1]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert!(!items[1]["call_id"].as_str().unwrap().is_empty());
        assert_eq!(r["status"], "completed");
        // One token per byte: every token up to the end of `</think>`.
        assert_eq!(
            r["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64(),
            Some(THINK.len() as u64),
            "streamed: {streamed}"
        );
        // ... and the EOS token after the call.
        assert_eq!(
            r["usage"]["output_tokens"].as_u64(),
            Some((THINK.len() + CALL.len() + 1) as u64)
        );

        // The follow-up with the call's output, by id and by items.
        let call_id = items[1]["call_id"].as_str().unwrap();
        let output =
            json!({"type": "function_call_output", "call_id": call_id, "output": "21 C, sunny"});
        let (st, _) = create(
            &s,
            json!({"previous_response_id": r["id"], "input": [output.clone()], "tools": tools}),
        )
        .await;
        assert_eq!(st, 200);
        let p = last_prompt(&s);
        assert!(
            p.contains("Weather in Paris?") && p.contains("21 C, sunny"),
            "{p}"
        );
        let mut input = vec![json!({"role": "user", "content": "Weather in Paris?"})];
        input.extend(items.iter().cloned());
        input.push(output);
        let (st, e) = create(&s, json!({"input": input, "tools": tools})).await;
        assert_eq!(st, 200, "{e}");
        assert!(last_prompt(&s).contains("21 C, sunny"));
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_and_streamed_responses_can_be_cancelled() {
    let s = server(Options {
        step_delay: Duration::from_millis(10),
        ..Options::default()
    })
    .await;
    let (st, r) = create(
        &s,
        json!({"input": "Hi", "background": true, "max_output_tokens": 200}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["status"], "in_progress");
    assert_eq!(r["background"], true);
    let id = r["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, now) = get(&s, &id).await;
    assert_eq!(now["status"], "in_progress");
    let (st, c) = send(
        reqwest::Method::POST,
        &s,
        &format!("/v1/responses/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["status"], "cancelled");
    let made = c["usage"]["output_tokens"].as_u64().unwrap();
    assert!(made > 0 && made < 200, "stopped part-way: {made}");
    let (_, got) = get(&s, &id).await;
    assert_eq!(got["status"], "cancelled");
    let (st, e) = send(
        reqwest::Method::POST,
        &s,
        &format!("/v1/responses/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(st, 400, "{e}");
    let (st, _) = send(
        reqwest::Method::POST,
        &s,
        "/v1/responses/resp_nope/cancel",
        None,
    )
    .await;
    assert_eq!(st, 404);

    // A background response that runs to its end is there to GET.
    let (_, r) = create(
        &s,
        json!({"input": "Hi", "background": true, "max_output_tokens": 3}),
    )
    .await;
    let id = r["id"].as_str().unwrap().to_string();
    let mut done = Value::Null;
    for _ in 0..200 {
        let (_, g) = get(&s, &id).await;
        if g["status"] != "in_progress" {
            done = g;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(done["status"], "incomplete", "{done}");
    assert_eq!(output_text(&done), &TEXT[..3]);

    // A stream, cancelled after its first delta, ends with its response.
    let mut resp = reqwest::Client::new()
        .post(format!("{}/v1/responses", s.base()))
        .json(&json!({"input": "Hi", "stream": true, "max_output_tokens": 200}))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    let mut cancelled = false;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if !cancelled && text.contains("response.output_text.delta") {
            let id = parse_events(
                text.split("\n\n")
                    .next()
                    .map(|f| format!("{f}\n\n"))
                    .as_deref()
                    .unwrap(),
            )[0]
            .1["response"]["id"]
                .as_str()
                .unwrap()
                .to_string();
            let (st, _) = send(
                reqwest::Method::POST,
                &s,
                &format!("/v1/responses/{id}/cancel"),
                None,
            )
            .await;
            assert_eq!(st, 200);
            cancelled = true;
        }
    }
    let ev = parse_events(&text);
    let last = &ev.last().unwrap().1;
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["status"], "cancelled");
    assert!(last["response"]["usage"]["output_tokens"].as_u64().unwrap() < 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_their_field() {
    let s = server(Options::default()).await;
    let cases = [
        (json!({}), "input"),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "temperature": "hot"}), "temperature"),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
            "text.format.schema",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}}),
            "text.format",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "auto"}),
            "tool_choice",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": "x", "background": true, "store": false}),
            "background",
        ),
        (json!({"input": "x", "store": "yes"}), "store"),
        (json!({"input": "x", "model": "other"}), "model"),
    ];
    for (body, field) in cases {
        let (st, e) = create(&s, body.clone()).await;
        assert!(st == 400 || st == 404, "{body}: {st} {e}");
        assert_eq!(e["error"]["param"], field, "{body}: {e}");
    }
    let (st, _) = get(&s, "resp_missing").await;
    assert_eq!(st, 404);
    s.shutdown().await;
}

/// The agent's model (a thinking one): a tool call until the tool's
/// output is in the prompt, then the answer.
fn agent_reply() -> Reply {
    Arc::new(|prompt: &str| {
        if prompt.contains("21 C and sunny") {
            "<think>The tool answered.</think>It is 21 C and sunny in Paris.".to_string()
        } else {
            format!("{THINK}{CALL}")
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_and_agents_sdk() {
    let plain = server(Options::default()).await;
    let tools = server(Options {
        reply: Some(agent_reply()),
        configure: Box::new(|c| {
            c.reasoning_parser = Some(ReasoningParserKind::Qwen3);
            c.auto_tool_parser = Some(ToolParserKind::Hermes);
        }),
        ..Options::default()
    })
    .await;
    let args = [
        format!("{}/v1", plain.base()),
        format!("{}/v1", tools.base()),
        "sluice-test".to_string(),
    ];
    let env = [("OPENAI_AGENTS_DISABLE_TRACING", "1")];
    common::run_python(
        "openai and openai-agents",
        "openai_responses.py",
        &args,
        &env,
    )
    .await;
    plain.shutdown().await;
    tools.shutdown().await;
}
