//! `sluice serve` as a user runs it: the built-in model on a free port, a
//! completion over HTTP, then SIGTERM and a clean exit (status 0).

mod common;

use common::spawn_serve;
use std::time::Duration;

#[test]
fn serve_answers_and_exits_cleanly_on_sigterm() {
    let mut serve = spawn_serve(&[], &[]);
    let url = serve.url.clone();
    let log = serve.log.clone();
    assert!(
        log.iter().any(|l| l.contains("built-in")),
        "the log says the built-in model runs: {log:?}"
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let body: serde_json::Value = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&serde_json::json!({"prompt": "Hello", "max_tokens": 5}))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json")
    });
    assert_eq!(body["usage"]["completion_tokens"], 5, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");

    let status = serve.terminate_and_wait();
    let rest = serve.rest_of_log();
    assert!(status.success(), "exit status {status:?}, log {rest:?}");
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}

#[test]
fn sigterm_exits_with_stalled_clients_connected() {
    use std::io::{Read, Write};
    let mut serve = spawn_serve(&["--shutdown-grace-secs", "1"], &[]);
    let addr = serve.url.trim_start_matches("http://").to_string();
    let connect = || std::net::TcpStream::connect(&addr).expect("connect");
    // Half-sent headers, a half-sent body, an idle kept-alive connection,
    // and a stream that is never read.
    let mut half_headers = connect();
    half_headers
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut half_body = connect();
    half_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 99\r\n\r\n{\"pro",
        )
        .unwrap();
    let mut idle = connect();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 256];
    let n = idle.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let mut unread = connect();
    let body = r#"{"prompt": "Hi", "max_tokens": 4000, "stream": true, "ignore_eos": true}"#;
    unread
        .write_all(
            format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let status = serve.terminate_and_wait();
    assert!(status.success(), "exit status {status:?}");
    drop((half_headers, half_body, idle, unread));
}

#[test]
fn api_key_from_vllm_api_key_and_the_exposure_warning() {
    let mut serve = spawn_serve(&["--host", "0.0.0.0"], &[("VLLM_API_KEY", "sekret")]);
    let (url, log) = (serve.url.clone(), serve.log.clone());
    // A key is set, so no warning about an open non-loopback address.
    assert!(
        !log.iter().any(|l| l.contains("without an API key")),
        "{log:?}"
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::new();
        let body = serde_json::json!({"prompt": "Hi", "max_tokens": 2});
        let without = client
            .post(format!("{url}/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(without.status(), 401);
        let with = client
            .post(format!("{url}/v1/completions"))
            .bearer_auth("sekret")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(with.status(), 200);
        let health = client.get(format!("{url}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);
    });
    assert!(serve.terminate_and_wait().success());

    let mut open = spawn_serve(&["--host", "0.0.0.0"], &[]);
    assert!(
        open.log.iter().any(|l| l.contains("without an API key")),
        "{:?}",
        open.log
    );
    assert!(open.terminate_and_wait().success());
}

/// A SIGTERM right after the listening line (a supervisor stopping a
/// replica at once) drains and exits 0: the handlers are installed before
/// the line is printed, not when the server first polls them.
#[test]
fn sigterm_right_after_the_listening_line_drains() {
    for _ in 0..5 {
        let mut serve = spawn_serve(&[], &[]);
        assert!(serve.terminate_and_wait().success());
    }
}
