//! `sluice bench`: a load-generating client for any OpenAI-compatible
//! server (sluice's own, vLLM, ...). It keeps `--concurrency` requests in
//! flight until `--num-requests` have been sent, optionally hanging up on a
//! fraction of the streams part-way, and reports outcomes, latencies and
//! throughput as a table and one JSON line. With `--check-kv-drain` it then
//! reads `/metrics` until `vllm:kv_cache_usage_perc` and the running and
//! waiting counts are back to 0 (a leak check), and reports the server's
//! resident memory when the server is local (`--server-pid`).

use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use serde_json::json;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Base URL of the server (without /v1).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Model name to send [default: the first of /v1/models].
    #[arg(long)]
    model: Option<String>,
    /// Requests to send in all.
    #[arg(long, default_value_t = 2000)]
    num_requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Prompt length in words (random words, so prompts differ).
    #[arg(long, default_value_t = 32)]
    prompt_words: usize,
    /// Share a fixed prefix of this many words across prompts (exercises
    /// prefix caching).
    #[arg(long, default_value_t = 16)]
    shared_prefix_words: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Use /v1/chat/completions instead of /v1/completions.
    #[arg(long)]
    chat: bool,
    /// Stream the responses (SSE).
    #[arg(long)]
    stream: bool,
    /// Fraction of streamed requests whose client disconnects after the
    /// first chunk.
    #[arg(long, default_value_t = 0.0)]
    disconnect_fraction: f64,
    /// After the run, wait for the server's KV usage and queues to drain to
    /// 0 (fails if they do not within 30 s).
    #[arg(long)]
    check_kv_drain: bool,
    /// Server process id, to report its resident memory (VmRSS) before and
    /// after.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Seed of the prompt generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: BenchArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(bench(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sluice bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Default)]
struct Results {
    ok: usize,
    overloaded: usize,
    disconnected: usize,
    failed: Vec<String>,
    ttft: Vec<f64>,
    e2e: Vec<f64>,
    output_tokens: usize,
}

const WORDS: &[&str] = &[
    "river", "stone", "light", "paper", "garden", "window", "engine", "signal", "market", "winter",
    "silver", "forest", "bridge", "letter", "number", "planet", "circle", "memory", "harbor",
    "thread",
];

fn prompt(seed: u64, i: usize, shared: usize, words: usize) -> String {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = Vec::with_capacity(words);
    for w in 0..words {
        let idx = if w < shared {
            w % WORDS.len()
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % WORDS.len() as u64) as usize
        };
        out.push(WORDS[idx]);
    }
    out.join(" ")
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

async fn metric(client: &reqwest::Client, url: &str, name: &str) -> Result<f64> {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("/metrics has no {name}"))
}

async fn one_request(
    client: reqwest::Client,
    args: Arc<BenchArgs>,
    model: String,
    i: usize,
    results: Arc<Mutex<Results>>,
) {
    let text = prompt(args.seed, i, args.shared_prefix_words, args.prompt_words);
    let (path, body) = if args.chat {
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": text}],
                   "max_tokens": args.max_tokens, "stream": args.stream, "ignore_eos": true}),
        )
    } else {
        (
            "/v1/completions",
            json!({"model": model, "prompt": text, "max_tokens": args.max_tokens,
                   "stream": args.stream, "ignore_eos": true}),
        )
    };
    // Deterministic choice of the requests that hang up.
    let hang_up = args.stream && ((i as f64 * 0.618_033_988_75).fract() < args.disconnect_fraction);
    let start = Instant::now();
    let resp = match client
        .post(format!("{}{path}", args.url))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            results
                .lock()
                .await
                .failed
                .push(format!("request {i}: {e}"));
            return;
        }
    };
    let status = resp.status();
    if status.as_u16() == 503 {
        results.lock().await.overloaded += 1;
        return;
    }
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        results
            .lock()
            .await
            .failed
            .push(format!("request {i}: HTTP {status}: {body}"));
        return;
    }
    if args.stream {
        let mut body = resp.bytes_stream();
        let mut ttft = None;
        let mut buf = String::new();
        let mut done = false;
        let mut tokens = 0usize;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    results
                        .lock()
                        .await
                        .failed
                        .push(format!("request {i}: stream broke: {e}"));
                    return;
                }
            };
            if ttft.is_none() {
                ttft = Some(start.elapsed().as_secs_f64());
                if hang_up {
                    drop(body);
                    let mut r = results.lock().await;
                    r.disconnected += 1;
                    return;
                }
            }
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(pos) = buf.find("\n\n") {
                let event: String = buf.drain(..pos + 2).collect();
                for line in event.lines() {
                    let Some(data) = line.strip_prefix("data: ") else {
                        continue;
                    };
                    if data.trim() == "[DONE]" {
                        done = true;
                    } else if data.contains("\"error\"") {
                        results
                            .lock()
                            .await
                            .failed
                            .push(format!("request {i}: error event {data}"));
                        return;
                    } else {
                        tokens += 1;
                    }
                }
            }
        }
        let mut r = results.lock().await;
        if !done {
            r.failed
                .push(format!("request {i}: stream ended without [DONE]"));
            return;
        }
        r.ok += 1;
        r.output_tokens += tokens;
        r.ttft.push(ttft.unwrap_or_default());
        r.e2e.push(start.elapsed().as_secs_f64());
    } else {
        let v: serde_json::Value = match resp.json().await {
            Ok(v) => v,
            Err(e) => {
                results
                    .lock()
                    .await
                    .failed
                    .push(format!("request {i}: bad body: {e}"));
                return;
            }
        };
        let mut r = results.lock().await;
        r.ok += 1;
        r.output_tokens += v["usage"]["completion_tokens"].as_u64().unwrap_or(0) as usize;
        r.e2e.push(start.elapsed().as_secs_f64());
    }
}

async fn bench(args: BenchArgs) -> Result<bool> {
    if args.concurrency == 0 || args.num_requests == 0 {
        bail!("--concurrency and --num-requests must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.disconnect_fraction) {
        bail!("--disconnect-fraction must be in [0, 1]");
    }
    let url = args.url.trim_end_matches('/').to_string();
    let args = Arc::new(BenchArgs {
        url: url.clone(),
        ..args
    });
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()
        .context("cannot build the HTTP client")?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let v: serde_json::Value = client
                .get(format!("{url}/v1/models"))
                .send()
                .await
                .with_context(|| format!("--url: cannot reach {url}"))?
                .json()
                .await?;
            v["data"][0]["id"]
                .as_str()
                .context("/v1/models lists no model")?
                .to_string()
        }
    };
    let rss_before = args.server_pid.and_then(rss_kib);
    let results = Arc::new(Mutex::new(Results::default()));
    let start = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, args, model, results, next) = (
            client.clone(),
            args.clone(),
            model.clone(),
            results.clone(),
            next.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= args.num_requests {
                    break;
                }
                one_request(
                    client.clone(),
                    args.clone(),
                    model.clone(),
                    i,
                    results.clone(),
                )
                .await;
            }
        }));
    }
    for w in workers {
        w.await.context("a client task panicked")?;
    }
    let elapsed = start.elapsed().as_secs_f64();

    let mut drained = None;
    if args.check_kv_drain {
        let deadline = Instant::now() + Duration::from_secs(30);
        let state = loop {
            let state = (
                metric(&client, &url, "vllm:kv_cache_usage_perc").await?,
                metric(&client, &url, "vllm:num_requests_running").await?,
                metric(&client, &url, "vllm:num_requests_waiting").await?,
            );
            if state == (0.0, 0.0, 0.0) || Instant::now() > deadline {
                break state;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        drained = Some(state);
    }
    let rss_after = args.server_pid.and_then(rss_kib);

    let mut r = results.lock().await;
    let (ttft50, ttft99) = (percentile(&mut r.ttft, 0.5), percentile(&mut r.ttft, 0.99));
    let (e2e50, e2e99) = (percentile(&mut r.e2e, 0.5), percentile(&mut r.e2e, 0.99));
    println!("requests            {}", args.num_requests);
    println!("  ok                {}", r.ok);
    println!("  503 (overloaded)  {}", r.overloaded);
    println!("  hung up on        {}", r.disconnected);
    println!("  failed            {}", r.failed.len());
    println!("wall time           {elapsed:.2} s");
    println!("requests/s          {:.1}", r.ok as f64 / elapsed);
    println!(
        "output chunks/s     {:.1}",
        r.output_tokens as f64 / elapsed
    );
    if args.stream {
        println!(
            "TTFT p50 / p99      {:.1} / {:.1} ms",
            ttft50 * 1e3,
            ttft99 * 1e3
        );
    }
    println!(
        "e2e p50 / p99       {:.1} / {:.1} ms",
        e2e50 * 1e3,
        e2e99 * 1e3
    );
    if let Some((kv, run, wait)) = drained {
        println!("after the run       kv_cache_usage {kv}, running {run}, waiting {wait}");
    }
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        println!(
            "server RSS          {:.1} MiB before, {:.1} MiB after",
            a as f64 / 1024.0,
            b as f64 / 1024.0
        );
    }
    for f in r.failed.iter().take(10) {
        eprintln!("failure: {f}");
    }
    println!(
        "{}",
        json!({
            "num_requests": args.num_requests, "concurrency": args.concurrency,
            "ok": r.ok, "overloaded": r.overloaded, "disconnected": r.disconnected,
            "failed": r.failed.len(), "wall_s": elapsed,
            "ttft_p50_ms": ttft50 * 1e3, "ttft_p99_ms": ttft99 * 1e3,
            "e2e_p50_ms": e2e50 * 1e3, "e2e_p99_ms": e2e99 * 1e3,
            "kv_after": drained.map(|d| d.0), "running_after": drained.map(|d| d.1),
            "waiting_after": drained.map(|d| d.2),
            "server_rss_kib_before": rss_before, "server_rss_kib_after": rss_after,
        })
    );
    let drained_ok = drained.is_none_or(|d| d == (0.0, 0.0, 0.0));
    Ok(r.failed.is_empty() && drained_ok)
}
