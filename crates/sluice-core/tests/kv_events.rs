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
    compare_in("", name)
}

/// Replays `traces/SUB/name.trace.json` against
/// `kv-events/SUB/name.vllm-kv-events.jsonl` (`sub` empty or ending in `/`).
fn compare_in(sub: &str, name: &str) -> Result<usize, String> {
    let text = std::fs::read_to_string(data().join(format!("traces/{sub}{name}.trace.json")))
        .map_err(|e| e.to_string())?;
    let golden =
        std::fs::read_to_string(data().join(format!("kv-events/{sub}{name}.vllm-kv-events.jsonl")))
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

/// The hybrid traces: every event names its group (`group_idx`, and for a
/// store the group's kind and window), a sliding-window group stores only
/// the blocks a later hit can use, and publishes a store even when none.
#[test]
fn every_hybrid_golden_trace_publishes_vllms_kv_events() {
    let mut names: Vec<String> = std::fs::read_dir(data().join("traces/hybrid"))
        .expect("hybrid trace dir")
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
                .join(format!("kv-events/hybrid/{n}.vllm-kv-events.jsonl"))
                .exists()
        })
        .count();
    assert!(
        with_events >= 11,
        "expected the hybrid kv-events goldens, found {with_events}"
    );
    let failures: Vec<String> = names
        .iter()
        .filter_map(|n| compare_in("hybrid/", n).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} hybrid traces differ from vLLM:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

mod common;

use proptest::prelude::*;
use sluice_core::kv_events::KvCacheEvent;
use sluice_core::{NewRequest, RequestStatus, SamplingParams, Scheduler, SchedulerConfig};
use std::collections::HashMap;

/// One random request: arrival step, prompt (tiny vocabulary, so prefixes
/// are shared and hits common), max tokens.
type Req = (u32, Vec<u32>, usize);

#[derive(Clone, Debug)]
struct Workload {
    block_size: usize,
    num_gpu_blocks: usize,
    reqs: Vec<Req>,
    /// (step, request index) to abort.
    aborts: Vec<(u32, usize)>,
    /// Steps before which the prefix cache is reset (preempting everyone
    /// first when the flag is set).
    resets: Vec<(u32, bool)>,
}

fn workload() -> impl Strategy<Value = Workload> {
    (
        prop::sample::select(vec![1usize, 2, 3, 4, 8]),
        4usize..40,
        prop::collection::vec(
            (0u32..30, prop::collection::vec(0u32..3, 1..40), 1usize..12),
            1..14,
        ),
        prop::collection::vec((0u32..40, 0usize..14), 0..4),
        prop::collection::vec((0u32..40, any::<bool>()), 0..3),
    )
        .prop_map(
            |(block_size, num_gpu_blocks, reqs, aborts, resets)| Workload {
                block_size,
                num_gpu_blocks,
                reqs,
                aborts,
                resets,
            },
        )
}

/// The pool's cached hashes as a multiset of external hashes.
fn cached(s: &Scheduler) -> HashMap<u64, usize> {
    let mut m = HashMap::new();
    for (h, blocks) in s.kv_cache_manager().pool().cached_map().iter() {
        *m.entry(h.hash.external()).or_default() += blocks.len();
    }
    m
}

fn apply(model: &mut HashMap<u64, usize>, events: &[KvCacheEvent]) -> Result<(), String> {
    for e in events {
        match e {
            KvCacheEvent::BlockStored { block_hashes, .. } => {
                for h in block_hashes {
                    *model.entry(*h).or_default() += 1;
                }
            }
            KvCacheEvent::BlockRemoved { block_hashes, .. } => {
                for h in block_hashes {
                    let n = model
                        .get_mut(h)
                        .ok_or_else(|| format!("removed {h:x}, never stored"))?;
                    *n -= 1;
                    if *n == 0 {
                        model.remove(h);
                    }
                }
            }
            KvCacheEvent::AllBlocksCleared => model.clear(),
        }
    }
    Ok(())
}

fn run(w: &Workload) -> Result<(), String> {
    let cfg = SchedulerConfig {
        enable_prefix_caching: true,
        enable_kv_cache_events: true,
        max_model_len: 256,
        ..common::config(w.block_size, w.num_gpu_blocks)
    };
    let mut s = Scheduler::new(cfg).map_err(|e| e.to_string())?;
    let mut model = HashMap::new();
    for step in 0..60u32 {
        for (i, r) in w.reqs.iter().enumerate().filter(|(_, r)| r.0 == step) {
            let new = NewRequest::new(format!("r{i}"), r.1.clone(), SamplingParams::greedy(r.2));
            s.add_request(new).map_err(|e| e.to_string())?;
        }
        for &(_, i) in w.aborts.iter().filter(|a| a.0 == step) {
            s.finish_requests(&[format!("r{i}")], RequestStatus::FinishedAborted);
        }
        for &(_, preempt) in w.resets.iter().filter(|r| r.0 == step) {
            s.reset_prefix_cache(preempt);
        }
        common::step_with(&mut s, step % 3);
        apply(&mut model, &s.take_kv_cache_events()).map_err(|e| format!("step {step}: {e}"))?;
        let pool = cached(&s);
        if model != pool {
            return Err(format!(
                "step {step}: events say {model:?}, pool holds {pool:?}"
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Replaying the event stream into a model of the cache (stored minus
    /// removed, emptied on AllBlocksCleared, counted per block since vLLM
    /// does not de-duplicate) always gives the pool's cached hashes.
    #[test]
    fn events_track_the_cached_block_set(w in workload()) {
        prop_assert_eq!(run(&w), Ok(()));
    }
}

#[test]
fn events_are_off_by_default() {
    let mut s = Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..common::config(4, 16)
    })
    .expect("config");
    common::add(&mut s, "a", (0..9).collect(), 2);
    common::step(&mut s);
    assert!(s.take_kv_cache_events().is_empty());
    assert!(s.kv_cache_manager().pool().cached_map().len() == 2);
}
