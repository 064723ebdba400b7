//! `sluice bench`'s prompt lengths against `sluice serve --model` on the
//! real SmolLM2-135M-Instruct GGUF file, measured from outside the bench:
//! the server's own `/metrics` (`vllm:request_prompt_tokens`, one
//! observation per finished request, its usage `prompt_tokens`).
//!
//! The reference is vLLM's random dataset (`vllm bench serve --dataset-name
//! random`): each request's sampled length is drawn in
//! `[floor((L - s)(1 - r)), ceil((L - s)(1 + r))]` (`L` the input length, `r`
//! the range ratio, `s` the special tokens encoding adds), the specials come
//! on top, and `gen_prompt_decode_to_target_len` re-encodes each prompt to
//! exactly its drawn length (vLLM only warns about the rare prompt that
//! still misses after ten tries). With the server's own tokenizer, so the
//! server counts exactly `L` tokens per request at `r = 0`, and no
//! "tokenizer mismatch" re-alignment happens.
//!
//! Also: every flag error exits 2, naming the flag.

mod common;

use serde_json::Value;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("bench")
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("sluice bench runs")
}

fn ok(out: Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "sluice bench failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

fn http(method: &str, url: &str, body: Option<Value>) -> String {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::new();
        let req = match body {
            Some(b) => client.post(url).json(&b),
            None => client.get(url),
        };
        let resp = req.send().await.expect("the server answers");
        assert!(
            resp.status().is_success(),
            "{method} {url}: {}",
            resp.status()
        );
        resp.text().await.expect("a body")
    })
}

/// `vllm:request_prompt_tokens`'s sum and count, from the server.
fn prompt_token_histogram(url: &str) -> (f64, f64) {
    let text = http("GET", &format!("{url}/metrics"), None);
    let value = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (
        value("vllm:request_prompt_tokens_sum"),
        value("vllm:request_prompt_tokens_count"),
    )
}

/// The special tokens the server's tokenizer adds to a prompt.
fn server_specials(url: &str) -> usize {
    let count = |add: bool| {
        let v: Value = serde_json::from_str(&http(
            "POST",
            &format!("{url}/tokenize"),
            Some(serde_json::json!({"prompt": "", "add_special_tokens": add})),
        ))
        .expect("JSON");
        v["tokens"].as_array().expect("tokens").len()
    };
    count(true) - count(false)
}

/// The summary's "Prompt tokens achieved" figures: mean, std, min, max.
fn achieved(stdout: &str) -> (f64, f64, usize, usize) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("Prompt tokens achieved (mean ± std):"))
        .unwrap_or_else(|| panic!("no achieved line in\n{stdout}"));
    let rest = line.split(':').nth(1).expect("a value");
    let nums: Vec<f64> = rest
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("a number"))
        .collect();
    assert_eq!(nums.len(), 4, "{line}");
    (nums[0], nums[1], nums[2] as usize, nums[3] as usize)
}

fn requested_line(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.starts_with("Prompt tokens requested:"))
        .unwrap_or_else(|| panic!("no requested line in\n{stdout}"))
        .trim_end()
        .to_string()
}

#[test]
fn prompts_have_the_requested_lengths_in_the_servers_tokens() {
    let model = common::smollm2();
    let model = model.to_str().expect("utf-8 path");
    let mut serve = common::spawn_serve(&["--model", model, "--max-model-len", "256"], &[]);
    serve.drain_log();
    let url = serve.url.clone();
    let specials = server_specials(&url);
    let common_args = |n: &'static str, len: &'static str, ratio: &'static str| {
        vec![
            "--base-url",
            url.as_str(),
            "--num-prompts",
            n,
            "--random-input-len",
            len,
            "--random-output-len",
            "2",
            "--random-range-ratio",
            ratio,
        ]
    };

    // 1. --tokenizer FILE.gguf, fixed length: the server counts exactly
    //    L tokens in every request.
    let before = prompt_token_histogram(&url);
    let mut args = common_args("8", "64", "0");
    args.extend(["--tokenizer", model]);
    let (stdout, stderr) = ok(bench(&args));
    let after = prompt_token_histogram(&url);
    assert!(!stderr.contains("mismatch"), "{stderr}");
    assert_eq!(after.1 - before.1, 8.0, "requests the server finished");
    assert_eq!(
        after.0 - before.0,
        8.0 * 64.0,
        "prompt tokens the server counted"
    );
    assert_eq!(
        requested_line(&stdout),
        format!("{:<40} 64", "Prompt tokens requested:")
    );
    assert_eq!(achieved(&stdout), (64.0, 0.0, 64, 64));

    // 2. A range ratio: every length inside vLLM's interval, and the
    //    summary's mean the server's mean.
    let (len, ratio) = (80usize, 0.5f64);
    let real = (len - specials) as f64;
    let lo = (real * (1.0 - ratio)).floor() as usize + specials;
    let hi = (real * (1.0 + ratio)).ceil() as usize + specials;
    let before = prompt_token_histogram(&url);
    let mut args = common_args("16", "80", "0.5");
    args.extend(["--tokenizer", model]);
    let (stdout, stderr) = ok(bench(&args));
    let after = prompt_token_histogram(&url);
    assert!(!stderr.contains("mismatch"), "{stderr}");
    assert_eq!(after.1 - before.1, 16.0);
    let server_mean = (after.0 - before.0) / 16.0;
    let (mean, std, min, max) = achieved(&stdout);
    assert!(
        (mean - server_mean).abs() < 0.05,
        "{mean} vs the server's {server_mean}"
    );
    assert!(
        lo <= min && max <= hi,
        "[{min}, {max}] outside [{lo}, {hi}]"
    );
    assert!(std > 0.0, "lengths vary with a range ratio");
    assert_eq!(
        requested_line(&stdout),
        format!(
            "{:<40} 80 (each in [{lo}, {hi}])",
            "Prompt tokens requested:"
        )
    );

    // 3. No --tokenizer: the server's /tokenize fits the prompts, with the
    //    same exact lengths.
    let before = prompt_token_histogram(&url);
    let (stdout, stderr) = ok(bench(&common_args("8", "48", "0")));
    let after = prompt_token_histogram(&url);
    assert!(stderr.contains("/tokenize"), "{stderr}");
    assert!(!stderr.contains("mismatch"), "{stderr}");
    assert_eq!(after.1 - before.1, 8.0);
    assert_eq!(after.0 - before.0, 8.0 * 48.0);
    assert_eq!(achieved(&stdout), (48.0, 0.0, 48, 48));
}

#[test]
fn every_flag_error_exits_2_naming_the_flag() {
    let empty = std::env::temp_dir().join(format!("sluice-bench-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let empty_s = empty.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--num-prompts", "many"], "--num-prompts"),
        (vec!["--request-rate", "fast"], "--request-rate"),
        (vec!["--random-input-len=-5"], "--random-input-len"),
        (vec!["--random-range-ratio", "1.5"], "--random-range-ratio"),
        (vec!["--max-concurrency", "0"], "--max-concurrency"),
        (vec!["--port", "http"], "--port"),
        (vec!["--dataset-name", "sharegpt"], "--dataset-name"),
        (vec!["--tokenizer", "models/missing.gguf"], "--tokenizer"),
        (vec!["--tokenizer", "./no/such/tokenizer"], "--tokenizer"),
        (vec!["--tokenizer", &empty_s], "--tokenizer"),
    ];
    for (args, flag) in cases {
        // A port nothing listens on: no case may get as far as the server.
        let mut all = vec!["--base-url", "http://127.0.0.1:9"];
        all.extend(&args);
        let out = bench(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        if flag == "--tokenizer" {
            assert!(stderr.contains(args[1]), "names the path: {stderr}");
        }
        assert!(
            !stderr.contains("127.0.0.1:9"),
            "{args:?} reached for the server: {stderr}"
        );
    }
    std::fs::remove_dir_all(&empty).unwrap();
}
