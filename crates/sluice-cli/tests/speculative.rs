//! `--speculative-config` on the command line: a bad configuration exits 2
//! naming the field, and `sluice generate` on SmolLM2 prints the same
//! completion with each method as without, plus the acceptance counters.

mod common;

use std::process::Command;

fn sluice(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("sluice runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_configurations_exit_2_naming_the_field() {
    let cases = [
        (
            r#"{"method": "bogus", "num_speculative_tokens": 2}"#,
            "method: unknown speculative method",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
            "greater than zero (0)",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 40}"#,
            "num_speculative_tokens=40 must be <= 32",
        ),
        (
            r#"{"method": "ngram"}"#,
            "num_speculative_tokens must be provided",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2, "typo": 1}"#,
            "typo: unknown field",
        ),
        (
            r#"{"method": "suffix", "suffix_decoding_min_token_prob": 2}"#,
            "suffix_decoding_min_token_prob=2 must be in [0, 1]",
        ),
        (
            r#"{"model": "no-such-draft.gguf", "num_speculative_tokens": 2}"#,
            "model: no-such-draft.gguf",
        ),
        ("not json", "not valid JSON"),
    ];
    for (json, want) in cases {
        let (code, _, err) = sluice(&[
            "generate",
            "--builtin",
            "tiny",
            "--prompt",
            "hi",
            "--speculative-config",
            json,
        ]);
        assert_eq!(code, Some(2), "{json}: {err}");
        assert!(
            err.contains("--speculative-config") && err.contains(want),
            "{json}: {err:?} does not name the flag and say {want:?}"
        );
    }
    // k beyond the context.
    let (code, _, err) = sluice(&[
        "generate",
        "--builtin",
        "tiny",
        "--max-model-len",
        "8",
        "--prompt",
        "hi",
        "--speculative-config",
        r#"{"method": "ngram", "num_speculative_tokens": 8}"#,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("num_speculative_tokens=8 does not fit in --max-model-len 8"),
        "{err}"
    );
    // The simulated executor does not draft.
    let (code, _, err) = sluice(&[
        "serve",
        "--executor",
        "simulated",
        "--profile",
        "h100-sxm",
        "--speculative-config",
        r#"{"method": "ngram", "num_speculative_tokens": 2}"#,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--speculative-config"), "{err}");
}

/// A draft model with another vocabulary (Gemma 3's 262,144 tokens for
/// SmolLM2's 49,152) is refused with vLLM's message, exit 2.
#[test]
fn a_draft_with_another_vocabulary_exits_2() {
    let target = common::smollm2();
    let draft = match std::env::var_os("SLUICE_GEMMA3_GGUF") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../.cache/models/gemma-3-270m-q4_k_m.gguf"),
    };
    assert!(
        draft.exists(),
        "{} is missing: run .ci/test (tools/fetch_gemma3.sh) or set SLUICE_GEMMA3_GGUF",
        draft.display()
    );
    let spec = format!(
        r#"{{"model": {:?}, "num_speculative_tokens": 3}}"#,
        draft.display().to_string()
    );
    let (code, _, err) = sluice(&[
        "generate",
        "--model",
        target.to_str().unwrap(),
        "--prompt",
        "hi",
        "--speculative-config",
        &spec,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--speculative-config")
            && err.contains("Target and draft model should have the same vocabulary size")
            && err.contains("Target model vocab_size=49152"),
        "{err}"
    );
}

#[test]
fn generate_with_each_method_prints_the_same_completion() {
    let model = common::smollm2();
    let model = model.to_str().unwrap();
    let prompt = "<|im_start|>user\nFix the typo and print the code again:\n\
                  def add(a, b):\n    retrun a + b\n<|im_end|>\n<|im_start|>assistant\n";
    let run = |spec: Option<&str>| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            prompt,
            "--max-tokens",
            "40",
            "--temperature",
            "0",
            "--threads",
            "2",
        ];
        if let Some(s) = spec {
            args.extend(["--speculative-config", s]);
        }
        let (code, out, err) = sluice(&args);
        assert_eq!(code, Some(0), "{spec:?}: {err}");
        (out, err)
    };
    let (want, plain_err) = run(None);
    assert!(!plain_err.contains("speculative decoding"), "{plain_err}");
    assert!(want.contains("return a + b"), "{want}");
    for spec in [
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3}"#,
        r#"{"method": "suffix"}"#,
    ] {
        let (got, err) = run(Some(spec));
        assert_eq!(got, want, "{spec}");
        let line = err
            .lines()
            .find(|l| l.starts_with("[speculative decoding:"))
            .unwrap_or_else(|| panic!("{spec}: no counters in {err}"));
        let accepted: u64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("accepted_tokens="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(accepted > 0, "{spec}: {line}");
    }
}

#[test]
fn serve_reports_vllms_spec_decode_metrics() {
    let model = common::smollm2();
    let mut serve = common::spawn_serve(
        &[
            "--model",
            model.to_str().unwrap(),
            "--max-model-len",
            "512",
            "--speculative-config",
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}"#,
        ],
        &[],
    );
    serve.drain_log();
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let body = serde_json::json!({
        "messages": [{"role": "user", "content":
            "Fix the typo and print the code again:\ndef add(a, b):\n    retrun a + b\n"}],
        "temperature": 0,
        "max_tokens": 40,
    });
    let metrics = rt.block_on(async move {
        let c = reqwest::Client::new();
        let v: serde_json::Value = c
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
        c.get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let value = |line_start: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("no {line_start} in the metrics"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let drafts = value("vllm:spec_decode_num_drafts_total{");
    let draft_tokens = value("vllm:spec_decode_num_draft_tokens_total{");
    let accepted = value("vllm:spec_decode_num_accepted_tokens_total{");
    assert!(
        drafts > 0.0 && accepted > 0.0 && accepted <= draft_tokens,
        "{metrics}"
    );
    // Per position 0..k, summing to the accepted tokens.
    let per_pos: f64 = (0..3)
        .map(|p| {
            let line = metrics
                .lines()
                .find(|l| {
                    l.starts_with("vllm:spec_decode_num_accepted_tokens_per_pos_total{")
                        && l.contains(&format!("position=\"{p}\""))
                })
                .unwrap_or_else(|| panic!("no position {p} in {metrics}"));
            line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
        })
        .sum();
    assert_eq!(per_pos, accepted, "{metrics}");
    serve.terminate_and_wait();
}
