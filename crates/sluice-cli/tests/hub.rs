//! `--model ORG/NAME` end to end, against a small Hugging Face Hub stand-in
//! served from this test on 127.0.0.1 (no test reaches the internet:
//! `HF_ENDPOINT` always points at the stand-in or at a closed local port).
//!
//! The stand-in answers the requests `hf-hub` makes: the repository
//! description `GET /api/models/{repo}/revision/{rev}` (`sha`, `siblings`),
//! and files `GET /{repo}/resolve/{rev}/{file}` with `Range`, answered with
//! `ETag` / `X-Repo-Commit` and `Content-Range`; weight files go, as on the
//! hub, through a 302 to a "CDN" URL with `X-Linked-Etag`. It logs every
//! request, so tests can tell what was downloaded and what was reused.

mod common;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TOKEN: &str = "hf_sluice_test_token";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/data/tiny-qwen2")
}

// ---------------------------------------------------------------------------
// The hub stand-in

#[derive(Clone, Default)]
struct MockRepo {
    files: BTreeMap<String, Vec<u8>>,
    sha: String,
    /// Tags that point at `sha` (besides `main`).
    tags: Vec<String>,
    /// Only requests with `Authorization: Bearer TOKEN` get in.
    gated: bool,
    /// Listed in `siblings` but answered 404 (a file that vanished).
    vanished: Vec<String>,
}

impl MockRepo {
    fn new(seed: &str, files: BTreeMap<String, Vec<u8>>) -> Self {
        MockRepo {
            sha: format!("{:016x}{:024x}", fnv(seed.as_bytes()), fnv(b"commit")),
            files,
            ..Default::default()
        }
    }
}

/// One request as the stand-in saw it.
#[derive(Clone, Debug)]
struct Logged {
    path: String,
    auth: Option<String>,
}

struct MockHub {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Logged>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MockHub {
    fn start(repos: BTreeMap<String, MockRepo>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let repos = Arc::new(repos);
        let thread = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (log, repos) = (log.clone(), repos.clone());
                    std::thread::spawn(move || serve(conn, addr, &repos, &log));
                }
            })
        };
        MockHub {
            addr,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    /// How many requests asked `repo` for `file` (resolve endpoint).
    fn file_requests(&self, repo: &str, file: &str) -> usize {
        let suffix = format!("/{file}");
        self.requests()
            .iter()
            .filter(|r| {
                r.path.starts_with(&format!("/{repo}/resolve/")) && r.path.ends_with(&suffix)
            })
            .count()
    }

    fn resolved_files(&self, repo: &str) -> Vec<String> {
        let prefix = format!("/{repo}/resolve/");
        let mut files: Vec<String> = self
            .requests()
            .iter()
            .filter_map(|r| r.path.strip_prefix(&prefix))
            .filter_map(|rest| rest.split_once('/').map(|(_, f)| f.to_string()))
            .collect();
        files.sort();
        files.dedup();
        files
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees `stop` and closes the port.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn is_lfs(file: &str) -> bool {
    file.ends_with(".safetensors") || file.ends_with(".gguf")
}

fn serve(
    conn: TcpStream,
    addr: SocketAddr,
    repos: &BTreeMap<String, MockRepo>,
    log: &Mutex<Vec<Logged>>,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let path = target.split('?').next().unwrap_or("").to_string();
    let auth = headers.get("authorization").cloned();
    log.lock().unwrap().push(Logged {
        path: path.clone(),
        auth: auth.clone(),
    });
    let reply = route(&path, auth.as_deref(), headers.get("range"), addr, repos);
    let mut out = conn;
    let mut head = format!(
        "HTTP/1.1 {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reply.body.len()
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(&reply.body);
    let _ = out.flush();
}

struct Reply {
    status: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn error(status: &'static str, code: &str, message: &str) -> Reply {
    Reply {
        status,
        headers: vec![
            ("X-Error-Code".into(), code.into()),
            ("X-Error-Message".into(), message.into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        body: json!({ "error": message }).to_string().into_bytes(),
    }
}

/// `bytes` (or the part `Range` asks for), as the hub and its CDN answer.
fn body(bytes: &[u8], range: Option<&String>, mut headers: Vec<(String, String)>) -> Reply {
    let total = bytes.len();
    let parsed = range.and_then(|r| r.strip_prefix("bytes=")).and_then(|r| {
        let (a, b) = r.split_once('-')?;
        let a: usize = a.parse().ok()?;
        let b: usize = if b.is_empty() {
            total.saturating_sub(1)
        } else {
            b.parse().ok()?
        };
        Some((a, b.min(total.saturating_sub(1))))
    });
    match parsed {
        Some((a, b)) if a < total && a <= b => {
            headers.push(("Content-Range".into(), format!("bytes {a}-{b}/{total}")));
            Reply {
                status: "206 Partial Content",
                headers,
                body: bytes[a..=b].to_vec(),
            }
        }
        _ => Reply {
            status: "200 OK",
            headers,
            body: bytes.to_vec(),
        },
    }
}

fn route(
    path: &str,
    auth: Option<&str>,
    range: Option<&String>,
    addr: SocketAddr,
    repos: &BTreeMap<String, MockRepo>,
) -> Reply {
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let authorised =
        |repo: &MockRepo| !repo.gated || auth == Some(format!("Bearer {TOKEN}").as_str());
    let known_rev = |repo: &MockRepo, rev: &str| {
        let rev = rev.replace("%2F", "/");
        rev == "main" || rev == repo.sha || repo.tags.contains(&rev)
    };
    match parts.as_slice() {
        ["api", "models", rest @ ..] => {
            // api/models/{org}/{name}/revision/{rev}
            let rest: Vec<&str> = rest.iter().flat_map(|p| p.split('/')).collect();
            let [org, name, "revision", rev] = rest.as_slice() else {
                return error("404 Not Found", "", "bad api path");
            };
            let id = format!("{org}/{name}");
            let Some(repo) = repos.get(&id) else {
                return error("404 Not Found", "RepoNotFound", "Repository not found");
            };
            if !authorised(repo) {
                return error(
                    "401 Unauthorized",
                    "GatedRepo",
                    "Access to this model is restricted",
                );
            }
            if !known_rev(repo, rev) {
                return error("404 Not Found", "RevisionNotFound", "Invalid rev id");
            }
            let siblings: Vec<Value> = repo
                .files
                .keys()
                .map(|f| json!({ "rfilename": f }))
                .collect();
            let info = json!({ "id": id, "modelId": id, "sha": repo.sha, "siblings": siblings, "private": false });
            Reply {
                status: "200 OK",
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: info.to_string().into_bytes(),
            }
        }
        ["cdn", ..] => {
            // cdn/{org}/{name}/{file, which may hold `/`}
            let rest: Vec<&str> = path.trim_start_matches('/').splitn(4, '/').collect();
            let [_, org, name, file] = rest.as_slice() else {
                return error("404 Not Found", "", "bad cdn path");
            };
            let id = format!("{org}/{name}");
            match repos.get(&id).and_then(|r| r.files.get(*file)) {
                Some(bytes) => body(bytes, range, vec![]),
                None => error("404 Not Found", "", "no such blob"),
            }
        }
        [org, name, "resolve", rev, file] => {
            let id = format!("{org}/{name}");
            let Some(repo) = repos.get(&id) else {
                return error("404 Not Found", "RepoNotFound", "Repository not found");
            };
            if !authorised(repo) {
                return error(
                    "401 Unauthorized",
                    "GatedRepo",
                    "Access to this model is restricted",
                );
            }
            if !known_rev(repo, rev) {
                return error("404 Not Found", "RevisionNotFound", "Invalid rev id");
            }
            let Some(bytes) = repo
                .files
                .get(*file)
                .filter(|_| !repo.vanished.iter().any(|v| v == file))
            else {
                return error("404 Not Found", "EntryNotFound", "Entry not found");
            };
            let etag = format!("{:016x}{:016x}", fnv(bytes), fnv(file.as_bytes()));
            let commit = ("X-Repo-Commit".to_string(), repo.sha.clone());
            if is_lfs(file) {
                Reply {
                    status: "302 Found",
                    headers: vec![
                        commit,
                        ("X-Linked-Etag".into(), format!("\"{etag}\"")),
                        ("X-Linked-Size".into(), bytes.len().to_string()),
                        ("Location".into(), format!("http://{addr}/cdn/{id}/{file}")),
                    ],
                    body: vec![],
                }
            } else {
                body(
                    bytes,
                    range,
                    vec![commit, ("ETag".into(), format!("\"{etag}\""))],
                )
            }
        }
        _ => error("404 Not Found", "", "unknown path"),
    }
}

// ---------------------------------------------------------------------------
// Repositories

/// The tiny Qwen2 fixture as a hub repository, plus files a real repository
/// has and sluice does not need.
fn tiny_repo(seed: &str) -> MockRepo {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        files.insert(name, std::fs::read(&path).unwrap());
    }
    files.insert("README.md".into(), b"# tiny\n".to_vec());
    files.insert(
        ".gitattributes".into(),
        b"*.safetensors filter=lfs\n".to_vec(),
    );
    MockRepo::new(seed, files)
}

/// The fixture's checkpoint split into two shards with an index.
fn sharded_repo(seed: &str) -> MockRepo {
    let mut repo = tiny_repo(seed);
    let single = repo.files.remove("model.safetensors").unwrap();
    let n = u64::from_le_bytes(single[..8].try_into().unwrap()) as usize;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&single[8..8 + n]).unwrap();
    let data = &single[8 + n..];
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut shards: [(BTreeMap<String, Value>, Vec<u8>); 2] = Default::default();
    let mut weight_map = BTreeMap::new();
    for (tensor, meta) in &header {
        if tensor == "__metadata__" {
            continue;
        }
        let i = if tensor.starts_with("model.layers.1.") || tensor == "model.norm.weight" {
            1
        } else {
            0
        };
        let (a, b) = (
            meta["data_offsets"][0].as_u64().unwrap() as usize,
            meta["data_offsets"][1].as_u64().unwrap() as usize,
        );
        let (h, bytes) = &mut shards[i];
        let start = bytes.len();
        bytes.extend_from_slice(&data[a..b]);
        h.insert(tensor.clone(), json!({ "dtype": meta["dtype"], "shape": meta["shape"], "data_offsets": [start, bytes.len()] }));
        weight_map.insert(tensor.clone(), names[i]);
    }
    for (i, (h, bytes)) in shards.into_iter().enumerate() {
        let mut head = serde_json::to_string(&h).unwrap().into_bytes();
        // Keep the data 8-byte aligned, as safetensors writers do.
        while (8 + head.len()) % 8 != 0 {
            head.push(b' ');
        }
        let mut file = (head.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(&head);
        file.extend_from_slice(&bytes);
        repo.files.insert(names[i].to_string(), file);
    }
    let index = json!({ "metadata": { "total_size": data.len() }, "weight_map": weight_map });
    repo.files.insert(
        "model.safetensors.index.json".into(),
        index.to_string().into_bytes(),
    );
    repo
}

/// A GGUF repository: several quantizations, a split set and a projector.
fn gguf_repo() -> MockRepo {
    fake_gguf_repo(&[
        "tiny-Q4_K_S.gguf",
        "tiny-Q4_K_M.gguf",
        "tiny-IQ4_XS.gguf",
        "tiny-Q8_0.gguf",
        "mmproj-tiny-Q4_K_M.gguf",
        "BF16/tiny-BF16-00001-of-00002.gguf",
        "BF16/tiny-BF16-00002-of-00002.gguf",
    ])
}

/// A repository of `.gguf` files whose contents are not GGUF: a run fetches
/// the file it picks, then fails in the GGUF reader, naming the file.
fn fake_gguf_repo(names: &[&str]) -> MockRepo {
    let mut files = BTreeMap::new();
    for name in names {
        files.insert(
            name.to_string(),
            format!("GGUF fake contents of {name}").into_bytes(),
        );
    }
    files.insert("README.md".into(), b"# tiny gguf\n".to_vec());
    MockRepo::new("gguf", files)
}

// ---------------------------------------------------------------------------
// Running sluice

/// A directory under the target's temporary folder, removed afterwards.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "hub-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The JSON line's token ids.
    fn token_ids(&self) -> Vec<u64> {
        assert_eq!(self.code, 0, "sluice failed: {}", self.stderr);
        let v: Value = serde_json::from_str(self.stdout.lines().next().unwrap()).unwrap();
        v["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    }

    /// The one error line of a failed run.
    fn error_line(&self) -> &str {
        assert_ne!(self.code, 0, "sluice should have failed: {}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        let last = self.stderr.lines().last().unwrap_or("");
        assert!(last.starts_with("error: --model"), "{}", self.stderr);
        last
    }
}

/// `sluice generate` with `model` (greedy, 4 tokens, JSON) under a Hugging
/// Face environment of only `env`: the HF_* variables of the machine running
/// the tests, and proxies, never leak in.
fn generate(model: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args([
        "generate",
        "--model",
        model,
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        "--prompt",
        "Hi",
    ])
    .args(["--kv-cache-memory", "16MiB", "--threads", "1"])
    .args(extra)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        let upper = k.to_ascii_uppercase();
        if upper.starts_with("HF_")
            || upper.starts_with("HUGGING")
            || upper.ends_with("_PROXY")
            || upper == "XDG_CACHE_HOME"
        {
            cmd.env_remove(&k);
        }
    }
    // No test may reach the default hub: an endpoint is always given.
    assert!(
        env.iter().any(|(k, _)| *k == "HF_ENDPOINT"),
        "set HF_ENDPOINT"
    );
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("sluice --model {model} did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Run {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

fn json_generate(model: &str, env: &[(&str, &str)]) -> Run {
    generate(model, &["--json"], env)
}

fn local_token_ids() -> Vec<u64> {
    let dir = fixture_dir();
    json_generate(
        dir.to_str().unwrap(),
        &[("HF_ENDPOINT", "http://127.0.0.1:9")],
    )
    .token_ids()
}

/// A local port nothing listens on (bound, then released).
fn closed_endpoint() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

fn repos(list: Vec<(&str, MockRepo)>) -> BTreeMap<String, MockRepo> {
    list.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn snapshot(home: &Path, repo: &str, sha: &str) -> PathBuf {
    home.join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots")
        .join(sha)
}

// ---------------------------------------------------------------------------
// Tests

#[test]
fn hub_model_downloads_into_the_cache_reuses_it_and_runs_offline() {
    let repo = tiny_repo("tiny");
    let sha = repo.sha.clone();
    let hub = MockHub::start(repos(vec![("sluice-test/tiny-qwen2", repo)]));
    let home = TempDir::new("tiny");
    let endpoint = hub.endpoint();
    let home_s = home.0.to_str().unwrap().to_string();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home_s.as_str()),
    ];

    let expected = local_token_ids();
    let first = json_generate("sluice-test/tiny-qwen2", &env);
    assert_eq!(first.token_ids(), expected, "{}", first.stderr);

    // The standard cache layout: a ref to the commit, the snapshot's files
    // as links into blobs/.
    let repo_dir = home.0.join("hub/models--sluice-test--tiny-qwen2");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main"))
            .unwrap()
            .trim(),
        sha
    );
    let snap = snapshot(&home.0, "sluice-test/tiny-qwen2", &sha);
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors",
    ] {
        let p = snap.join(f);
        assert!(
            std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{f}"
        );
        assert_eq!(
            std::fs::read(&p).unwrap(),
            std::fs::read(fixture_dir().join(f)).unwrap(),
            "{f}"
        );
    }
    assert!(std::fs::read_dir(repo_dir.join("blobs")).unwrap().count() >= 6);
    // Only what the loader reads was fetched.
    assert_eq!(
        hub.resolved_files("sluice-test/tiny-qwen2"),
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert!(!snap.join("reference.json").exists() && !snap.join("README.md").exists());

    // A second run asks the hub for the commit only: no file again. The
    // model is named by its id.
    let fetched = hub.requests().len();
    let second = generate("sluice-test/tiny-qwen2", &[], &env);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("sluice: model sluice-test/tiny-qwen2,"),
        "{}",
        second.stderr
    );
    let new: Vec<Logged> = hub.requests()[fetched..].to_vec();
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(
        new[0]
            .path
            .starts_with("/api/models/sluice-test/tiny-qwen2/revision/main"),
        "{new:?}"
    );
    assert_eq!(
        hub.file_requests("sluice-test/tiny-qwen2", "model.safetensors"),
        2
    ); // metadata + body, first run only

    // With the hub gone: offline mode uses the cache alone...
    drop(hub);
    let offline_env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home_s.as_str()),
        ("HF_HUB_OFFLINE", "1"),
    ];
    let offline = json_generate("sluice-test/tiny-qwen2", &offline_env);
    assert_eq!(offline.token_ids(), expected, "{}", offline.stderr);
    // ...and online mode falls back to it, saying so.
    let fallback = json_generate("sluice-test/tiny-qwen2", &env);
    assert_eq!(fallback.token_ids(), expected, "{}", fallback.stderr);
    assert!(
        fallback.stderr.contains("cannot reach the hub")
            && fallback.stderr.contains("using the cached copy"),
        "{}",
        fallback.stderr
    );

    // Offline, an uncached repository or revision fails clearly.
    let e = json_generate("sluice-test/other", &offline_env);
    let line = e.error_line();
    assert!(
        line.contains("--model sluice-test/other: offline (HF_HUB_OFFLINE is set)"),
        "{line}"
    );
    assert!(line.contains("not in the cache"), "{line}");
    let e = generate(
        "sluice-test/tiny-qwen2",
        &["--revision", "v2"],
        &offline_env,
    );
    assert!(
        e.error_line()
            .contains("sluice-test/tiny-qwen2 (revision v2) is not in the cache"),
        "{}",
        e.stderr
    );
}

#[test]
fn offline_mode_never_touches_the_network() {
    let hub = MockHub::start(repos(vec![("sluice-test/tiny-qwen2", tiny_repo("tiny"))]));
    let home = TempDir::new("offline");
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.0.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "1"),
    ];
    let e = json_generate("sluice-test/tiny-qwen2", &env);
    assert!(e.error_line().contains("offline"), "{}", e.stderr);
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
}

#[test]
fn sharded_checkpoint_and_a_tag_revision() {
    let repo = MockRepo {
        tags: vec!["v1.0".into()],
        ..sharded_repo("sharded")
    };
    let sha = repo.sha.clone();
    let hub = MockHub::start(repos(vec![("sluice-test/tiny-sharded", repo)]));
    let home = TempDir::new("sharded");
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.0.to_str().unwrap()),
    ];

    let run = generate(
        "sluice-test/tiny-sharded",
        &["--json", "--revision", "v1.0"],
        &env,
    );
    assert_eq!(run.token_ids(), local_token_ids(), "{}", run.stderr);
    let snap = snapshot(&home.0, "sluice-test/tiny-sharded", &sha);
    for f in [
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        assert!(snap.join(f).is_file(), "{f}");
    }
    let refs = home.0.join("hub/models--sluice-test--tiny-sharded/refs");
    assert_eq!(
        std::fs::read_to_string(refs.join("v1.0")).unwrap().trim(),
        sha
    );
    assert!(
        hub.requests()
            .iter()
            .all(|r| !r.path.contains("/resolve/main/")),
        "{:?}",
        hub.requests()
    );

    // A commit id as the revision: the same snapshot, nothing downloaded.
    let before = hub.requests().len();
    let run = generate(
        "sluice-test/tiny-sharded",
        &["--json", "--revision", &sha],
        &env,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(hub.requests().len(), before + 1);

    // --load-format dummy needs no weights: a fresh cache gets none.
    let home2 = TempDir::new("dummy");
    let env2 = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home2.0.to_str().unwrap()),
    ];
    let before = hub.file_requests(
        "sluice-test/tiny-sharded",
        "model-00001-of-00002.safetensors",
    );
    let run = generate(
        "sluice-test/tiny-sharded",
        &["--json", "--load-format", "dummy"],
        &env2,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        hub.file_requests(
            "sluice-test/tiny-sharded",
            "model-00001-of-00002.safetensors"
        ),
        before
    );
    assert!(!snapshot(&home2.0, "sluice-test/tiny-sharded", &sha)
        .join("model.safetensors.index.json")
        .exists());
}

#[test]
fn gated_repo_needs_hf_token_sent_as_bearer() {
    let repo = MockRepo {
        gated: true,
        ..tiny_repo("gated")
    };
    let hub = MockHub::start(repos(vec![("sluice-test/gated", repo)]));
    let home = TempDir::new("gated");
    let endpoint = hub.endpoint();
    let home_s = home.0.to_str().unwrap().to_string();

    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home_s.as_str()),
    ];
    let e = json_generate("sluice-test/gated", &env);
    let line = e.error_line();
    assert!(
        line.contains("--model sluice-test/gated")
            && line.contains("401")
            && line.contains("HF_TOKEN"),
        "{line}"
    );

    let bad = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home_s.as_str()),
        ("HF_TOKEN", "hf_wrong"),
    ];
    let e = json_generate("sluice-test/gated", &bad);
    let line = e.error_line();
    assert!(
        line.contains("401") && line.contains("token from HF_TOKEN has no access"),
        "{line}"
    );

    let before = hub.requests().len();
    let good = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home_s.as_str()),
        ("HF_TOKEN", TOKEN),
    ];
    let run = json_generate("sluice-test/gated", &good);
    assert_eq!(run.token_ids(), local_token_ids(), "{}", run.stderr);
    let hub_requests: Vec<Logged> = hub.requests()[before..]
        .iter()
        .filter(|r| !r.path.starts_with("/cdn/"))
        .cloned()
        .collect();
    assert!(hub_requests.len() > 6);
    for r in &hub_requests {
        assert_eq!(
            r.auth.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str()),
            "{r:?}"
        );
    }

    // The token file `huggingface-cli login` writes works too.
    let home2 = TempDir::new("gated-file");
    std::fs::write(home2.0.join("token"), format!("{TOKEN}\n")).unwrap();
    let env2 = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home2.0.to_str().unwrap()),
    ];
    assert_eq!(json_generate("sluice-test/gated", &env2).code, 0);
}

#[test]
fn missing_repos_files_and_bad_ids_are_one_clear_line() {
    let broken = MockRepo {
        vanished: vec!["model.safetensors".into()],
        ..tiny_repo("broken")
    };
    let mut no_tokenizer = tiny_repo("no-tok");
    no_tokenizer.files.remove("tokenizer.json");
    let mut only_bin = tiny_repo("bin");
    let w = only_bin.files.remove("model.safetensors").unwrap();
    only_bin.files.insert("pytorch_model.bin".into(), w);
    let hub = MockHub::start(repos(vec![
        ("sluice-test/broken", broken),
        ("sluice-test/no-tokenizer", no_tokenizer),
        ("sluice-test/only-bin", only_bin),
        ("sluice-test/tiny-gguf", gguf_repo()),
        (
            "sluice-test/gguf-no-default",
            fake_gguf_repo(&["tiny-Q8_0.gguf", "tiny-Q5_K_M.gguf"]),
        ),
    ]));
    let home = TempDir::new("errors");
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.0.to_str().unwrap()),
    ];

    let check = |model: &str, extra: &[&str], env: &[(&str, &str)], wants: &[&str]| {
        let run = generate(model, extra, env);
        let line = run.error_line().to_string();
        for w in wants {
            assert!(line.contains(w), "{model}: {line:?} lacks {w:?}");
        }
    };
    check(
        "sluice-test/nope",
        &[],
        &env,
        &["--model sluice-test/nope: no such model repository", "404"],
    );
    check(
        "sluice-test/broken",
        &[],
        &env,
        &[
            "--model sluice-test/broken: model.safetensors: no such file",
            "404",
        ],
    );
    check(
        "sluice-test/no-tokenizer",
        &[],
        &env,
        &["--model sluice-test/no-tokenizer: the repository has no tokenizer.json"],
    );
    check(
        "sluice-test/only-bin",
        &[],
        &env,
        &["has no model.safetensors", "only PyTorch weights"],
    );
    check(
        "sluice-test/broken",
        &["--revision", "nope"],
        &env,
        &[
            "--model sluice-test/broken (revision nope): no revision \"nope\"",
            "404",
        ],
    );
    check(
        "sluice-test/gguf-no-default",
        &[],
        &env,
        &[
            "a GGUF repository without a Q4_K_M file",
            "--model sluice-test/gguf-no-default:QUANT",
            "tiny-Q8_0.gguf",
        ],
    );
    check(
        "not/a/model/id",
        &[],
        &env,
        &[
            "--model: no such file or directory: not/a/model/id",
            "\"not/a/model/id\" is not a Hugging Face model id",
        ],
    );
    check(
        "./missing-dir",
        &[],
        &env,
        &["--model: no such file or directory: ./missing-dir"],
    );
    let bad_rev = generate("sluice-test/broken", &["--revision", "../../etc"], &env);
    assert_eq!(bad_rev.code, 2, "a refused flag value");
    assert!(
        bad_rev
            .stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("error: --revision \"../../etc\""),
        "{}",
        bad_rev.stderr
    );
    let closed = closed_endpoint();
    let down = [
        ("HF_ENDPOINT", closed.as_str()),
        ("HF_HOME", home.0.to_str().unwrap()),
    ];
    check(
        "sluice-test/broken",
        &[],
        &down,
        &[
            "--model sluice-test/broken: cannot reach the hub at",
            "not in the cache",
            "HF_HUB_OFFLINE=1",
        ],
    );
}

#[test]
fn gguf_quant_tag_picks_the_right_file() {
    let repo = gguf_repo();
    let sha = repo.sha.clone();
    let hub = MockHub::start(repos(vec![
        ("sluice-test/tiny-gguf", repo.clone()),
        ("sluice-test/one-gguf", fake_gguf_repo(&["one-Q8_0.gguf"])),
    ]));
    let home = TempDir::new("gguf");
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.0.to_str().unwrap()),
    ];
    let snap = snapshot(&home.0, "sluice-test/tiny-gguf", &sha);

    // The files are not real GGUF: the run fails in the reader, after the
    // right file was fetched and named.
    let run = json_generate("sluice-test/tiny-gguf:q4_k_m", &env);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("tiny-Q4_K_M.gguf: GGUF"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let path = snap.join("tiny-Q4_K_M.gguf");
    assert!(
        run.stderr.contains(&format!(
            "sluice: --model sluice-test/tiny-gguf:q4_k_m: {}",
            path.display()
        )),
        "{}",
        run.stderr
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        repo.files["tiny-Q4_K_M.gguf"]
    );
    assert_eq!(
        hub.resolved_files("sluice-test/tiny-gguf"),
        ["tiny-Q4_K_M.gguf"]
    );

    // No tag: Q4_K_M, as llama.cpp's `-hf` picks.
    let run = json_generate("sluice-test/tiny-gguf", &env);
    assert!(
        run.stderr
            .contains("no quantization given, using tiny-Q4_K_M.gguf"),
        "{}",
        run.stderr
    );
    assert_eq!(
        hub.resolved_files("sluice-test/tiny-gguf"),
        ["tiny-Q4_K_M.gguf"]
    );

    // No tag and no Q4_K_M: a repository's only file set.
    let run = json_generate("sluice-test/one-gguf", &env);
    assert!(
        run.stderr
            .contains("no quantization given, using one-Q8_0.gguf"),
        "{}",
        run.stderr
    );

    // A split set: every part, the first one named.
    let run = json_generate("sluice-test/tiny-gguf:BF16", &env);
    assert!(
        run.stderr.contains(
            &snap
                .join("BF16/tiny-BF16-00001-of-00002.gguf")
                .display()
                .to_string()
        ),
        "{}",
        run.stderr
    );
    assert!(snap.join("BF16/tiny-BF16-00002-of-00002.gguf").is_file());

    // --gguf-file names one exactly.
    let run = generate(
        "sluice-test/tiny-gguf",
        &["--gguf-file", "tiny-Q8_0.gguf"],
        &env,
    );
    assert!(
        run.stderr
            .contains(&snap.join("tiny-Q8_0.gguf").display().to_string()),
        "{}",
        run.stderr
    );
    assert_eq!(
        hub.resolved_files("sluice-test/tiny-gguf"),
        [
            "BF16/tiny-BF16-00001-of-00002.gguf",
            "BF16/tiny-BF16-00002-of-00002.gguf",
            "tiny-Q4_K_M.gguf",
            "tiny-Q8_0.gguf"
        ]
    );

    // Offline, the cached quantization is found again; an uncached one is not.
    let offline = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.0.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "1"),
    ];
    let before = hub.requests().len();
    let run = json_generate("sluice-test/tiny-gguf:Q4_K_M", &offline);
    assert!(
        run.stderr.contains(&path.display().to_string()),
        "{}",
        run.stderr
    );
    let e = json_generate("sluice-test/tiny-gguf:Q4_K_S", &offline);
    assert!(
        e.error_line().contains("offline")
            && e.error_line().contains("no .gguf file matches \"Q4_K_S\""),
        "{}",
        e.stderr
    );
    assert_eq!(hub.requests().len(), before);

    // Tags that match nothing, or too much, say what there is.
    let e = json_generate("sluice-test/tiny-gguf:Q2_K", &env);
    assert!(
        e.error_line().contains("no .gguf file matches \"Q2_K\"")
            && e.error_line().contains("tiny-Q4_K_M.gguf"),
        "{}",
        e.stderr
    );
    let e = json_generate("sluice-test/tiny-gguf:Q4_K", &env);
    assert!(e.error_line().contains("matches several"), "{}", e.stderr);
    let e = generate(
        "sluice-test/tiny-gguf:Q4_K_M",
        &["--gguf-file", "tiny-Q8_0.gguf"],
        &env,
    );
    assert!(e.error_line().contains("not both"), "{}", e.stderr);
}

/// `sluice bench --tokenizer ORG/NAME` (a hub id, as vLLM's bench takes):
/// only the repository's tokenizer files are downloaded, the prompts built
/// with them match the server's tokenizer (the same tiny-qwen2 files, so
/// no re-alignment), and a second run offline reads the cache.
#[test]
fn bench_tokenizer_hub_id_downloads_the_tokenizer_only() {
    let repo = tiny_repo("tok");
    let hub = MockHub::start(repos(vec![("sluice-test/tiny-qwen2", repo)]));
    let home = TempDir::new("bench-tok");
    let endpoint = hub.endpoint();
    let home_s = home.0.to_str().unwrap().to_string();
    let fixture = fixture_dir();
    let mut serve = common::spawn_serve(&["--model", fixture.to_str().unwrap()], &[]);
    serve.drain_log();
    let bench = |offline: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args([
            "bench",
            "--base-url",
            &serve.url,
            "--tokenizer",
            "sluice-test/tiny-qwen2",
            "--num-prompts",
            "4",
            "--random-input-len",
            "24",
            "--random-output-len",
            "2",
        ]);
        for (k, _) in std::env::vars() {
            if k.to_ascii_uppercase().starts_with("HF_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("HF_ENDPOINT", &endpoint).env("HF_HOME", &home_s);
        if offline {
            cmd.env("HF_HUB_OFFLINE", "1");
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("mismatch"), "{stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stdout = bench(false);
    assert!(stdout.contains("Successful requests:"), "{stdout}");
    assert_eq!(
        hub.resolved_files("sluice-test/tiny-qwen2"),
        [
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json"
        ],
        "the tokenizer's files, no config or weights"
    );
    let before = hub.requests().len();
    bench(true);
    assert_eq!(hub.requests().len(), before, "offline: the cache only");
}
