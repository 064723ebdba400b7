//! `sluice simulate` end to end: vLLM's result keys, the cluster flags,
//! sweeps against an SLO, traces, the timeline, `simulate fit` and a run on
//! the profile it writes, and bad input refused with exit 2 naming the flag,
//! file or line.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-simulate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn simulate(args: &[&str]) -> Output {
    sluice()
        .arg("simulate")
        .args(args)
        .arg("--no-progress")
        .output()
        .expect("runs")
}

fn json_of(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = simulate(&all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn refused(args: &[&str], needle: &str) {
    let out = simulate(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
}

const SMALL: &[&str] = &[
    "--model",
    "Qwen2.5-7B",
    "--hardware",
    "H100-SXM",
    "--num-prompts",
    "200",
    "--random-input-len",
    "512",
    "--random-output-len",
    "64",
    "--request-rate",
    "20",
];

#[test]
fn a_run_reports_vllms_result_keys() {
    let v = json_of(SMALL);
    for key in [
        "duration",
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "median_tpot_ms",
        "p99_itl_ms",
        "median_e2el_ms",
    ] {
        assert!(v[key].is_number(), "{key} missing: {v}");
    }
    assert_eq!(v["completed"], 200);
    assert_eq!(v["total_input_tokens"], 200 * 512);
    assert_eq!(v["total_output_tokens"], 200 * 64);
    // Deterministic for a seed.
    assert_eq!(v["median_ttft_ms"], json_of(SMALL)["median_ttft_ms"]);
    // The text summary names vLLM's lines.
    let out = simulate(SMALL);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Median TTFT (ms):"), "{text}");
    assert!(text.contains("KV blocks"), "{text}");
}

#[test]
fn a_hybrid_model_is_sized_by_its_kv_cache_groups() {
    // Gemma 3 270M on the built-in H100 (85,520,809,984 bytes) at 0.1:
    // ⌈8,552,080,998.4⌉ − 536,131,840 bytes of weights (268,065,920
    // parameters × 2) − the 2 GiB reserve = 5,868,465,511 bytes. vLLM's
    // six groups of 3 layers make a block 3 pages of 16 tokens × 2 × 1 KV
    // head × 256 × 2 bytes = 49,152 bytes: 119,394 blocks. Without the
    // hybrid manager a block is a page of all 18 layers, 294,912 bytes:
    // 19,899 blocks.
    let args = [
        "--model",
        "google/gemma-3-270m",
        "--hardware",
        "H100-SXM",
        "--gpu-memory-utilization",
        "0.1",
        "--num-prompts",
        "40",
        "--random-input-len",
        "2048",
        "--random-output-len",
        "32",
        "--request-rate",
        "20",
    ];
    let out = simulate(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("(119394 KV blocks:"), "{text}");
    assert!(text.contains("6 KV cache groups of 3 layers"), "{text}");
    let off = [&args[..], &["--disable-hybrid-kv-cache-manager"]].concat();
    let out = simulate(&off);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("(19899 KV blocks:"), "{text}");
    assert!(!text.contains("KV cache groups"), "{text}");
    // Both runs schedule every request through their groups.
    assert_eq!(json_of(&args)["completed"], 40);
    assert_eq!(json_of(&off)["completed"], 40);
}

#[test]
fn replicas_routers_and_pd_split_the_load() {
    let mut args = SMALL.to_vec();
    args.extend(["--replicas", "4", "--router", "least-requests"]);
    let v = json_of(&args);
    assert_eq!(v["completed"], 200);
    let per = v["per_replica"].as_array().expect("per-replica figures");
    assert_eq!(per.len(), 4);
    let sum: u64 = per.iter().map(|r| r["completed"].as_u64().unwrap()).sum();
    assert_eq!(sum, 200);
    assert!(per.iter().all(|r| r["completed"].as_u64().unwrap() > 0));

    let mut pd = SMALL.to_vec();
    pd.extend(["--pd", "1:2"]);
    let v = json_of(&pd);
    assert_eq!(v["completed"], 200);
    let per = v["per_replica"].as_array().unwrap();
    assert_eq!(per[0]["role"], "prefill");
    assert_eq!(per[0]["completed"], 0, "the client streams from decode");
    assert_eq!(per[1]["role"], "decode");
}

#[test]
fn a_rate_sweep_finds_the_largest_rate_meeting_the_slo() {
    let mut args = SMALL.to_vec();
    args.extend(["--sweep-rate", "10:60:25", "--slo", "ttft=200,tpot=40"]);
    let v = json_of(&args);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3);
    let rates: Vec<f64> = rows
        .iter()
        .map(|r| r["request_rate"].as_f64().unwrap())
        .collect();
    assert_eq!(rates, vec![10.0, 35.0, 60.0]);
    // The answer is the largest row that meets the SLO.
    let best = rows
        .iter()
        .filter(|r| r["meets_slo"] == true)
        .map(|r| r["request_rate"].as_f64().unwrap())
        .fold(None, |_, r| Some(r));
    assert_eq!(v["max_request_rate_meeting_slo"].as_f64(), best);

    let mut args: Vec<&str> = SMALL.iter().copied().filter(|a| *a != "20").collect();
    args.retain(|a| *a != "--request-rate");
    args.extend([
        "--request-rate",
        "60",
        "--sweep-replicas",
        "1:4",
        "--slo",
        "ttft=500,tpot=50",
    ]);
    let v = json_of(&args);
    let n = v["min_replicas_meeting_slo"].as_u64();
    let rows = v["rows"].as_array().unwrap();
    // Rows stop at the first count that meets it.
    if let Some(n) = n {
        assert_eq!(rows.last().unwrap()["replicas"].as_u64(), Some(n));
        assert!(rows[..rows.len() - 1]
            .iter()
            .all(|r| r["meets_slo"] == false));
    }
}

#[test]
fn a_trace_runs_and_a_malformed_line_is_named() {
    let good = tmp("good.jsonl");
    std::fs::write(
        &good,
        "{\"arrival_s\": 0.0, \"prompt_len\": 100, \"output_len\": 10}\n\
         {\"arrival_s\": 0.5, \"prompt_len\": 300, \"output_len\": 20, \"priority\": 1}\n",
    )
    .unwrap();
    let timeline = tmp("timeline.csv");
    let v = json_of(&[
        "--dataset-name",
        "trace",
        "--dataset-path",
        good.to_str().unwrap(),
        "--timeline",
        timeline.to_str().unwrap(),
    ]);
    assert_eq!(v["completed"], 2);
    assert_eq!(v["total_output_tokens"], 30);
    let csv = std::fs::read_to_string(&timeline).unwrap();
    assert!(csv.starts_with("time_s,replica,scheduled_tokens"), "{csv}");
    assert_eq!(
        csv.lines().count() as u64,
        1 + v["num_steps"].as_u64().unwrap()
    );

    let bad = tmp("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"arrival_s\": 0.0, \"prompt_len\": 100, \"output_len\": 10}\n\
         {\"arrival_s\": 0.5, \"prompt_len\": 300}\n",
    )
    .unwrap();
    refused(
        &[
            "--dataset-name",
            "trace",
            "--dataset-path",
            bad.to_str().unwrap(),
        ],
        "line 2",
    );
}

#[test]
fn multi_turn_conversations_hit_the_prefix_cache() {
    let v = json_of(&[
        "--dataset-name",
        "multi-turn",
        "--num-prompts",
        "30",
        "--request-rate",
        "2",
        "--num-turns",
        "uniform:4,0",
        "--think-time",
        "1",
        "--random-input-len",
        "200",
        "--random-output-len",
        "50",
    ]);
    assert_eq!(v["completed"], 120);
    assert!(v["prefix_cache_hit_rate"].as_f64().unwrap() > 0.3, "{v}");
}

/// A step log of a known linear cost: `simulate fit` recovers it well, and
/// a run on the profile it writes uses it (its TPOT is the decode cost).
#[test]
fn fit_writes_a_profile_that_simulate_runs_on() {
    let log = tmp("steps.jsonl");
    let mut lines = String::new();
    for i in 0..400u64 {
        let decode = (i % 7 + 1) as usize;
        let prefill = if i % 3 == 0 { 64 * (i % 5) as usize } else { 0 };
        // Contexts vary, and the cost does not depend on them.
        let mut rows: Vec<[usize; 3]> = (0..decode)
            .map(|j| [1, 50 + (i as usize * 37 + j * 101) % 900, 1])
            .collect();
        if prefill > 0 {
            rows.push([prefill, 0, 1]);
        }
        let t = 0.010 + 0.002 * decode as f64 + 0.0001 * prefill as f64;
        let rec = serde_json::json!({
            "step": i, "t_s": i as f64 * 0.02, "num_reqs": rows.len(),
            "num_prefill_reqs": usize::from(prefill > 0), "num_decode_reqs": decode,
            "prefill_tokens": prefill, "decode_tokens": decode,
            "sum_context_len": 0, "kv_blocks_touched": 0,
            "forward_s": t * 0.9, "step_s": t, "rows": rows,
        });
        lines.push_str(&rec.to_string());
        lines.push('\n');
    }
    std::fs::write(&log, lines).unwrap();
    let profile = tmp("cpu.json");
    let out = sluice()
        .args(["simulate", "fit"])
        .arg(&log)
        .arg("-o")
        .arg(&profile)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("held-out error"), "{text}");
    let v = json_of(&[
        "--hardware",
        profile.to_str().unwrap(),
        "--num-gpu-blocks-override",
        "4096",
        "--num-prompts",
        "1",
        "--random-input-len",
        "64",
        "--random-output-len",
        "11",
    ]);
    // One request alone: each decode step costs 10 + 2 ms.
    let tpot = v["median_tpot_ms"].as_f64().unwrap();
    assert!((tpot - 12.0).abs() < 0.5, "TPOT {tpot} ms");

    // Forty requests at once make steps bigger than any in the log: said.
    let out = simulate(&[
        "--hardware",
        profile.to_str().unwrap(),
        "--num-gpu-blocks-override",
        "4096",
        "--num-prompts",
        "40",
        "--random-input-len",
        "64",
        "--random-output-len",
        "8",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("extrapolated"), "{err}");

    // A fitted profile has no memory: the KV size must be given.
    refused(
        &[
            "--hardware",
            profile.to_str().unwrap(),
            "--num-prompts",
            "1",
        ],
        "--num-gpu-blocks-override",
    );
    let bad = tmp("bad-steps.jsonl");
    std::fs::write(&bad, "{\"step\": 0}\nnot json\n").unwrap();
    let out = sluice()
        .args(["simulate", "fit"])
        .arg(&bad)
        .arg("-o")
        .arg(tmp("never.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

#[test]
fn bad_flags_are_refused_naming_them() {
    refused(&["--model", "no-such-model"], "--model");
    refused(&["--hardware", "no-such-gpu"], "--hardware");
    refused(&["--router", "fastest"], "round-robin");
    refused(&["--pd", "0:2"], "--pd");
    refused(&["--sweep-rate", "5:1:1"], "--sweep-rate");
    refused(&["--slo", "ttft=fast"], "ttft");
    refused(&["--input-len-dist", "normal:10"], "normal");
    refused(&["--gpu-memory-utilization", "1.5"], "utilization");
    // Llama-3.1-70B's 141 GB of bf16 weights do not fit one H100.
    refused(&["--model", "Llama-3.1-70B"], "do not fit");
    refused(&["--dataset-name", "trace"], "--dataset-path");
    // The generator's refusals name the flag, not its field.
    refused(&["--random-range-ratio", "1.5"], "--random-range-ratio");
    refused(
        &["--burstiness", "0", "--request-rate", "5"],
        "--burstiness",
    );
    refused(&["--duration", "10"], "--request-rate");
    refused(&["--max-concurrency", "0"], "--max-concurrency");
}

/// `sluice replay`'s traces of vLLM runs, simulated: the trace's scheduler
/// config is used, and each engine step schedules the tokens vLLM's did
/// (the golden decision logs), step for step (every trace without aborts,
/// FCFS and priority; a trace cut by `max_steps` is compared over vLLM's
/// steps).
#[test]
fn replay_traces_schedule_vllms_tokens_step_for_step() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-core/tests/data/traces");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".trace.json") else {
            continue;
        };
        let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if trace["aborts"].as_array().is_some_and(|a| !a.is_empty()) {
            continue;
        }
        let golden: Vec<u64> = std::fs::read_to_string(dir.join(format!("{stem}.vllm.jsonl")))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|step| {
                step["scheduled"]
                    .as_object()
                    .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
            })
            .filter(|&n| n > 0)
            .collect();
        let timeline = tmp(&format!("{stem}.csv"));
        let v = json_of(&[
            "--dataset-name",
            "trace",
            "--dataset-path",
            path.to_str().unwrap(),
            "--timeline",
            timeline.to_str().unwrap(),
        ]);
        let n = trace["requests"].as_array().unwrap().len();
        assert_eq!(v["completed"].as_u64(), Some(n as u64), "{stem}");
        let simulated: Vec<u64> = std::fs::read_to_string(&timeline)
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(2).unwrap().parse().unwrap())
            .filter(|&n: &u64| n > 0)
            .collect();
        assert!(simulated.len() >= golden.len(), "{stem}");
        assert_eq!(simulated[..golden.len()], golden[..], "{stem}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} traces checked");
}

/// `bench-model --profile` on the built-in tiny shape: a table profile on
/// the grid the engine limits give, with the serving KV cache, that
/// `simulate` runs on without `--num-gpu-blocks-override`; bad limits are
/// refused naming the flag.
#[test]
fn a_measured_table_profile_drives_the_simulator() {
    let path = tmp("tiny-profile.json");
    let p = path.to_str().unwrap();
    let profile = |extra: &[&str]| {
        sluice()
            .args([
                "bench-model",
                "--model",
                "tiny",
                "--vocab-size",
                "512",
                "--threads",
                "1",
            ])
            .args([
                "--profile",
                p,
                "--max-num-batched-tokens",
                "64",
                "--concurrency",
                "4",
            ])
            .args(["--repeats", "1", "--kv-cache-memory", "8MiB"])
            .args(extra)
            .output()
            .expect("runs")
    };
    let out = profile(&["--profile-max-model-len", "128"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("mixed steps priced by the"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["kind"], "table");
    let t = &v["table"];
    let axis = |a: &Value| -> Vec<f64> {
        a.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    // The grid of the limits: chunks up to the budget, contexts up to where
    // the largest chunk fits (127 - 64, in blocks of 16), batches up to 4,
    // prompts up to what leaves room for a timed step per batch size.
    assert_eq!(axis(&t["prefill"]["chunk_tokens"]), [1.0, 16.0, 32.0, 64.0]);
    assert_eq!(axis(&t["prefill"]["context"]), [0.0, 48.0]);
    assert_eq!(axis(&t["decode"]["batch_size"]), [1.0, 2.0, 4.0]);
    // Prompts 1, 63, 122 (128 - 3 - 1 repeat × 3 batch sizes), plus the
    // sampled token and the middle of the timed step.
    assert_eq!(axis(&t["decode"]["mean_context"]), [3.0, 65.0, 124.0]);
    for row in t["prefill"]["time_s"].as_array().unwrap() {
        assert!(axis(row).iter().all(|&s| s > 0.0), "{row}");
    }
    // 8 MiB of the tiny shape's KV cache, in 16-token blocks.
    let blocks = v["kv_cache"]["num_blocks"].as_u64().unwrap();
    assert!(blocks >= 2, "{v}");
    // Mixed steps: 1 and 4 rows (the largest batch) beside 16 and 64
    // tokens (the largest chunk).
    assert_eq!(v["mixed_measured"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(
        v["measured_on"]["model"],
        "tiny (the built-in shape, dummy Bf16 weights)"
    );
    // The speed probe before, between and after the four parts.
    assert_eq!(
        v["measured_on"]["speed_probe_s"].as_array().unwrap().len(),
        5,
        "{v}"
    );
    // The decode grid on one cached prefix: one row shares nothing; at 4
    // rows of a 63-token prompt the 62-token prefix's 3 full blocks (48
    // tokens) are shared by the 3 rows after the first, of 4 × 65 context
    // tokens at the middle timed step: 144 / 260.
    let shared = &t["decode"]["shared"];
    let fraction: Vec<Vec<f64>> = shared["fraction"]
        .as_array()
        .unwrap()
        .iter()
        .map(axis)
        .collect();
    assert!(fraction[0].iter().all(|&f| f == 0.0), "{shared}");
    assert!((fraction[2][1] - 144.0 / 260.0).abs() < 1e-6, "{shared}");
    assert_eq!(shared["time_s"].as_array().unwrap().len(), 3, "{shared}");

    let out = simulate(&[
        "--hardware",
        p,
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--num-prompts",
        "4",
        "--max-model-len",
        "128",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["completed"], 4, "{r}");
    // A prompt past the grid's contexts is counted and said.
    let out = simulate(&[
        "--hardware",
        p,
        "--random-input-len",
        "100",
        "--random-output-len",
        "20",
        "--num-prompts",
        "2",
        "--max-model-len",
        "128",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("were outside the profile's measured grid"),
        "{err}"
    );

    for (extra, needle) in [
        (
            &["--profile-max-model-len", "32"][..],
            "--profile-max-model-len: 32",
        ),
        (
            &[
                "--speculative-config",
                r#"{"method": "ngram", "num_speculative_tokens": 2}"#,
            ][..],
            "--profile: measures steps without speculative decoding",
        ),
    ] {
        let out = profile(extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}
