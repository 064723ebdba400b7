//! The startup summary `serve` logs before it listens: what model runs
//! (name, where from, architecture, weight formats), on what (kernel
//! paths, CPU features, threads) and with how much KV cache (blocks,
//! tokens, bytes; max_model_len, block size), as vLLM's start-up lines
//! say it.
//!
//! Owns the wording only: every figure is read from what was built (the
//! loaded model, the executor's KV pool, the scheduler config, the kernel
//! dispatch), so the summary says what runs, not what was asked for.

use serde_json::Value;
use sluice_model::config::ModelConfig;
use sluice_model::kernels::{self, KernelFamily, QuantFormat};
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::LoadedModel;
use sluice_server::logging;

/// What `prepare` learnt about the model while loading it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Where it came from: `--model ORG/NAME (PATH)`, `--builtin tiny`.
    pub source: String,
    /// The Hugging Face class (`Qwen2ForCausalLM`).
    pub architecture: &'static str,
    pub num_layers: usize,
    /// `(format, matrices, bytes)`, most bytes first; empty when no
    /// weights are loaded (`--executor simulated`).
    pub weights: Vec<(QuantFormat, usize, usize)>,
    /// Bytes of one KV block; `None` when no cache is held (simulated).
    pub kv_bytes_per_block: Option<usize>,
    /// The KV cache's element type (`bfloat16`); `None` when simulated.
    pub kv_dtype: Option<&'static str>,
}

impl ModelInfo {
    /// The info of a model of `config` from `source`, its weights
    /// `loaded` (`None`: simulated), its KV cache in blocks laid out as
    /// `blocks` says (block size, layer grouping: what a block costs).
    pub fn of(
        source: String,
        config: &ModelConfig,
        loaded: Option<&LoadedModel>,
        blocks: &KvCacheConfig,
    ) -> Self {
        ModelInfo {
            source,
            architecture: config
                .architecture
                .def()
                .hf_architectures()
                .first()
                .copied()
                .unwrap_or("unknown"),
            num_layers: config.num_hidden_layers,
            weights: loaded.map(LoadedModel::weight_formats).unwrap_or_default(),
            kv_bytes_per_block: loaded.map(|_| blocks.block_bytes(config)),
            kv_dtype: loaded.map(|_| blocks.dtype.name()),
        }
    }
}

/// The figures of the KV cache line.
#[derive(Clone, Copy, Debug)]
pub struct KvFigures {
    pub num_blocks: usize,
    pub block_size: usize,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
}

/// `1.5 GiB`, `16.0 MiB`, `512 B`.
pub fn human_bytes(n: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// The kernel family a weight format's matmul runs in.
fn family(f: QuantFormat) -> KernelFamily {
    match f {
        QuantFormat::F32 => KernelFamily::F32,
        QuantFormat::Bf16 => KernelFamily::Bf16,
        QuantFormat::F16 => KernelFamily::F16,
        _ => KernelFamily::Quant,
    }
}

/// `Q4_1 ×168 matrices (80.1 MiB), F32 ×1 (36.0 MiB)`.
fn weights_text(weights: &[(QuantFormat, usize, usize)]) -> String {
    weights
        .iter()
        .enumerate()
        .map(|(i, (f, n, bytes))| {
            let noun = if i == 0 { " matrices" } else { "" };
            format!("{} ×{n}{noun} ({})", f.name(), human_bytes(*bytes))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Logs the model, kernel and KV cache lines.
pub fn log_summary(model_name: &str, info: &ModelInfo, kv: &KvFigures) {
    log_model(model_name, info);
    if !info.weights.is_empty() {
        log_kernels(info);
    }
    log_kv(info, kv);
}

fn log_model(model_name: &str, info: &ModelInfo) {
    let total: usize = info.weights.iter().map(|w| w.2).sum();
    let weights = match info.weights.len() {
        0 => "none loaded (simulated executor)".to_string(),
        1 => format!("{}; norms and biases F32", weights_text(&info.weights)),
        _ => format!(
            "{} = {}; norms and biases F32",
            weights_text(&info.weights),
            human_bytes(total)
        ),
    };
    let dominant = info.weights.first().map(|w| w.0.name());
    logging::log(
        logging::Level::Info,
        &format!(
            "model {model_name:?} from {}: {}, {} layers; weights {weights}",
            info.source, info.architecture, info.num_layers
        ),
        &[
            ("event", "startup".into()),
            ("model", model_name.into()),
            ("source", info.source.as_str().into()),
            ("architecture", info.architecture.into()),
            ("num_layers", info.num_layers.into()),
            ("weight_dtype", dominant.into()),
            ("weight_bytes", total.into()),
        ],
    );
}

fn log_kernels(info: &ModelInfo) {
    let features = kernels::cpu_features();
    // The paths the weights' matmuls and attention run on; the full
    // per-family list follows from the CPU features.
    let mut paths: Vec<String> = Vec::new();
    for (f, _, _) in &info.weights {
        let fam = family(*f);
        let p = kernels::kernel_path(fam);
        let entry = format!("{} matmul {p}", f.name());
        if !paths.contains(&entry) {
            paths.push(entry);
        }
    }
    paths.push(format!(
        "attention {}",
        kernels::kernel_path(KernelFamily::Attention)
    ));
    let cap = std::env::var("SLUICE_KERNEL").unwrap_or_else(|_| "unset".into());
    let threads = kernels::num_threads();
    let main_path = info
        .weights
        .first()
        .map(|(f, _, _)| kernels::kernel_path(family(*f)).name());
    logging::log(
        logging::Level::Info,
        &format!(
            "kernels: {}; SLUICE_KERNEL {cap}; threads {threads}; {features}",
            paths.join(", ")
        ),
        &[
            ("event", "startup".into()),
            ("kernel_path", main_path.into()),
            ("sluice_kernel", Value::from(cap.as_str())),
            ("threads", threads.into()),
        ],
    );
}

fn log_kv(info: &ModelInfo, kv: &KvFigures) {
    let tokens = kv.num_blocks.saturating_mul(kv.block_size);
    let bytes = info
        .kv_bytes_per_block
        .map(|b| b.saturating_mul(kv.num_blocks));
    let size = bytes.map_or_else(
        || "not held (simulated)".to_string(),
        |b| format!("{} ({})", human_bytes(b), info.kv_dtype.unwrap_or("?")),
    );
    logging::log(
        logging::Level::Info,
        &format!(
            "KV cache: {} blocks × {} tokens = {tokens} tokens, {size}; max_model_len {}, \
             max_num_seqs {}, max_num_batched_tokens {}",
            kv.num_blocks,
            kv.block_size,
            kv.max_model_len,
            kv.max_num_seqs,
            kv.max_num_batched_tokens
        ),
        &[
            ("event", "startup".into()),
            ("kv_blocks", kv.num_blocks.into()),
            ("block_size", kv.block_size.into()),
            ("kv_tokens", tokens.into()),
            ("kv_bytes", bytes.into()),
            ("kv_cache_dtype", info.kv_dtype.into()),
            ("max_model_len", kv.max_model_len.into()),
            ("max_num_seqs", kv.max_num_seqs.into()),
            ("max_num_batched_tokens", kv.max_num_batched_tokens.into()),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(16 << 20), "16.0 MiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn weights_list_the_formats_most_bytes_first() {
        let w = [
            (QuantFormat::Q4_1, 168, 80 << 20),
            (QuantFormat::F32, 1, 1 << 20),
        ];
        assert_eq!(
            weights_text(&w),
            "Q4_1 ×168 matrices (80.0 MiB), F32 ×1 (1.0 MiB)"
        );
    }
}
