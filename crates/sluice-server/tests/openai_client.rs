//! The official `openai` Python package as the client: completions, chat,
//! streaming, usage, errors (tests/openai_client.py).
//!
//! Needs a Python with `openai` installed: `$SLUICE_PYTHON`, else the
//! workspace's `.venv/bin/python` (`.ci/test` creates it).

mod common;

use common::TestServer;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    let server = TestServer::start("sluice-test", None, Duration::ZERO).await;
    let args = [
        format!("http://{}/v1", server.addr),
        "sluice-test".to_string(),
    ];
    common::run_python("openai", "openai_client.py", &args, &[]).await;
    server.shutdown().await;
}
