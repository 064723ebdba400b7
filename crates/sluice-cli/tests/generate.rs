//! `sluice generate` end to end: the fixture models' greedy outputs match
//! Hugging Face transformers' reference, and bad flags fail cleanly.

use serde_json::Value;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-model/tests/data")
        .join(name)
}

/// Runs `sluice` with `args`; (exit code, stdout, stderr). Killed after a
/// generous bound so a hang fails the test instead of the CI run.
fn sluice(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("sluice {args:?} did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code().unwrap_or(-1), out, err)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn check_reference(name: &str) {
    let dir = fixture(name);
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompts = reference["prompts"].as_array().unwrap();
    let dir_arg = dir.to_str().unwrap().to_string();
    let mut args: Vec<String> = [
        "generate",
        "--model",
        &dir_arg,
        "--temperature",
        "0",
        "--ignore-eos",
        "--max-tokens",
        "32",
        "--json",
        "--logprobs",
        "5",
        // transformers' references are f32 throughout.
        "--kv-cache-dtype",
        "float32",
    ]
    .map(String::from)
    .to_vec();
    for p in prompts {
        args.push("--prompt".into());
        args.push(p["text"].as_str().unwrap().into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = sluice(&args);
    assert_eq!(code, 0, "stderr: {err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), prompts.len(), "{out}");
    for (got, want) in lines.iter().zip(prompts) {
        let label = want["name"].as_str().unwrap();
        assert_eq!(
            ids(&got["prompt_ids"]),
            ids(&want["input_ids"]),
            "{name}/{label}"
        );
        assert_eq!(
            ids(&got["token_ids"]),
            ids(&want["greedy_token_ids"]),
            "{name}/{label}: greedy tokens differ"
        );
        // Top-5 logprobs per step, best first, as in the reference.
        let got_lp = got["logprobs"].as_array().unwrap();
        let want_lp = want["top_logprobs"].as_array().unwrap();
        assert_eq!(got_lp.len(), 32);
        for (g, w) in got_lp.iter().zip(want_lp) {
            let (g, w) = (g.as_array().unwrap(), w.as_array().unwrap());
            assert_eq!(g.len(), 5);
            assert_eq!(g[0]["id"], w[0]["id"], "{name}/{label}");
            let d = g[0]["logprob"].as_f64().unwrap() - w[0]["logprob"].as_f64().unwrap();
            assert!(d.abs() < 1e-3, "{name}/{label}: logprob off by {d}");
        }
    }
}

#[test]
fn greedy_generation_matches_transformers_tiny_qwen2() {
    check_reference("tiny-qwen2");
}

#[test]
fn greedy_generation_matches_transformers_tiny_llama() {
    check_reference("tiny-llama");
}

#[test]
fn prompts_keep_their_command_line_order() {
    let dir = fixture("tiny-qwen2");
    let (code, out, err) = sluice(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "2",
        "--json",
        "--prompt-ids",
        "5,6",
        "--prompt",
        "Hello",
        "--prompt-ids=7",
    ]);
    assert_eq!(code, 0, "{err}");
    let prompt_ids: Vec<Vec<u64>> = out
        .lines()
        .map(|l| ids(&serde_json::from_str::<Value>(l).unwrap()["prompt_ids"]))
        .collect();
    assert_eq!(prompt_ids, vec![vec![5, 6], vec![39, 601, 311], vec![7]]);
}

#[test]
fn the_builtin_model_runs_without_files_and_says_so() {
    let (code, out, err) = sluice(&["generate", "--prompt", "Hi", "--max-tokens", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("built-in \"tiny\" model"), "{err}");
    assert!(err.contains("completion_tokens=3"), "{err}");
    assert!(!out.is_empty());
}

#[test]
fn bad_flags_fail_with_a_message_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["generate", "--prompt", "hi", "--max-tokens", "0"],
            "--max-tokens",
        ),
        (
            &["generate", "--prompt", "hi", "--temperature", "-1"],
            "--temperature",
        ),
        (
            &[
                "generate",
                "--prompt",
                "hi",
                "--min-tokens",
                "5",
                "--max-tokens",
                "2",
            ],
            "--min-tokens",
        ),
        (&["generate", "--prompt-ids", "1,x"], "--prompt-ids"),
        (&["generate", "--prompt-ids", "1,99999"], "--prompt"),
        (&["generate", "--max-tokens", "3"], "--prompt"),
        (
            &[
                "generate",
                "--model",
                "/nonexistent-sluice-dir",
                "--prompt",
                "hi",
            ],
            "--model",
        ),
        (
            &["generate", "--prompt", "hi", "--kv-cache-memory", "lots"],
            "--kv-cache-memory",
        ),
        (
            &["generate", "--prompt", "hi", "--scheduling-policy", "lifo"],
            "--scheduling-policy",
        ),
        (
            &[
                "generate",
                "--prompt",
                "hi",
                "--num-gpu-blocks-override",
                "3",
            ],
            "--max-model-len",
        ),
        (
            &["generate", "--prompt", "hi", "--max-model-len", "999999"],
            "--max-model-len",
        ),
    ];
    for (args, flag) in cases {
        let (code, _, err) = sluice(args);
        assert_ne!(code, 0, "{args:?} succeeded");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A KV cache larger than the machine is refused before it is allocated:
/// one line naming the flag and both sizes, exit status 2 (it used to abort
/// with "memory allocation of ... bytes failed" and a backtrace).
#[cfg(target_os = "linux")]
#[test]
fn a_kv_cache_that_cannot_fit_exits_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "generate",
                "--prompt",
                "hi",
                "--kv-cache-memory",
                "1048576GiB",
            ],
            "error: --kv-cache-memory: 1 PiB requested for the KV cache, but only ",
        ),
        (
            &["serve", "--port", "0", "--kv-cache-memory", "1048576GiB"],
            "sluice serve: --kv-cache-memory: 1 PiB requested for the KV cache, but only ",
        ),
        (
            &[
                "generate",
                "--prompt",
                "hi",
                "--num-gpu-blocks-override",
                "100000000",
            ],
            // 10^8 blocks of 8 KiB (the tiny model, 16-token blocks, the
            // default f16 cache).
            "error: --num-gpu-blocks-override 100000000: 762.9 GiB requested for the KV cache, \
             but only ",
        ),
        (
            &[
                "bench-model",
                "--concurrency",
                "100000",
                "--prompt-len",
                "100000",
            ],
            "sluice bench-model: --concurrency, --prompt-len, --output-len, --block-size: ",
        ),
    ];
    for (args, want) in cases {
        let (code, out, err) = sluice(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains("requested for the KV cache"))
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        assert!(line.starts_with(want), "{args:?}: {line}");
        assert!(
            line.ends_with(" of memory is available"),
            "{args:?}: {line}"
        );
        assert!(!err.contains("memory allocation"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    // A size that overflows is a configuration error too.
    let (code, _, err) = sluice(&["bench-model", "--concurrency", "18446744073709551615"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the KV cache size overflows"), "{err}");
}

#[test]
fn structured_output_flags_constrain_every_completion() {
    let dir = std::env::temp_dir().join(format!("sluice-gen-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}},
            "additionalProperties": false}"#,
    )
    .unwrap();
    let grammar = dir.join("g.lark");
    std::fs::write(&grammar, "start: \"A\" | \"B\" \"C\"\n").unwrap();
    // The built-in tiny model (random weights): only the grammar decides.
    type Check = fn(&str) -> bool;
    let cases: [(&[&str], Check); 4] = [
        (&["--choice", "yes,no"], |t| t == "yes" || t == "no"),
        (&["--regex", "[0-9]{3}"], |t| {
            t.len() == 3 && t.bytes().all(|b| b.is_ascii_digit())
        }),
        (
            &[
                "--json-schema",
                schema.to_str().unwrap(),
                "--whitespace-pattern",
                "[ ]?",
            ],
            |t| serde_json::from_str::<Value>(t).is_ok_and(|v| v["ok"].is_boolean()),
        ),
        (&["--grammar", grammar.to_str().unwrap()], |t| {
            t == "A" || t == "BC"
        }),
    ];
    for (flags, ok) in cases {
        let mut args = vec![
            "generate",
            "--prompt",
            "Hi",
            "--prompt",
            "Yo",
            "--max-tokens",
            "64",
            "--temperature",
            "0",
        ];
        args.extend_from_slice(flags);
        args.push("--json");
        let (code, out, err) = sluice(&args);
        assert_eq!(code, 0, "{flags:?}: {err}");
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        for v in lines {
            let text = v["text"].as_str().unwrap();
            assert!(ok(text), "{flags:?}: {text:?}");
            assert_eq!(v["finish_reason"], "stop", "{flags:?}: {v}");
        }
    }
    // Bad constraints and files: exit 2 naming the flag.
    for (flags, want) in [
        (&["--regex", "(unclosed"][..], "--regex"),
        (
            &["--json-schema", "/nonexistent/s.json"][..],
            "--json-schema",
        ),
        (
            &["--choice", "a", "--regex", "b"][..],
            "cannot be used with",
        ),
    ] {
        let mut args = vec!["generate", "--prompt", "Hi"];
        args.extend_from_slice(flags);
        let (code, _, err) = sluice(&args);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
