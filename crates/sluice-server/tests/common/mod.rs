//! A server over a scripted engine for the HTTP tests: the built-in
//! byte-level tokenizer, and a "model" that writes `TEXT` one byte token at a
//! time (after an optional delay per step, to keep requests in flight).
#![allow(dead_code)]

use sluice_engine::{
    Engine, EngineConfig, RequestLimits, SchedulerConfig, ScriptedExecutor, SeqView, Tokenizer,
};
use sluice_server::{serve, ServerConfig};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const TEXT: &str = "The quick brown fox jumps over the lazy dog. ";
pub const MAX_MODEL_LEN: usize = 256;

/// How to build a test server; `Default` is a plain one.
/// What the model answers to a prompt.
pub type Reply = Arc<dyn Fn(&str) -> String + Send + Sync>;

pub struct Options {
    pub model_name: String,
    pub max_waiting: Option<usize>,
    pub step_delay: Duration,
    pub limits: RequestLimits,
    pub max_num_seqs: usize,
    /// The KV cache pool, in blocks of 16 tokens.
    pub num_blocks: usize,
    /// The model writes this once, then EOS, instead of `TEXT` forever.
    pub text: Option<String>,
    /// The model writes what this gives for the prompt (its bytes as
    /// text), then EOS: a conversation that depends on what was said.
    pub reply: Option<Reply>,
    /// Adjusts the server configuration (keys, timeouts, TLS, ...).
    pub configure: Box<dyn FnOnce(&mut ServerConfig) + Send>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            model_name: "test-model".into(),
            max_waiting: None,
            step_delay: Duration::ZERO,
            limits: RequestLimits::default(),
            max_num_seqs: 16,
            num_blocks: 512,
            text: None,
            reply: None,
            configure: Box::new(|_| {}),
        }
    }
}

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub engine: Engine,
    /// Every prompt the model was run on (its first step), in order: what
    /// the engine really got.
    pub prompts: Arc<Mutex<Vec<Vec<u32>>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    pub async fn start(
        model_name: &str,
        max_waiting: Option<usize>,
        step_delay: Duration,
    ) -> TestServer {
        TestServer::start_with(Options {
            model_name: model_name.into(),
            max_waiting,
            step_delay,
            ..Options::default()
        })
        .await
    }

    pub async fn start_with(opts: Options) -> TestServer {
        let step_delay = opts.step_delay;
        let text = opts.text;
        let reply = opts.reply;
        let prompts = Arc::new(Mutex::new(Vec::new()));
        let seen = prompts.clone();
        let script = move |s: &SeqView<'_>| {
            if !step_delay.is_zero() {
                std::thread::sleep(step_delay);
            }
            if s.output.is_empty() {
                if let Ok(mut seen) = seen.lock() {
                    seen.push(s.prompt.to_vec());
                }
            }
            let replied = reply.as_ref().map(|r| {
                let bytes: Vec<u8> = s
                    .prompt
                    .iter()
                    .filter(|&&t| t < 256)
                    .map(|&t| t as u8)
                    .collect();
                r(&String::from_utf8_lossy(&bytes))
            });
            match replied.as_ref().or(text.as_ref()) {
                Some(t) => match t.as_bytes().get(s.output.len()) {
                    Some(&b) => vec![u32::from(b)],
                    None => vec![256],
                },
                None => vec![u32::from(TEXT.as_bytes()[s.output.len() % TEXT.len()])],
            }
        };
        let tokenizer = Arc::new(Tokenizer::builtin());
        let sched = SchedulerConfig {
            max_model_len: MAX_MODEL_LEN,
            max_num_batched_tokens: 512,
            max_num_seqs: opts.max_num_seqs,
            ..SchedulerConfig::default()
        };
        let mut cfg = EngineConfig::new(sched).with_model_eos(&tokenizer, &[256]);
        cfg.max_waiting_requests = opts.max_waiting;
        cfg.limits = opts.limits;
        let executor = ScriptedExecutor::new(opts.num_blocks, script).with_vocab_size(384);
        let engine = Engine::start(cfg, Box::new(executor), tokenizer).expect("engine starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut config = ServerConfig::new(addr, opts.model_name, MAX_MODEL_LEN);
        config.shutdown_grace = Duration::from_secs(5);
        (opts.configure)(&mut config);
        let task = tokio::spawn(serve(engine.clone(), config, listener, async {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            engine,
            prompts,
            stop: Some(tx),
            task,
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends `body` (as JSON) to `path`: the status and the answer (its
    /// JSON, or its text as a JSON string).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut r = reqwest::Client::new().request(method, format!("{}{path}", self.base()));
        if let Some(b) = body {
            r = r.json(b);
        }
        let r = r.send().await.expect("request sent");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, v)
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    /// Signals shutdown without waiting for it.
    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// Stops the server (graceful shutdown) and waits for it.
    pub async fn shutdown(mut self) {
        self.signal_shutdown();
        self.task.await.expect("server task").expect("server ran");
    }

    /// Signals shutdown and waits for the server to return, failing the
    /// test if it does not within `bound` (a hang detector, far above the
    /// expected time).
    pub async fn shutdown_within(mut self, bound: Duration) {
        self.signal_shutdown();
        match tokio::time::timeout(bound, self.task).await {
            Ok(joined) => joined.expect("server task").expect("server ran"),
            Err(_) => panic!("the server did not stop within {bound:?} of the shutdown signal"),
        }
    }
}

/// A Python with the official client packages the tests drive the server
/// with (`package` names the one this test needs): `$SLUICE_PYTHON`, else
/// the workspace's `.venv/bin/python` (`.ci/test` creates it).
pub fn python(package: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_PYTHON") {
        return std::path::PathBuf::from(p);
    }
    let venv = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with the {package} package: run `.ci/test` (it creates .venv with the client \
         packages) or set SLUICE_PYTHON"
    );
    venv
}

/// Runs `tests/SCRIPT` with the client Python (`python(package)`) and
/// `args`; fails with its output unless it exits 0.
pub async fn run_python(package: &str, script: &str, args: &[String], env: &[(&str, &str)]) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = tokio::process::Command::new(python(package))
        .arg(&path)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .expect("python runs");
    assert!(
        out.status.success(),
        "{script} failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
