//! The trace parsers: good files become the right requests, malformed
//! lines become errors naming the file, line and field.

use sluice_core::replay::replay;
use sluice_core::trace::{Trace, TraceAbort};
use sluice_core::SchedulerConfig;
use sluice_core::SchedulingPolicy;
use sluice_sim::traces::{
    load_trace, load_trace_with, parse_azure_csv, parse_jsonl, parse_replay_json,
    replay_output_len, replay_workload, TraceFormat, TraceOptions,
};
use std::io::Cursor;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn jsonl_err(text: &str) -> String {
    parse_jsonl("t.jsonl", Cursor::new(text), &TraceOptions::default())
        .unwrap_err()
        .to_string()
}

fn csv_err(text: &str) -> String {
    parse_azure_csv("a.csv", Cursor::new(text), &TraceOptions::default())
        .unwrap_err()
        .to_string()
}

#[test]
fn jsonl_good_file() {
    let t = load_trace(&data("sample.jsonl")).unwrap();
    assert_eq!(t.format, TraceFormat::Jsonl);
    assert!(t.replay.is_none());
    let r = &t.requests;
    assert_eq!(r.len(), 3, "the blank line is skipped");
    let ids: Vec<&str> = r.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["0", "tokens", "2"]);
    assert_eq!(
        r.iter().map(|r| r.arrival_s).collect::<Vec<_>>(),
        [0.0, 0.25, 1.0]
    );
    assert_eq!(
        r.iter().map(|r| r.prompt.len()).collect::<Vec<_>>(),
        [12, 3, 3]
    );
    assert_eq!(r[1].prompt, [5, 6, 7]);
    assert_eq!(
        r.iter()
            .map(|r| (r.output_len, r.priority))
            .collect::<Vec<_>>(),
        [(4, 0), (2, -1), (1, 2)]
    );
    assert!(r
        .iter()
        .all(|r| r.after.is_none() && r.arrival_step.is_none()));
    // Synthetic prompts come from the seed: the same for the same seed.
    assert_eq!(
        load_trace(&data("sample.jsonl")).unwrap().requests,
        t.requests
    );
    let other = load_trace_with(
        &data("sample.jsonl"),
        &TraceOptions {
            seed: 1,
            ..TraceOptions::default()
        },
    )
    .unwrap();
    assert_ne!(other.requests[0].prompt, r[0].prompt);
    assert_eq!(other.requests[1].prompt, r[1].prompt);
    let two = load_trace_with(
        &data("sample.jsonl"),
        &TraceOptions {
            max_requests: Some(2),
            ..TraceOptions::default()
        },
    )
    .unwrap();
    assert_eq!(two.requests[..], r[..2]);
}

#[test]
fn jsonl_errors_name_line_and_field() {
    let good = r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 2}"#;
    let cases = [
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 2"#,
            "t.jsonl line 2: not valid JSON",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4}"#,
            "t.jsonl line 2: field `output_len`: missing",
        ),
        (
            r#"{"prompt_len": 4, "output_len": 2}"#,
            "t.jsonl line 2: field `arrival_s`: missing",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "output_len": "2"}"#,
            "t.jsonl line 2: field `output_len`: expected a positive integer, got \"2\"",
        ),
        (
            r#"{"arrival_s": "soon", "prompt_len": 4, "output_len": 2}"#,
            "t.jsonl line 2: field `arrival_s`: expected a number of seconds",
        ),
        (
            r#"{"arrival_s": -1.5, "prompt_len": 4, "output_len": 2}"#,
            "t.jsonl line 2: field `arrival_s`: must be finite and ≥ 0, got -1.5",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": -4, "output_len": 2}"#,
            "t.jsonl line 2: field `prompt_len`: expected a positive integer, got -4",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 0}"#,
            "t.jsonl line 2: field `output_len`: must be at least 1",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "prompt_token_ids": [1], "output_len": 2}"#,
            "t.jsonl line 2: both `prompt_len` and `prompt_token_ids` are given",
        ),
        (
            r#"{"arrival_s": 0, "output_len": 2}"#,
            "t.jsonl line 2: missing `prompt_len` or `prompt_token_ids`",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 2, "max_tokens": 3, "temp": 1}"#,
            "t.jsonl line 2: unknown fields `max_tokens`, `temp`",
        ),
        (
            r#"{"arrival_s": 0, "prompt_token_ids": [1, -2], "output_len": 2}"#,
            "t.jsonl line 2: field `prompt_token_ids[1]`: expected a token id",
        ),
        (
            r#"{"arrival_s": 0, "prompt_token_ids": [], "output_len": 2}"#,
            "t.jsonl line 2: field `prompt_token_ids`: the prompt is empty",
        ),
        (
            r#"{"arrival_s": 0, "prompt_token_ids": "1 2", "output_len": 2}"#,
            "t.jsonl line 2: field `prompt_token_ids`: expected an array of token ids",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 2, "priority": 3000000000}"#,
            "t.jsonl line 2: field `priority`: expected an integer in the i32 range",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 99999999, "output_len": 2}"#,
            "t.jsonl line 2: field `prompt_len`: 99999999 is above the limit",
        ),
        (
            r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 2, "id": 7}"#,
            "t.jsonl line 2: field `id`: expected a string",
        ),
        (r#"[1, 2]"#, "t.jsonl line 2: expected a JSON object"),
    ];
    for (line, want) in cases {
        let got = jsonl_err(&format!("{good}\n{line}\n{good}\n"));
        assert!(
            got.starts_with(want),
            "{line}\n  got  {got:?}\n  want {want:?}"
        );
    }
    // Blank lines count: the error is on the file's line 4.
    let got = jsonl_err(&format!("{good}\n\n   \n{{\"arrival_s\": 0}}\n"));
    assert!(got.starts_with("t.jsonl line 4: "), "{got}");
    let dup = r#"{"arrival_s": 0, "prompt_len": 4, "output_len": 2, "id": "x"}"#;
    let got = jsonl_err(&format!("{dup}\n{dup}\n"));
    assert_eq!(
        got,
        "t.jsonl line 2: field `id`: duplicate id \"x\" (first on line 1)"
    );
    let got = parse_jsonl(
        "t.jsonl",
        Cursor::new(b"\xff\xfe\n".to_vec()),
        &TraceOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(got, "t.jsonl line 1: not valid UTF-8");
}

#[test]
fn azure_csv_good_file() {
    let t = load_trace(&data("azure_sample.csv")).unwrap();
    assert_eq!(t.format, TraceFormat::AzureCsv);
    let r = &t.requests;
    // Unsorted rows: arrivals are relative to the earliest (row 3).
    let want = [1.58059, 5.895169, 0.0, 15.9];
    for (req, w) in r.iter().zip(want) {
        assert!((req.arrival_s - w).abs() < 1e-9, "{} vs {w}", req.arrival_s);
    }
    assert_eq!(
        r.iter()
            .map(|r| (r.prompt.len(), r.output_len))
            .collect::<Vec<_>>(),
        [(374, 44), (396, 109), (879, 34), (91, 7)]
    );
    assert_eq!(
        r.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["0", "1", "2", "3"]
    );
    // Columns found by name in any order; `+00:00` offsets (the 2024 trace).
    let t = load_trace(&data("azure_reordered.csv")).unwrap();
    let r = &t.requests;
    assert_eq!((r[0].prompt.len(), r[0].output_len), (2048, 10));
    assert_eq!((r[1].prompt.len(), r[1].output_len), (128, 20));
    assert_eq!(r[0].arrival_s, 0.0);
    assert!((r[1].arrival_s - 1.49007).abs() < 1e-9);
    // CRLF line ends and a byte-order mark are fine.
    let crlf = "\u{feff}timestamp,contexttokens,generatedtokens\r\n\
                2023-11-16 18:15:46.5,10,2\r\n2023-11-16 18:15:47,20,3\r\n";
    let r = parse_azure_csv("a.csv", Cursor::new(crlf), &TraceOptions::default()).unwrap();
    assert_eq!(r.len(), 2);
    assert!((r[1].arrival_s - 0.5).abs() < 1e-12);
}

#[test]
fn azure_csv_errors_name_line_and_column() {
    let head = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n";
    let cases = [
        (
            "2023-11-16 25:15:46.6805900,374,44",
            "a.csv line 3: field `TIMESTAMP`: `2023-11-16 25:15:46.6805900` is not a date-time",
        ),
        (
            "yesterday,374,44",
            "a.csv line 3: field `TIMESTAMP`: `yesterday` is not a date-time",
        ),
        (
            "2023-11-16 18:15:46.6805900,374",
            "a.csv line 3: 2 fields, but the header has 3",
        ),
        (
            "2023-11-16 18:15:46.6805900,374,44,1",
            "a.csv line 3: 4 fields, but the header has 3",
        ),
        (
            "2023-11-16 18:15:46.6805900,-374,44",
            "a.csv line 3: field `ContextTokens`: expected a positive integer, got `-374`",
        ),
        (
            "2023-11-16 18:15:46.6805900,374,0",
            "a.csv line 3: field `GeneratedTokens`: must be at least 1, got 0",
        ),
        (
            "2023-11-16 18:15:46.6805900,37.4,44",
            "a.csv line 3: field `ContextTokens`: expected a positive integer, got `37.4`",
        ),
    ];
    for (row, want) in cases {
        let got = csv_err(&format!("{head}{row}\n"));
        assert!(
            got.starts_with(want),
            "{row}\n  got  {got:?}\n  want {want:?}"
        );
    }
    assert_eq!(
        csv_err("TIMESTAMP,Tokens\n"),
        "a.csv line 1: the header lacks columns `ContextTokens`, `GeneratedTokens` (found \
         `TIMESTAMP`, `Tokens`)"
    );
    assert!(csv_err("").starts_with("a.csv: empty"));
}

#[test]
fn replay_trace_keeps_config_steps_and_aborts() {
    let t = load_trace(&data("replay_sample.json")).unwrap();
    assert_eq!(t.format, TraceFormat::Replay);
    let w = t.replay.as_ref().unwrap();
    assert_eq!(w.name, "two requests and an abort");
    assert_eq!(w.config.max_model_len, 24);
    assert_eq!(w.config.block_size, 4);
    assert_eq!(w.config.policy, SchedulingPolicy::Priority);
    assert!(w.config.enable_prefix_caching);
    assert_eq!(w.max_steps, 50);
    assert_eq!(
        w.aborts,
        [TraceAbort {
            step: 2,
            id: "c".into()
        }]
    );
    let r = &t.requests;
    assert_eq!(
        r.iter()
            .map(|r| (r.id.as_str(), r.arrival_step, r.priority, r.output_len))
            .collect::<Vec<_>>(),
        [
            ("a", Some(0), 0, 3),  // EOS (2) is output[2]
            ("b", Some(3), 5, 5),  // EOS ignored: all of max_tokens
            ("c", Some(1), 0, 14), // 10 prompt + 14 reaches max_model_len 24
        ]
    );
    assert_eq!(r[1].prompt, [1, 2, 3, 4, 6, 7]);
}

/// The outputs a request's replay produces, read off the decision log: a
/// request alone, without prefix caching or preemption, is scheduled its
/// prompt plus all outputs but the last.
fn replayed_outputs(trace: &Trace, i: usize) -> usize {
    let mut alone = trace.clone();
    alone.requests = vec![trace.requests[i].clone()];
    alone.requests[0].arrival_step = 0;
    alone.aborts.clear();
    alone.config.enable_prefix_caching = false;
    let log = replay(alone).unwrap();
    let scheduled: usize = log
        .iter()
        .flat_map(|s| s.scheduled.iter())
        .map(|(_, n)| n)
        .sum();
    assert!(log.iter().all(|s| s.preempted.is_empty()));
    scheduled + 1 - trace.requests[i].prompt.len()
}

#[test]
fn output_lengths_equal_what_replay_emits() {
    let text = std::fs::read_to_string(data("replay_sample.json")).unwrap();
    let mut trace = Trace::from_json(&text).unwrap();
    // More stop rules: a stop token, EOS ignored but a stop id listed,
    // EOS at the very first output, and min_tokens (which replay ignores).
    let mut extra = trace.requests[0].clone();
    extra.id = "stop".into();
    extra.output = vec![5, 6, 7, 8];
    extra.eos_token_id = None;
    extra.stop_token_ids = vec![7];
    trace.requests.push(extra.clone());
    trace.requests.push(sluice_core::trace::TraceRequest {
        id: "ignored".into(),
        ignore_eos: true,
        eos_token_id: Some(5),
        stop_token_ids: vec![8],
        ..extra.clone()
    });
    trace.requests.push(sluice_core::trace::TraceRequest {
        id: "first".into(),
        eos_token_id: Some(5),
        min_tokens: 3,
        stop_token_ids: vec![],
        ..extra
    });
    let w = replay_workload("t.json", &trace).unwrap();
    let got: Vec<usize> = w.requests.iter().map(|r| r.output_len).collect();
    assert_eq!(got, [3, 5, 14, 3, 4, 1]);
    for (i, r) in trace.requests.iter().enumerate() {
        assert_eq!(
            replay_output_len(r, trace.config.max_model_len),
            replayed_outputs(&trace, i),
            "{}",
            r.id
        );
    }
}

#[test]
fn replay_trace_errors_name_file_and_path() {
    let e = parse_replay_json("r.json", "{").unwrap_err().to_string();
    assert!(e.starts_with("r.json: not valid JSON"), "{e}");
    let cfg = r#""config": {"block_size": 4, "num_gpu_blocks": 8, "max_num_batched_tokens": 16, "max_num_seqs": 2, "max_model_len": 32}"#;
    let e = parse_replay_json(
        "r.json",
        &format!(r#"{{{cfg}, "requests": [{{"id": "a", "prompt": "hi", "output": [1]}}]}}"#),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "r.json: field `requests[0].prompt`: expected an array of token ids"
    );
    let e = parse_replay_json(
        "r.json",
        &format!(
            r#"{{{cfg}, "requests": [{{"id": "a", "prompt": [1], "output": [1], "priority": 4000000000}}]}}"#
        ),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "r.json: field `requests[0].priority`: 4000000000 does not fit in an i32"
    );
    // The simulator can run a replay trace's requests under its config.
    let w = parse_replay_json(
        "r.json",
        &format!(r#"{{{cfg}, "requests": [{{"id": "a", "prompt": [1, 2], "output": [3, 4]}}]}}"#),
    )
    .unwrap();
    assert_eq!(w.config.max_num_seqs, 2);
    assert_ne!(w.config, SchedulerConfig::default());
}

#[test]
fn load_trace_picks_the_format_by_extension() {
    let e = load_trace(Path::new("requests.txt"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "requests.txt: cannot tell the trace format from the extension `.txt` (expected .jsonl \
         for JSON lines, .csv for an Azure LLM inference trace, .json for a sluice replay trace)"
    );
    let e = load_trace(Path::new("requests")).unwrap_err().to_string();
    assert!(e.contains("a name without an extension"), "{e}");
    let e = load_trace(Path::new("/nonexistent/t.jsonl"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/t.jsonl: cannot open"), "{e}");
    let e = load_trace(Path::new("/nonexistent/t.json"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/t.json: cannot open"), "{e}");
    // Upper-case extensions count.
    assert!(matches!(
        sluice_sim::traces::trace_format(Path::new("X.CSV")),
        Ok(TraceFormat::AzureCsv)
    ));
}
