//! Profiles: what `sluice simulate --profile` and `sluice serve
//! --executor simulated` take to know how long a step lasts.
//!
//! A profile is one JSON file tagged by `"kind"`:
//! - `"roofline"`: a `hardware` object (every [`Hardware`] field); the
//!   step time comes from the model's shape ([`Roofline`]);
//! - `"fitted"`: a [`FittedModel`] (`model`) with what it was fitted on
//!   and its held-out error;
//! - `"table"`: a [`TableModel`] (`table`).
//!
//! ```json
//! {"kind": "fitted", "name": "qwen2.5-7b on 1×H100", "fitted_on": "steps.jsonl",
//!  "train_steps": 800, "held_out": {"steps": 200, "mape_pct": 3.1, ...},
//!  "model": {"segmentation": "by_phase", "target": "step_s", "pieces": [...]}}
//! ```
//!
//! A built-in hardware name (`H100-SXM`, `h200`, …) is a roofline
//! profile too, so `--profile h100` works without a file. Fitted and
//! table profiles describe the deployment they were measured on, model
//! and tensor parallelism included: they ignore the model shape, and when
//! they record `tensor_parallel` a different one is refused. Errors name
//! the file and the field.

use crate::fit::{FitReport, FittedModel};
use crate::roofline::{Hardware, ModelShape, Roofline, RooflineError};
use crate::step::{StepShape, StepTimeModel};
use crate::table::TableModel;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A boxed model is a model, so that `Simulator<Box<dyn StepTimeModel +
/// Send + Sync>>` takes what [`Profile::step_model`] returns.
impl<T: StepTimeModel + ?Sized> StepTimeModel for Box<T> {
    fn step_time(&self, step: &StepShape) -> f64 {
        (**self).step_time(step)
    }
    fn outside_range(&self, step: &StepShape) -> bool {
        (**self).outside_range(step)
    }
    fn prices_shared_context(&self) -> bool {
        (**self).prices_shared_context()
    }
}

/// A roofline profile: hardware parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RooflineProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub hardware: Hardware,
}

/// Held-out error of a fit, as [`FitReport`] measured it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldOutError {
    pub steps: usize,
    pub mape_pct: f64,
    pub median_ape_pct: f64,
    pub p90_ape_pct: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r2: Option<f64>,
}

/// A fitted profile: the model and what it was fitted on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The step log (or a description of the deployment) it came from.
    #[serde(default)]
    pub fitted_on: String,
    /// Tensor parallelism of the measured deployment, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<usize>,
    /// Device memory of one GPU of the measured deployment, for KV
    /// sizing, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<f64>,
    #[serde(default)]
    pub train_steps: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutError>,
    /// The largest steps of the log it was fitted on: beyond them its
    /// predictions are extrapolations (`sluice simulate` says how often).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fitted_range: Option<StepRange>,
    pub model: FittedModel,
}

/// The extent of the steps a profile was fitted on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRange {
    /// Most tokens in one step.
    pub max_tokens: usize,
    /// Most requests in one step.
    pub max_rows: usize,
}

impl StepRange {
    /// The range of `records`' steps (`None` when there are none).
    pub fn of(records: &[crate::steplog::StepRecord]) -> Option<StepRange> {
        if records.is_empty() {
            return None;
        }
        Some(StepRange {
            max_tokens: records
                .iter()
                .map(|r| r.prefill_tokens + r.decode_tokens)
                .max()
                .unwrap_or(0),
            max_rows: records.iter().map(|r| r.num_reqs).max().unwrap_or(0),
        })
    }

    /// Whether a step of `tokens` tokens and `rows` requests is beyond it.
    pub fn exceeded_by(&self, tokens: usize, rows: usize) -> bool {
        tokens > self.max_tokens || rows > self.max_rows
    }
}

impl FittedProfile {
    /// The profile of a fit.
    pub fn from_report(report: &FitReport, fitted_on: impl Into<String>) -> FittedProfile {
        FittedProfile {
            name: None,
            fitted_on: fitted_on.into(),
            tensor_parallel: None,
            memory_bytes: None,
            train_steps: report.train_steps,
            held_out: Some(HeldOutError {
                steps: report.held_out_steps,
                mape_pct: report.held_out_mape_pct,
                median_ape_pct: report.held_out_median_ape_pct,
                p90_ape_pct: report.held_out_p90_ape_pct,
                r2: report.held_out_r2,
            }),
            fitted_range: None,
            model: report.model.clone(),
        }
    }
}

/// A table profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<f64>,
    /// The KV cache of the runner that was measured: the simulator sizes
    /// its cache from it, so no `--num-gpu-blocks-override` is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<MeasuredKvCache>,
    /// The model, machine and settings the table was measured with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_on: Option<MeasuredOn>,
    /// Mixed steps measured beside the grid: what chose `mixed_rule` (and
    /// `step_overhead_s`), kept so that a reader can check the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_measured: Option<Vec<MixedPoint>>,
    pub table: TableModel,
}

/// One measured mixed step: `batch_size` decode rows of `mean_context`
/// beside a chunk of `chunk_tokens` on `context` cached, in `time_s`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixedPoint {
    pub batch_size: f64,
    pub mean_context: f64,
    pub chunk_tokens: f64,
    pub context: f64,
    pub time_s: f64,
}

/// A measured runner's KV cache: `num_blocks` blocks of `block_size`
/// tokens (the whole pool, null block included, as `num_gpu_blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredKvCache {
    pub num_blocks: usize,
    pub block_size: usize,
}

impl MeasuredKvCache {
    /// The same cache in blocks of `block_size` tokens (whole blocks).
    pub fn blocks_of(&self, block_size: usize) -> usize {
        (self.num_blocks * self.block_size) / block_size.max(1)
    }
}

/// Where a table was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredOn {
    /// The model as given (a path or a built-in shape) and its weights.
    pub model: String,
    /// The CPU's model name and the instruction sets the kernels used.
    pub cpu: String,
    pub threads: usize,
    /// Repeats per grid point (each point's time is their median).
    pub repeats: usize,
    /// Seconds the whole measurement took.
    pub cost_s: f64,
    /// A reference step (one decode row of a 1-token prompt, median of 5)
    /// timed before, between and after the grid's parts: on a steady
    /// machine they agree; apart by more than 15 %, the machine changed
    /// speed while it was measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub speed_probe_s: Vec<f64>,
}

/// A step-time profile ([module docs](self)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
// One profile is loaded per run: its size does not matter, boxing would
// only burden every match.
#[allow(clippy::large_enum_variant)]
pub enum Profile {
    Roofline(RooflineProfile),
    Fitted(FittedProfile),
    Table(TableProfile),
}

/// Why a profile could not be had or used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{spec}: not a built-in hardware profile ({builtins}) and no such file")]
    NotFound { spec: String, builtins: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {problem}")]
    Invalid { file: String, problem: String },
    #[error("a roofline profile needs the model's shape (--model)")]
    NeedsModel,
    #[error("this {kind} profile was measured at tensor parallel size {profile}, not {asked}")]
    TensorParallelMismatch {
        kind: &'static str,
        profile: usize,
        asked: usize,
    },
    #[error(transparent)]
    Roofline(#[from] RooflineError),
}

/// A `serde_path_to_error` error as "field `a.b[2]`: what".
pub(crate) fn describe_path_error<E: std::fmt::Display>(
    e: &serde_path_to_error::Error<E>,
) -> String {
    let path = e.path().to_string();
    if path == "." || path.is_empty() {
        e.inner().to_string()
    } else {
        format!("field `{path}`: {}", e.inner())
    }
}

impl Profile {
    /// A built-in hardware name (a roofline profile) or a path to a
    /// profile JSON file.
    pub fn load(spec: &str) -> Result<Profile, ProfileError> {
        if let Some(p) = Hardware::builtin_profile(spec) {
            return Ok(Profile::Roofline(RooflineProfile {
                name: Some(p.name.clone()),
                description: Some(p.description.clone()),
                hardware: p.hardware,
            }));
        }
        let path = Path::new(spec);
        if !path.exists() {
            return Err(ProfileError::NotFound {
                spec: spec.to_string(),
                builtins: Hardware::builtin_names().join(", "),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Profile::from_json_str(&text, &path.display().to_string())
    }

    /// A profile from JSON text, validated; `file` is what errors name.
    pub fn from_json_str(text: &str, file: &str) -> Result<Profile, ProfileError> {
        let invalid = |problem: String| ProfileError::Invalid {
            file: file.to_string(),
            problem,
        };
        // Parsed in two steps, the tag first: serde buffers an internally
        // tagged enum's fields, which would lose the path of a bad one.
        let mut root: serde_json::Value =
            serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let Some(obj) = root.as_object_mut() else {
            return Err(invalid("expected a JSON object".into()));
        };
        let kind = match obj.remove("kind") {
            Some(serde_json::Value::String(k)) => k,
            Some(other) => {
                return Err(invalid(format!(
                    "field `kind`: expected a string, found {other}"
                )))
            }
            None => {
                return Err(invalid(
                    "missing field `kind` (\"roofline\", \"fitted\" or \"table\")".into(),
                ))
            }
        };
        fn part<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, String> {
            serde_path_to_error::deserialize(v).map_err(|e| describe_path_error(&e))
        }
        let profile = match kind.as_str() {
            "roofline" => part(&root).map(Profile::Roofline),
            "fitted" => part(&root).map(Profile::Fitted),
            "table" => part(&root).map(Profile::Table),
            other => Err(format!(
                "field `kind`: unknown kind `{other}`, expected `roofline`, `fitted` or `table`"
            )),
        }
        .map_err(invalid)?;
        profile.validate().map_err(invalid)?;
        Ok(profile)
    }

    /// Every figure usable; errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Profile::Roofline(p) => p.hardware.validate().map_err(|e| nest("hardware", &e)),
            Profile::Fitted(p) => {
                check_memory(p.memory_bytes)?;
                check_tp(p.tensor_parallel)?;
                p.model.validate().map_err(|e| nest("model", &e))
            }
            Profile::Table(p) => {
                check_memory(p.memory_bytes)?;
                check_tp(p.tensor_parallel)?;
                p.table.validate().map_err(|e| nest("table", &e))
            }
        }
    }

    /// Writes the profile as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        let mut text = serde_json::to_string_pretty(self).map_err(|e| ProfileError::Invalid {
            file: path.display().to_string(),
            problem: e.to_string(),
        })?;
        text.push('\n');
        std::fs::write(path, text).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// `"roofline"`, `"fitted"` or `"table"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Profile::Roofline(_) => "roofline",
            Profile::Fitted(_) => "fitted",
            Profile::Table(_) => "table",
        }
    }

    /// One GPU's device memory, when the profile knows it (for KV sizing).
    pub fn memory_bytes(&self) -> Option<f64> {
        match self {
            Profile::Roofline(p) => Some(p.hardware.memory_bytes),
            Profile::Fitted(p) => p.memory_bytes,
            Profile::Table(p) => p.memory_bytes,
        }
    }

    /// The KV cache a table profile was measured with.
    pub fn measured_kv_cache(&self) -> Option<MeasuredKvCache> {
        match self {
            Profile::Table(p) => p.kv_cache,
            _ => None,
        }
    }

    /// The hardware parameters of a roofline profile.
    pub fn hardware(&self) -> Option<&Hardware> {
        match self {
            Profile::Roofline(p) => Some(&p.hardware),
            _ => None,
        }
    }

    /// The step-time model of this profile for `model` on
    /// `tensor_parallel` GPUs. A roofline needs the model's shape; fitted
    /// and table profiles ignore it.
    pub fn step_model(
        &self,
        model: Option<&ModelShape>,
        tensor_parallel: usize,
    ) -> Result<Box<dyn StepTimeModel + Send + Sync>, ProfileError> {
        if tensor_parallel == 0 {
            return Err(RooflineError::ZeroTensorParallel.into());
        }
        let same_tp = |kind: &'static str, recorded: Option<usize>| match recorded {
            Some(p) if p != tensor_parallel => Err(ProfileError::TensorParallelMismatch {
                kind,
                profile: p,
                asked: tensor_parallel,
            }),
            _ => Ok(()),
        };
        Ok(match self {
            Profile::Roofline(p) => {
                let model = model.ok_or(ProfileError::NeedsModel)?;
                Box::new(Roofline::with_tensor_parallel(
                    *model,
                    p.hardware,
                    tensor_parallel,
                )?)
            }
            Profile::Fitted(p) => {
                same_tp("fitted", p.tensor_parallel)?;
                Box::new(p.model.clone())
            }
            Profile::Table(p) => {
                same_tp("table", p.tensor_parallel)?;
                Box::new(p.table.clone())
            }
        })
    }
}

/// A nested part's "`field`: problem" as "`prefix.field`: problem".
fn nest(prefix: &str, e: &str) -> String {
    match e.strip_prefix('`') {
        Some(rest) => format!("`{prefix}.{rest}"),
        None => format!("{prefix}: {e}"),
    }
}

fn check_memory(m: Option<f64>) -> Result<(), String> {
    match m {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(format!(
            "`memory_bytes`: {v}, expected a positive number of bytes"
        )),
        _ => Ok(()),
    }
}

fn check_tp(tp: Option<usize>) -> Result<(), String> {
    match tp {
        Some(0) => Err("`tensor_parallel`: 0, expected at least 1".into()),
        _ => Ok(()),
    }
}
