//! `sluice replay` end to end: the decision log, malformed traces, --bench.

use std::path::{Path, PathBuf};
use std::process::Command;

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-core/tests/data/traces")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[test]
fn replay_writes_the_golden_log() {
    let out = sluice()
        .arg("replay")
        .arg(traces().join("seed-example.trace.json"))
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let golden = std::fs::read_to_string(traces().join("seed-example.vllm.jsonl")).expect("golden");
    // Same text, byte for byte: the log is formatted like vLLM's json.dumps.
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden);
}

/// `--kv-events` writes vLLM's captured events for the trace, byte for byte
/// (the golden lines are compact JSON, as sluice writes them).
#[test]
fn replay_writes_the_golden_kv_events() {
    for name in ["prefix-preempt-01", "preempt-01"] {
        let path = tmp(&format!("{name}.kv-events.jsonl"));
        let st = sluice()
            .arg("replay")
            .arg(traces().join(format!("{name}.trace.json")))
            .arg("-o")
            .arg(tmp(&format!("{name}.log.jsonl")))
            .arg("--kv-events")
            .arg(&path)
            // vLLM's goldens ran without it; it would move every hash.
            .env_remove("PYTHONHASHSEED")
            .status()
            .expect("runs");
        assert!(st.success());
        let golden = std::fs::read_to_string(
            traces().join(format!("../kv-events/{name}.vllm-kv-events.jsonl")),
        )
        .expect("golden");
        let got = std::fs::read_to_string(&path).expect("written");
        assert!(!got.is_empty());
        assert_eq!(got, golden, "{name}");
    }
}

/// PYTHONHASHSEED moves every hash, as in vLLM; the decisions stay the same.
#[test]
fn pythonhashseed_seeds_the_kv_event_hashes() {
    let run = |seed: Option<&str>| {
        let path = tmp(&format!("seed-{seed:?}.kv-events.jsonl"));
        let mut cmd = sluice();
        cmd.arg("replay")
            .arg(traces().join("prefix-01.trace.json"))
            .arg("-o")
            .arg(tmp(&format!("seed-{seed:?}.log.jsonl")))
            .arg("--kv-events")
            .arg(&path);
        match seed {
            Some(s) => cmd.env("PYTHONHASHSEED", s),
            None => cmd.env_remove("PYTHONHASHSEED"),
        };
        assert!(cmd.status().expect("runs").success());
        std::fs::read_to_string(&path).expect("written")
    };
    let (unset, zero) = (run(None), run(Some("0")));
    assert_ne!(unset, zero);
    assert_eq!(unset.lines().count(), zero.lines().count());
}

#[test]
fn replay_to_a_file() {
    let path = tmp("prefix-01.jsonl");
    let st = sluice()
        .arg("replay")
        .arg(traces().join("prefix-01.trace.json"))
        .arg("-o")
        .arg(&path)
        .status()
        .expect("runs");
    assert!(st.success());
    let got = std::fs::read_to_string(&path).expect("log");
    let want = std::fs::read_to_string(traces().join("prefix-01.vllm.jsonl")).expect("golden");
    assert_eq!(got, want);
}

/// A trace with KV cache groups: `new_blocks` one list per group, byte for
/// byte vLLM's log.
#[test]
fn replay_writes_the_per_group_log_of_a_hybrid_trace() {
    for name in ["sw-full-01", "mixed-kinds-01"] {
        let dir = traces().join("hybrid");
        let out = sluice()
            .arg("replay")
            .arg(dir.join(format!("{name}.trace.json")))
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let golden =
            std::fs::read_to_string(dir.join(format!("{name}.vllm.jsonl"))).expect("golden");
        assert_eq!(String::from_utf8_lossy(&out.stdout), golden, "{name}");
    }
}

/// A malformed `config.kv_cache_groups` names the field and exits 2.
#[test]
fn malformed_kv_cache_groups_name_the_field_and_exit_2() {
    let cases = [
        (r#"[]"#, "config.kv_cache_groups: must be a non-empty list"),
        (
            r#"[{"kind": "sliding"}]"#,
            "config.kv_cache_groups[0].kind:",
        ),
        (
            r#"[{"kind": "full"}, {"kind": "sliding_window", "sliding_window": 0}]"#,
            "config.kv_cache_groups[1].sliding_window: must be an integer >= 1",
        ),
        (
            r#"[{"kind": "chunked_local", "attention_chunk_size": 8, "window": 3}]"#,
            "config.kv_cache_groups[0].window: unknown field for kind chunked_local",
        ),
    ];
    for (i, (groups, want)) in cases.iter().enumerate() {
        let path = tmp(&format!("bad-groups-{i}.trace.json"));
        std::fs::write(
            &path,
            format!(
                r#"{{"config": {{"block_size": 16, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128, "kv_cache_groups": {groups}}}}}"#
            ),
        )
        .expect("write");
        let out = sluice().arg("replay").arg(&path).output().expect("runs");
        assert_eq!(out.status.code(), Some(2), "{groups}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{groups}: {err}");
    }
}

#[test]
fn malformed_trace_names_the_field_and_exits_2() {
    let path = tmp("bad.trace.json");
    std::fs::write(
        &path,
        r#"{"config": {"block_size": 16, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128},
            "requests": [{"id": "a", "prompt": [1], "output": [1]}, {"id": "b", "prompt": [1], "output": [2]},
                         {"id": "c", "prompt": [1], "output": [3]}, {"id": "d", "prompt": "oops", "output": [4]}]}"#,
    )
    .expect("write");
    let out = sluice().arg("replay").arg(&path).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("requests[3].prompt: expected an array of token ids"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    let out = sluice()
        .arg("replay")
        .arg(tmp("missing.json"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bench_prints_one_json_line_and_writes_timings() {
    let timings = tmp("timings.jsonl");
    let out = sluice()
        .args(["replay", "--bench"])
        .arg(traces().join("basic-01.trace.json"))
        .arg("--timings")
        .arg(&timings)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(line["steps"], 38);
    assert!(line["median_us"].as_f64().is_some());
    assert!(line["p99_us"].as_f64().is_some());
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&timings)
        .expect("timings")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 38);
    assert_eq!(lines[5]["step"], 5);
    assert!(lines[5]["schedule_ns"].as_u64().is_some() && lines[5]["update_ns"].as_u64().is_some());
}

/// Runs `sluice replay` on a trace whose config (or top level, or first
/// request) has `field` set to `value`; (exit code, stdout, stderr).
fn replay_with(section: &str, field: &str, value: &str) -> (Option<i32>, Vec<u8>, String) {
    let mut trace: serde_json::Value = serde_json::from_str(
        r#"{"config": {"block_size": 16, "num_gpu_blocks": 8, "max_num_batched_tokens": 64, "max_num_seqs": 2, "max_model_len": 128},
            "requests": [{"id": "a", "prompt": [1, 2], "output": [3, 4]}]}"#,
    )
    .expect("trace");
    let v: serde_json::Value = serde_json::from_str(value).expect("value");
    match section {
        "config" => trace["config"][field] = v,
        "request" => trace["requests"][0][field] = v,
        _ => trace[field] = v,
    }
    let path = tmp(&format!("huge-{section}-{field}-{value}.trace.json"));
    std::fs::write(&path, trace.to_string()).expect("write");
    let out = sluice().arg("replay").arg(&path).output().expect("runs");
    (
        out.status.code(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn huge_sizes_are_refused_naming_the_field_and_exit_2() {
    let cases = [
        (
            "config",
            "num_gpu_blocks",
            "2147483648",
            "config.num_gpu_blocks: must be at most 16777216 (2^24), got 2147483648",
        ),
        (
            "config",
            "num_gpu_blocks",
            "9223372036854775808",
            "config.num_gpu_blocks: must be at most 16777216 (2^24), got 9223372036854775808",
        ),
        (
            "config",
            "num_gpu_blocks",
            "100000000",
            "config.num_gpu_blocks: must be at most 16777216 (2^24), got 100000000",
        ),
        (
            "config",
            "max_model_len",
            "1099511627776",
            "config.max_model_len: must be at most 16777216 (2^24)",
        ),
        (
            "config",
            "block_size",
            "4294967296",
            "config.block_size: must be at most 65536 (2^16)",
        ),
        (
            "top",
            "max_steps",
            "9223372036854775808",
            "max_steps: must be at most 16777216 (2^24)",
        ),
        (
            "request",
            "max_tokens",
            "9223372036854775808",
            "requests[0].max_tokens: must be at most 16777216 (2^24)",
        ),
    ];
    for (section, field, value, want) in cases {
        let start = std::time::Instant::now();
        let (code, stdout, err) = replay_with(section, field, value);
        assert_eq!(code, Some(2), "{field}={value}: {err}");
        assert!(err.contains(want), "{field}={value}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(stdout.is_empty());
        // Refused up front, not after allocating for it.
        assert!(
            start.elapsed().as_secs() < 10,
            "{field}={value} took {:?}",
            start.elapsed()
        );
    }
}

#[cfg(unix)]
#[test]
fn an_endless_file_is_read_only_up_to_the_limit() {
    let out = sluice()
        .args(["replay", "/dev/zero"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/dev/zero: larger than 256 MiB, the limit of a trace"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    let out = sluice().arg("replay").arg(traces()).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("it is a directory"), "{err}");
}
