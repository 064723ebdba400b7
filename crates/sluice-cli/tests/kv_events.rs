//! `sluice serve --kv-events-config`: a bad config exits 2 naming the
//! field before the model loads; a good one starts vLLM's ZMQ publisher,
//! and a subscriber written from vLLM's wire format and hash definition
//! (`kv_events_subscriber.py`: pyzmq + msgpack, in the `.venv` `.ci/test`
//! makes) finds a prompt's blocks under vLLM's hashes, live and replayed.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn serve_with(config: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--port", "0", "--host", "127.0.0.1"])
        .args(["--kv-events-config", config])
        .env_remove("VLLM_API_KEY")
        .output()
        .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_kv_events_configs_exit_2_naming_the_field() {
    for (config, named) in [
        (
            r#"{"enable_kv_cache_event": true}"#,
            "enable_kv_cache_event",
        ),
        (r#"{"buffer_steps": "many"}"#, "buffer_steps"),
        (r#"{"publisher": "kafka"}"#, "publisher"),
        (r#"{"endpoint": "ipc:///tmp/kv"}"#, "endpoint"),
        (r#"{"enable_kv_cache_events": tru"#, "not valid JSON"),
    ] {
        let (code, stderr) = serve_with(config);
        assert_eq!(code, Some(2), "{config}: {stderr}");
        assert!(
            stderr.contains("--kv-events-config") && stderr.contains(named),
            "{config}: {stderr}"
        );
    }
}

#[test]
fn serve_starts_the_publisher() {
    let mut serve = common::spawn_serve(
        &[
            "--kv-events-config",
            r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}"#,
        ],
        &[],
    );
    assert!(
        serve.log.iter().any(
            |l| l.contains("publishing KV cache events on tcp://*:") && l.contains("replay on")
        ),
        "{:?}",
        serve.log
    );
    // One answered request first: the listening line can come before the
    // SIGTERM handler is installed (a SIGTERM then kills the process).
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let health = rt.block_on(async {
        reqwest::Client::new()
            .get(format!("{url}/health"))
            .timeout(std::time::Duration::from_secs(60))
            .send()
            .await
            .expect("request")
            .status()
    });
    assert!(health.is_success(), "{health}");
    let status = serve.terminate_and_wait();
    let rest = serve.rest_of_log();
    assert!(status.success(), "exit status {status:?}, log {rest:?}");
}

/// The Python with pyzmq and msgpack: `$SLUICE_PYTHON`, else `.venv`.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with pyzmq and msgpack: run `.ci/test` (it creates .venv with `pip \
         install pyzmq msgpack`) or set SLUICE_PYTHON"
    );
    venv
}

/// `"... on tcp://*:PORT (replay on tcp://*:PORT)"` -> both endpoints.
fn endpoints(log: &[String]) -> (String, String) {
    let line = log
        .iter()
        .find(|l| l.contains("publishing KV cache events on "))
        .unwrap_or_else(|| panic!("no publisher line in {log:?}"));
    let rest = line.split("publishing KV cache events on ").nth(1).unwrap();
    let publish = rest.split_whitespace().next().unwrap().to_string();
    let replay = rest
        .split("(replay on ")
        .nth(1)
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no replay endpoint in {line:?}"))
        .to_string();
    (publish, replay)
}

#[test]
fn a_subscriber_finds_the_prompts_blocks_with_vllms_hashes() {
    let python = python();
    let mut serve = common::spawn_serve(
        &[
            "--block-size",
            "16",
            "--kv-events-config",
            r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": "kv"}"#,
        ],
        &[],
    );
    let (publish, replay) = endpoints(&serve.log);
    serve.drain_log();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // vLLM's own block hashes, to check the subscriber's hash chain first.
    let hashes = dir.join("../sluice-core/tests/data/vllm-block-hashes.json");
    let out = Command::new(&python)
        .arg(dir.join("tests/kv_events_subscriber.py"))
        .args([&publish, &replay, &serve.url, "kv", "16"])
        .arg(&hashes)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "KV events subscriber failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = serve.terminate_and_wait();
    assert!(status.success(), "exit status {status:?}");
}
