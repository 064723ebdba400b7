//! [`ModelShape::load`]: the shape a user names — a built-in model, a
//! Hugging Face `config.json` (or a directory holding one), or a GGUF
//! file — and [`ModelConfigError`], why one could not be had.
//!
//! Only the shape is read, never a weight: a GGUF's tensor data is
//! measured (its size is the weight bytes) but not touched. Errors name
//! the file and the key.

use crate::{LayeredShape, ModelShape};
use std::path::{Path, PathBuf};

/// Why a model shape could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ModelConfigError {
    #[error("{spec}: not a built-in model ({builtins}) and no such file or directory")]
    NotFound { spec: String, builtins: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: key `{key}`: {problem}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error("{}: {problem}", path.display())]
    Shape { path: PathBuf, problem: String },
    #[error(transparent)]
    Gguf(#[from] sluice_gguf::GgufError),
}

impl ModelShape {
    /// The shape `spec` names: a built-in (short name or Hugging Face id,
    /// any case) first, then a path: a `config.json` (any JSON file), a
    /// GGUF file, or a directory holding a `config.json` or exactly one
    /// GGUF model.
    pub fn load(spec: &str) -> Result<ModelShape, ModelConfigError> {
        LayeredShape::load(spec).map(|l| l.shape)
    }

    /// The shape of the model at `path` (never a built-in): a `config.json`
    /// (any JSON file), a GGUF file, or a directory holding a `config.json`
    /// or else exactly one GGUF model — the precedence the model loader
    /// uses.
    pub fn from_path(path: &Path) -> Result<ModelShape, ModelConfigError> {
        LayeredShape::from_path(path).map(|l| l.shape)
    }
}

impl LayeredShape {
    /// [`ModelShape::load`] with the layers' attention kinds.
    pub fn load(spec: &str) -> Result<LayeredShape, ModelConfigError> {
        if let Some(shape) = LayeredShape::builtin(spec) {
            return Ok(shape);
        }
        LayeredShape::from_path(Path::new(spec)).map_err(|e| match e {
            ModelConfigError::NotFound { .. } => ModelConfigError::NotFound {
                spec: spec.to_string(),
                builtins: ModelShape::builtin_names().join(", "),
            },
            e => e,
        })
    }

    /// [`ModelShape::from_path`] with the layers' attention kinds.
    pub fn from_path(path: &Path) -> Result<LayeredShape, ModelConfigError> {
        if path.is_dir() {
            let config = path.join("config.json");
            if config.is_file() {
                return LayeredShape::from_config_json(&config);
            }
            let gguf = sluice_gguf::resolve_model_path(path)?;
            return LayeredShape::from_gguf(&gguf);
        }
        if path.is_file() {
            if sluice_gguf::is_gguf_file(path) {
                return LayeredShape::from_gguf(path);
            }
            return LayeredShape::from_config_json(path);
        }
        Err(ModelConfigError::NotFound {
            spec: path.display().to_string(),
            builtins: ModelShape::builtin_names().join(", "),
        })
    }
}
