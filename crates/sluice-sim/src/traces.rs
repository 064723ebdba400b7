//! Request traces read from files, as simulator requests.
//!
//! Three formats, picked by [`load_trace`] from the extension:
//! - **JSONL** (`.jsonl`): one object a line, `{"arrival_s": f64,
//!   "prompt_len": n | "prompt_token_ids": [..], "output_len": n,
//!   "priority"?: i32, "id"?: string}`: exactly one of `prompt_len` and
//!   `prompt_token_ids`; any other key is an error; blank lines are
//!   skipped. `prompt_len` becomes synthetic token ids drawn from the
//!   options' seed (so two such prompts share no prefix). Ids default to
//!   the request's index.
//! - **Azure LLM inference CSV** (`.csv`, the AzurePublicDataset traces
//!   such as `AzureLLMInferenceTrace_conv.csv`): a header naming
//!   `TIMESTAMP`, `ContextTokens` and `GeneratedTokens` in any order (case
//!   ignored, other columns ignored), then one row per request. A
//!   timestamp is `YYYY-MM-DD HH:MM:SS[.fraction]` (up to 9 fractional
//!   digits; `T` may separate date and time; a trailing `Z` or `±HH:MM`
//!   offset is honoured). Rows need not be sorted: `arrival_s` is each
//!   timestamp minus the earliest one. Prompts are synthetic as above;
//!   ids are the row's index.
//! - **`sluice replay` traces** (`.json`, `docs/scheduler-trace.md`),
//!   parsed by `sluice_core::trace`: each request arrives at its
//!   `arrival_step` (`SimRequest::arrival_step`), with its prompt and
//!   priority and, as `output_len`, the number of outputs the replay emits
//!   before finishing it ([`replay_output_len`], exact). The trace's
//!   scheduler config, aborts and `max_steps` come back with the requests:
//!   the simulator runs every request to its end, so a caller must refuse
//!   or warn about aborts rather than have them silently ignored.
//!
//! The CSV reader is deliberately simple: fields split at commas, with
//! surrounding spaces and double quotes removed (the Azure files quote
//! nothing); a quoted comma is not supported.
//!
//! Promise: a malformed file is an error naming the file, the line (or
//! the JSON path, for replay traces) and the field, never a panic. Both
//! text formats keep the file's order; the simulator orders by arrival.

use crate::sim::SimRequest;
use crate::workload::{random_tokens, Rng};
use serde_json::{Map, Value};
use sluice_core::trace::{Trace, TraceAbort, TraceRequest, MAX_TRACE_BYTES};
use sluice_core::SchedulerConfig;
use std::collections::HashMap;
use std::fmt;
use std::io::BufRead;
use std::path::Path;

/// Largest prompt or output a text trace may name (2^24, the scheduler's
/// `MAX_MODEL_LEN`): nothing longer could run, and a typo such as an
/// extra digit must not allocate gigabytes of synthetic tokens.
pub const MAX_TRACE_LEN: u64 = 1 << 24;

/// How synthetic prompts are made and how much of a file is read.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceOptions {
    /// Seed of the synthetic prompt tokens.
    pub seed: u64,
    /// Synthetic token ids are drawn below this.
    pub vocab: u32,
    /// Read only the first this many requests (data rows).
    pub max_requests: Option<usize>,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            seed: 0,
            vocab: 32_000,
            max_requests: None,
        }
    }
}

/// A trace file that cannot be used: where and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFileError {
    pub file: String,
    /// 1-based line, for the line formats.
    pub line: Option<usize>,
    /// The field (JSONL key, CSV column, or a replay trace's JSON path).
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for TraceFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, " line {line}")?;
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for TraceFileError {}

/// The file formats [`load_trace`] knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    Jsonl,
    AzureCsv,
    Replay,
}

/// A `sluice replay` trace as simulator input.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayWorkload {
    pub name: String,
    /// The config the trace was recorded under: simulate with it.
    pub config: SchedulerConfig,
    pub requests: Vec<SimRequest>,
    /// The trace's aborts (step, id), which the simulator does not model.
    pub aborts: Vec<TraceAbort>,
    /// The replay's step limit (the simulator runs to completion).
    pub max_steps: u64,
}

/// What a replay trace carries besides its requests.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayInfo {
    pub name: String,
    /// The config the trace was recorded under: simulate with it.
    pub config: SchedulerConfig,
    /// The trace's aborts (step, id), which the simulator does not model.
    pub aborts: Vec<TraceAbort>,
    /// The replay's step limit (the simulator runs to completion).
    pub max_steps: u64,
}

/// Any trace, as [`load_trace`] returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedTrace {
    pub format: TraceFormat,
    pub requests: Vec<SimRequest>,
    /// Replay traces only: the config, aborts and step limit.
    pub replay: Option<ReplayInfo>,
}

/// Builds errors for one file.
struct At<'a> {
    file: &'a str,
}

impl At<'_> {
    fn err(
        &self,
        line: Option<usize>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> TraceFileError {
        TraceFileError {
            file: self.file.to_string(),
            line,
            field: field.map(str::to_string),
            message: message.into(),
        }
    }

    fn line<T>(&self, line: usize, message: impl Into<String>) -> Result<T, TraceFileError> {
        Err(self.err(Some(line), None, message))
    }

    fn field<T>(
        &self,
        line: usize,
        field: &str,
        message: impl Into<String>,
    ) -> Result<T, TraceFileError> {
        Err(self.err(Some(line), Some(field), message))
    }
}

/// Calls `each(line_number, text)` for every non-blank line (trailing
/// `\r` removed), stopping early when it returns `Ok(false)`.
fn for_each_line(
    at: &At<'_>,
    mut reader: impl BufRead,
    mut each: impl FnMut(usize, &str) -> Result<bool, TraceFileError>,
) -> Result<(), TraceFileError> {
    let mut buf = Vec::new();
    let mut n = 0usize;
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| at.err(Some(n + 1), None, format!("cannot read: {e}")))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        let Ok(text) = std::str::from_utf8(&buf) else {
            return at.line(n, "not valid UTF-8");
        };
        let text = text.trim_end_matches(['\n', '\r']);
        // A byte-order mark some tools write before the first line.
        let text = if n == 1 {
            text.trim_start_matches('\u{feff}')
        } else {
            text
        };
        if text.trim().is_empty() {
            continue;
        }
        if !each(n, text)? {
            return Ok(());
        }
    }
}

/// A JSON value, shortened for a message.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// A length field: an integer in `1..=MAX_TRACE_LEN`.
fn json_len(at: &At<'_>, line: usize, key: &str, v: &Value) -> Result<usize, TraceFileError> {
    match v.as_u64() {
        Some(0) => at.field(line, key, "must be at least 1, got 0"),
        Some(n) if n > MAX_TRACE_LEN => at.field(
            line,
            key,
            format!("{n} is above the limit of {MAX_TRACE_LEN} (2^24)"),
        ),
        Some(n) => Ok(n as usize),
        None => at.field(
            line,
            key,
            format!("expected a positive integer, got {}", show(v)),
        ),
    }
}

const JSONL_KEYS: [&str; 6] = [
    "arrival_s",
    "prompt_len",
    "prompt_token_ids",
    "output_len",
    "priority",
    "id",
];

fn jsonl_request(
    at: &At<'_>,
    line: usize,
    text: &str,
    index: usize,
    rng: &mut Rng,
    vocab: u32,
) -> Result<SimRequest, TraceFileError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| at.err(Some(line), None, format!("not valid JSON: {e}")))?;
    let Some(obj): Option<&Map<String, Value>> = value.as_object() else {
        return at.line(
            line,
            format!("expected a JSON object, got {}", show(&value)),
        );
    };
    let unknown: Vec<String> = obj
        .keys()
        .filter(|k| !JSONL_KEYS.contains(&k.as_str()))
        .map(|k| format!("`{k}`"))
        .collect();
    if !unknown.is_empty() {
        return at.line(
            line,
            format!(
                "unknown field{} {} (expected arrival_s, prompt_len or prompt_token_ids, \
                 output_len, priority, id)",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", ")
            ),
        );
    }
    let arrival_s = match obj.get("arrival_s") {
        None => {
            return at.field(
                line,
                "arrival_s",
                "missing (expected seconds, a finite number ≥ 0)",
            )
        }
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && t >= 0.0 => t,
            Some(t) => {
                return at.field(
                    line,
                    "arrival_s",
                    format!("must be finite and ≥ 0, got {t}"),
                )
            }
            None => {
                return at.field(
                    line,
                    "arrival_s",
                    format!("expected a number of seconds, got {}", show(v)),
                )
            }
        },
    };
    let prompt = match (obj.get("prompt_len"), obj.get("prompt_token_ids")) {
        (Some(_), Some(_)) => {
            return at.line(
                line,
                "both `prompt_len` and `prompt_token_ids` are given (expected exactly one)",
            )
        }
        (None, None) => {
            return at.line(
                line,
                "missing `prompt_len` or `prompt_token_ids` (expected exactly one)",
            )
        }
        (Some(v), None) => {
            let n = json_len(at, line, "prompt_len", v)?;
            random_tokens(rng, n, vocab)
        }
        (None, Some(v)) => {
            let Some(items) = v.as_array() else {
                return at.field(
                    line,
                    "prompt_token_ids",
                    format!("expected an array of token ids, got {}", show(v)),
                );
            };
            if items.is_empty() {
                return at.field(line, "prompt_token_ids", "the prompt is empty");
            }
            if items.len() as u64 > MAX_TRACE_LEN {
                return at.field(
                    line,
                    "prompt_token_ids",
                    format!(
                        "{} tokens, above the limit of {MAX_TRACE_LEN} (2^24)",
                        items.len()
                    ),
                );
            }
            let mut ids = Vec::with_capacity(items.len());
            for (i, t) in items.iter().enumerate() {
                match t.as_u64().and_then(|t| u32::try_from(t).ok()) {
                    Some(t) => ids.push(t),
                    None => {
                        return at.field(
                            line,
                            &format!("prompt_token_ids[{i}]"),
                            format!(
                                "expected a token id (an integer in 0..2^32), got {}",
                                show(t)
                            ),
                        )
                    }
                }
            }
            ids
        }
    };
    let output_len = match obj.get("output_len") {
        None => return at.field(line, "output_len", "missing (expected a positive integer)"),
        Some(v) => json_len(at, line, "output_len", v)?,
    };
    let priority = match obj.get("priority") {
        None => 0,
        Some(v) => match v.as_i64().and_then(|p| i32::try_from(p).ok()) {
            Some(p) => p,
            None => {
                return at.field(
                    line,
                    "priority",
                    format!("expected an integer in the i32 range, got {}", show(v)),
                )
            }
        },
    };
    let id = match obj.get("id") {
        None => index.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => return at.field(line, "id", format!("expected a string, got {}", show(v))),
    };
    let mut req = SimRequest::new(id, arrival_s, prompt, output_len);
    req.priority = priority;
    Ok(req)
}

/// Parses a JSONL trace from `reader`; `file` names it in errors.
pub fn parse_jsonl(
    file: &str,
    reader: impl BufRead,
    opts: &TraceOptions,
) -> Result<Vec<SimRequest>, TraceFileError> {
    let at = At { file };
    let mut rng = Rng::new(opts.seed);
    let mut out: Vec<SimRequest> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let limit = opts.max_requests.unwrap_or(usize::MAX);
    if limit == 0 {
        return Ok(out);
    }
    for_each_line(&at, reader, |line, text| {
        let req = jsonl_request(&at, line, text, out.len(), &mut rng, opts.vocab)?;
        if let Some(first) = seen.insert(req.id.clone(), line) {
            return at.field(
                line,
                "id",
                format!("duplicate id {:?} (first on line {first})", req.id),
            );
        }
        out.push(req);
        Ok(out.len() < limit)
    })?;
    Ok(out)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Fixed-width decimal digits.
fn digits(s: &str, what: &str) -> Result<u32, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the {what} `{s}` is not a number"));
    }
    s.parse::<u32>()
        .map_err(|_| format!("the {what} `{s}` is out of range"))
}

/// Nanoseconds since the Unix epoch of `YYYY-MM-DD HH:MM:SS[.f{1,9}]`
/// with an optional `T` separator and `Z` / `±HH:MM` / `±HHMM` offset.
pub fn parse_timestamp(s: &str) -> Result<i128, String> {
    let s = s.trim();
    let bad = |why: String| {
        Err(format!(
            "`{s}` is not a date-time like 2023-11-16 18:15:46.6805900 ({why})"
        ))
    };
    let (date, rest) = match s.find([' ', 'T']) {
        Some(i) => (&s[..i], s[i + 1..].trim_start()),
        None => return bad("no time after the date".into()),
    };
    let dp: Vec<&str> = date.split('-').collect();
    let [ys, ms, ds] = dp[..] else {
        return bad("the date is not YYYY-MM-DD".into());
    };
    if ys.len() != 4 || ms.len() != 2 || ds.len() != 2 {
        return bad("the date is not YYYY-MM-DD".into());
    }
    let (y, m, d) = match (digits(ys, "year"), digits(ms, "month"), digits(ds, "day")) {
        (Ok(y), Ok(m), Ok(d)) => (i64::from(y), m, d),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return bad(e),
    };
    if !(1..=12).contains(&m) {
        return bad(format!("month {m}"));
    }
    if d == 0 || d > days_in_month(y, m) {
        return bad(format!("day {d} of month {m}"));
    }
    // Split off an offset: `Z`, or a sign after the seconds.
    let (time, offset_s) = if let Some(t) = rest.strip_suffix(['Z', 'z']) {
        (t, 0i64)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (t, off) = (&rest[..i], &rest[i..]);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let hm = off[1..].replace(':', "");
        if hm.len() != 4 || !hm.bytes().all(|b| b.is_ascii_digit()) {
            return bad(format!("offset `{off}` is not ±HH:MM"));
        }
        let (oh, om) = match (
            digits(&hm[..2], "offset hour"),
            digits(&hm[2..], "offset minute"),
        ) {
            (Ok(h), Ok(m)) if h <= 23 && m <= 59 => (i64::from(h), i64::from(m)),
            _ => return bad(format!("offset `{off}` is not ±HH:MM")),
        };
        (t, sign * (oh * 3600 + om * 60))
    } else {
        (rest, 0)
    };
    let (hms, frac) = match time.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (time, None),
    };
    let tp: Vec<&str> = hms.split(':').collect();
    let [hs, mins, ss] = tp[..] else {
        return bad("the time is not HH:MM:SS".into());
    };
    if hs.len() != 2 || mins.len() != 2 || ss.len() != 2 {
        return bad("the time is not HH:MM:SS".into());
    }
    let (h, mi, sec) = match (
        digits(hs, "hour"),
        digits(mins, "minute"),
        digits(ss, "second"),
    ) {
        (Ok(h), Ok(mi), Ok(sec)) => (h, mi, sec),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return bad(e),
    };
    if h > 23 || mi > 59 || sec > 59 {
        return bad(format!("time {h:02}:{mi:02}:{sec:02}"));
    }
    let nanos = match frac {
        None => 0,
        Some(f) if f.is_empty() || f.len() > 9 => {
            return bad(format!("{} fractional digits (1 to 9 allowed)", f.len()))
        }
        Some(f) => match digits(f, "fraction") {
            Ok(v) => i128::from(v) * 10i128.pow(9 - f.len() as u32),
            Err(e) => return bad(e),
        },
    };
    let secs = days_from_civil(y, m, d) * 86_400
        + i64::from(h) * 3600
        + i64::from(mi) * 60
        + i64::from(sec)
        - offset_s;
    Ok(i128::from(secs) * 1_000_000_000 + nanos)
}

/// The Azure trace's columns, as named in its header.
const AZURE_COLUMNS: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

fn csv_field(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(s)
}

fn csv_len(at: &At<'_>, line: usize, column: &str, text: &str) -> Result<usize, TraceFileError> {
    match text.parse::<u64>() {
        Ok(0) => at.field(line, column, "must be at least 1, got 0"),
        Ok(n) if n > MAX_TRACE_LEN => at.field(
            line,
            column,
            format!("{n} is above the limit of {MAX_TRACE_LEN} (2^24)"),
        ),
        Ok(n) => Ok(n as usize),
        Err(_) => at.field(
            line,
            column,
            format!("expected a positive integer, got `{text}`"),
        ),
    }
}

/// Parses an Azure LLM inference trace CSV from `reader`; `file` names it
/// in errors.
pub fn parse_azure_csv(
    file: &str,
    reader: impl BufRead,
    opts: &TraceOptions,
) -> Result<Vec<SimRequest>, TraceFileError> {
    let at = At { file };
    let mut rng = Rng::new(opts.seed);
    let limit = opts.max_requests.unwrap_or(usize::MAX);
    // Column index of each of AZURE_COLUMNS, and the header's width.
    let mut columns: Option<([usize; 3], usize)> = None;
    let mut rows: Vec<(i128, SimRequest)> = Vec::new();
    for_each_line(&at, reader, |line, text| {
        let fields: Vec<&str> = text.split(',').map(csv_field).collect();
        let Some((idx, width)) = columns else {
            let find = |name: &str| fields.iter().position(|f| f.eq_ignore_ascii_case(name));
            let missing: Vec<String> = AZURE_COLUMNS
                .iter()
                .filter(|c| find(c).is_none())
                .map(|c| format!("`{c}`"))
                .collect();
            if !missing.is_empty() {
                return at.line(
                    line,
                    format!(
                        "the header lacks column{} {} (found {})",
                        if missing.len() == 1 { "" } else { "s" },
                        missing.join(", "),
                        fields
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
            let mut idx = [0; 3];
            for (slot, name) in idx.iter_mut().zip(AZURE_COLUMNS) {
                *slot = find(name).unwrap_or(0);
            }
            columns = Some((idx, fields.len()));
            return Ok(limit > 0);
        };
        if fields.len() != width {
            return at.line(
                line,
                format!("{} fields, but the header has {width}", fields.len()),
            );
        }
        let ts =
            parse_timestamp(fields[idx[0]]).or_else(|m| at.field(line, AZURE_COLUMNS[0], m))?;
        let prompt_len = csv_len(&at, line, AZURE_COLUMNS[1], fields[idx[1]])?;
        let output_len = csv_len(&at, line, AZURE_COLUMNS[2], fields[idx[2]])?;
        let prompt = random_tokens(&mut rng, prompt_len, opts.vocab);
        rows.push((
            ts,
            SimRequest::new(rows.len().to_string(), 0.0, prompt, output_len),
        ));
        Ok(rows.len() < limit)
    })?;
    if columns.is_none() {
        return Err(at.err(
            None,
            None,
            "empty: expected a header naming TIMESTAMP, ContextTokens, GeneratedTokens",
        ));
    }
    let first = rows.iter().map(|(t, _)| *t).min().unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(|(t, mut r)| {
            r.arrival_s = (t - first) as f64 / 1e9;
            r
        })
        .collect())
}

/// The number of outputs `sluice_core::replay` emits for `r` before the
/// scheduler finishes it, under `max_model_len`: its stop check runs after
/// each appended token, EOS first (unless `ignore_eos`), then
/// `stop_token_ids`, then the length caps (`max_tokens`, or prompt plus
/// outputs reaching `max_model_len`). Replay never shows the scheduler
/// `min_tokens` (the scripted outputs stand in for the sampler), so it
/// does not count here either. Exact for any trace the parser accepts.
pub fn replay_output_len(r: &TraceRequest, max_model_len: usize) -> usize {
    let cap = r
        .max_tokens
        .min(max_model_len.saturating_sub(r.prompt.len()));
    let eos = if r.ignore_eos { None } else { r.eos_token_id };
    r.output
        .iter()
        .take(cap)
        .position(|&t| Some(t) == eos || r.stop_token_ids.contains(&t))
        .map_or(cap, |k| k + 1)
}

/// A parsed replay trace as simulator requests. `file` names it in
/// errors (only a priority outside `i32` can fail here).
///
/// The simulator samples its own output tokens (`sim::output_token`), not
/// the trace's scripted ones: the counts match replay exactly, the token
/// values do not, which matters only where prefix caching could match a
/// prompt against another request's outputs.
pub fn replay_workload(file: &str, trace: &Trace) -> Result<ReplayWorkload, TraceFileError> {
    let at = At { file };
    let max_len = trace.config.max_model_len;
    let requests = trace
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let priority = i32::try_from(r.priority).map_err(|_| {
                at.err(
                    None,
                    Some(&format!("requests[{i}].priority")),
                    format!("{} does not fit in an i32", r.priority),
                )
            })?;
            let mut req = SimRequest::new(
                r.id.clone(),
                0.0,
                r.prompt.clone(),
                replay_output_len(r, max_len),
            );
            req.priority = priority;
            req.arrival_step = Some(r.arrival_step);
            Ok(req)
        })
        .collect::<Result<Vec<_>, TraceFileError>>()?;
    Ok(ReplayWorkload {
        name: trace.name.clone(),
        config: trace.config.clone(),
        requests,
        aborts: trace.aborts.clone(),
        max_steps: trace.max_steps,
    })
}

/// Parses a replay trace's JSON text with the core parser.
pub fn parse_replay_json(file: &str, text: &str) -> Result<ReplayWorkload, TraceFileError> {
    let trace = Trace::from_json(text).map_err(|e| TraceFileError {
        file: file.to_string(),
        line: None,
        field: (!e.path.is_empty()).then(|| e.path.clone()),
        message: e.message,
    })?;
    replay_workload(file, &trace)
}

fn open(path: &Path) -> Result<std::io::BufReader<std::fs::File>, TraceFileError> {
    std::fs::File::open(path)
        .map(std::io::BufReader::new)
        .map_err(|e| TraceFileError {
            file: path.display().to_string(),
            line: None,
            field: None,
            message: format!("cannot open: {e}"),
        })
}

/// Reads a JSONL trace file.
pub fn read_jsonl(path: &Path, opts: &TraceOptions) -> Result<Vec<SimRequest>, TraceFileError> {
    parse_jsonl(&path.display().to_string(), open(path)?, opts)
}

/// Reads an Azure LLM inference trace CSV file.
pub fn read_azure_csv(path: &Path, opts: &TraceOptions) -> Result<Vec<SimRequest>, TraceFileError> {
    parse_azure_csv(&path.display().to_string(), open(path)?, opts)
}

/// Reads a replay trace file (at most `MAX_TRACE_BYTES`).
pub fn read_replay_trace(path: &Path) -> Result<ReplayWorkload, TraceFileError> {
    let file = path.display().to_string();
    let fail = |message: String| TraceFileError {
        file: file.clone(),
        line: None,
        field: None,
        message,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| fail(format!("cannot open: {e}")))?
        .len();
    if size > MAX_TRACE_BYTES as u64 {
        return Err(fail(format!(
            "{size} bytes, more than the limit of {} MiB",
            MAX_TRACE_BYTES >> 20
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    parse_replay_json(&file, &text)
}

/// The format a path's extension names.
pub fn trace_format(path: &Path) -> Result<TraceFormat, TraceFileError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("jsonl") => Ok(TraceFormat::Jsonl),
        Some("csv") => Ok(TraceFormat::AzureCsv),
        Some("json") => Ok(TraceFormat::Replay),
        other => Err(TraceFileError {
            file: path.display().to_string(),
            line: None,
            field: None,
            message: format!(
                "cannot tell the trace format from {} (expected .jsonl for JSON lines, .csv for \
                 an Azure LLM inference trace, .json for a sluice replay trace)",
                match other {
                    Some(e) => format!("the extension `.{e}`"),
                    None => "a name without an extension".into(),
                }
            ),
        }),
    }
}

/// Loads a trace of any known format with default options.
pub fn load_trace(path: &Path) -> Result<LoadedTrace, TraceFileError> {
    load_trace_with(path, &TraceOptions::default())
}

/// Loads a trace of the format its extension names.
pub fn load_trace_with(path: &Path, opts: &TraceOptions) -> Result<LoadedTrace, TraceFileError> {
    let format = trace_format(path)?;
    Ok(match format {
        TraceFormat::Jsonl => LoadedTrace {
            format,
            requests: read_jsonl(path, opts)?,
            replay: None,
        },
        TraceFormat::AzureCsv => LoadedTrace {
            format,
            requests: read_azure_csv(path, opts)?,
            replay: None,
        },
        TraceFormat::Replay => {
            let w = read_replay_trace(path)?;
            let mut requests = w.requests;
            if let Some(n) = opts.max_requests {
                requests.truncate(n);
            }
            LoadedTrace {
                format,
                requests,
                replay: Some(ReplayInfo {
                    name: w.name,
                    config: w.config,
                    aborts: w.aborts,
                    max_steps: w.max_steps,
                }),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_by_hand() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00").unwrap(), 0);
        assert_eq!(
            parse_timestamp("1970-01-02 00:00:01.5").unwrap(),
            86_401_500_000_000
        );
        // 2023-11-16 is day 19677 since the epoch.
        let t = parse_timestamp("2023-11-16 18:15:46.6805900").unwrap();
        assert_eq!(
            t,
            (19_677i128 * 86_400 + 18 * 3600 + 15 * 60 + 46) * 1_000_000_000 + 680_590_000
        );
        assert_eq!(
            parse_timestamp("2023-11-16T20:15:46.6805900+02:00").unwrap(),
            t
        );
        assert_eq!(
            parse_timestamp("2024-02-29 00:00:00Z").unwrap() % 1_000_000_000,
            0
        );
        for (bad, why) in [
            ("2023-11-16", "no time"),
            ("2023-13-01 00:00:00", "month 13"),
            ("2023-02-29 00:00:00", "day 29 of month 2"),
            ("2023-11-16 24:00:00", "time 24:00:00"),
            ("2023-11-16 18:15:46.1234567890", "10 fractional digits"),
            ("2023-11-16 18:15", "HH:MM:SS"),
            ("2023-11-16 18:15:4x", "`4x` is not a number"),
            ("23-11-16 18:15:46", "YYYY-MM-DD"),
        ] {
            let e = parse_timestamp(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn replay_output_len_follows_the_stop_rule() {
        let r = TraceRequest {
            id: "a".into(),
            arrival_step: 0,
            priority: 0,
            prompt: vec![1, 2, 3],
            output: vec![10, 11, 2, 12, 13, 14],
            max_tokens: 6,
            min_tokens: 4,
            eos_token_id: Some(2),
            ignore_eos: false,
            stop_token_ids: vec![13],
        };
        // EOS at output[2]; min_tokens is not the scheduler's.
        assert_eq!(replay_output_len(&r, 100), 3);
        let ign = TraceRequest {
            ignore_eos: true,
            ..r.clone()
        };
        assert_eq!(replay_output_len(&ign, 100), 5, "stop id 13 still stops");
        assert_eq!(replay_output_len(&ign, 5), 2, "prompt 3 + 2 reaches 5");
        let capped = TraceRequest { max_tokens: 2, ..r };
        assert_eq!(replay_output_len(&capped, 100), 2);
    }
}
