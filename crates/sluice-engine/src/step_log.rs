//! The step log writer: one `sluice_core::StepRecord` JSON line per
//! engine step that scheduled tokens (`sluice serve --step-log PATH`), for
//! `sluice simulate fit` and for checking a simulation against serving.
//!
//! What is logged: every step whose `schedule()` gave at least one token.
//! Steps that scheduled nothing (a stall waiting for KV blocks, a step that
//! only told the executor about finished requests) are not logged: they
//! run no forward pass, and a fitter reading them as zero-token steps would
//! learn a step cost that no simulated step pays. Their indices still
//! count, so `step` shows a gap where they were.
//!
//! Promises: writing never slows serving down by more than formatting one
//! line into a buffer (a `BufWriter`, flushed every `FLUSH_LINES` lines,
//! when a line finds the last flush `FLUSH_INTERVAL` old, when the engine
//! goes idle and when it stops); a write error is reported once on stderr,
//! naming the log, and logging stops while serving goes on.

use sluice_core::StepRecord;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Lines between flushes while steps keep coming.
pub const FLUSH_LINES: usize = 256;
/// Longest a written line waits in the buffer while steps keep coming.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Where the step records go (see the module docs).
pub struct StepLog {
    /// `None` once a write failed.
    out: Option<BufWriter<Box<dyn Write + Send>>>,
    /// What the log is called in messages (its path).
    name: String,
    line: Vec<u8>,
    unflushed: usize,
    last_flush: Instant,
    written: u64,
}

impl StepLog {
    /// Creates (truncates) the file at `path`. The error names the path.
    pub fn create(path: &Path) -> io::Result<StepLog> {
        let file = File::create(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create the step log {}: {e}", path.display()),
            )
        })?;
        Ok(StepLog::new(path.display().to_string(), Box::new(file)))
    }

    /// A log into any writer; `name` is what messages call it.
    pub fn new(name: impl Into<String>, out: Box<dyn Write + Send>) -> StepLog {
        StepLog {
            out: Some(BufWriter::with_capacity(128 * 1024, out)),
            name: name.into(),
            line: Vec::with_capacity(512),
            unflushed: 0,
            last_flush: Instant::now(),
            written: 0,
        }
    }

    /// Lines written so far (into the buffer).
    pub fn lines_written(&self) -> u64 {
        self.written
    }

    /// Whether logging still runs (no write has failed).
    pub fn is_active(&self) -> bool {
        self.out.is_some()
    }

    /// Appends one line.
    pub fn write(&mut self, record: &StepRecord) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        self.line.clear();
        // A record is numbers only: serializing it cannot fail.
        if serde_json::to_writer(&mut self.line, record).is_err() {
            return;
        }
        self.line.push(b'\n');
        if let Err(e) = out.write_all(&self.line) {
            self.fail(&e);
            return;
        }
        self.written += 1;
        self.unflushed += 1;
        if self.unflushed >= FLUSH_LINES || self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush();
        }
    }

    /// Writes out what is buffered.
    pub fn flush(&mut self) {
        if self.unflushed == 0 {
            return;
        }
        if let Some(out) = self.out.as_mut() {
            if let Err(e) = out.flush() {
                self.fail(&e);
                return;
            }
        }
        self.unflushed = 0;
        self.last_flush = Instant::now();
    }

    fn fail(&mut self, e: &io::Error) {
        eprintln!(
            "sluice: step log {}: write failed ({e}); step logging stops, serving goes on",
            self.name
        );
        // Dropping a BufWriter retries its flush; what it holds is lost
        // either way, so forget it without another attempt.
        if let Some(w) = self.out.take() {
            let (_inner, _lost) = w.into_parts();
        }
    }
}

impl Drop for StepLog {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Accepts `ok` bytes, then fails every write.
    struct Failing {
        ok: usize,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.ok == 0 {
                return Err(io::Error::other("disk full"));
            }
            let n = buf.len().min(self.ok);
            self.ok -= n;
            self.got.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_flushed_in_batches_and_on_drop() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let mut log = StepLog::new(
            "mem",
            Box::new(Failing {
                ok: usize::MAX,
                got: got.clone(),
            }),
        );
        let rec = StepRecord {
            step: 3,
            ..StepRecord::default()
        };
        for _ in 0..FLUSH_LINES - 1 {
            log.write(&rec);
        }
        // Within a second of the last flush, nothing has gone out yet.
        if log.last_flush.elapsed() < FLUSH_INTERVAL {
            assert!(got.lock().unwrap().is_empty());
        }
        log.write(&rec);
        assert_eq!(
            got.lock().unwrap().split(|&b| b == b'\n').count(),
            FLUSH_LINES + 1
        );
        log.write(&rec);
        drop(log);
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), FLUSH_LINES + 1);
        for line in text.lines() {
            let back: StepRecord = serde_json::from_str(line).unwrap();
            assert_eq!(back, rec);
        }
    }

    #[test]
    fn a_write_error_stops_logging_without_panicking() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let mut log = StepLog::new(
            "full",
            Box::new(Failing {
                ok: 10,
                got: got.clone(),
            }),
        );
        let rec = StepRecord::default();
        for _ in 0..FLUSH_LINES * 2 {
            log.write(&rec);
        }
        assert!(!log.is_active());
        let written = log.lines_written();
        log.write(&rec);
        log.flush();
        assert_eq!(log.lines_written(), written);
        assert_eq!(got.lock().unwrap().len(), 10);
    }
}
