//! Model configuration: `config.json` and `generation_config.json` of a
//! Hugging Face checkpoint, parsed into the shapes the forward pass needs.
//!
//! Promises: a `ModelConfig` that parses is internally consistent (heads
//! divide evenly into KV groups, head_dim is even for RoPE, every size is at
//! least 1), so the model code can index without re-checking. Errors name the
//! file and the field. Only what this runner implements is accepted: the
//! architectures of `model/arch/` (Qwen2, Qwen3, Llama with Mistral-style
//! checkpoints) with SiLU MLPs, RoPE with no / linear / llama3 scaling. What
//! differs between architectures (the layer's pieces, the sliding-window
//! rule, the default head_dim) is asked of the architecture's `Arch`; the
//! fields every family shares are read here.

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use sluice_gguf::GgmlType;
use std::path::Path;

pub use crate::model::arch::{Architecture, ConfigSwitches, LayerPieces};
use crate::model::Activation;
use crate::model::RopeParams;

/// How RoPE frequencies are adjusted for long contexts (`rope_scaling`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (equivalently, every frequency).
    Linear {
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling with a smooth medium band.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// The parsed `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    /// The layer's pieces (see [`LayerPieces`], which the architecture
    /// decides): bias on q/k/v (always for Qwen2) ...
    pub qkv_bias: bool,
    /// ... and on o_proj (Llama's and Qwen3's `attention_bias` covers both),
    pub o_bias: bool,
    /// per-head RMSNorm of q and k (Qwen3),
    pub qk_norm: bool,
    /// biases on gate / up / down.
    pub mlp_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// `torch_dtype` / `dtype` (F32, F16 or BF16; `None` for any other or
    /// none): what `DType::Auto` loads the weights as.
    pub checkpoint_dtype: Option<GgmlType>,
    /// What the config says about attention beyond its geometry.
    pub attention: AttentionConfig,
}

/// The attention settings of `config.json` an architecture may read into
/// each layer's shape (`Arch::layer_attention`); which ones apply, and to
/// which layers, is the architecture's call, so each is kept as written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionConfig {
    /// `sliding_window`, when the architecture has it in force (Mistral:
    /// always; Qwen2 / Qwen3: only with `use_sliding_window`).
    pub sliding_window: Option<usize>,
    /// `max_window_layers`: layers below it attend fully even with a
    /// window in force (Qwen2 / Qwen3).
    pub max_window_layers: Option<usize>,
    /// `query_pre_attn_scalar`: the softmax scale is its inverse square
    /// root instead of head_dim's (Gemma).
    pub query_pre_attn_scalar: Option<f64>,
    /// `attn_logit_softcapping` (Gemma 2).
    pub attn_logit_softcapping: Option<f64>,
    /// `layer_types`: which layers slide and which attend fully (Gemma 3,
    /// gpt-oss), one per layer.
    pub layer_types: Option<Vec<LayerType>>,
    /// `sliding_window_pattern` (or `_sliding_window_pattern`): every N-th
    /// layer attends fully, the others slide (Gemma 3 without
    /// `layer_types`).
    pub sliding_window_pattern: Option<usize>,
    /// The RoPE of the sliding layers where it differs from the config's
    /// (Gemma 3's `rope_local_base_freq`, or `rope_parameters`'
    /// `sliding_attention` entry).
    pub local_rope: Option<RopeParams>,
}

/// One entry of `layer_types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    FullAttention,
    SlidingAttention,
}

impl LayerType {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "full_attention" => Some(Self::FullAttention),
            "sliding_attention" => Some(Self::SlidingAttention),
            _ => None,
        }
    }
}

impl ModelConfig {
    /// Query heads sharing one KV head.
    pub fn num_queries_per_kv(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The layer's pieces, as one value.
    pub fn pieces(&self) -> LayerPieces {
        LayerPieces {
            qkv_bias: self.qkv_bias,
            o_bias: self.o_bias,
            qk_norm: self.qk_norm,
            mlp_bias: self.mlp_bias,
        }
    }

    /// Sets the layer's pieces (a loader that built the config from another
    /// format: `Architecture::def().pieces(..)`).
    pub fn set_pieces(&mut self, p: LayerPieces) {
        self.qkv_bias = p.qkv_bias;
        self.o_bias = p.o_bias;
        self.qk_norm = p.qk_norm;
        self.mlp_bias = p.mlp_bias;
    }

    /// The model's layers in KV cache groups, as vLLM forms them from each
    /// layer's window (`sluice_core::kv_cache::LayerGroups`).
    pub fn kv_layer_groups(
        &self,
        policy: sluice_core::kv_cache::GroupingPolicy,
    ) -> sluice_core::kv_cache::LayerGroups {
        let kinds = crate::model::DecoderPlan::of(self).attention_kinds();
        sluice_core::kv_cache::LayerGroups::of_layers(&kinds, policy)
    }

    /// The model's shape (`sluice_arch`), what KV sizing and a simulated
    /// executor see: widths from this config, 2 bytes per weight and
    /// activation (vLLM's `--dtype auto` runs float32 checkpoints in bf16),
    /// dense. A checkpoint on disk is better sized by
    /// `sluice_arch::ModelShape::load`, which also sees a GGUF's stored
    /// bytes; the two agree on every width (`sluice-cli/tests/sizing.rs`).
    pub fn shape(&self) -> sluice_arch::ModelShape {
        sluice_arch::ModelShape {
            hidden: self.hidden_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            intermediate: self.intermediate_size,
            vocab: self.vocab_size,
            bytes_per_param: 2,
            num_experts: 0,
            experts_per_token: 0,
            tie_word_embeddings: self.tie_word_embeddings,
            stored_weight_bytes: None,
            kv_cache_dtype: sluice_arch::KvCacheDtype::Auto,
        }
    }

    /// Width of the fused q/k/v projection output.
    pub fn qkv_size(&self) -> usize {
        (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
    }

    /// Parameters of the model (embedding and head counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (h, i, hd) = (self.hidden_size, self.intermediate_size, self.head_dim);
        let q = self.num_attention_heads * hd;
        let kv = self.num_key_value_heads * hd;
        let mut layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += h;
        }
        if self.qk_norm {
            layer += 2 * hd;
        }
        if self.mlp_bias {
            layer += 2 * i + h;
        }
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_hidden_layers * layer + h + head
    }

    /// Reads and checks `<dir>/config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read model config {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).context("config.json is not valid JSON")?;
        let value = with_architecture_defaults(text_model_config(value)?);
        let raw: RawConfig =
            serde_json::from_value(value).context("config.json is not a valid model config")?;
        raw.into_config()
    }

    /// The invariants the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in positive {
            if v == 0 {
                bail!("config field `{field}` must be at least 1");
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "config: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!(
                "config: head_dim ({}) must be even for rotary embeddings",
                self.head_dim
            );
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            bail!(
                "config field `rms_norm_eps` must be a positive number, got {}",
                self.rms_norm_eps
            );
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            bail!(
                "config field `rope_theta` must be a positive number, got {}",
                self.rope_theta
            );
        }
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                if !(factor > 0.0 && factor.is_finite()) {
                    bail!("config: rope_scaling.factor must be positive, got {factor}");
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                if !(factor > 0.0
                    && low_freq_factor > 0.0
                    && high_freq_factor > low_freq_factor
                    && original_max_position_embeddings > 0.0)
                {
                    bail!(
                        "config: llama3 rope_scaling needs factor > 0, low_freq_factor > 0, \
                         high_freq_factor > low_freq_factor and original_max_position_embeddings > 0 \
                         (got {factor}, {low_freq_factor}, {high_freq_factor}, \
                         {original_max_position_embeddings})"
                    );
                }
            }
        }
        if let Some(&id) = self
            .eos_token_ids
            .iter()
            .find(|&&id| id as usize >= self.vocab_size)
        {
            bail!(
                "config: eos_token_id {id} is outside the vocabulary ({})",
                self.vocab_size
            );
        }
        Ok(())
    }
}

/// The config of the text model: a multimodal checkpoint whose
/// architecture runs only its language model (`Gemma3ForConditionalGeneration`)
/// nests it under `text_config`, which inherits the outer config's token ids
/// and dtype when it has none.
fn text_model_config(mut value: serde_json::Value) -> Result<serde_json::Value> {
    let names: Vec<String> = value
        .get("architectures")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .unwrap_or_default();
    let Some(arch) = Architecture::from_hf(&names, None) else {
        return Ok(value);
    };
    let Some(wrapper) = names
        .iter()
        .find(|n| arch.def().hf_text_model_wrappers().contains(&n.as_str()))
    else {
        return Ok(value);
    };
    let Some(serde_json::Value::Object(mut text)) =
        value.get_mut("text_config").map(std::mem::take)
    else {
        bail!("config.json: {wrapper} has no `text_config` object");
    };
    for key in [
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "torch_dtype",
        "dtype",
    ] {
        if let Some(v) = value.get(key) {
            text.entry(key).or_insert_with(|| v.clone());
        }
    }
    text.insert("architectures".into(), serde_json::json!([wrapper]));
    Ok(serde_json::Value::Object(text))
}

/// `value` with the fields its architecture's transformers config class
/// defaults filled in where absent (Gemma 3's text configs omit most).
fn with_architecture_defaults(mut value: serde_json::Value) -> serde_json::Value {
    let names: Vec<String> = value
        .get("architectures")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .unwrap_or_default();
    let model_type = value
        .get("model_type")
        .and_then(|t| t.as_str())
        .map(str::to_string);
    let Some(arch) = Architecture::from_hf(&names, model_type.as_deref()) else {
        return value;
    };
    let defaults = arch.def().hf_config_defaults();
    if let (Some(obj), serde_json::Value::Object(defaults)) = (value.as_object_mut(), defaults) {
        for (k, v) in defaults {
            obj.entry(k).or_insert(v);
        }
    }
    value
}

/// Token ids given as one integer or a list (both occur in the wild).
#[derive(Deserialize, Clone, Debug)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Self::One(x) => vec![x],
            Self::Many(v) => v,
        }
    }
}

#[derive(Deserialize, Debug, Default)]
struct RawRopeScaling {
    #[serde(alias = "type")]
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    /// transformers 5 moves `rope_theta` into `rope_parameters`.
    rope_theta: Option<f64>,
}

#[derive(Deserialize, Debug)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: Option<usize>,
    vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeScaling>,
    /// transformers 5: one `RawRopeScaling`, or one per layer type
    /// (`{"full_attention": {..}, "sliding_attention": {..}}`).
    rope_parameters: Option<serde_json::Value>,
    rope_local_base_freq: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    /// Gemma's name for `hidden_act`.
    hidden_activation: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    sliding_window: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    private_sliding_window_pattern: Option<usize>,
}

fn required(v: Option<usize>, field: &str) -> Result<usize> {
    v.ok_or_else(|| anyhow!("config.json has no `{field}`"))
}

impl RawConfig {
    fn into_config(self) -> Result<ModelConfig> {
        let names = self.architectures.clone().unwrap_or_default();
        let architecture =
            Architecture::from_hf(&names, self.model_type.as_deref()).ok_or_else(|| {
                anyhow!(
                    "unsupported architecture {names:?} (model_type {:?}); supported: {}",
                    self.model_type,
                    Architecture::supported_hf_names().join(", ")
                )
            })?;
        let arch = architecture.def();
        let max_position_embeddings =
            required(self.max_position_embeddings, "max_position_embeddings")?;
        let sliding_window = match &self.sliding_window {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(w) if w > 0 => Some(w as usize),
                _ => bail!("config field `sliding_window` must be a positive integer, got {v}"),
            },
        }
        .filter(|_| arch.hf_sliding_window_in_force(self.use_sliding_window));

        let hidden_size = required(self.hidden_size, "hidden_size")?;
        if let Some(act) = self.hidden_act.as_ref().or(self.hidden_activation.as_ref()) {
            let wired = arch.wiring(hidden_size).activation;
            let named = match act.as_str() {
                "silu" | "swish" => Some(Activation::Silu),
                "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
                _ => None,
            };
            if named != Some(wired) {
                bail!(
                    "config field `hidden_act` (or `hidden_activation`) is {act:?}; {} uses {}",
                    arch.hf_architectures()[0],
                    match wired {
                        Activation::Silu => "\"silu\"",
                        Activation::GeluTanh => "\"gelu_pytorch_tanh\"",
                    }
                );
            }
        }
        let num_attention_heads = required(self.num_attention_heads, "num_attention_heads")?;
        if num_attention_heads == 0 {
            bail!("config field `num_attention_heads` must be at least 1");
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None => arch
                .hf_default_head_dim(hidden_size, num_attention_heads)
                .ok_or_else(|| {
                    anyhow!(
                        "config: hidden_size ({hidden_size}) is not a multiple of \
                         num_attention_heads ({num_attention_heads}) and no head_dim is given"
                    )
                })?,
        };

        let (params, local_params) = split_rope_parameters(self.rope_parameters.as_ref())?;
        let rope_theta = self
            .rope_theta
            .or_else(|| params.as_ref().and_then(|p| p.rope_theta))
            .unwrap_or(10000.0);
        let scaling = self.rope_scaling.as_ref().or(params.as_ref());
        let rope_scaling = match scaling {
            None => RopeScaling::None,
            Some(s) => parse_rope_scaling(s)?,
        };
        let local_rope = match (&local_params, self.rope_local_base_freq) {
            (Some(p), _) => Some(RopeParams {
                base: p.rope_theta.ok_or_else(|| {
                    anyhow!("config: rope_parameters.sliding_attention has no `rope_theta`")
                })?,
                scaling: parse_rope_scaling(p)?,
            }),
            (None, Some(base)) => Some(RopeParams {
                base,
                scaling: RopeScaling::None,
            }),
            (None, None) => None,
        };
        if let Some(cap) = self.final_logit_softcapping {
            bail!(
                "config field `final_logit_softcapping` is {cap}; soft-capping the final logits \
                 is not supported"
            );
        }
        let num_hidden_layers = required(self.num_hidden_layers, "num_hidden_layers")?;
        let layer_types = parse_layer_types(self.layer_types.as_deref(), num_hidden_layers)?;
        let sliding_window_pattern = self
            .sliding_window_pattern
            .or(self.private_sliding_window_pattern);

        let checkpoint_dtype = self
            .torch_dtype
            .as_deref()
            .or(self.dtype.as_deref())
            .and_then(sluice_arch::checkpoint_dtype);
        let pieces = arch.pieces(ConfigSwitches {
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
        });
        let mut config = ModelConfig {
            architecture,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim,
            intermediate_size: required(self.intermediate_size, "intermediate_size")?,
            vocab_size: required(self.vocab_size, "vocab_size")?,
            max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: self
                .tie_word_embeddings
                .unwrap_or_else(|| arch.hf_default_tie_word_embeddings()),
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            mlp_bias: false,
            bos_token_id: self.bos_token_id,
            eos_token_ids: self
                .eos_token_id
                .map(OneOrMany::into_vec)
                .unwrap_or_default(),
            checkpoint_dtype,
            attention: AttentionConfig {
                sliding_window,
                max_window_layers: self.max_window_layers,
                query_pre_attn_scalar: self.query_pre_attn_scalar,
                attn_logit_softcapping: self.attn_logit_softcapping,
                layer_types,
                sliding_window_pattern,
                local_rope,
            },
        };
        config.set_pieces(pieces);
        config.validate()?;
        Ok(config)
    }
}

/// `layer_types`, checked: one known entry per layer.
fn parse_layer_types(
    types: Option<&[String]>,
    num_hidden_layers: usize,
) -> Result<Option<Vec<LayerType>>> {
    let layer_types = match types {
        None => None,
        Some(types) => {
            if types.len() != num_hidden_layers {
                bail!(
                    "config field `layer_types` has {} entries for num_hidden_layers {}",
                    types.len(),
                    num_hidden_layers
                );
            }
            let parsed = types
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    LayerType::parse(t).ok_or_else(|| {
                        anyhow!(
                            "config field `layer_types[{i}]` is {t:?}; supported: \
                             \"full_attention\", \"sliding_attention\""
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Some(parsed)
        }
    };
    Ok(layer_types)
}

/// `rope_parameters` as the config's own RoPE and, when it is given per
/// layer type (transformers 5's Gemma 3), the sliding layers' RoPE.
fn split_rope_parameters(
    value: Option<&serde_json::Value>,
) -> Result<(Option<RawRopeScaling>, Option<RawRopeScaling>)> {
    let Some(value) = value else {
        return Ok((None, None));
    };
    let parse = |v: &serde_json::Value, field: &str| -> Result<RawRopeScaling> {
        serde_json::from_value(v.clone())
            .with_context(|| format!("config field `{field}` is not a RoPE parameter set"))
    };
    let per_type = value
        .as_object()
        .is_some_and(|o| o.contains_key("full_attention") || o.contains_key("sliding_attention"));
    if !per_type {
        return Ok((Some(parse(value, "rope_parameters")?), None));
    }
    let entry = |name: &str| {
        value
            .get(name)
            .map(|v| parse(v, &format!("rope_parameters.{name}")))
            .transpose()
    };
    Ok((entry("full_attention")?, entry("sliding_attention")?))
}

fn parse_rope_scaling(s: &RawRopeScaling) -> Result<RopeScaling> {
    let need = |v: Option<f64>, field: &str| {
        v.ok_or_else(|| anyhow!("config: rope_scaling has no `{field}`"))
    };
    match s.rope_type.as_deref() {
        None | Some("default") => Ok(RopeScaling::None),
        Some("linear") => Ok(RopeScaling::Linear {
            factor: need(s.factor, "factor")?,
        }),
        Some("llama3") => Ok(RopeScaling::Llama3 {
            factor: need(s.factor, "factor")?,
            low_freq_factor: need(s.low_freq_factor, "low_freq_factor")?,
            high_freq_factor: need(s.high_freq_factor, "high_freq_factor")?,
            original_max_position_embeddings: need(
                s.original_max_position_embeddings,
                "original_max_position_embeddings",
            )?,
        }),
        Some(other) => bail!(
            "config: rope_scaling type {other:?} is not supported (supported: default, linear, llama3)"
        ),
    }
}

/// The parts of `generation_config.json` the engine uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// Every token that ends generation, primary EOS first.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    /// Default sampling settings the checkpoint recommends (vLLM applies
    /// these when a request leaves them unset).
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

#[derive(Deserialize, Debug)]
struct RawGenerationConfig {
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
    pad_token_id: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// What to use when a checkpoint has no `generation_config.json`: the
    /// model config's EOS and BOS.
    pub fn from_model_config(config: &ModelConfig) -> Self {
        GenerationConfig {
            eos_token_ids: config.eos_token_ids.clone(),
            bos_token_id: config.bos_token_id,
            ..Default::default()
        }
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawGenerationConfig =
            serde_json::from_str(text).context("not a valid generation config")?;
        Ok(GenerationConfig {
            eos_token_ids: raw
                .eos_token_id
                .map(OneOrMany::into_vec)
                .unwrap_or_default(),
            bos_token_id: raw.bos_token_id,
            pad_token_id: raw.pad_token_id,
            temperature: raw.temperature,
            top_p: raw.top_p,
            top_k: raw.top_k,
            min_p: raw.min_p,
            repetition_penalty: raw.repetition_penalty,
        })
    }

    /// Reads `<dir>/generation_config.json` if present; otherwise falls back
    /// to the model config. EOS ids missing from the file are taken from the
    /// model config too.
    pub fn load(dir: &Path, config: &ModelConfig) -> Result<Self> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(Self::from_model_config(config));
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut gen = Self::from_json(&text).with_context(|| format!("in {}", path.display()))?;
        if gen.eos_token_ids.is_empty() {
            gen.eos_token_ids = config.eos_token_ids.clone();
        }
        if gen.bos_token_id.is_none() {
            gen.bos_token_id = config.bos_token_id;
        }
        Ok(gen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":64,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
        "intermediate_size":160,"vocab_size":1000,"max_position_embeddings":512,
        "rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":true,
        "eos_token_id":999,"sliding_window":512,"use_sliding_window":false}"#;

    #[test]
    fn parses_qwen2() {
        let c = ModelConfig::from_json(QWEN).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen2);
        assert_eq!(c.head_dim, 16);
        assert!(c.qkv_bias && !c.o_bias);
        assert_eq!(c.eos_token_ids, vec![999]);
        assert_eq!(c.rope_scaling, RopeScaling::None);
    }

    #[test]
    fn parses_qwen3_with_its_own_head_dim() {
        let text = QWEN
            .replace("Qwen2ForCausalLM", "Qwen3ForCausalLM")
            .replace("\"hidden_size\":64,", "\"hidden_size\":64,\"head_dim\":32,");
        let c = ModelConfig::from_json(&text).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        assert_eq!(c.head_dim, 32, "head_dim from the config, not 64 / 4");
        assert!(c.qk_norm && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
        assert_eq!(c.qkv_size(), (4 + 2 * 2) * 32);
        // Without head_dim, transformers' Qwen3 default (128) applies.
        let text = QWEN.replace("Qwen2ForCausalLM", "Qwen3ForCausalLM");
        assert_eq!(ModelConfig::from_json(&text).unwrap().head_dim, 128);
        // attention_bias biases q/k/v and o together.
        let text = text.replace(
            "\"eos_token_id\"",
            "\"attention_bias\":true,\"eos_token_id\"",
        );
        let c = ModelConfig::from_json(&text).unwrap();
        assert!(c.qkv_bias && c.o_bias && c.qk_norm);
        let mut p = c.num_parameters();
        p -= c.num_hidden_layers * (c.qkv_size() + c.hidden_size + 2 * c.head_dim);
        let mut plain = c.clone();
        plain.set_pieces(LayerPieces::default());
        assert_eq!(p, plain.num_parameters());
    }

    #[test]
    fn rejects_unknown_architecture_by_name() {
        let text = QWEN.replace("Qwen2ForCausalLM", "GPT2LMHeadModel");
        let e = format!("{:#}", ModelConfig::from_json(&text).unwrap_err());
        assert!(e.contains("GPT2LMHeadModel"), "{e}");
        assert!(
            e.contains("Qwen3ForCausalLM"),
            "lists what is supported: {e}"
        );
    }

    #[test]
    fn rejects_bad_grouping_and_names_fields() {
        let text = QWEN.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3");
        let e = format!("{:#}", ModelConfig::from_json(&text).unwrap_err());
        assert!(e.contains("num_key_value_heads"), "{e}");
        let text = QWEN.replace("\"vocab_size\":1000,", "");
        let e = format!("{:#}", ModelConfig::from_json(&text).unwrap_err());
        assert!(e.contains("vocab_size"), "{e}");
    }

    #[test]
    fn parses_llama3_scaling_and_eos_list() {
        let text = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,
            "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":4,
            "head_dim":8,"intermediate_size":192,"vocab_size":1024,
            "max_position_embeddings":512,"eos_token_id":[1021,1023],
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":64,"rope_type":"llama3"}}"#;
        let c = ModelConfig::from_json(text).unwrap();
        assert_eq!(c.eos_token_ids, vec![1021, 1023]);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        let yarn = text.replace("llama3", "yarn");
        let e = format!("{:#}", ModelConfig::from_json(&yarn).unwrap_err());
        assert!(e.contains("yarn"), "{e}");
    }

    #[test]
    fn mistral_sliding_window_reaches_every_layer_and_keeps_one_sliding_group() {
        let text = r#"{"architectures":["MistralForCausalLM"],"hidden_size":64,
            "num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":8,
            "vocab_size":10,"max_position_embeddings":32768,"sliding_window":4096}"#;
        let c = ModelConfig::from_json(text).unwrap();
        assert_eq!(c.attention.sliding_window, Some(4096));
        let plan = crate::model::DecoderPlan::of(&c);
        assert!(plan.layers.iter().all(|l| l.window == Some(4096)));
        plan.check(&c).unwrap();
        // Every layer slides: one group, which frees out-of-window blocks
        // (vLLM's uniform sliding-window layout), with the hybrid manager
        // off too: vLLM only promotes sliding layers to full beside full
        // ones.
        use sluice_core::kv_cache::{GroupingPolicy, KvCacheGroupSpec};
        let groups = c.kv_layer_groups(GroupingPolicy::default());
        assert_eq!(groups.specs, vec![KvCacheGroupSpec::sliding_window(4096)]);
        let off = GroupingPolicy {
            hybrid: false,
            chunked_local: false,
        };
        assert_eq!(
            c.kv_layer_groups(off).specs,
            vec![KvCacheGroupSpec::sliding_window(4096)]
        );
        // No window, or one that covers the whole context: full attention.
        for ok in ["null", "32768"] {
            let c = ModelConfig::from_json(&text.replace("4096", ok)).unwrap();
            assert_eq!(c.architecture, Architecture::Llama);
            crate::model::DecoderPlan::of(&c).check(&c).unwrap();
        }
        let bad = text.replace("4096", "-3");
        let e = format!("{:#}", ModelConfig::from_json(&bad).unwrap_err());
        assert!(e.contains("sliding_window"), "{e}");
    }

    #[test]
    fn qwen2_window_applies_from_max_window_layers_when_in_force() {
        let text = QWEN.replace(
            "\"sliding_window\":512,\"use_sliding_window\":false",
            "\"sliding_window\":128,\"use_sliding_window\":true,\"max_window_layers\":1",
        );
        assert_ne!(text, QWEN);
        let c = ModelConfig::from_json(&text).unwrap();
        assert!(c.num_hidden_layers >= 2);
        let windows: Vec<_> = crate::model::DecoderPlan::of(&c)
            .layers
            .iter()
            .map(|l| l.window)
            .collect();
        let mut want = vec![Some(128); c.num_hidden_layers];
        want[0] = None;
        assert_eq!(windows, want);
        // Not in force: no window at all.
        let c = ModelConfig::from_json(QWEN).unwrap();
        assert_eq!(c.attention.sliding_window, None);
    }

    /// google/gemma-3-270m's config.json as transformers 4.x writes it:
    /// `rope_local_base_freq`, `_sliding_window_pattern`, `layer_types`.
    const GEMMA3_270M: &str = r#"{"architectures":["Gemma3ForCausalLM"],
        "_sliding_window_pattern":6,"attention_bias":false,"attn_logit_softcapping":null,
        "bos_token_id":2,"eos_token_id":1,"final_logit_softcapping":null,"head_dim":256,
        "hidden_activation":"gelu_pytorch_tanh","hidden_size":640,"intermediate_size":2048,
        "layer_types":["sliding_attention","sliding_attention","sliding_attention",
          "sliding_attention","sliding_attention","full_attention","sliding_attention",
          "sliding_attention","sliding_attention","sliding_attention","sliding_attention",
          "full_attention","sliding_attention","sliding_attention","sliding_attention",
          "sliding_attention","sliding_attention","full_attention"],
        "max_position_embeddings":32768,"model_type":"gemma3_text","num_attention_heads":4,
        "num_hidden_layers":18,"num_key_value_heads":1,"query_pre_attn_scalar":256,
        "rms_norm_eps":1e-06,"rope_local_base_freq":10000.0,"rope_scaling":null,
        "rope_theta":1000000.0,"sliding_window":512,"torch_dtype":"bfloat16",
        "vocab_size":262144}"#;

    #[test]
    fn gemma3_in_transformers_4_form() {
        let c = ModelConfig::from_json(GEMMA3_270M).unwrap();
        assert_eq!(c.architecture, Architecture::Gemma3);
        // Gemma3TextConfig ties the head by default.
        assert!(c.qk_norm && !c.qkv_bias && c.tie_word_embeddings);
        let plan = crate::model::DecoderPlan::of(&c);
        let full: Vec<usize> = (0..18)
            .filter(|&l| plan.layers[l].window.is_none())
            .collect();
        assert_eq!(full, vec![5, 11, 17]);
        assert!(plan
            .layers
            .iter()
            .all(|l| l.window.is_none_or(|w| w == 512)));
        assert_eq!(plan.layers[0].rope.unwrap().base, 1e4);
        assert_eq!(plan.layers[5].rope.unwrap().base, 1e6);
        assert_eq!(plan.layers[0].scale, 1.0 / 16.0);
        assert_eq!(plan.wiring.embedding_scale, Some(640f32.sqrt()));
        // Without layer_types the pattern decides, the same layers.
        let mut v: serde_json::Value = serde_json::from_str(GEMMA3_270M).unwrap();
        v.as_object_mut().unwrap().remove("layer_types");
        let c2 = ModelConfig::from_json(&v.to_string()).unwrap();
        assert_eq!(crate::model::DecoderPlan::of(&c2), plan);
        // And a pattern of 2 alternates.
        v["_sliding_window_pattern"] = 2.into();
        let c3 = ModelConfig::from_json(&v.to_string()).unwrap();
        let p3 = crate::model::DecoderPlan::of(&c3);
        assert!((0..18).all(|l| p3.layers[l].window.is_none() == (l % 2 == 1)));
    }

    #[test]
    fn gemma3_errors_name_the_field() {
        let cases = [
            (
                "\"final_logit_softcapping\":null",
                "\"final_logit_softcapping\":30.0",
                "final_logit_softcapping",
            ),
            (
                "\"full_attention\"],",
                "\"full_attention\",\"full_attention\"],",
                "layer_types",
            ),
            (
                "\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\n",
                "\"chunked_attention\",\"sliding_attention\",\"sliding_attention\",\n",
                "layer_types[0]",
            ),
            ("\"gelu_pytorch_tanh\"", "\"silu\"", "hidden_act"),
        ];
        for (from, to, field) in cases {
            let text = GEMMA3_270M.replacen(from, to, 1);
            assert_ne!(text, GEMMA3_270M, "{from}");
            let e = format!("{:#}", ModelConfig::from_json(&text).unwrap_err());
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn hidden_act_must_be_the_architectures() {
        let text = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,
            "num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":8,
            "vocab_size":10,"max_position_embeddings":64,"hidden_act":"gelu_pytorch_tanh"}"#;
        let e = format!("{:#}", ModelConfig::from_json(text).unwrap_err());
        assert!(e.contains("hidden_act") && e.contains("\"silu\""), "{e}");
        ModelConfig::from_json(&text.replace("gelu_pytorch_tanh", "silu")).unwrap();
    }

    #[test]
    fn generation_config_eos_forms() {
        let g = GenerationConfig::from_json(r#"{"eos_token_id":[5,6],"top_k":20}"#).unwrap();
        assert_eq!(g.eos_token_ids, vec![5, 6]);
        assert_eq!(g.top_k, Some(20));
        let g = GenerationConfig::from_json(r#"{"eos_token_id":7}"#).unwrap();
        assert_eq!(g.eos_token_ids, vec![7]);
    }
}
