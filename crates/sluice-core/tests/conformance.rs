//! Conformance against vLLM 0.33.0: every golden decision log in
//! `tests/data/traces/` (produced by vLLM's own scheduler) must be reproduced
//! block for block: every field of every step equal, block ids included.

use serde_json::Value;
use sluice_core::replay::replay;
use sluice_core::trace::Trace;
use std::path::{Path, PathBuf};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/traces")
}

/// Replays `name` and returns the first difference from its golden log.
fn compare(name: &str) -> Result<usize, String> {
    compare_in(&data_dir(), name)
}

/// Replays `dir/name.trace.json` against `dir/name.vllm.jsonl`.
fn compare_in(dir: &Path, name: &str) -> Result<usize, String> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.trace.json")))
        .map_err(|e| e.to_string())?;
    let golden = std::fs::read_to_string(dir.join(format!("{name}.vllm.jsonl")))
        .map_err(|e| e.to_string())?;
    let trace = Trace::from_json(&text).map_err(|e| e.to_string())?;
    let log = replay(trace).map_err(|e| e.to_string())?;
    let want: Vec<Value> = golden
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden line is JSON"))
        .collect();
    for (i, (rec, exp)) in log.iter().zip(&want).enumerate() {
        let got: Value = serde_json::from_str(&rec.to_json()).expect("our line is JSON");
        if &got != exp {
            return Err(format!(
                "{name}: step {i} differs\n  vllm:   {exp}\n  sluice: {got}"
            ));
        }
    }
    if log.len() != want.len() {
        return Err(format!(
            "{name}: {} steps, vLLM has {}",
            log.len(),
            want.len()
        ));
    }
    Ok(want.len())
}

fn golden_names() -> Vec<String> {
    names_in(&data_dir())
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("trace data dir")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".trace.json").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// Every golden trace of `tests/data/traces/<family>/` (at least `min`)
/// replays block-equivalent to its vLLM log.
fn family_replays_block_equivalent(family: &str, min: usize) {
    let dir = data_dir().join(family);
    let names = names_in(&dir);
    assert!(
        names.len() >= min,
        "expected the {family} golden traces, found {}",
        names.len()
    );
    let failures: Vec<String> = names
        .iter()
        .filter_map(|n| compare_in(&dir, n).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} {family} traces differ from vLLM:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

/// The hybrid traces (`tests/data/traces/hybrid/`: sliding-window,
/// chunked-local and full-attention groups in one pool), block for block,
/// `new_blocks` per group.
#[test]
fn every_hybrid_golden_trace_replays_block_equivalent() {
    family_replays_block_equivalent("hybrid", 16);
}

/// The speculative-decoding traces (`tests/data/traces/speculative/`:
/// scripted drafts per request, accepted as far as they equal the scripted
/// outputs), block for block, the scheduled drafts of every step included.
#[test]
fn every_speculative_golden_trace_replays_block_equivalent() {
    family_replays_block_equivalent("speculative", 20);
}

#[test]
fn every_golden_trace_replays_block_equivalent() {
    let names = golden_names();
    assert!(
        names.len() >= 40,
        "expected the golden traces, found {}",
        names.len()
    );
    let failures: Vec<String> = names.iter().filter_map(|n| compare(n).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} traces differ from vLLM:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

/// The seed article's worked example (`docs/scheduler-semantics.md`
/// §Worked examples, E3):
/// A (100-token prompt, 4 outputs), B (200, 2), C (50, 3); budget 256,
/// max_num_seqs 4, no chunked prefill, no prefix caching.
///
/// The article's story admits C only in round 3, but by its own rules C fits
/// in round 2: A's decode (1) + B's prompt (200) + C's prompt (50) = 251 <= 256
/// tokens and 3 <= 4 sequences. vLLM schedules A:1, B:200, C:50 there (the
/// `seed-example` golden), so that is what we assert.
#[test]
fn seed_article_worked_example() {
    use sluice_core::{NewRequest, SamplingParams, Scheduler, SchedulerConfig};
    let mut s = Scheduler::new(SchedulerConfig {
        block_size: 16,
        num_gpu_blocks: 64,
        max_num_batched_tokens: 256,
        max_num_seqs: 4,
        max_model_len: 4096,
        enable_chunked_prefill: false,
        enable_prefix_caching: false,
        ..SchedulerConfig::default()
    })
    .unwrap();
    for (id, len, max) in [("A", 100u32, 4), ("B", 200, 2), ("C", 50, 3)] {
        let prompt = (0..len).collect();
        s.add_request(NewRequest::new(id, prompt, SamplingParams::greedy(max)))
            .unwrap();
    }
    let mut rounds = Vec::new();
    while s.has_unfinished_requests() {
        let out = s.schedule();
        let plan: Vec<(String, usize)> = out
            .num_scheduled_tokens
            .iter()
            .map(|e| (e.req_id.to_string(), e.num_tokens))
            .collect();
        let mut mro = sluice_core::ModelRunnerOutput::with_capacity(plan.len());
        for e in &out.num_scheduled_tokens {
            let r = s.request(e.handle).unwrap();
            if r.num_computed_tokens() >= r.num_tokens() {
                mro.push(&[7]);
            } else {
                mro.push(&[]);
            }
        }
        s.update_from_output(&out, &mro);
        rounds.push(plan);
    }
    let p = |v: &[(&str, usize)]| {
        v.iter()
            .map(|(a, n)| (a.to_string(), *n))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rounds[0],
        p(&[("A", 100)]),
        "round 1: A's prompt; B would exceed the budget"
    );
    assert_eq!(
        rounds[1],
        p(&[("A", 1), ("B", 200), ("C", 50)]),
        "round 2: C fits too"
    );
    assert_eq!(rounds[2], p(&[("A", 1), ("B", 1), ("C", 1)]));
    assert_eq!(
        rounds[3],
        p(&[("A", 1), ("C", 1)]),
        "B finished after 2 tokens"
    );
    assert_eq!(
        rounds.len(),
        4,
        "A finishes its 4th token together with C's 3rd"
    );
}
