//! The official `openai` Python package as the client: completions, chat,
//! streaming, usage, errors (tests/openai_client.py).
//!
//! Needs a Python with `openai` installed: `$SLUICE_PYTHON`, else the
//! workspace's `.venv/bin/python` (`.ci/test` creates it).

mod common;

use common::TestServer;
use std::path::PathBuf;
use std::time::Duration;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with the openai package: run `.ci/test` (it creates .venv with `pip install openai`) \
         or set SLUICE_PYTHON"
    );
    venv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    let python = python();
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
