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

fn data_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/bench")
        .join(name)
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

fn step_logs(dataset: &str) -> BTreeMap<String, Vec<StepRecord>> {
    let path = data_dir(dataset).join("step-logs.tar.gz");
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
/// (this test prints the scores): c1 +4.2 %, c16 +10.9 %, c64 +27.9 %, p30
/// −5.3 %, p70 −13.8 %, p110 −7.8 %, longprompt +3.5 %, longoutput +19.1 %,
/// prefix +59.9 % (its logs predate `shared_context`, so its rows' shared
/// prefix is priced as distinct contexts), preempt +30.5 %.
const BOUNDS: &[(&str, f64)] = &[
    ("c1", 0.08),
    ("c16", 0.14),
    ("c64", 0.31),
    ("p30", 0.09),
    ("p70", 0.17),
    ("p110", 0.11),
    ("longprompt", 0.07),
    ("longoutput", 0.22),
    ("prefix", 0.63),
    ("preempt", 0.34),
];

/// The table profile of `dataset`.
fn profile(dataset: &str) -> Profile {
    let path = data_dir(dataset).join("profile.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let profile = Profile::from_json_str(&text, "profile.json").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(profile.kind(), "table");
    profile
}

/// Every workload of `bounds` predicted within its bound.
fn check_dataset(dataset: &str, bounds: &[(&str, f64)]) {
    let model = profile(dataset).step_model(None, 1).unwrap();
    let logs = step_logs(dataset);
    let mut failures = Vec::new();
    for &(workload, bound) in bounds {
        let log = logs
            .get(workload)
            .unwrap_or_else(|| panic!("{dataset}: no {workload}.r1.steps.jsonl"));
        assert!(log.len() > 50, "{workload}: only {} steps", log.len());
        let e = busy_time_error(model.as_ref(), log);
        println!(
            "{dataset} {workload:<11} {:>5} steps  busy time predicted {:+.1} %  (bound ±{:.0} %)",
            log.len(),
            e * 100.0,
            bound * 100.0
        );
        if e.abs() > bound {
            failures.push(format!("{workload}: {:+.1} %", e * 100.0));
        }
    }
    assert!(
        failures.is_empty(),
        "{dataset}: outside the bounds: {failures:?}"
    );
}

#[test]
fn the_committed_grid_profile_predicts_held_out_step_logs() {
    check_dataset("sim-validation-smollm2", BOUNDS);
}

/// The same on an AVX2 machine (AMD EPYC Zen 3), whose profile also holds
/// the decode grid on one cached prefix and whose step logs record each
/// row's shared context. Scores when committed: c1 −12.8 %, c16 −9.2 %,
/// c64 −0.4 %, p70 −12.8 %, longprompt −3.5 %, longoutput −5.8 %, prefix
/// +1.0 %.
const BOUNDS_AVX2: &[(&str, f64)] = &[
    ("c1", 0.16),
    ("c16", 0.13),
    ("c64", 0.04),
    ("p70", 0.16),
    ("longprompt", 0.07),
    ("longoutput", 0.09),
    ("prefix", 0.05),
];

#[test]
fn the_committed_avx2_grid_profile_predicts_held_out_step_logs() {
    check_dataset("sim-validation-smollm2-avx2", BOUNDS_AVX2);
}

/// On the shared-prefix workload (16 requests on one 768-token system
/// prompt), pricing the rows' shared blocks from the profile's
/// `decode.shared` grid predicts the measured decode steps better than
/// taking every row's context as its own (when committed: +3.0 % against
/// +28.9 % over their busy time).
#[test]
fn pricing_shared_prefix_blocks_predicts_the_prefix_log_better() {
    let dataset = "sim-validation-smollm2-avx2";
    let Profile::Table(with) = profile(dataset) else {
        unreachable!("checked by profile()")
    };
    assert!(
        with.table.decode.shared.is_some(),
        "the profile has a shared grid"
    );
    let mut without = with.table.clone();
    without.decode.shared = None;
    let logs = step_logs(dataset);
    let decode_only: Vec<StepRecord> = logs["prefix"]
        .iter()
        .filter(|r| r.num_reqs > 0 && r.num_prefill_reqs == 0)
        .cloned()
        .collect();
    let shared_steps = decode_only
        .iter()
        .filter(|r| r.shared_context.iter().any(|&s| s > 0))
        .count();
    assert!(
        shared_steps * 2 > decode_only.len(),
        "most decode steps share the prefix ({shared_steps} of {})",
        decode_only.len()
    );
    let e_with = busy_time_error(&with.table, &decode_only);
    let e_without = busy_time_error(&without, &decode_only);
    println!(
        "prefix decode steps: busy time {:+.1} % priced shared, {:+.1} % as distinct",
        e_with * 100.0,
        e_without * 100.0
    );
    assert!(
        e_with.abs() < 0.06 && e_with.abs() * 3.0 < e_without.abs(),
        "shared {e_with}, distinct {e_without}"
    );
}
