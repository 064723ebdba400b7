//! `sluice replay TRACE.json [-o LOG.jsonl] [--kv-events EVENTS.jsonl]` and
//! `sluice replay --bench`.
//!
//! `--kv-events` also writes the KV cache events each step published, one
//! `{"step": N, "events": [...]}` line per step that published any: the
//! format of vLLM's captured events (`sluice_core::kv_events`). As in vLLM,
//! `PYTHONHASHSEED` (when set) seeds the block hashes.
//!
//! A trace is read whole, but never more than `MAX_TRACE_BYTES`: the path
//! may name a pipe or a device (`/dev/zero`) that never ends.

use crate::options::hash_seed_from_env;
use clap::Args;
use sluice_core::kv_events::step_events_json;
use sluice_core::replay::{ReplayError, Replayer, StepTiming};
use sluice_core::trace::{Trace, MAX_TRACE_BYTES};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub struct ReplayArgs {
    /// The trace (its format: docs/scheduler-trace.md).
    trace: PathBuf,
    /// Write the decision log here instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Also write the KV cache events of each step here (JSON lines).
    #[arg(long, value_name = "PATH", conflicts_with = "bench")]
    kv_events: Option<PathBuf>,
    /// Time the scheduler instead of writing the log: prints one JSON line
    /// with the step count and the median and p99 µs per step of
    /// schedule() + update_from_output().
    #[arg(long)]
    bench: bool,
    /// With --bench: also write per-step timings as JSON lines here.
    #[arg(long, requires = "bench")]
    timings: Option<PathBuf>,
    /// With --bench: only count steps from this one on (e.g. past warm-up).
    #[arg(long, default_value_t = 0, requires = "bench")]
    measure_from: u64,
    /// With --bench: only count steps before this one.
    #[arg(long, requires = "bench")]
    measure_to: Option<u64>,
}

/// Exit status for a malformed trace (as the trace spec requires).
const BAD_INPUT: u8 = 2;

/// The trace's text: at most `MAX_TRACE_BYTES`, UTF-8. Errors name the file.
fn read_trace(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let too_large = || {
        format!(
            "{shown}: larger than {} MiB, the limit of a trace",
            MAX_TRACE_BYTES >> 20
        )
    };
    let file = File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if meta.is_dir() {
        return Err(format!("cannot read {shown}: it is a directory"));
    }
    // A regular file's length is known: refuse a huge one before reading.
    // Anything else (a pipe, a device) reports no useful length and is read
    // as a stream, up to one byte past the limit.
    let mut text = Vec::new();
    if meta.is_file() {
        if meta.len() > MAX_TRACE_BYTES as u64 {
            return Err(too_large());
        }
        text.reserve_exact(meta.len() as usize);
    }
    file.take(MAX_TRACE_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if text.len() > MAX_TRACE_BYTES {
        return Err(too_large());
    }
    String::from_utf8(text).map_err(|e| format!("{shown}: not UTF-8 text: {e}"))
}

pub fn run(args: ReplayArgs) -> ExitCode {
    let text = match read_trace(&args.trace) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice replay: {e}");
            return ExitCode::from(BAD_INPUT);
        }
    };
    let trace = match Trace::from_json(&text) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice replay: {}: {e}", args.trace.display());
            return ExitCode::from(BAD_INPUT);
        }
    };
    let result = if args.bench {
        bench(trace, &args)
    } else {
        write_log(trace, args.output.as_ref(), args.kv_events.as_ref())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice replay: {e}");
            // A trace the parser accepted but the scheduler refused is still
            // bad input; a failed write (a closed pipe, a full disk) is not.
            if e.is::<ReplayError>() {
                ExitCode::from(BAD_INPUT)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn create(p: &Path) -> anyhow::Result<BufWriter<File>> {
    Ok(BufWriter::new(File::create(p).map_err(|e| {
        anyhow::anyhow!("cannot create {}: {e}", p.display())
    })?))
}

fn write_log(
    trace: Trace,
    output: Option<&PathBuf>,
    kv_events: Option<&PathBuf>,
) -> anyhow::Result<()> {
    let mut out: Box<dyn Write> = match output {
        Some(p) => Box::new(create(p)?),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let mut events_out = kv_events.map(|p| create(p)).transpose()?;
    let seed = hash_seed_from_env().map_err(ReplayError)?;
    let mut r = Replayer::with_options(trace, events_out.is_some(), seed)?;
    while r.has_next() {
        let step = r.next_step();
        if let Some(rec) = r.step(true, None)? {
            writeln!(out, "{}", rec.to_json())?;
        }
        if let Some(ev_out) = &mut events_out {
            let events = r.take_kv_cache_events();
            if !events.is_empty() {
                writeln!(ev_out, "{}", step_events_json(step, &events))?;
            }
        }
    }
    out.flush()?;
    if let Some(mut ev_out) = events_out {
        ev_out.flush()?;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

fn bench(trace: Trace, args: &ReplayArgs) -> anyhow::Result<()> {
    let seed = hash_seed_from_env().map_err(ReplayError)?;
    let mut r = Replayer::with_options(trace, false, seed)?;
    let mut timings = Vec::new();
    while r.has_next() {
        let mut t = StepTiming::default();
        r.step(false, Some(&mut t))?;
        timings.push(t);
    }
    if let Some(path) = &args.timings {
        let mut f = BufWriter::new(
            File::create(path)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?,
        );
        for t in &timings {
            writeln!(
                f,
                "{{\"step\": {}, \"schedule_ns\": {}, \"update_ns\": {}}}",
                t.step, t.schedule_ns, t.update_ns
            )?;
        }
        f.flush()?;
    }
    let to = args.measure_to.unwrap_or(u64::MAX);
    let measured: Vec<&StepTiming> = timings
        .iter()
        .filter(|t| t.step >= args.measure_from && t.step < to)
        .collect();
    let mut total: Vec<f64> = measured
        .iter()
        .map(|t| (t.schedule_ns + t.update_ns) as f64 / 1000.0)
        .collect();
    let mut sched: Vec<f64> = measured
        .iter()
        .map(|t| t.schedule_ns as f64 / 1000.0)
        .collect();
    let mut upd: Vec<f64> = measured
        .iter()
        .map(|t| t.update_ns as f64 / 1000.0)
        .collect();
    for v in [&mut total, &mut sched, &mut upd] {
        v.sort_by(f64::total_cmp);
    }
    let reqs: Vec<usize> = measured.iter().map(|t| t.num_scheduled_reqs).collect();
    let mean_reqs = if reqs.is_empty() {
        0.0
    } else {
        reqs.iter().sum::<usize>() as f64 / reqs.len() as f64
    };
    println!(
        "{{\"steps\": {}, \"measured_steps\": {}, \"median_us\": {:.3}, \"p99_us\": {:.3}, \
         \"schedule_median_us\": {:.3}, \"update_median_us\": {:.3}, \"mean_scheduled_reqs\": {:.1}}}",
        timings.len(),
        measured.len(),
        percentile(&total, 0.5),
        percentile(&total, 0.99),
        percentile(&sched, 0.5),
        percentile(&upd, 0.5),
        mean_reqs
    );
    Ok(())
}
