//! The connection layer over real loopback sockets: TCP_NODELAY, the
//! keep-alive / header / body timeouts, shutdown with clients in every
//! awkward state, API keys, TLS, CORS, 405 and 413.
//!
//! No timing is asserted: a timeout under test is set short and the test
//! waits (with a far larger bound, as a hang detector) for the server to
//! act.

mod common;

use common::{Options, TestServer};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far above any timeout under test: only a hang trips it.
const HANG: Duration = Duration::from_secs(30);

async fn start(
    configure: impl FnOnce(&mut sluice_server::ServerConfig) + Send + 'static,
) -> TestServer {
    TestServer::start_with(Options {
        configure: Box::new(configure),
        ..Options::default()
    })
    .await
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    match tokio::time::timeout(HANG, stream.read_to_end(&mut out)).await {
        Ok(_) => String::from_utf8_lossy(&out).into_owned(),
        Err(_) => panic!(
            "the server kept the connection open; got {:?}",
            String::from_utf8_lossy(&out)
        ),
    }
}

fn request(method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Reads one HTTP response with a Content-Length body from `stream`.
async fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(HANG, stream.read(&mut chunk))
            .await
            .expect("a response")
            .expect("read");
        assert!(
            n > 0,
            "closed before a full response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                return (status, text[end + 4..end + 4 + len].to_string());
            }
        }
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_sockets_have_tcp_nodelay() {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let s = TestServer::start("m", None, Duration::ZERO).await;
    let mut client = TcpStream::connect(s.addr).await.unwrap();
    client
        .write_all(request("GET", "/health", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut client).await.0, 200);
    // The server runs in this process: find its end of the connection
    // among our own file descriptors and read the option back.
    let mut accepted = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: `fd` is an open socket of this process; the TcpStream
        // only borrows it for the queries and `into_raw_fd` gives it back
        // without closing it.
        let sock = unsafe { std::net::TcpStream::from_raw_fd(fd) };
        let theirs = sock.local_addr().ok() == Some(s.addr) && sock.peer_addr().is_ok();
        let nodelay = sock.nodelay();
        let _ = sock.into_raw_fd();
        if theirs {
            accepted += 1;
            assert!(nodelay.unwrap(), "an accepted socket without TCP_NODELAY");
        }
    }
    assert!(accepted >= 1, "the server's socket was not found");
    drop(client);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let s = start(|c| c.timeouts.keep_alive = Duration::from_millis(300)).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    // A first request is served and the connection kept alive ...
    c.write_all(request("GET", "/version", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut c).await.0, 200);
    // ... then closed once idle for the keep-alive timeout.
    assert_eq!(read_to_close(&mut c).await, "");
    // A connection that never sends anything is closed the same way.
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    assert_eq!(read_to_close(&mut silent).await, "");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_headers_are_closed_after_the_header_timeout() {
    let s = start(|c| {
        c.timeouts.keep_alive = Duration::from_secs(60);
        c.timeouts.header_read = Duration::from_millis(300);
    })
    .await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    read_to_close(&mut c).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_a_huge_one_413() {
    let s = start(|c| {
        c.timeouts.body_read = Duration::from_millis(300);
        c.max_request_body_bytes = 1000;
    })
    .await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"prompt\"",
    )
    .await
    .unwrap();
    let (status, body) = read_response(&mut c).await;
    assert_eq!(status, 408, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--timeout-body-read"));

    let big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(2000));
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", s.base()))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1000 bytes"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_method_is_405_with_an_openai_error() {
    let s = TestServer::start("m", None, Duration::ZERO).await;
    let r = reqwest::get(format!("{}/v1/completions", s.base()))
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 405, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("GET"));
    s.shutdown().await;
}

/// Every awkward client at once: shutdown still returns (and closes them
/// all) within the grace period plus a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_every_connection_whatever_its_state() {
    let mut s = TestServer::start_with(Options {
        // Slow steps keep the streamed request generating past the grace.
        step_delay: Duration::from_millis(20),
        configure: Box::new(|c| {
            c.shutdown_grace = Duration::from_secs(1);
            c.timeouts.keep_alive = Duration::from_secs(600);
            c.timeouts.header_read = Duration::from_secs(600);
            c.timeouts.body_read = Duration::from_secs(600);
            c.timeouts.write_stall = Duration::from_secs(600);
        }),
        ..Options::default()
    })
    .await;
    // Idle keep-alive: one request served, then nothing.
    let mut idle = TcpStream::connect(s.addr).await.unwrap();
    idle.write_all(request("GET", "/health", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut idle).await.0, 200);
    // Half-sent headers.
    let mut half_headers = TcpStream::connect(s.addr).await.unwrap();
    half_headers
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
        .await
        .unwrap();
    // Half-sent body.
    let mut half_body = TcpStream::connect(s.addr).await.unwrap();
    half_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 50\r\n\r\n{\"pro",
        )
        .await
        .unwrap();
    // A stream its client never reads.
    let mut unread = TcpStream::connect(s.addr).await.unwrap();
    let body =
        json!({"prompt": "Hi", "max_tokens": 250, "stream": true, "ignore_eos": true}).to_string();
    unread
        .write_all(request("POST", "/v1/completions", &body).as_bytes())
        .await
        .unwrap();
    // Wait until the engine runs it, so the shutdown finds it in flight.
    for _ in 0..3000 {
        if s.engine.stats().num_running_reqs == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.engine.stats().num_running_reqs, 1);

    s.signal_shutdown();
    for (name, conn) in [
        ("idle", &mut idle),
        ("half headers", &mut half_headers),
        ("half body", &mut half_body),
        ("unread stream", &mut unread),
    ] {
        let mut sink = Vec::new();
        let closed = tokio::time::timeout(HANG, conn.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "{name}: still open after shutdown");
    }
    s.shutdown_within(HANG).await;
}

/// A request in flight when the signal comes finishes normally within the
/// grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_requests_in_flight_finish() {
    let mut s = TestServer::start_with(Options {
        step_delay: Duration::from_millis(5),
        configure: Box::new(|c| c.shutdown_grace = Duration::from_secs(20)),
        ..Options::default()
    })
    .await;
    let base = s.base();
    let req = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt": "Hi", "max_tokens": 40}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    for _ in 0..3000 {
        if s.engine.stats().num_running_reqs == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    s.signal_shutdown();
    let v = req.await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40);
    s.shutdown_within(HANG).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_v1_and_the_tokenizer_but_not_the_probes() {
    let s = start(|c| c.api_keys = vec!["k-one".into(), "k-two".into()]).await;
    let client = reqwest::Client::new();
    let base = s.base();
    let post = |key: Option<&str>, path: &str| {
        let mut r = client
            .post(format!("{base}{path}"))
            .json(&json!({"prompt": "Hi", "max_tokens": 2}));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let r = post(None, "/v1/completions").await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 401, "{v}");
    assert_eq!(
        post(Some("wrong"), "/v1/completions")
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        post(Some("k-one"), "/v1/completions")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        post(Some("k-two"), "/v1/completions")
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(post(None, "/tokenize").await.unwrap().status(), 401);
    assert_eq!(
        post(Some("k-two"), "/tokenize").await.unwrap().status(),
        200
    );
    let models = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 401);
    for open in ["/health", "/ready", "/metrics", "/version"] {
        let r = client.get(format!("{base}{open}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{open}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflight_when_configured_and_nothing_otherwise() {
    let s = start(|c| {
        c.cors.allowed_origins = vec!["https://app.example".into()];
        c.api_keys = vec!["k".into()];
    })
    .await;
    let client = reqwest::Client::new();
    let preflight = |origin: &'static str| {
        client
            .request(
                reqwest::Method::OPTIONS,
                format!("{}/v1/completions", s.base()),
            )
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization,content-type",
            )
            .send()
    };
    // The preflight carries no key and still passes.
    let r = preflight("https://app.example").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let r = preflight("https://evil.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    s.shutdown().await;

    let plain = TestServer::start("m", None, Duration::ZERO).await;
    let r = reqwest::Client::new()
        .get(format!("{}/health", plain.base()))
        .header("Origin", "https://app.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    plain.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_generated_certificate() {
    let dir = std::env::temp_dir().join(format!("sluice-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_file = dir.join("cert.pem");
    let key_file = dir.join("key.pem");
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.key_pair.serialize_pem()).unwrap();
    let files = sluice_server::TlsFiles {
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
    };
    let s = start(move |c| c.tls = Some(files)).await;
    let root = reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(root)
        .resolve("localhost", s.addr)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}", s.addr.port());
    let v: Value = client
        .post(format!("{url}/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
    // Plain HTTP on the TLS port is refused, and the server carries on.
    let plain = reqwest::get(format!("http://{}/health", s.addr)).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    let ok = client.get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    s.shutdown().await;

    // A bad key file is an error naming the flag.
    std::fs::write(&key_file, "not a key").unwrap();
    let e = sluice_server::tls::acceptor(&sluice_server::TlsFiles {
        cert_file,
        key_file,
    })
    .err()
    .expect("a bad key is refused")
    .to_string();
    assert!(e.starts_with("--ssl-keyfile"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
