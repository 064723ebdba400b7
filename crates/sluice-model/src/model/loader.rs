//! `load_model`: from a `ModelSpec` (a Hugging Face directory, a GGUF file
//! or a built-in config; real or dummy weights; a dtype) to a
//! `LoadedModel`, the description of a model that a backend turns into its
//! own weights: the config, the generation config, and a [`WeightSource`]
//! (a tensor source with the format the weights are asked for in).
//! Nothing is converted here: the CPU backend reads the tensors into a
//! [`Model`] with [`Model::build`], another backend reads them into its own
//! memory.
//!
//! Promises: every user mistake — no model named, both named, a missing
//! `config.json` or weights file, an unsupported architecture — comes back
//! from `load_model` as an error naming the file or key; a missing or
//! misshapen tensor from [`Model::build`], naming the tensor and the file.

use super::{Model, Role, TensorId};
use crate::config::{GenerationConfig, ModelConfig};
use crate::kernels::QuantFormat;
use crate::weights::{DummySource, SafetensorsSource, TensorSource};
use anyhow::{bail, Context, Result};
use sluice_gguf::GgmlType;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

/// Where the weights come from (vLLM's `--load-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadFormat {
    /// The checkpoint's safetensors files.
    #[default]
    Auto,
    /// Random weights of the config's shape, deterministic from the seed.
    Dummy,
}

impl FromStr for LoadFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "safetensors" => Ok(Self::Auto),
            "dummy" => Ok(Self::Dummy),
            other => Err(format!(
                "unknown load format {other:?} (expected \"auto\", \"safetensors\" or \"dummy\")"
            )),
        }
    }
}

/// The dtype linear weights are held in (`--dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DType {
    /// The checkpoint's own: bf16 stays bf16, f16 becomes bf16 (there is no
    /// f16 kernel), f32 stays f32.
    #[default]
    Auto,
    F32,
    Bf16,
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" | "float" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            other => Err(format!(
                "unknown dtype {other:?} (expected \"auto\", \"f32\" or \"bf16\")"
            )),
        }
    }
}

impl DType {
    fn resolve(self, checkpoint: Option<GgmlType>) -> QuantFormat {
        match self {
            DType::F32 => QuantFormat::F32,
            DType::Bf16 => QuantFormat::Bf16,
            DType::Auto => match checkpoint {
                Some(GgmlType::BF16) | Some(GgmlType::F16) => QuantFormat::Bf16,
                _ => QuantFormat::F32,
            },
        }
    }
}

/// What to load.
#[derive(Clone, Debug, Default)]
pub struct ModelSpec {
    /// A Hugging Face model directory, or a GGUF model (a `.gguf` file, the
    /// first part of a split set, or a directory holding one).
    pub dir: Option<PathBuf>,
    /// A built-in config name (see `builtin::NAMES`); dummy weights only.
    pub builtin: Option<String>,
    pub load_format: LoadFormat,
    pub dtype: DType,
    /// Seed of dummy weights.
    pub seed: u64,
    /// Quantize float linear weights to this format at load
    /// (`--quantization q8_0|q4_0`), whatever `dtype` says.
    pub quantization: Option<QuantFormat>,
}

/// A model described for a backend: its configs and where its weights come
/// from. Cloning shares the tensor source.
#[derive(Clone)]
pub struct LoadedModel {
    pub config: ModelConfig,
    pub generation_config: GenerationConfig,
    pub weights: WeightSource,
    /// The directory it came from (for the tokenizer), if any.
    pub dir: Option<PathBuf>,
    /// For a GGUF file: its tokenizer vocabulary and what else it says.
    pub gguf: Option<GgufInfo>,
}

/// Where a model's weights come from and how they are to be read.
#[derive(Clone)]
pub struct WeightSource {
    /// The tensors, by name in the source's naming.
    pub tensors: Arc<dyn TensorSource + Send + Sync>,
    /// What linear weights and the embedding are asked for in (a source that
    /// keeps stored formats hands out its own: `TensorSource::format_of`).
    pub dtype: QuantFormat,
    /// Per-frequency RoPE divisors a GGUF file stores
    /// (`rope_freqs.weight`, Llama 3's long-context scaling), applied over
    /// the config's RoPE.
    pub rope_freq_factors: Option<Arc<[f32]>>,
    /// The file or directory the tensors live in, for error messages.
    pub origin: Option<PathBuf>,
}

impl std::fmt::Debug for WeightSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightSource")
            .field("dtype", &self.dtype)
            .field(
                "rope_freq_factors",
                &self.rope_freq_factors.as_ref().map(|f| f.len()),
            )
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl WeightSource {
    /// `tensors` asked for in `dtype`, with no RoPE factors.
    pub fn new(tensors: impl TensorSource + Send + Sync + 'static, dtype: QuantFormat) -> Self {
        WeightSource {
            tensors: Arc::new(tensors),
            dtype,
            rope_freq_factors: None,
            origin: None,
        }
    }
}

impl LoadedModel {
    /// The formats the weight matrices are read in (the embedding, each
    /// layer's seven projections, an untied head — as the source hands
    /// them out for the asked format, which is what a backend gets) by
    /// format: `(format, tensors, bytes)`, the most bytes first. Norms and
    /// biases (f32) are not counted; a tensor the source cannot describe
    /// is left out (reading it fails later, naming it).
    pub fn weight_formats(&self) -> Vec<(QuantFormat, usize, usize)> {
        let c = &self.config;
        let arch = c.architecture.def();
        let naming = self.weights.tensors.naming();
        let (h, q, kv) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let inter = c.intermediate_size;
        let mut shapes = vec![(TensorId::model(Role::Embedding), c.vocab_size, h)];
        for l in 0..c.num_hidden_layers {
            let id = |role| TensorId::layer(l, role);
            shapes.extend([
                (id(Role::QProj), q, h),
                (id(Role::KProj), kv, h),
                (id(Role::VProj), kv, h),
                (id(Role::OProj), h, q),
                (id(Role::GateProj), inter, h),
                (id(Role::UpProj), inter, h),
                (id(Role::DownProj), h, inter),
            ]);
        }
        if !c.tie_word_embeddings {
            shapes.push((TensorId::model(Role::LmHead), c.vocab_size, h));
        }
        let mut out: Vec<(QuantFormat, usize, usize)> = Vec::new();
        for (id, rows, cols) in shapes {
            let name = arch.tensor_name(id, naming);
            let Ok(format) = self.weights.tensors.format_of(&name, self.weights.dtype) else {
                continue;
            };
            let Ok(row) = format.row_bytes(cols) else {
                continue;
            };
            let bytes = rows.saturating_mul(row);
            match out.iter_mut().find(|(f, _, _)| *f == format) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += bytes;
                }
                None => out.push((format, 1, bytes)),
            }
        }
        out.sort_by_key(|w| std::cmp::Reverse(w.2));
        out
    }
}

impl Model {
    /// The CPU model of `loaded`: every tensor read from its weight source
    /// (shapes checked, formats as the source hands them out), with the
    /// source's RoPE factors applied.
    pub fn build(loaded: &LoadedModel) -> Result<Model> {
        let w = &loaded.weights;
        let mut model =
            Model::load(&loaded.config, &*w.tensors, w.dtype).with_context(|| match &w.origin {
                Some(p) => format!("loading the model in {}", p.display()),
                None => "loading the model".to_string(),
            })?;
        if let Some(factors) = &w.rope_freq_factors {
            for rope in &mut model.ropes {
                rope.divide_by(factors);
            }
        }
        Ok(model)
    }
}

/// What a GGUF file carries besides the weights.
#[derive(Clone, Debug)]
pub struct GgufInfo {
    /// The file (the first part of a split set).
    pub path: PathBuf,
    pub vocab: sluice_tokenizer::GgufVocab,
    /// `general.sampling.*` recommendations, for the log.
    pub sampling_defaults: Vec<String>,
}

/// Loads the model `spec` names.
pub fn load_model(spec: &ModelSpec) -> Result<LoadedModel> {
    match (&spec.dir, &spec.builtin) {
        (Some(_), Some(_)) => bail!("give either a model directory or a built-in model, not both"),
        (None, None) => bail!("no model given: pass a model directory or a built-in model name"),
        (None, Some(name)) => {
            if spec.load_format != LoadFormat::Dummy {
                bail!(
                    "built-in model {name:?} has no weights files; use it with --load-format dummy"
                );
            }
            let (config, generation) = crate::builtin::config(name)?;
            load_dummy(config, generation, spec.dtype, spec.seed)
        }
        (Some(path), None) if crate::gguf::is_gguf_model(path) => load_gguf(spec, path),
        (Some(dir), None) => {
            if !dir.is_dir() {
                bail!("model directory {} does not exist", dir.display());
            }
            let config = ModelConfig::from_file(&dir.join("config.json"))?;
            let generation = GenerationConfig::load(dir, &config)?;
            let mut loaded = match spec.load_format {
                LoadFormat::Dummy => match spec.quantization {
                    Some(q) => load_dummy_as(config, generation, q, spec.seed)?,
                    None => load_dummy(config, generation, spec.dtype, spec.seed)?,
                },
                LoadFormat::Auto => {
                    let source = SafetensorsSource::open(dir)?;
                    let dtype = match spec.quantization {
                        Some(q) => q,
                        None => spec.dtype.resolve(config.checkpoint_dtype),
                    };
                    config.validate()?;
                    let mut weights = WeightSource::new(source, dtype);
                    weights.origin = Some(dir.clone());
                    LoadedModel {
                        config,
                        generation_config: generation,
                        weights,
                        dir: None,
                        gguf: None,
                    }
                }
            };
            loaded.dir = Some(dir.clone());
            Ok(loaded)
        }
    }
}

/// A model of `config`'s shape with deterministic random weights (for
/// benchmarks: a built-in config with, say, its vocabulary changed).
pub fn load_dummy(
    config: ModelConfig,
    generation_config: GenerationConfig,
    dtype: DType,
    seed: u64,
) -> Result<LoadedModel> {
    let dtype = dtype.resolve(config.checkpoint_dtype);
    load_dummy_as(config, generation_config, dtype, seed)
}

/// `load_dummy` with the weights' dtype given exactly (a quantized format
/// quantizes the random weights at load).
pub fn load_dummy_as(
    config: ModelConfig,
    generation_config: GenerationConfig,
    dtype: QuantFormat,
    seed: u64,
) -> Result<LoadedModel> {
    config.validate()?;
    Ok(LoadedModel {
        config,
        generation_config,
        weights: WeightSource::new(DummySource::new(seed), dtype),
        dir: None,
        gguf: None,
    })
}

/// A GGUF file: its tensors in their stored formats (`--dtype auto`), or
/// converted to `--dtype f32|bf16`; `--quantization` quantizes float
/// tensors at load.
fn load_gguf(spec: &ModelSpec, path: &std::path::Path) -> Result<LoadedModel> {
    let file = crate::gguf::resolve(path)?;
    let mut g = crate::gguf::GgufModel::open(&file)?;
    let info = GgufInfo {
        path: file.clone(),
        vocab: g.vocab,
        sampling_defaults: g.sampling_defaults,
    };
    if spec.load_format == LoadFormat::Dummy {
        let mut loaded = load_dummy(g.config, g.generation, spec.dtype, spec.seed)?;
        loaded.gguf = Some(info);
        return Ok(loaded);
    }
    let dtype = match (spec.quantization, spec.dtype) {
        (Some(q), _) => {
            g.source.set_keep_stored(false);
            q
        }
        (None, DType::Auto) => QuantFormat::F32,
        (None, other) => {
            g.source.set_keep_stored(false);
            other.resolve(None)
        }
    };
    g.config.validate()?;
    let mut weights = WeightSource::new(g.source, dtype);
    weights.rope_freq_factors = g.rope_freq_factors.map(Arc::from);
    weights.origin = Some(file);
    Ok(LoadedModel {
        config: g.config,
        generation_config: g.generation,
        weights,
        dir: None,
        gguf: Some(info),
    })
}
