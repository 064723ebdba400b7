//! The official `openai` Python package as the client: completions, chat,
//! streaming, usage, errors (tests/openai_client.py).
//!
//! Needs a Python with `openai` installed: `$SLUICE_PYTHON`, else the
//! workspace's `.venv/bin/python` (`.ci/test` creates it).

mod common;

use common::{python, TestServer};
use std::path::PathBuf;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    let python = python("openai");
    let server = TestServer::start("sluice-test", None, Duration::ZERO).await;
    let addr = server.addr;
    let script_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script_path)
        .arg(format!("http://{addr}/v1"))
        .arg("sluice-test")
        .output()
        .await
        .expect("python runs");
    server.shutdown().await;
    assert!(
        out.status.success(),
        "openai client checks failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
