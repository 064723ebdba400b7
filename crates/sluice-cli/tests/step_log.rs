//! `sluice serve --step-log PATH` on the built-in tiny model: one request,
//! then SIGTERM; the file holds one `StepRecord` line per step, whose token
//! sums are the request's and whose times are positive. A path that cannot
//! be created stops the server before it starts (exit 2, naming the path).

mod common;

use common::spawn_serve;
use sluice_sim::steplog::StepRecord;
use std::time::Duration;

#[test]
fn the_step_log_holds_every_step_of_a_request() {
    let dir = std::env::temp_dir().join(format!("sluice-step-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("steps.jsonl");
    let mut serve = spawn_serve(&["--step-log", path.to_str().unwrap()], &[]);
    serve.drain_log();
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let body: serde_json::Value = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(
                &serde_json::json!({"prompt": "Hello, step log", "max_tokens": 6,
                                      "ignore_eos": true}),
            )
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json")
    });
    assert_eq!(body["usage"]["completion_tokens"], 6, "{body}");
    assert!(serve.terminate_and_wait().success());
    let text = std::fs::read_to_string(&path).unwrap();
    let recs: Vec<StepRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(recs.len(), 6, "one prefill step, five decode steps: {text}");
    assert_eq!(
        recs.iter().map(|r| r.prefill_tokens).sum::<usize>(),
        prompt_tokens
    );
    assert_eq!(recs.iter().map(|r| r.decode_tokens).sum::<usize>(), 5);
    assert_eq!(recs[0].rows, vec![[prompt_tokens, 0, 1]]);
    for (i, r) in recs.iter().enumerate() {
        assert!(r.forward_s > 0.0 && r.step_s >= r.forward_s, "{r:?}");
        if i > 0 {
            assert_eq!(r.rows, vec![[1, prompt_tokens + i - 1, 1]]);
            assert!(r.step > recs[i - 1].step && r.t_s > recs[i - 1].t_s);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_step_log_that_cannot_be_created_exits_2_naming_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--port", "0", "--host", "127.0.0.1"])
        .args(["--step-log", "/nonexistent-sluice-dir/steps.jsonl"])
        .output()
        .expect("sluice runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--step-log") && err.contains("/nonexistent-sluice-dir/steps.jsonl"),
        "{err}"
    );
    assert!(!err.contains("serving"), "{err}");
}
