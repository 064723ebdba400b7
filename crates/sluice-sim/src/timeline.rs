//! The `--timeline CSV` writer: one row per engine step, streamed.
//!
//! Columns, after a header row:
//! `time_s,replica,scheduled_tokens,num_reqs,running,waiting,kv_usage,preemptions`
//! where `time_s` is the step's start on the virtual clock, `running` /
//! `waiting` / `kv_usage` are as right after `schedule()`, and
//! `preemptions` counts the requests that step preempted. Numbers are
//! written in Rust's shortest round-trip form, so a reader gets back the
//! exact `f64`s. Rows go out in the order given; a multi-replica caller
//! that wants them by time merges its replicas' steps first.

use crate::sim::StepLog;
use std::io::{self, Write};

/// The header row, without its newline.
pub const HEADER: &str =
    "time_s,replica,scheduled_tokens,num_reqs,running,waiting,kv_usage,preemptions";

/// Writes steps as CSV rows to any `io::Write` (buffer it: one `write!`
/// per row).
pub struct TimelineWriter<W: Write> {
    out: W,
}

impl<W: Write> TimelineWriter<W> {
    /// Starts a timeline: writes the header.
    pub fn new(mut out: W) -> io::Result<Self> {
        writeln!(out, "{HEADER}")?;
        Ok(TimelineWriter { out })
    }

    /// Writes one step's row.
    pub fn write_step(&mut self, s: &StepLog) -> io::Result<()> {
        writeln!(
            self.out,
            "{},{},{},{},{},{},{},{}",
            s.start_s,
            s.replica,
            s.num_tokens,
            s.num_reqs,
            s.num_running,
            s.num_waiting,
            s.kv_usage,
            s.num_preempted
        )
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes a whole timeline (header and every step) to `out`.
pub fn write_timeline<'a, W: Write>(
    out: W,
    steps: impl IntoIterator<Item = &'a StepLog>,
) -> io::Result<W> {
    let mut w = TimelineWriter::new(out)?;
    for s in steps {
        w.write_step(s)?;
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_steps_exactly() {
        let steps = [
            StepLog {
                replica: 0,
                start_s: 0.0,
                duration_s: 0.25,
                num_reqs: 2,
                num_tokens: 300,
                num_preempted: 0,
                num_running: 2,
                num_waiting: 1,
                kv_usage: 0.125,
                ..StepLog::default()
            },
            StepLog {
                replica: 1,
                start_s: 0.25,
                duration_s: 0.01,
                num_reqs: 3,
                num_tokens: 3,
                num_preempted: 1,
                num_running: 2,
                num_waiting: 2,
                kv_usage: 0.1,
                ..StepLog::default()
            },
        ];
        let out = write_timeline(Vec::new(), &steps).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "time_s,replica,scheduled_tokens,num_reqs,running,waiting,kv_usage,preemptions\n\
             0,0,300,2,2,1,0.125,0\n\
             0.25,1,3,3,2,2,0.1,1\n"
        );
    }

    #[test]
    fn an_empty_run_is_just_the_header() {
        let out = write_timeline(Vec::new(), &[]).unwrap();
        assert_eq!(out, format!("{HEADER}\n").into_bytes());
    }
}
