//! Everything the benchmark asks the server besides the measured requests:
//! the model list, vLLM's prompt re-alignment through `/tokenize` and
//! `/detokenize`, the KV-drain check on `/metrics`, and the server
//! process's resident memory (`--server-pid`).

use super::dataset::SampleRequest;
use anyhow::{bail, Context, Result};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The first model of `/v1/models`: its `id` (the name to send) and its
/// `root` (vLLM's model id; the id when the server gives no root).
pub async fn first_model(client: &reqwest::Client, base_url: &str) -> Result<(String, String)> {
    let url = format!("{base_url}/v1/models");
    let resp = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("--base-url: cannot reach {url}"))?;
    if !resp.status().is_success() {
        bail!("{url} answered {}; pass --model", resp.status());
    }
    let v: Value = resp
        .json()
        .await
        .with_context(|| format!("{url}: the answer is not JSON"))?;
    let first = &v["data"][0];
    let id = first["id"]
        .as_str()
        .with_context(|| format!("{url} lists no model; pass --model"))?;
    let root = first["root"].as_str().unwrap_or(id);
    Ok((id.to_string(), root.to_string()))
}

async fn tokenize(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    prompt: &str,
) -> Result<Vec<u32>, (Option<u16>, String)> {
    tokenize_with(client, base_url, model, prompt, false).await
}

async fn tokenize_with(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    prompt: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, (Option<u16>, String)> {
    let resp = client
        .post(format!("{base_url}/tokenize"))
        .json(&json!({"model": model, "prompt": prompt, "add_special_tokens": add_special_tokens}))
        .send()
        .await
        .map_err(|e| (None, e.to_string()))?;
    let status = resp.status();
    if !status.is_success() {
        return Err((Some(status.as_u16()), format!("HTTP {status}")));
    }
    let v: Value = resp.json().await.map_err(|e| (None, e.to_string()))?;
    v["tokens"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|t| t.as_u64().map(|t| t as u32))
                .collect::<Option<Vec<u32>>>()
        })
        .ok_or((None, "no `tokens` array in the answer".to_string()))
}

async fn detokenize(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    tokens: &[u32],
) -> Option<String> {
    let resp = client
        .post(format!("{base_url}/detokenize"))
        .json(&json!({"model": model, "tokens": tokens}))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let v: Value = resp.json().await.ok()?;
    v["prompt"].as_str().map(str::to_string)
}

/// vLLM's `_align_prompts_to_server_tokenizer`: when the server tokenizes
/// the first prompt to a different length than the local tokenizer did,
/// every prompt longer there is cut to its intended length with the
/// server's own tokens. Problems only warn: the prompts stay as they are.
pub async fn align_prompts(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    requests: Vec<SampleRequest>,
) -> Vec<SampleRequest> {
    let Some(first) = requests.first() else {
        return requests;
    };
    let server_len = match tokenize(client, base_url, model, &first.prompt).await {
        Ok(t) => t.len(),
        Err((Some(404), _)) => {
            eprintln!(
                "WARNING: /tokenize unavailable (404: no /tokenize route, or no model named \
                 {model:?}), skipping alignment."
            );
            return requests;
        }
        Err((_, e)) => {
            eprintln!("WARNING: /tokenize probe failed ({e}), skipping alignment.");
            return requests;
        }
    };
    if server_len == first.prompt_len {
        return requests;
    }
    eprintln!(
        "WARNING: tokenizer mismatch (server={server_len}, expected={}), re-aligning prompts.",
        first.prompt_len
    );
    let fixed = stream::iter(requests.into_iter().map(|req| async move {
        let Ok(tokens) = tokenize(client, base_url, model, &req.prompt).await else {
            return req;
        };
        if tokens.len() <= req.prompt_len {
            return req;
        }
        match detokenize(client, base_url, model, &tokens[..req.prompt_len]).await {
            Some(prompt) => SampleRequest { prompt, ..req },
            None => req,
        }
    }))
    .buffered(64)
    .collect::<Vec<_>>()
    .await;
    fixed
}

/// No local tokenizer: each drafted prompt is fitted to its length in the
/// server's tokens through `/tokenize` and `/detokenize` (see
/// [`fit_one`]), the special tokens the server adds (a BOS) counted in
/// the length, as `--random-input-len` counts them. A server without
/// `/tokenize` keeps the drafts, with a warning.
pub async fn fit_to_server(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    requests: Vec<SampleRequest>,
    disable_bar: bool,
) -> Vec<SampleRequest> {
    let with = tokenize_with(client, base_url, model, "", true).await;
    let without = tokenize_with(client, base_url, model, "", false).await;
    let specials = match (with, without) {
        (Ok(a), Ok(b)) => a.len().saturating_sub(b.len()),
        (Err((code, e)), _) | (_, Err((code, e))) => {
            let code = code.map_or(String::new(), |c| format!("{c}: "));
            eprintln!(
                "WARNING: /tokenize unavailable ({code}{e}): the prompts keep the built-in \
                 tokenizer's lengths; pass --tokenizer for exact lengths."
            );
            return requests;
        }
    };
    eprintln!(
        "Fitting {} prompts to the server's tokenizer through /tokenize...",
        requests.len()
    );
    let bar = super::progress_bar(requests.len() as u64, disable_bar);
    let missed = std::sync::atomic::AtomicUsize::new(0);
    let fitted = stream::iter(requests.into_iter().map(|req| {
        let (bar, missed) = (&bar, &missed);
        async move {
            let target = req.prompt_len.saturating_sub(specials).max(1);
            let out = match fit_one(client, base_url, model, &req.prompt, target).await {
                Some((prompt, len)) => {
                    if len != target {
                        missed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    SampleRequest {
                        prompt,
                        prompt_len: len + specials,
                        ..req
                    }
                }
                None => {
                    missed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    req
                }
            };
            bar.inc(1);
            out
        }
    }))
    .buffered(16)
    .collect::<Vec<_>>()
    .await;
    bar.finish_and_clear();
    let missed = missed.into_inner();
    if missed > 0 {
        eprintln!(
            "{missed} prompts did not reach their exact length in the server's tokens (the \
             summary shows the achieved lengths)."
        );
    }
    fitted
}

/// One prompt fitted to `target` tokens of the server's tokenizer: the
/// draft is repeated until it is long enough there, its server tokens cut
/// to `target` and turned back into text, then that text is measured again
/// (a cut can merge or split tokens at the seam) and the cut moved by the
/// difference, a few times. Returns the text and its length there (the
/// closest one found), or `None` when the server did not answer.
async fn fit_one(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    draft: &str,
    target: usize,
) -> Option<(String, usize)> {
    let mut text = draft.to_string();
    let mut tokens = tokenize(client, base_url, model, &text).await.ok()?;
    for _ in 0..8 {
        if tokens.len() >= target || text.is_empty() {
            break;
        }
        text = format!("{text} {text}");
        tokens = tokenize(client, base_url, model, &text).await.ok()?;
    }
    if tokens.len() <= target {
        let n = tokens.len();
        return Some((text, n));
    }
    let mut best: Option<(String, usize)> = None;
    let mut cut = target;
    let mut tried = Vec::new();
    for _ in 0..6 {
        tried.push(cut);
        let prompt = detokenize(client, base_url, model, &tokens[..cut]).await?;
        let n = tokenize(client, base_url, model, &prompt).await.ok()?.len();
        let closer = best
            .as_ref()
            .is_none_or(|(_, b)| n.abs_diff(target) < b.abs_diff(target));
        if closer {
            best = Some((prompt, n));
        }
        if n == target {
            break;
        }
        let next = (cut as i64 + target as i64 - n as i64).clamp(1, tokens.len() as i64) as usize;
        if tried.contains(&next) {
            break;
        }
        cut = next;
    }
    best
}

/// The sum over label sets of one metric in Prometheus text (`None` when
/// the metric is absent). Only the exact name counts, not longer names it
/// prefixes.
pub fn prometheus_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = match rest.chars().next() {
            Some('{') => match rest.find('}') {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            Some(' ') | Some('\t') => rest,
            _ => continue,
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

pub const DRAIN_METRICS: [&str; 3] = [
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
];

/// Polls `/metrics` until the drain metrics are all 0, for at most
/// `timeout`; returns their last values and whether they drained.
pub async fn wait_for_drain(
    client: &reqwest::Client,
    base_url: &str,
    timeout: Duration,
) -> Result<([f64; 3], bool)> {
    let url = format!("{base_url}/metrics");
    let deadline = Instant::now() + timeout;
    loop {
        let text = client
            .get(&url)
            .send()
            .await
            .with_context(|| format!("--check-kv-drain: cannot read {url}"))?
            .text()
            .await
            .with_context(|| format!("--check-kv-drain: cannot read {url}"))?;
        let mut values = [0.0; 3];
        for (v, name) in values.iter_mut().zip(DRAIN_METRICS) {
            *v = prometheus_value(&text, name)
                .with_context(|| format!("--check-kv-drain: {url} has no {name}"))?;
        }
        if values == [0.0; 3] {
            return Ok((values, true));
        }
        if Instant::now() > deadline {
            return Ok((values, false));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `--server-pid`: a pid, a file holding one, or `auto`: the local process
/// that listens on `port` (found through /proc/net/tcp{,6} and the
/// processes' socket descriptors).
pub fn resolve_pid(spec: &str, port: Option<u16>) -> Result<u32> {
    let spec = spec.trim();
    if let Ok(pid) = spec.parse::<u32>() {
        return Ok(pid);
    }
    if spec == "auto" {
        let port = port.context("--server-pid auto: the server URL has no port")?;
        return listener_pid(port).with_context(|| {
            format!("--server-pid auto: no local process of this user listens on port {port}")
        });
    }
    let text = std::fs::read_to_string(spec)
        .with_context(|| format!("--server-pid: {spec:?} is not a pid nor a readable pid file"))?;
    text.trim()
        .parse::<u32>()
        .with_context(|| format!("--server-pid: {spec} does not hold a pid"))
}

fn listener_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT; state 0A is LISTEN.
            if f.len() > 9 && f[3] == "0A" {
                let p = f[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                if p == Some(port) {
                    inodes.push(format!("socket:[{}]", f[9]));
                }
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The process's resident set (VmRSS) in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The port of an http(s) URL (explicit, or the scheme's default).
pub fn url_port(url: &str) -> Option<u16> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit('@').next()?;
    let after_host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.1,
        None => host_port.find(':').map_or("", |i| &host_port[i..]),
    };
    match after_host.strip_prefix(':') {
        Some(p) => p.parse().ok(),
        None => Some(if scheme == "https" { 443 } else { 80 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn prometheus_values_by_exact_name() {
        let text = "# HELP vllm:num_requests_running x\n\
                    vllm:num_requests_running{model_name=\"a\"} 2\n\
                    vllm:num_requests_running{model_name=\"b\"} 1\n\
                    vllm:num_requests_running_total 99\n\
                    vllm:kv_cache_usage_perc 0.25\n";
        assert_eq!(
            prometheus_value(text, "vllm:num_requests_running"),
            Some(3.0)
        );
        assert_eq!(
            prometheus_value(text, "vllm:kv_cache_usage_perc"),
            Some(0.25)
        );
        assert_eq!(prometheus_value(text, "vllm:num_requests_waiting"), None);
    }

    #[test]
    fn ports_of_urls() {
        assert_eq!(url_port("http://127.0.0.1:8000"), Some(8000));
        assert_eq!(url_port("http://[::1]:9/x"), Some(9));
        assert_eq!(url_port("https://example.com/v1"), Some(443));
        assert_eq!(url_port("http://example.com"), Some(80));
    }

    #[test]
    fn pids_and_pid_files() {
        assert_eq!(resolve_pid("123", None).unwrap(), 123);
        let dir = std::env::temp_dir().join(format!("sluice-bench-pid-{}", std::process::id()));
        std::fs::write(&dir, "4567\n").unwrap();
        assert_eq!(resolve_pid(dir.to_str().unwrap(), None).unwrap(), 4567);
        std::fs::remove_file(&dir).unwrap();
        assert!(
            format!("{:#}", resolve_pid("/no/such/file", None).unwrap_err())
                .contains("--server-pid")
        );
    }

    #[test]
    fn auto_finds_the_listener() {
        if !Path::new("/proc/net/tcp").exists() {
            return; // not Linux, or no procfs: `auto` cannot work there
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(resolve_pid("auto", Some(port)).unwrap(), std::process::id());
        assert!(rss_kib(std::process::id()).is_some_and(|k| k > 0));
    }
}
