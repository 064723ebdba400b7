//! `sluice serve` as a user runs it: the built-in model on a free port, a
//! completion over HTTP, then SIGTERM and a clean exit (status 0).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn serve_answers_and_exits_cleanly_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--kv-cache-memory",
            "16MiB",
            "--threads",
            "1",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    // "sluice: serving "tiny" on http://127.0.0.1:PORT (...)"
    let mut url = None;
    let mut log = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("a log line");
        log.push(line.clone());
        if let Some(rest) = line.split("on http://").nth(1) {
            url = rest
                .split_whitespace()
                .next()
                .map(|a| format!("http://{a}"));
            break;
        }
    }
    let url = url.unwrap_or_else(|| panic!("no listening line in {log:?}"));
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

    let pid = child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = child.wait().expect("sluice exits");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.success(), "exit status {status:?}, log {rest:?}");
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}

/// Starts `sluice serve` with `extra` flags and `env`; returns the child,
/// its URL and the stderr lines read so far (the rest stay in `lines`).
/// A `sluice serve` child that is killed if the test fails before it ends.
struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn spawn_serve(
    extra: &[&str],
    env: &[(&str, &str)],
) -> (
    Serve,
    String,
    Vec<String>,
    std::io::Lines<BufReader<std::process::ChildStderr>>,
) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args([
        "serve",
        "--port",
        "0",
        "--kv-cache-memory",
        "16MiB",
        "--threads",
        "1",
    ])
    .args(extra)
    .env_remove("VLLM_API_KEY")
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = Serve(cmd.spawn().expect("sluice serve starts"));
    let mut lines = BufReader::new(child.0.stderr.take().expect("stderr")).lines();
    let mut log = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("a log line");
        log.push(line.clone());
        if let Some(rest) = line.split("on http://").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            let port = addr.rsplit(':').next().unwrap_or_default();
            return (child, format!("http://127.0.0.1:{port}"), log, lines);
        }
    }
    panic!("no listening line in {log:?}");
}

fn terminate_and_wait(serve: &mut Serve) -> std::process::ExitStatus {
    let child = &mut serve.0;
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs")
        .success());
    // A hang detector, far above grace + 2 s: the old server ran > 90 s.
    for _ in 0..600 {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("sluice serve did not exit within 60 s of SIGTERM");
}

#[test]
fn sigterm_exits_with_stalled_clients_connected() {
    use std::io::{Read, Write};
    let (mut child, url, _log, _lines) =
        spawn_serve(&["--host", "127.0.0.1", "--shutdown-grace-secs", "1"], &[]);
    let addr = url.trim_start_matches("http://").to_string();
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
    let status = terminate_and_wait(&mut child);
    assert!(status.success(), "exit status {status:?}");
    drop((half_headers, half_body, idle, unread));
}

#[test]
fn api_key_from_vllm_api_key_and_the_exposure_warning() {
    let (mut child, url, log, _lines) =
        spawn_serve(&["--host", "0.0.0.0"], &[("VLLM_API_KEY", "sekret")]);
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
    assert!(terminate_and_wait(&mut child).success());

    let (mut open, _url, log, _lines) = spawn_serve(&["--host", "0.0.0.0"], &[]);
    assert!(
        log.iter().any(|l| l.contains("without an API key")),
        "{log:?}"
    );
    assert!(terminate_and_wait(&mut open).success());
}
