//! A server over a scripted engine for the HTTP tests: the built-in
//! byte-level tokenizer, and a "model" that writes `TEXT` one byte token at a
//! time (after an optional delay per step, to keep requests in flight).
#![allow(dead_code)]

use sluice_engine::{Engine, EngineConfig, SchedulerConfig, ScriptedExecutor, SeqView, Tokenizer};
use sluice_server::{serve, ServerConfig};
use std::sync::Arc;
use std::time::Duration;

pub const TEXT: &str = "The quick brown fox jumps over the lazy dog. ";
pub const MAX_MODEL_LEN: usize = 256;

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub engine: Engine,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    pub async fn start(
        model_name: &str,
        max_waiting: Option<usize>,
        step_delay: Duration,
    ) -> TestServer {
        let script = move |s: &SeqView<'_>| {
            if !step_delay.is_zero() {
                std::thread::sleep(step_delay);
            }
            vec![u32::from(TEXT.as_bytes()[s.output.len() % TEXT.len()])]
        };
        let tokenizer = Arc::new(Tokenizer::builtin());
        let sched = SchedulerConfig {
            max_model_len: MAX_MODEL_LEN,
            max_num_batched_tokens: 512,
            max_num_seqs: 16,
            ..SchedulerConfig::default()
        };
        let mut cfg = EngineConfig::new(sched).with_model_eos(&tokenizer, &[256]);
        cfg.max_waiting_requests = max_waiting;
        let executor = ScriptedExecutor::new(512, script).with_vocab_size(384);
        let engine = Engine::start(cfg, Box::new(executor), tokenizer).expect("engine starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let config = ServerConfig {
            addr,
            model_name: model_name.into(),
            max_model_len: MAX_MODEL_LEN,
            shutdown_grace: Duration::from_secs(5),
        };
        let task = tokio::spawn(serve(engine.clone(), config, listener, async {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            engine,
            stop: Some(tx),
            task,
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server (graceful shutdown) and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.await.expect("server task").expect("server ran");
    }
}
