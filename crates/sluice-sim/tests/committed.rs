//! The committed validation data (`docs/bench/sim-validation-smollm2/`):
//! a table profile measured on a grid of step shapes by `sluice
//! bench-model --profile`, and the step logs `sluice serve --step-log`
//! wrote while `tools/validate_sim.sh` measured held-out workloads on the
//! same machine. The profile never saw those steps: each log's busy time
//! (Σ `step_s`) as the profile predicts it, step by step from the logged
//! shapes, must stay within the error measured when the data was
//! committed (the bounds below, a few points above it), so that a change to
//! the table's lookup or interpolation that makes its predictions of real
//! steps worse fails here.

use flate2::read::GzDecoder;
use sluice_sim::fit::parse_step_log;
use sluice_sim::profile::Profile;
use sluice_sim::steplog::StepRecord;
use sluice_sim::StepTimeModel;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench/sim-validation-smollm2")
}

/// The regular files of an uncompressed ustar archive, by name.
fn untar(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut at = 0;
    while at + 512 <= bytes.len() {
        let header = &bytes[at..at + 512];
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let field = |r: std::ops::Range<usize>| {
            let f = &header[r];
            let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).trim().to_string()
        };
        let name = field(0..100);
        let size = usize::from_str_radix(&field(124..136), 8)
            .unwrap_or_else(|e| panic!("tar entry {name}: size: {e}"));
        let kind = header[156];
        let body = at + 512;
        assert!(body + size <= bytes.len(), "tar entry {name} is truncated");
        if kind == b'0' || kind == 0 {
            let name = name.rsplit('/').next().unwrap_or(&name).to_string();
            files.insert(name, bytes[body..body + size].to_vec());
        }
        at = body + size.div_ceil(512) * 512;
    }
    files
}

fn step_logs() -> BTreeMap<String, Vec<StepRecord>> {
    let path = data_dir().join("step-logs.tar.gz");
    let gz = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut tar = Vec::new();
    GzDecoder::new(gz.as_slice())
        .read_to_end(&mut tar)
        .expect("step-logs.tar.gz is gzip");
    untar(&tar)
        .into_iter()
        .filter_map(|(name, body)| {
            let workload = name.strip_suffix(".r1.steps.jsonl")?.to_string();
            let text = String::from_utf8(body).expect("a step log is UTF-8");
            let records = parse_step_log(&text, &name).unwrap_or_else(|e| panic!("{e}"));
            Some((workload, records))
        })
        .collect()
}

/// Σ predicted ÷ Σ measured step time − 1 over a log's non-empty steps.
fn busy_time_error(model: &dyn StepTimeModel, log: &[StepRecord]) -> f64 {
    let (mut predicted, mut measured) = (0.0, 0.0);
    for r in log.iter().filter(|r| r.num_reqs > 0) {
        predicted += model.step_time(&r.shape());
        measured += r.step_s;
    }
    predicted / measured - 1.0
}

/// Each held-out workload's bound on |busy-time error|, a few points above
/// what the committed profile scored on its log when it was committed
/// (printed by this test).
const BOUNDS: &[(&str, f64)] = &[
    ("c1", 0.10),
    ("c16", 0.10),
    ("c64", 0.10),
    ("p30", 0.10),
    ("p70", 0.10),
    ("p110", 0.10),
    ("longprompt", 0.10),
    ("longoutput", 0.10),
    ("prefix", 0.10),
    ("preempt", 0.10),
];

#[test]
fn the_committed_grid_profile_predicts_held_out_step_logs() {
    let path = data_dir().join("profile.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let profile = Profile::from_json_str(&text, "profile.json").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(profile.kind(), "table");
    let model = profile.step_model(None, 1).unwrap();
    let logs = step_logs();
    let mut failures = Vec::new();
    for &(workload, bound) in BOUNDS {
        let log = logs
            .get(workload)
            .unwrap_or_else(|| panic!("step-logs.tar.gz has no {workload}.r1.steps.jsonl"));
        assert!(log.len() > 50, "{workload}: only {} steps", log.len());
        let e = busy_time_error(model.as_ref(), log);
        println!(
            "{workload:<11} {:>5} steps  busy time predicted {:+.1} %  (bound ±{:.0} %)",
            log.len(),
            e * 100.0,
            bound * 100.0
        );
        if e.abs() > bound {
            failures.push(format!("{workload}: {:+.1} %", e * 100.0));
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}
