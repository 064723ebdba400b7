//! `sluice serve --enable-log-requests` on the built-in tiny model: one
//! stderr line per request as it arrives, with its id (the response's
//! `id`), its client key (the gateway header, else `user`, else the API
//! key's label), its prompt and max tokens. Without the flag, no such line.

mod common;

use common::spawn_serve;
use serde_json::{json, Value};
use std::time::Duration;

/// `printf 'sk-log-test' | sha256sum`, first 8 hex digits.
const KEY_LABEL: &str = "key:70791e12";

fn post(url: &str, path: &str, headers: &[(&str, &str)], body: Value) -> Value {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut req = reqwest::Client::new()
            .post(format!("{url}{path}"))
            .bearer_auth("sk-log-test")
            .timeout(Duration::from_secs(60))
            .json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.expect("request");
        assert!(resp.status().is_success(), "{}", resp.status());
        resp.json().await.expect("json")
    })
}

/// The log line of the request whose response is `resp`.
fn line_of<'a>(log: &'a [String], resp: &Value) -> &'a str {
    let id = resp["id"].as_str().expect("an id");
    let prefix = format!("sluice: request {id}: ");
    let found: Vec<&String> = log.iter().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(found.len(), 1, "one line for {id} in {log:#?}");
    found[0]
}

#[test]
fn each_request_is_logged_with_its_client_key() {
    let mut serve = spawn_serve(&["--enable-log-requests", "--api-key", "sk-log-test"], &[]);
    let url = serve.url.clone();
    let gateway = post(
        &url,
        "/v1/completions",
        &[("x-gateway-inference-fairness-id", "tenant-a")],
        json!({"prompt": "Hello", "max_tokens": 3, "user": "alice", "temperature": 0}),
    );
    let user = post(
        &url,
        "/v1/chat/completions",
        &[],
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
               "user": "alice"}),
    );
    let key = post(
        &url,
        "/v1/completions",
        &[],
        json!({"prompt": "Hello there", "max_tokens": 5}),
    );
    assert!(serve.terminate_and_wait().success());
    let log = serve.rest_of_log();

    let l = line_of(&log, &gateway);
    let prompt = gateway["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        l.contains(&format!(
            "client_key=\"tenant-a\" prompt_tokens={prompt} max_tokens=3 "
        )),
        "{l}"
    );
    assert!(l.contains("temperature=0 "), "{l}");
    let l = line_of(&log, &user);
    let prompt = user["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        l.contains(&format!(
            "client_key=\"alice\" prompt_tokens={prompt} max_tokens=4 "
        )),
        "{l}"
    );
    let l = line_of(&log, &key);
    assert!(l.contains(&format!("client_key=\"{KEY_LABEL}\" ")), "{l}");
    assert!(log.iter().all(|l| !l.contains("sk-log-test")), "{log:#?}");
}

#[test]
fn without_the_flag_requests_are_not_logged() {
    let mut serve = spawn_serve(&["--api-key", "sk-log-test"], &[]);
    let url = serve.url.clone();
    let resp = post(
        &url,
        "/v1/completions",
        &[],
        json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(resp["usage"]["completion_tokens"], 2, "{resp}");
    assert!(serve.terminate_and_wait().success());
    let log = serve.rest_of_log();
    assert!(
        log.iter().all(|l| !l.starts_with("sluice: request ")),
        "{log:#?}"
    );
}

#[test]
fn a_client_id_header_that_is_no_header_name_exits_2_naming_the_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--port", "0", "--host", "127.0.0.1"])
        .args(["--client-id-header", "x tenant"])
        .output()
        .expect("sluice runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--client-id-header"), "{err}");
    assert!(!err.contains("serving"), "{err}");
}
