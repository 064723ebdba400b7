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

mod azure;
mod jsonl;
mod replay;
#[cfg(test)]
mod tests;

pub use azure::*;
pub use jsonl::*;
pub use replay::*;

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
