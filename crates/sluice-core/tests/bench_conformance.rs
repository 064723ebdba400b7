//! Conformance at scale: the five scheduler-overhead traces of
//! `tests/data/bench/` (gzip-compressed; see its README.md) must replay to
//! vLLM 0.33.0's decision logs byte for byte, exactly as `sluice replay`
//! writes them (one `StepRecord::to_json` line per step). The 40 small
//! goldens (`conformance.rs`) cover the corner cases; these cover scale:
//! up to 3,600 requests, 1,024 running at once and a 147,712-block pool.
//!
//! All five take about 10 s in the debug profile on two cores, so none is
//! ignored.

use flate2::read::GzDecoder;
use sluice_core::replay::replay;
use sluice_core::trace::Trace;
use std::io::Read;
use std::path::{Path, PathBuf};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bench")
}

fn gunzip(path: &Path) -> String {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text
}

/// Replays `name` and asserts its log equals the golden one byte for byte,
/// naming the first differing step when it does not.
fn check(name: &str) {
    let dir = data_dir();
    let trace = gunzip(&dir.join(format!("{name}.trace.json.gz")));
    let golden = gunzip(&dir.join(format!("{name}.vllm.jsonl.gz")));
    let trace = Trace::from_json(&trace).unwrap_or_else(|e| panic!("{name}: {e}"));
    let log = replay(trace).unwrap_or_else(|e| panic!("{name}: {e}"));

    let mut ours = String::with_capacity(golden.len());
    for rec in &log {
        ours.push_str(&rec.to_json());
        ours.push('\n');
    }
    if ours == golden {
        return;
    }
    // Not identical: name the first step that differs, for the reader.
    let (want, got): (Vec<&str>, Vec<&str>) = (golden.lines().collect(), ours.lines().collect());
    if let Some(step) = (0..want.len().min(got.len())).find(|&i| want[i] != got[i]) {
        panic!(
            "{name}: step {step} differs\n  vllm:   {}\n  sluice: {}",
            want[step], got[step]
        );
    }
    panic!(
        "{name}: {} steps, vLLM has {} (or the line endings differ)",
        got.len(),
        want.len()
    );
}

#[test]
fn decode_64_replays_byte_identical() {
    check("decode-64");
}

#[test]
fn decode_256_replays_byte_identical() {
    check("decode-256");
}

#[test]
fn decode_1024_replays_byte_identical() {
    check("decode-1024");
}

#[test]
fn mixed_256_replays_byte_identical() {
    check("mixed-256");
}

#[test]
fn mixed_1024_replays_byte_identical() {
    check("mixed-1024");
}
