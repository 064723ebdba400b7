//! The process's log: one record per line on stderr, at a level, in text
//! or JSON.
//!
//! Owns: the process-wide settings (`init`: the least level written and the
//! format) and the writing of a record. Every server-side message goes
//! through here — the startup summary, the access and stats lines,
//! warnings — so `--log-level` and `--log-format` apply to all of them.
//!
//! Promises:
//! - one record is one line, written whole under stderr's lock, so lines
//!   of concurrent writers never interleave;
//! - text: `sluice: MSG` (`sluice: warning: MSG`, `sluice: debug: MSG`),
//!   the lines sluice has always printed; a record's fields are already
//!   part of its message and are not repeated;
//! - JSON: one object per line with `ts` (RFC 3339, UTC, milliseconds),
//!   `level` (`error`, `warn`, `info`, `debug`), `msg` (the text line's
//!   message), then the record's fields as keys of their own, so a log
//!   shipper needs no parsing of `msg`;
//! - before `init`, records at info and above are written as text (what
//!   the commands other than `serve` get).

use serde_json::{Map, Value};
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How important a record is; a record is written when its level is at
/// least as important as the configured one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// A level name as `RUST_LOG` spells them (`trace` is written as
    /// debug, `off` keeps only errors).
    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "error" => Some(Level::Error),
            "warn" | "warning" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" | "trace" => Some(Level::Debug),
            _ => None,
        }
    }

    /// The level a `RUST_LOG` value asks sluice for: a directive naming a
    /// target that starts with `sluice` (`sluice=debug`,
    /// `sluice_server=warn`) wins over a bare level (`debug`); anything
    /// else (other crates' targets, span filters) is ignored. `None` when
    /// the value says nothing about sluice.
    pub fn from_rust_log(value: &str) -> Option<Level> {
        let mut bare = None;
        let mut ours = None;
        for directive in value.split(',').map(str::trim) {
            match directive.split_once('=') {
                Some((target, level)) if target.trim().starts_with("sluice") => {
                    ours = Level::parse(level).or(ours);
                }
                Some(_) => {}
                None => bare = Level::parse(directive).or(bare),
            }
        }
        ours.or(bare)
    }

    fn from_code(c: u8) -> Level {
        match c {
            1 => Level::Error,
            2 => Level::Warn,
            4 => Level::Debug,
            _ => Level::Info,
        }
    }
}

/// How records are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `sluice: MSG`, for people.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// `Level` as a `u8`; 0: not initialised (info).
static LEVEL: AtomicU8 = AtomicU8::new(0);
/// 0: text, 1: JSON.
static FORMAT: AtomicU8 = AtomicU8::new(0);

/// Sets the least level written and the format, for the whole process
/// (a later call replaces them).
pub fn init(level: Level, format: Format) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    FORMAT.store(u8::from(format == Format::Json), Ordering::Relaxed);
}

/// The least level written.
pub fn level() -> Level {
    Level::from_code(LEVEL.load(Ordering::Relaxed))
}

pub fn format() -> Format {
    if FORMAT.load(Ordering::Relaxed) == 1 {
        Format::Json
    } else {
        Format::Text
    }
}

/// Whether a record at `level` would be written (to skip building one).
pub fn enabled(level: Level) -> bool {
    level <= self::level()
}

/// Writes one record: `msg`, and in JSON also `fields`, each as its own
/// key (a field named `ts`, `level` or `msg` is dropped).
pub fn log(level: Level, msg: &str, fields: &[(&str, Value)]) {
    log_as("sluice", level, msg, fields);
}

/// [`log`] under another prefix of the text line (`sluice serve: MSG`).
pub fn log_as(prefix: &str, level: Level, msg: &str, fields: &[(&str, Value)]) {
    if !enabled(level) {
        return;
    }
    let line = match format() {
        Format::Text => text_line(prefix, level, msg),
        Format::Json => json_line(SystemTime::now(), level, msg, fields),
    };
    let mut err = std::io::stderr().lock();
    // A closed stderr has nowhere to report to.
    let _ = writeln!(err, "{line}");
}

pub fn error(msg: &str) {
    log(Level::Error, msg, &[]);
}

pub fn warn(msg: &str) {
    log(Level::Warn, msg, &[]);
}

pub fn info(msg: &str) {
    log(Level::Info, msg, &[]);
}

pub fn debug(msg: &str) {
    log(Level::Debug, msg, &[]);
}

fn text_line(prefix: &str, level: Level, msg: &str) -> String {
    match level {
        Level::Warn => format!("{prefix}: warning: {msg}"),
        Level::Debug => format!("{prefix}: debug: {msg}"),
        Level::Error | Level::Info => format!("{prefix}: {msg}"),
    }
}

fn json_line(now: SystemTime, level: Level, msg: &str, fields: &[(&str, Value)]) -> String {
    let mut obj = Map::new();
    obj.insert("ts".into(), Value::from(rfc3339(now)));
    obj.insert("level".into(), Value::from(level.as_str()));
    obj.insert("msg".into(), Value::from(msg));
    for (k, v) in fields {
        if !obj.contains_key(*k) {
            obj.insert((*k).to_string(), v.clone());
        }
    }
    Value::Object(obj).to_string()
}

/// `2026-12-02T05:34:24.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let t = i64::try_from(d.as_secs())
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |s: u64, ms: u64| UNIX_EPOCH + Duration::from_millis(s * 1000 + ms);
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00.000Z");
        // `date -u -d @951782400`: the leap day of 2000.
        assert_eq!(rfc3339(at(951_782_400, 5)), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(at(1_796_189_664, 123)), "2026-12-02T05:34:24.123Z");
        assert_eq!(rfc3339(at(4_107_542_399, 999)), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn rust_log_values_give_sluices_level() {
        assert_eq!(Level::from_rust_log("debug"), Some(Level::Debug));
        assert_eq!(Level::from_rust_log("sluice=debug"), Some(Level::Debug));
        assert_eq!(
            Level::from_rust_log("warn,sluice_server=debug,hyper=trace"),
            Some(Level::Debug)
        );
        assert_eq!(
            Level::from_rust_log("sluice=error,info"),
            Some(Level::Error)
        );
        assert_eq!(Level::from_rust_log("hyper=debug"), None);
        assert_eq!(Level::from_rust_log("TRACE"), Some(Level::Debug));
        assert_eq!(Level::from_rust_log(""), None);
    }

    #[test]
    fn lines_in_both_formats() {
        assert_eq!(text_line("sluice", Level::Info, "hi"), "sluice: hi");
        assert_eq!(
            text_line("sluice", Level::Warn, "hm"),
            "sluice: warning: hm"
        );
        let line = json_line(
            UNIX_EPOCH,
            Level::Info,
            "done",
            &[
                ("status", Value::from(200)),
                ("msg", Value::from("dropped")),
            ],
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ts"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["level"], "info");
        assert_eq!(v["msg"], "done");
        assert_eq!(v["status"], 200);
        assert!(!line.contains('\n'));
    }

    #[test]
    fn levels_order_from_error_to_debug() {
        assert!(Level::Error < Level::Warn && Level::Info < Level::Debug);
        assert_eq!(Level::from_code(Level::Warn as u8), Level::Warn);
        assert_eq!(Level::from_code(0), Level::Info);
    }
}
