//! `sluice serve --kv-events-config`: a bad config exits 2 naming the
//! field before the model loads; a good one starts vLLM's ZMQ publisher.

mod common;

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
