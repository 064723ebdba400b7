//! The official `openai` Python package as the client: completions, chat,
//! streaming, usage, errors (tests/openai_client.py).
//!
//! Needs a Python with `openai` installed: `$SLUICE_PYTHON`, else the
//! workspace's `.venv/bin/python` (`.ci/test` creates it).

use sluice_engine::{Engine, EngineConfig, SchedulerConfig, ScriptedExecutor, SeqView, Tokenizer};
use sluice_server::{serve, ServerConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const TEXT: &str = "The quick brown fox jumps over the lazy dog. ";

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
    let script = |s: &SeqView<'_>| vec![u32::from(TEXT.as_bytes()[s.output.len() % TEXT.len()])];
    let tokenizer = Arc::new(Tokenizer::builtin());
    let sched = SchedulerConfig {
        max_model_len: 256,
        max_num_batched_tokens: 512,
        max_num_seqs: 16,
        ..SchedulerConfig::default()
    };
    let cfg = EngineConfig::new(sched).with_model_eos(&tokenizer, &[256]);
    let executor = ScriptedExecutor::new(512, script).with_vocab_size(384);
    let engine = Engine::start(cfg, Box::new(executor), tokenizer).expect("engine starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let config = ServerConfig {
        addr,
        model_name: "sluice-test".into(),
        max_model_len: 256,
        shutdown_grace: Duration::from_secs(5),
    };
    let server = tokio::spawn(serve(engine, config, listener, async {
        let _ = rx.await;
    }));

    let script_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script_path)
        .arg(format!("http://{addr}/v1"))
        .arg("sluice-test")
        .output()
        .await
        .expect("python runs");
    let _ = tx.send(());
    server.await.expect("server task").expect("server ran");
    assert!(
        out.status.success(),
        "openai client checks failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
