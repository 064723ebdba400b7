//! The render endpoints (`/v1/completions/render`,
//! `/v1/chat/completions/render`) answer with the ids the generation
//! endpoints run (checked against the prompts the engine really got) and
//! refuse, with the same 400, what generation refuses; and the dev
//! endpoint `POST /reset_prefix_cache`.

mod common;

use common::{Options, TestServer};
use serde_json::{json, Value};
use std::time::Duration;

async fn post(s: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    s.post(path, body).await
}

fn ids(v: &Value) -> Vec<u32> {
    v["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Runs `body` on the generation endpoint and returns the prompts the
/// engine got for it (sorted: several prompts run concurrently).
async fn generated_prompts(s: &TestServer, path: &str, body: &Value) -> Vec<Vec<u32>> {
    s.prompts.lock().unwrap().clear();
    let (status, v) = post(s, path, body).await;
    assert_eq!(status, 200, "{v}");
    let mut got = s.prompts.lock().unwrap().clone();
    got.sort();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_render_shows_the_ids_generation_runs() {
    let s = TestServer::start_with(Options::default()).await;
    for body in [
        json!({"prompt": "Hello, world", "max_tokens": 3}),
        json!({"prompt": ["one", "two prompts"], "max_tokens": 2, "temperature": 0.5}),
        json!({"prompt": [1, 2, 3, 200], "max_tokens": 1}),
        json!({"prompt": [[5, 6], [7]], "max_tokens": 1, "n": 2}),
    ] {
        let (status, rendered) = post(&s, "/v1/completions/render", &body).await;
        assert_eq!(status, 200, "{rendered}");
        let list = rendered.as_array().expect("a list, one per prompt");
        let mut rendered_ids: Vec<Vec<u32>> = list.iter().map(ids).collect();
        rendered_ids.sort();
        let mut generated = generated_prompts(&s, "/v1/completions", &body).await;
        // n > 1 runs the prompt once per completion only if prefill is
        // shared; compare the distinct prompts.
        generated.dedup();
        assert_eq!(rendered_ids, generated, "{body}");

        // GenerateRequest's shape.
        for (i, r) in list.iter().enumerate() {
            let id = r["request_id"].as_str().unwrap();
            assert!(id.starts_with("cmpl-"), "{id}");
            if list.len() > 1 {
                assert!(id.ends_with(&format!("-{i}")), "{id}");
            }
            for key in [
                "features",
                "sampling_params",
                "model",
                "stream",
                "cache_salt",
                "priority",
                "kv_transfer_params",
            ] {
                assert!(r.get(key).is_some(), "{key} missing in {r}");
            }
            assert_eq!(r["output_mode"], "tokens");
            assert_eq!(r["sampling_params"]["max_tokens"], body["max_tokens"]);
            assert_eq!(
                r["sampling_params"]["n"],
                body.get("n").unwrap_or(&json!(1)).clone()
            );
        }
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_render_shows_the_templated_ids_generation_runs() {
    let s = TestServer::start_with(Options::default()).await;
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
    }}]);
    for body in [
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
        json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
        ], "max_completion_tokens": 2, "add_generation_prompt": true}),
        json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ], "tools": tools, "tool_choice": "none", "max_tokens": 2}),
    ] {
        let (status, rendered) = post(&s, "/v1/chat/completions/render", &body).await;
        assert_eq!(status, 200, "{rendered}");
        assert!(rendered["request_id"]
            .as_str()
            .unwrap()
            .starts_with("chatcmpl-"));
        let generated = generated_prompts(&s, "/v1/chat/completions", &body).await;
        assert_eq!(vec![ids(&rendered)], generated, "{body}");
        let ctx = &rendered["parse_context"];
        assert!(ctx.is_object(), "{rendered}");
        if body.get("tools").is_some() {
            assert_eq!(ctx["tools"], tools);
            assert_eq!(ctx["history_tool_call_cnt"], 1);
        }
    }
    // The prompt is what the template made, not the raw text: the
    // template's markers are in it.
    let (_, r) = post(
        &s,
        "/v1/chat/completions/render",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert!(ids(&r).len() > 2, "{r}");
    s.shutdown().await;
}

/// Bodies generation refuses: render refuses each with the same status
/// and the same error object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_refuses_what_generation_refuses_with_the_same_error() {
    let s = TestServer::start_with(Options::default()).await;
    let long = "x".repeat(300);
    let completions = [
        json!({"max_tokens": 1}),
        json!({"prompt": "hi", "model": "other"}),
        json!({"prompt": "hi", "max_tokens": 0}),
        json!({"prompt": "hi", "max_tokens": "ten"}),
        json!({"prompt": "hi", "temperature": -1}),
        json!({"prompt": long, "max_tokens": 1}),
        json!({"prompt": [1, 99999], "max_tokens": 1}),
        json!({"prompt": [], "max_tokens": 1}),
        json!({"prompt": "hi", "n": 1000}),
        json!({"prompt": "hi", "suffix": "!"}),
        json!({"prompt": "hi", "echo": true, "logprobs": 1}),
        json!({"prompt": "hi", "stop_token_ids": [99999]}),
        json!({"prompt": "hi", "structured_outputs": {"regex": "("}}),
    ];
    let chats = [
        json!({"max_tokens": 1}),
        json!({"messages": []}),
        json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        json!({"messages": [{"role": "user", "content": long}], "max_tokens": 1}),
        json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}),
        json!({"messages": [{"role": "user", "content": "hi"}], "model": "other"}),
        json!({"messages": [{"role": "user", "content": "hi"}],
               "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}),
    ];
    for (path, bodies) in [
        ("/v1/completions", &completions[..]),
        ("/v1/chat/completions", &chats[..]),
    ] {
        for body in bodies {
            let (gen_status, gen_error) = post(&s, path, body).await;
            assert!(
                (400..500).contains(&gen_status),
                "{path} {body}: {gen_status} {gen_error}"
            );
            let (status, error) = post(&s, &format!("{path}/render"), body).await;
            assert_eq!(status, gen_status, "{path}/render {body}: {error}");
            assert_eq!(error, gen_error, "{path}/render {body}");
        }
    }
    s.shutdown().await;
}

// ---------------------------------------------------------------------
// POST /reset_prefix_cache

/// 64 bytes: four full blocks, so a repeat is served from the cache.
const PROMPT: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

async fn cached_tokens(s: &TestServer) -> u64 {
    let (status, v) = post(
        s,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

async fn dev_server(step_delay: Duration) -> TestServer {
    TestServer::start_with(Options {
        step_delay,
        configure: Box::new(|c| c.dev_endpoints = true),
        ..Options::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prefix_cache_is_a_dev_endpoint() {
    let s = TestServer::start_with(Options::default()).await;
    let (status, v) = post(&s, "/reset_prefix_cache", &json!({})).await;
    assert_eq!(status, 404, "not mounted without dev endpoints: {v}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prefix_cache_empties_the_cache() {
    let s = dev_server(Duration::ZERO).await;
    assert_eq!(cached_tokens(&s).await, 0);
    assert!(cached_tokens(&s).await > 0, "the repeat hits the cache");
    let (status, v) = post(&s, "/reset_prefix_cache", &Value::Null).await;
    assert_eq!((status, v), (200, json!({"success": true})));
    assert_eq!(cached_tokens(&s).await, 0, "nothing cached after the reset");
    // vLLM's query parameters; a non-boolean is a 400 naming it.
    let (status, v) = post(&s, "/reset_prefix_cache?reset_external=true", &Value::Null).await;
    assert_eq!((status, v), (200, json!({"success": true})));
    let (status, v) = post(
        &s,
        "/reset_prefix_cache?reset_running_requests=maybe",
        &Value::Null,
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "reset_running_requests", "{v}");
    let r = reqwest::get(format!("{}/reset_prefix_cache", s.base()))
        .await
        .unwrap();
    assert_eq!(r.status(), 405, "POST only");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_prefix_cache_with_running_requests() {
    let s = dev_server(Duration::from_millis(20)).await;
    let client = reqwest::Client::new();
    let running = client
        .post(format!("{}/v1/completions", s.base()))
        .json(&json!({"prompt": PROMPT, "max_tokens": 40}))
        .send();
    let running = tokio::spawn(running);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.engine.stats().num_running_reqs == 0 {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its blocks are held: vLLM's `success: false`, retry later.
    let (status, v) = post(&s, "/reset_prefix_cache", &Value::Null).await;
    assert_eq!((status, v), (200, json!({"success": false})));
    let (status, v) = post(
        &s,
        "/reset_prefix_cache?reset_running_requests=true",
        &Value::Null,
    )
    .await;
    assert_eq!((status, v), (200, json!({"success": true})));
    // The preempted request resumes and completes in full.
    let v: Value = running.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap().len(), 40);
    s.shutdown().await;
}
