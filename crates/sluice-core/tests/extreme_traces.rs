//! Fuzz-style robustness of trace parsing and replay: every golden trace in
//! `tests/data/traces/`, with one numeric field at a time set to an extreme
//! value (0, 1, -1, a fraction, 2^24 + 1, 2^31, 2^53, 2^63, -2^63), is either
//! refused by `Trace::from_json` / `Replayer` with an error or replays
//! without panicking. Replays are cut after a few steps, so the whole sweep
//! stays within seconds even where a mutation is accepted (a huge
//! `max_steps`, a tiny pool).
//!
//! Deterministic on purpose: the same cases run everywhere, and a failure
//! names the trace, the field and the value to reproduce it.

use serde_json::Value;
use sluice_core::replay::Replayer;
use sluice_core::trace::Trace;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Values past every limit, at them, and of every wrong numeric kind.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "16777217",
    "2147483648",
    "9007199254740992",
    "9223372036854775808",
    "-9223372036854775808",
];

/// Steps replayed per accepted mutation.
const MAX_REPLAY_STEPS: usize = 24;

const CONFIG_FIELDS: &[&str] = &[
    "block_size",
    "num_gpu_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "long_prefill_token_threshold",
];

const REQUEST_FIELDS: &[&str] = &[
    "arrival_step",
    "priority",
    "max_tokens",
    "min_tokens",
    "eos_token_id",
];

/// Where a mutation writes.
enum Target {
    Config(&'static str),
    Top(&'static str),
    Request(usize, &'static str),
    /// The first entry of a token array of a request.
    RequestToken(usize, &'static str),
    Abort(usize, &'static str),
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Config(f) => format!("config.{f}"),
            Target::Top(f) => (*f).to_string(),
            Target::Request(i, f) => format!("requests[{i}].{f}"),
            Target::RequestToken(i, f) => format!("requests[{i}].{f}[0]"),
            Target::Abort(i, f) => format!("aborts[{i}].{f}"),
        }
    }

    /// Sets the field; false when the trace has no such place (a token
    /// array that is empty, a request or abort that does not exist).
    fn apply(&self, trace: &mut Value, v: Value) -> bool {
        let slot = match self {
            Target::Config(f) => trace.get_mut("config").map(|c| &mut c[*f]),
            Target::Top(f) => Some(&mut trace[*f]),
            Target::Request(i, f) => trace
                .get_mut("requests")
                .and_then(|r| r.get_mut(*i))
                .map(|r| &mut r[*f]),
            Target::RequestToken(i, f) => trace
                .get_mut("requests")
                .and_then(|r| r.get_mut(*i))
                .and_then(|r| r.get_mut(*f))
                .and_then(|a| a.get_mut(0)),
            Target::Abort(i, f) => trace
                .get_mut("aborts")
                .and_then(|a| a.get_mut(*i))
                .map(|a| &mut a[*f]),
        };
        match slot {
            Some(slot) => {
                *slot = v;
                true
            }
            None => false,
        }
    }
}

fn targets() -> Vec<Target> {
    let mut t: Vec<Target> = CONFIG_FIELDS.iter().map(|f| Target::Config(f)).collect();
    t.push(Target::Top("max_steps"));
    for i in 0..2 {
        t.extend(REQUEST_FIELDS.iter().map(|f| Target::Request(i, f)));
        for f in ["prompt", "output", "stop_token_ids"] {
            t.push(Target::RequestToken(i, f));
        }
        t.push(Target::Abort(i, "step"));
    }
    t
}

/// Golden traces up to this size go through `Trace::from_json` (text);
/// larger ones through `Trace::from_value`, the same validation without
/// printing and re-parsing the JSON, which is most of their cost (it took
/// the sweep from 3 s to 12 s). `from_json` is `from_str` + `from_value`.
const TEXT_PATH_MAX_BYTES: usize = 16 << 10;

/// Parses and replays a few steps; Err(message) only on a panic.
fn parse_and_replay(trace: &Value, as_text: bool) -> Result<(), String> {
    let run = catch_unwind(AssertUnwindSafe(|| {
        let parsed = if as_text {
            Trace::from_json(&trace.to_string())
        } else {
            Trace::from_value(trace)
        };
        let Ok(trace) = parsed else {
            return;
        };
        let Ok(mut replayer) = Replayer::new(trace) else {
            return;
        };
        for _ in 0..MAX_REPLAY_STEPS {
            if !replayer.has_next() || replayer.step(true, None).is_err() {
                break;
            }
        }
    }));
    run.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}

#[test]
fn extreme_numbers_in_golden_traces_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/traces");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".trace.json").map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 40, "golden traces missing: {names:?}");

    // The default hook would print every caught panic; the failures are
    // reported below, all together.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let targets = targets();
    let mut failures = Vec::new();
    let mut cases = 0;
    for name in &names {
        let text = std::fs::read_to_string(dir.join(format!("{name}.trace.json"))).unwrap();
        let golden: Value = serde_json::from_str(&text).unwrap();
        let as_text = text.len() <= TEXT_PATH_MAX_BYTES;
        for target in &targets {
            for value in VALUES {
                let mut trace = golden.clone();
                if !target.apply(&mut trace, serde_json::from_str(value).unwrap()) {
                    continue;
                }
                cases += 1;
                if let Err(panic) = parse_and_replay(&trace, as_text) {
                    failures.push(format!("{name}: {} = {value}: {panic}", target.describe()));
                }
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(cases > 5000, "only {cases} cases ran");
    assert!(
        failures.is_empty(),
        "{} of {cases} mutated traces panicked:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
