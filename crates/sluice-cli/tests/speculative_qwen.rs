//! The Qwen2.5-Coder pair (1.5B-Instruct target, 0.5B draft; 1.6 GB from
//! PyPI, so behind `SLUICE_QWEN_CODER=1`): on the three prompts of
//! `tools/speculative_prompts/`, `sluice generate` prints the same greedy
//! completion with n-gram, suffix and draft-model speculation as without,
//! also with a stop string and with two prompts at once. With the switch
//! set, the files are fetched (`tools/fetch_qwen_coder.sh`, sha256-checked)
//! and a failed fetch fails the test saying why; without it the test says
//! it did not run.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fetch(which: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("tools/fetch_qwen_coder.sh"))
        .arg(which)
        .current_dir(repo())
        .output()
        .expect("bash runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "tools/fetch_qwen_coder.sh {which} failed:\n{log}"
    );
    let name = match which {
        "0.5b" => "qwen2.5-coder-0.5b-q4_k_m.gguf",
        _ => "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    };
    repo().join(".cache/models").join(name)
}

fn chat(prompt: &str) -> String {
    let text = std::fs::read_to_string(repo().join("tools/speculative_prompts").join(prompt))
        .expect("prompt file");
    format!(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        text.trim_end()
    )
}

fn generate(target: &Path, prompts: &[String], spec: Option<&str>, extra: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["generate", "--model"]).arg(target);
    for p in prompts {
        cmd.args(["--prompt", p]);
    }
    cmd.args([
        "--max-tokens",
        "96",
        "--temperature",
        "0",
        "--max-model-len",
        "2048",
    ]);
    cmd.args(extra);
    if let Some(s) = spec {
        cmd.args(["--speculative-config", s]);
    }
    let out = cmd.output().expect("sluice runs");
    assert!(
        out.status.success(),
        "{spec:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn qwen_coder_pair_keeps_every_greedy_output() {
    if std::env::var("SLUICE_QWEN_CODER").as_deref() != Ok("1") {
        eprintln!(
            "not run: set SLUICE_QWEN_CODER=1 to fetch the Qwen2.5-Coder pair (1.6 GB) and run it"
        );
        return;
    }
    let target = fetch("1.5b");
    let draft = fetch("0.5b");
    let specs = [
        r#"{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}"#.to_string(),
        r#"{"method": "suffix", "num_speculative_tokens": 16}"#.to_string(),
        format!(r#"{{"model": {:?}, "num_speculative_tokens": 4}}"#, draft.display().to_string()),
    ];
    for prompt in ["code_edit.txt", "quoting_summary.txt", "story.txt"] {
        let p = [chat(prompt)];
        let want = generate(&target, &p, None, &[]);
        for spec in &specs {
            assert_eq!(
                generate(&target, &p, Some(spec), &[]),
                want,
                "{prompt}: {spec}"
            );
        }
        // A stop string from the middle of the completion.
        let mid = want
            .char_indices()
            .nth(want.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        let stop: String = want[mid..].chars().take(4).collect();
        let stopped = generate(&target, &p, None, &["--stop", &stop]);
        for spec in &specs {
            let got = generate(&target, &p, Some(spec), &["--stop", &stop]);
            assert_eq!(got, stopped, "{prompt} with --stop {stop:?}: {spec}");
        }
    }
    // Two prompts at once (a batch of two with drafts).
    let two = [chat("code_edit.txt"), chat("story.txt")];
    let want = generate(&target, &two, None, &[]);
    for spec in &specs {
        assert_eq!(
            generate(&target, &two, Some(spec), &[]),
            want,
            "two prompts: {spec}"
        );
    }
}
