//! KV cache events against vLLM 0.33.0: replaying each golden trace of
//! `tests/data/traces/` with events on must publish, step for step, exactly
//! the events vLLM's scheduler published on it (`tests/data/kv-events/`,
//! captured from vLLM's own `BlockPool` with a recording publisher).

use serde_json::Value;
use sluice_core::kv_events::step_events_json;
use sluice_core::replay::replay_with_kv_events;
use sluice_core::trace::Trace;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn compare(name: &str) -> Result<usize, String> {
    let text = std::fs::read_to_string(data().join(format!("traces/{name}.trace.json")))
        .map_err(|e| e.to_string())?;
    let golden =
        std::fs::read_to_string(data().join(format!("kv-events/{name}.vllm-kv-events.jsonl")))
            .unwrap_or_default();
    let trace = Trace::from_json(&text).map_err(|e| e.to_string())?;
    let (_, events) = replay_with_kv_events(trace, None).map_err(|e| e.to_string())?;
    let want: Vec<Value> = golden
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden line is JSON"))
        .collect();
    for (i, ((step, ev), exp)) in events.iter().zip(&want).enumerate() {
        let line = step_events_json(*step, ev);
        let got: Value = serde_json::from_str(&line).expect("our line is JSON");
        if &got != exp {
            let short = |v: &Value| {
                let s = v.to_string();
                s.chars().take(600).collect::<String>()
            };
            return Err(format!(
                "{name}: event line {i} (step {step}) differs\n  vllm:   {}\n  sluice: {}",
                short(exp),
                short(&got)
            ));
        }
    }
    if events.len() != want.len() {
        return Err(format!(
            "{name}: {} steps with events, vLLM has {}",
            events.len(),
            want.len()
        ));
    }
    Ok(want.len())
}

#[test]
fn every_golden_trace_publishes_vllms_kv_events() {
    let mut names: Vec<String> = std::fs::read_dir(data().join("traces"))
        .expect("trace dir")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".trace.json").map(str::to_string)
        })
        .collect();
    names.sort();
    let with_events = names
        .iter()
        .filter(|n| {
            data()
                .join(format!("kv-events/{n}.vllm-kv-events.jsonl"))
                .exists()
        })
        .count();
    assert!(
        with_events >= 20,
        "expected the kv-events goldens, found {with_events}"
    );
    // A trace without a golden file (prefix caching off) must publish none.
    let failures: Vec<String> = names.iter().filter_map(|n| compare(n).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} traces differ from vLLM:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}
