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
