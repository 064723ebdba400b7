//! llama.cpp's GGUF files as a model source: the model config from the
//! `{arch}.*` keys, the tokenizer's vocabulary from `tokenizer.ggml.*`, and
//! a `TensorSource` that hands tensors out in their stored formats.
//!
//! Promises:
//! - quantized tensors reach the kernels as they are stored (Q8_0, Q4_K,
//!   ...), borrowed from the file's memory map when nothing needs
//!   rearranging, so a Q4 file costs its own size in memory, not f32's;
//! - llama.cpp's converter stores the Q and K rows of `llama` models
//!   permuted for its interleaved RoPE; they are un-permuted here, whole
//!   rows at a time (a row of a quantized tensor is a run of whole blocks),
//!   so the model's half-split RoPE applies unchanged;
//! - a missing key or tensor, a wrong shape, a type sluice cannot run, an
//!   unknown architecture, a partial rotary dimension or an unsupported RoPE
//!   scaling is an error naming it.

use crate::config::{GenerationConfig, ModelConfig, RopeScaling};
use crate::kernels::QuantFormat;
use crate::model::arch::{Architecture, TensorNaming};
use crate::weights::{TensorSource, Weight, WeightBytes};
use anyhow::{anyhow, bail, Context, Result};
use sluice_gguf::{GgmlType, GgufFile, Metadata, TensorInfo};
use sluice_tokenizer::GgufVocab;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A GGUF model file, opened: its config, vocabulary and tensors.
pub struct GgufModel {
    pub config: ModelConfig,
    pub generation: GenerationConfig,
    pub vocab: GgufVocab,
    /// `general.sampling.*` and similar recommendations, as `key = value`,
    /// for the log (they are not applied: requests say what they want).
    pub sampling_defaults: Vec<String>,
    /// Per-frequency RoPE divisors (`rope_freqs.weight`, Llama 3.1's long
    /// context scaling as llama.cpp's converter stores it).
    pub rope_freq_factors: Option<Vec<f32>>,
    pub source: GgufSource,
}

/// Whether `path` names a GGUF model: a `.gguf` file, or a directory
/// without `config.json` that holds one.
pub fn is_gguf_model(path: &Path) -> bool {
    if path.is_file() {
        return sluice_gguf::is_gguf_file(path);
    }
    path.is_dir()
        && !path.join("config.json").exists()
        && std::fs::read_dir(path).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| sluice_gguf::is_gguf_file(&e.path()))
        })
}

/// The file a GGUF `path` (file, first split part, or directory) loads.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    Ok(sluice_gguf::resolve_model_path(path)?)
}

fn opt_u32(md: &Metadata, key: &str) -> Result<Option<u32>> {
    Ok(md.opt(key, Metadata::u32)?)
}

fn required_usize(md: &Metadata, key: &str) -> Result<usize> {
    let v = md.u64(key)?;
    usize::try_from(v).map_err(|_| anyhow!("{}: {key} = {v} does not fit", md.file()))
}

/// `{arch}.attention.head_count_kv` may be one number or one per layer;
/// sluice runs models whose layers agree.
fn head_count_kv(md: &Metadata, key: &str, default: usize) -> Result<usize> {
    match md.get(key) {
        None => Ok(default),
        Some(v) if v.as_array().is_some() => {
            let counts = md.u32_array(key)?;
            let first = *counts
                .first()
                .ok_or_else(|| anyhow!("{}: {key} is an empty array", md.file()))?;
            if counts.iter().any(|&c| c != first) {
                bail!(
                    "{}: {key} differs between layers ({counts:?}); sluice runs models whose \
                     layers all have the same number of KV heads",
                    md.file()
                );
            }
            Ok(first as usize)
        }
        Some(_) => required_usize(md, key),
    }
}

/// The stored format of `info`, or an error naming the tensor and its type.
fn stored_format(info: &TensorInfo) -> Result<QuantFormat> {
    let t = info.ggml_type();
    QuantFormat::from_ggml_type(t.id()).ok_or_else(|| {
        anyhow!(
            "{}: type {} is not supported (sluice runs F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, \
             Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS)",
            info.name(),
            t.name()
        )
    })
}

fn vocab(md: &Metadata) -> Result<GgufVocab> {
    let strs = |key: &str| -> Result<Option<Vec<String>>> {
        Ok(md.opt(key, |m, k| m.str_array(k).map(<[String]>::to_vec))?)
    };
    Ok(GgufVocab {
        model: md.str("tokenizer.ggml.model")?.to_string(),
        pre: md.opt("tokenizer.ggml.pre", |m, k| m.str(k).map(str::to_string))?,
        tokens: md.str_array("tokenizer.ggml.tokens")?.to_vec(),
        token_types: md.opt("tokenizer.ggml.token_type", |m, k| {
            m.i32_array(k).map(|v| v.into_owned())
        })?,
        scores: md.opt("tokenizer.ggml.scores", |m, k| {
            m.f32_array(k).map(|v| v.into_owned())
        })?,
        merges: strs("tokenizer.ggml.merges")?,
        bos_token_id: opt_u32(md, "tokenizer.ggml.bos_token_id")?,
        eos_token_id: opt_u32(md, "tokenizer.ggml.eos_token_id")?,
        eot_token_id: opt_u32(md, "tokenizer.ggml.eot_token_id")?,
        eom_token_id: opt_u32(md, "tokenizer.ggml.eom_token_id")?,
        unknown_token_id: opt_u32(md, "tokenizer.ggml.unknown_token_id")?,
        padding_token_id: opt_u32(md, "tokenizer.ggml.padding_token_id")?,
        add_bos_token: md.opt("tokenizer.ggml.add_bos_token", Metadata::bool)?,
        add_eos_token: md.opt("tokenizer.ggml.add_eos_token", Metadata::bool)?,
        add_space_prefix: md.opt("tokenizer.ggml.add_space_prefix", Metadata::bool)?,
        chat_template: md.opt("tokenizer.chat_template", |m, k| {
            m.str(k).map(str::to_string)
        })?,
        huggingface_json: md.opt("tokenizer.huggingface.json", |m, k| {
            m.str(k).map(str::to_string)
        })?,
    })
}

impl GgufModel {
    /// Opens `path` (a `.gguf` file, the first part of a split set, or a
    /// directory holding one model) and reads its config and vocabulary.
    pub fn open(path: &Path) -> Result<GgufModel> {
        let file = GgufFile::open(path)?;
        let md = file.metadata();
        let name = md.file().to_string();
        let arch_name = file.architecture()?.to_string();
        let architecture = Architecture::from_gguf(&arch_name).ok_or_else(|| {
            let known: Vec<&str> = Architecture::ALL
                .iter()
                .map(|a| a.def().gguf_architecture())
                .collect();
            anyhow!(
                "{name}: general.architecture = {arch_name:?} is not supported (sluice runs {})",
                known.join(", ")
            )
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let hidden_size = required_usize(md, &key("embedding_length"))?;
        let num_attention_heads = required_usize(md, &key("attention.head_count"))?;
        let num_key_value_heads =
            head_count_kv(md, &key("attention.head_count_kv"), num_attention_heads)?;
        let head_dim = match md.opt(&key("attention.key_length"), Metadata::u64)? {
            Some(d) => d as usize,
            None => {
                if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
                    bail!(
                        "{name}: {} ({hidden_size}) is not a multiple of {} ({num_attention_heads})",
                        key("embedding_length"),
                        key("attention.head_count")
                    );
                }
                hidden_size / num_attention_heads
            }
        };
        if let Some(v) = md.opt(&key("attention.value_length"), Metadata::u64)? {
            if v as usize != head_dim {
                bail!(
                    "{name}: {} ({v}) differs from the key length ({head_dim}); sluice needs them \
                     equal",
                    key("attention.value_length")
                );
            }
        }
        if let Some(rot) = md.opt(&key("rope.dimension_count"), Metadata::u64)? {
            if rot as usize != head_dim {
                bail!(
                    "{name}: {} = {rot} rotates part of each head (head_dim {head_dim}); partial \
                     rotary embeddings are not supported",
                    key("rope.dimension_count")
                );
            }
        }
        let rope_scaling = match md.opt(&key("rope.scaling.type"), |m, k| m.str(k))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: f64::from(md.f32(&key("rope.scaling.factor"))?),
            },
            Some(other) => bail!(
                "{name}: {} = {other:?} is not supported (none, linear, or llama3's rope_freqs \
                 tensor)",
                key("rope.scaling.type")
            ),
        };
        let embedding = file.require_tensor("token_embd.weight")?;
        let vocab_size = usize::try_from(embedding.n_rows())
            .map_err(|_| anyhow!("{name}: token_embd.weight has too many rows"))?;
        let has = |t: &str| file.tensor(t).is_some();
        let vocab = vocab(md)?;
        let eot_token_id = vocab.eot_token_id.or_else(|| end_of_turn_token(&vocab));
        let eos_token_ids: Vec<u32> = [vocab.eos_token_id, eot_token_id, vocab.eom_token_id]
            .into_iter()
            .flatten()
            .fold(Vec::new(), |mut acc, id| {
                if !acc.contains(&id) {
                    acc.push(id);
                }
                acc
            });
        let mut config = ModelConfig {
            architecture,
            hidden_size,
            num_hidden_layers: required_usize(md, &key("block_count"))?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size: required_usize(md, &key("feed_forward_length"))?,
            vocab_size,
            max_position_embeddings: required_usize(md, &key("context_length"))?,
            rms_norm_eps: f64::from(md.f32(&key("attention.layer_norm_rms_epsilon"))?),
            rope_theta: md
                .opt(&key("rope.freq_base"), Metadata::f32)?
                .map_or(10_000.0, f64::from),
            rope_scaling,
            tie_word_embeddings: !has("output.weight"),
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            mlp_bias: false,
            bos_token_id: vocab.bos_token_id,
            eos_token_ids,
            checkpoint_dtype: None,
            attention: Default::default(),
        };
        // The layer's pieces are what the file holds.
        config.qkv_bias = has("blk.0.attn_q.bias");
        config.o_bias = has("blk.0.attn_output.bias");
        config.qk_norm = has("blk.0.attn_q_norm.weight");
        config.mlp_bias = has("blk.0.ffn_up.bias");
        config.attention = architecture
            .def()
            .gguf_attention(md, &config)
            .with_context(|| format!("{name}: attention settings"))?;
        config
            .validate()
            .with_context(|| format!("{name}: the model's shape"))?;
        let rope_freq_factors = match file.tensor("rope_freqs.weight") {
            None => None,
            Some(info) => {
                let factors = read_f32(info)?;
                if factors.len() != head_dim / 2 {
                    bail!(
                        "rope_freqs.weight: {} factors, expected head_dim / 2 = {}",
                        factors.len(),
                        head_dim / 2
                    );
                }
                Some(factors)
            }
        };
        let sampling_defaults = md
            .iter()
            .filter(|(k, _)| k.starts_with("general.sampling."))
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        let generation = GenerationConfig::from_model_config(&config);
        let permute_qk = architecture.def().gguf_permutes_qk().then_some(QkPermute {
            num_heads: num_attention_heads,
            num_kv_heads: num_key_value_heads,
        });
        Ok(GgufModel {
            config,
            generation,
            vocab,
            sampling_defaults,
            rope_freq_factors,
            source: GgufSource {
                file: Arc::new(file),
                permute_qk,
                keep_stored: true,
                dequantize: false,
            },
        })
    }
}

/// Gemma's `<end_of_turn>`, which its GGUF files do not name as the
/// end-of-turn token: llama.cpp finds it by its text (with the other
/// chat formats' end-of-turn tokens) when `tokenizer.ggml.eot_token_id` is
/// absent, and Gemma's generation_config.json lists it beside the EOS, so a
/// chat turn stops there. Only a control token of that text counts.
fn end_of_turn_token(vocab: &GgufVocab) -> Option<u32> {
    let types = vocab.token_types.as_ref()?;
    vocab
        .tokens
        .iter()
        .zip(types)
        .position(|(t, &ty)| {
            t == "<end_of_turn>" && ty == sluice_tokenizer::gguf::token_type::CONTROL
        })
        .map(|i| i as u32)
}

fn read_f32(info: &TensorInfo) -> Result<Vec<f32>> {
    let format = stored_format(info)?;
    let n = usize::try_from(info.n_elements())
        .map_err(|_| anyhow!("{}: too many elements", info.name()))?;
    let mut out = vec![0.0f32; n];
    format
        .dequantize_row(info.data(), &mut out)
        .map_err(|e| anyhow!("{}: {e}", info.name()))?;
    Ok(out)
}

/// Head counts for un-permuting `llama`'s Q and K rows.
#[derive(Clone, Copy, Debug)]
struct QkPermute {
    num_heads: usize,
    num_kv_heads: usize,
}

/// The tensors of a GGUF file, in llama.cpp's names (`blk.3.attn_q.weight`).
pub struct GgufSource {
    file: Arc<GgufFile>,
    permute_qk: Option<QkPermute>,
    /// Hand every tensor out in its stored format (`--dtype auto`), floats
    /// included; otherwise float tensors are converted to the requested
    /// dtype (or quantized to it at load).
    keep_stored: bool,
    /// Hand quantized tensors out dequantized to the requested float dtype
    /// too (exactly as `gguf.quants.dequantize` does), for a float
    /// reference run of a quantized file.
    dequantize: bool,
}

impl GgufSource {
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Whether float tensors keep their stored format (the default) or are
    /// converted to the dtype the model asks for.
    pub fn set_keep_stored(&mut self, keep: bool) {
        self.keep_stored = keep;
    }

    /// Whether quantized tensors are dequantized to the requested float
    /// dtype (a reference run of the file's own weights without its
    /// integer arithmetic) instead of running as stored.
    pub fn set_dequantize(&mut self, dequantize: bool) {
        self.dequantize = dequantize;
    }

    /// The head count whose rows `name` holds permuted, if it is a `llama`
    /// Q or K tensor.
    fn permuted_heads(&self, name: &str) -> Option<usize> {
        let p = self.permute_qk?;
        let rest = name.strip_prefix("blk.")?;
        let (_, tail) = rest.split_once('.')?;
        match tail {
            "attn_q.weight" | "attn_q.bias" => Some(p.num_heads),
            "attn_k.weight" | "attn_k.bias" => Some(p.num_kv_heads),
            _ => None,
        }
    }
}

/// llama.cpp's converter reorders each head's rows from the half-split
/// layout (`[x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}]`, rotated as halves) to
/// pairs (`[x_0, y_0, x_1, y_1, ...]`, rotated as neighbours). Row `r` of
/// head `h` in the half-split order is stored row `2r` (first half) or
/// `2(r - d/2) + 1` (second half).
fn stored_row(row: usize, rows_per_head: usize) -> usize {
    let (head, r) = (row / rows_per_head, row % rows_per_head);
    let half = rows_per_head / 2;
    let s = if r < half { 2 * r } else { 2 * (r - half) + 1 };
    head * rows_per_head + s
}

impl TensorSource for GgufSource {
    fn naming(&self) -> TensorNaming {
        TensorNaming::Gguf
    }

    fn contains(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    fn release(&self, name: &str) {
        if let Some(info) = self.file.tensor(name) {
            info.release_pages();
        }
    }

    fn format_of(&self, name: &str, requested: QuantFormat) -> Result<QuantFormat> {
        let info = self.file.require_tensor(name)?;
        let stored = stored_format(info)?;
        let convert = if stored.is_float() {
            !self.keep_stored
        } else {
            self.dequantize && requested.is_float()
        };
        Ok(if convert {
            // Converted (or quantized at load, or dequantized) as asked.
            requested
        } else {
            // The stored format, used by the kernels as it is.
            stored
        })
    }

    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> Result<()> {
        let info = self.file.require_tensor(name)?;
        let stored = stored_format(info)?;
        // GGUF lists dimensions fastest first: `[cols, rows]` for `[rows × cols]`.
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        if info.dims() != dims.as_slice() {
            bail!(
                "{name}: shape {:?} in the file, expected {:?} (GGUF order {dims:?})",
                info.dims(),
                shape
            );
        }
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let rows = shape.iter().product::<usize>() / cols;
        let row_bytes = stored.row_bytes(cols).map_err(|e| anyhow!("{name}: {e}"))?;
        let data = info.data();
        let permuted = self.permuted_heads(name);
        if let Some(heads) = permuted {
            if heads == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
                bail!("{name}: {rows} rows do not split into {heads} heads of an even size");
            }
        }
        let row_order = |row: usize| -> usize {
            match permuted {
                Some(heads) => stored_row(row, rows / heads),
                None => row,
            }
        };
        let same_format = out.dtype() == stored;
        let quantized = !stored.is_float();
        if same_format && quantized {
            if out.is_empty() && permuted.is_none() {
                // Borrow the mapped bytes: no copy of the tensor.
                *out = Weight::Quant {
                    format: stored,
                    bytes: WeightBytes::mapped(Arc::new(info.bytes()), 0..data.len())?,
                };
                return Ok(());
            }
            let Weight::Quant { bytes, .. } = out else {
                bail!("{name}: internal error: a quantized weight expected");
            };
            let buf = bytes.make_owned();
            buf.reserve(data.len());
            for row in 0..rows {
                let s = row_order(row) * row_bytes;
                buf.extend_from_slice(&data[s..s + row_bytes]);
            }
            return Ok(());
        }
        if quantized && !matches!(out, Weight::F32(_) | Weight::Bf16(_) | Weight::F16(_)) {
            bail!(
                "{name}: stored as {}, cannot be converted to {} (requantizing would lose \
                 accuracy twice)",
                stored.name(),
                out.dtype().name()
            );
        }
        // Decode row by row to f32, then append in the output's dtype.
        let mut row_f32 = vec![0.0f32; cols];
        for row in 0..rows {
            let s = row_order(row) * row_bytes;
            stored
                .dequantize_row(&data[s..s + row_bytes], &mut row_f32)
                .map_err(|e| anyhow!("{name}: {e}"))?;
            let target = out.dtype();
            crate::weights::append_f32_rows(&row_f32, cols, out)
                .with_context(|| format!("{name}: converting to {target:?}"))?;
        }
        Ok(())
    }
}

/// A type name for errors about the GGML types a file may hold.
pub fn ggml_type_name(id: u32) -> String {
    GgmlType::from_id(id).map_or_else(|| format!("type id {id}"), |t| t.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_rows_are_unpermuted_within_each_head() {
        // One head of 4 rows: stored as [x0, y0, x1, y1].
        let order: Vec<usize> = (0..4).map(|r| stored_row(r, 4)).collect();
        assert_eq!(order, vec![0, 2, 1, 3]);
        // Two heads of 4: the second head's rows stay in the second head.
        let order: Vec<usize> = (0..8).map(|r| stored_row(r, 4)).collect();
        assert_eq!(order, vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }
}
