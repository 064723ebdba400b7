//! `--speculative-config`: vLLM's `SpeculativeConfig` JSON, with its
//! field names, defaults and validation messages (vLLM 0.33), and the
//! drafter it asks for.
//!
//! Promises: every bad value is an error naming the field; a field vLLM
//! has but sluice does not implement is refused as such (never silently
//! ignored), and an unknown field is refused as unknown.

use super::{DraftModelDrafter, Drafter, NgramDrafter, SuffixDrafter, SuffixParams};
use crate::kv_cache::KvCacheConfig;
use crate::{load_model, DType, LoadFormat, LoadedModel, ModelSpec};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

/// The most drafts one request may get per step (one verification pass
/// then computes up to 33 rows of logits per request).
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

/// Which proposer, with its settings.
#[derive(Clone, Debug, PartialEq)]
pub enum SpeculativeMethod {
    /// Prompt lookup: `prompt_lookup_min` / `prompt_lookup_max`.
    Ngram { min_n: usize, max_n: usize },
    /// Suffix decoding.
    Suffix(SuffixParams),
    /// A smaller model with the target's vocabulary (`model`: its path).
    DraftModel { model: String },
}

impl SpeculativeMethod {
    /// The name vLLM gives it (`method`).
    pub fn name(&self) -> &'static str {
        match self {
            SpeculativeMethod::Ngram { .. } => "ngram",
            SpeculativeMethod::Suffix(_) => "suffix",
            SpeculativeMethod::DraftModel { .. } => "draft_model",
        }
    }
}

/// A parsed and checked `--speculative-config`.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculativeConfig {
    pub method: SpeculativeMethod,
    /// k: drafts per request and step, at most.
    pub num_speculative_tokens: usize,
    /// `num_speculative_tokens_per_batch_size`, validated and sorted:
    /// inclusive batch-size ranges and the k of each.
    pub per_batch_size: Option<Vec<(usize, usize, usize)>>,
    /// `rejection_sample_method: "synthetic"`: drafts accepted by chance,
    /// position i of a run with unconditional probability `rates[i]`
    /// (vLLM's `synthetic_acceptance_rates`, or those it derives from
    /// `synthetic_acceptance_length`). Only the simulated executor takes
    /// it: on a real model it would change the outputs.
    pub synthetic_acceptance_rates: Option<Vec<f64>>,
}

/// The methods vLLM 0.33 knows that sluice does not run (they need
/// trained draft heads or a GPU).
const VLLM_ONLY_METHODS: &[&str] = &[
    "eagle",
    "eagle3",
    "mtp",
    "ngram_gpu",
    "custom_class",
    "dflash",
    "dspark",
    "extract_hidden_states",
    "medusa",
    "mlp_speculator",
];

/// Fields of vLLM 0.33's `SpeculativeConfig` that sluice does not
/// implement.
const VLLM_ONLY_FIELDS: &[&str] = &[
    "enforce_eager",
    "draft_tensor_parallel_size",
    "tensor_parallel_size",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "max_model_len",
    "revision",
    "code_revision",
    "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch",
    "disable_eagle_block_drop",
    "disable_lookahead_block_hashes",
    "draft_lm_head_quantization",
    "use_local_argmax_reduction",
    "use_heterogeneous_vocab",
    "parallel_drafting",
    "target_model_config",
    "target_parallel_config",
    "draft_model_config",
    "draft_parallel_config",
    "draft_load_config",
    "enable_adaptive_verification",
    "dspark_draft_topk",
    "xpress_topc",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
];

const FIELDS: &[&str] = &[
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "num_speculative_tokens_per_batch_size",
    "disable_by_batch_size",
    "draft_sample_method",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
];

/// Reads one JSON field, naming it in errors.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn int(&self, name: &str) -> Result<Option<i64>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| anyhow!("{name}: expected an integer, got {v}")),
        }
    }

    fn float(&self, name: &str) -> Result<Option<f64>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| anyhow!("{name}: expected a number, got {v}")),
        }
    }

    fn string(&self, name: &str) -> Result<Option<&str>> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => bail!("{name}: expected a string, got {v}"),
        }
    }
}

impl SpeculativeConfig {
    /// Parses the JSON object of `--speculative-config`.
    pub fn parse(json: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| anyhow!("not valid JSON: {e}"))?;
        let Value::Object(map) = value else {
            bail!("expected a JSON object, got {value}");
        };
        Self::from_map(&map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<Self> {
        for key in map.keys() {
            if VLLM_ONLY_FIELDS.contains(&key.as_str()) {
                bail!("{key}: a field of vLLM's speculative config that sluice does not implement");
            }
            if !FIELDS.contains(&key.as_str()) {
                bail!("{key}: unknown field (known: {})", FIELDS.join(", "));
            }
        }
        let f = Fields(map);
        let model = f.string("model")?;
        let method = match (f.string("method")?, model) {
            (Some(m), _) => m.to_string(),
            // vLLM: a model of "ngram" means the ngram method, any other
            // model a draft model.
            (None, Some("ngram" | "[ngram]")) => "ngram".into(),
            (None, Some(_)) => "draft_model".into(),
            (None, None) => {
                bail!("num_speculative_tokens was provided but without speculative model.")
            }
        };
        let method = if method == "[ngram]" {
            "ngram".to_string()
        } else {
            method
        };
        if let Some(m) = f.string("draft_sample_method")? {
            if m != "greedy" {
                bail!(
                    "draft_sample_method: {m:?} is not supported (sluice drafts greedily: the \
                     draft's probabilities are treated as one-hot, vLLM's default \"greedy\")"
                );
            }
        }
        let mut k = f.int("num_speculative_tokens")?;
        let method = match method.as_str() {
            "ngram" => ngram_bounds(&f)?,
            "suffix" => {
                let p = suffix_params(&f)?;
                // vLLM: the tree depth is k's default (a maximum: suffix
                // decoding chooses each proposal's length).
                k = k.or(Some(p.max_tree_depth as i64));
                SpeculativeMethod::Suffix(p)
            }
            "draft_model" => match model {
                Some(m) => SpeculativeMethod::DraftModel { model: m.into() },
                None => bail!("model: the draft_model method needs the draft model's path"),
            },
            m if VLLM_ONLY_METHODS.contains(&m) => bail!(
                "method: {m:?} is a vLLM method sluice does not run (supported: ngram, suffix, \
                 draft_model)"
            ),
            m => bail!(
                "method: unknown speculative method {m:?} (supported: ngram, suffix, draft_model)"
            ),
        };
        for key in map.keys() {
            let applies = match &method {
                SpeculativeMethod::Ngram { .. } => key.starts_with("prompt_lookup_"),
                SpeculativeMethod::Suffix(_) => key.starts_with("suffix_decoding_"),
                SpeculativeMethod::DraftModel { .. } => false,
            };
            if (key.starts_with("prompt_lookup_") || key.starts_with("suffix_decoding_"))
                && !applies
            {
                bail!("{key}: does not apply to the {} method", method.name());
            }
        }
        let Some(k) = k else {
            bail!(
                "num_speculative_tokens must be provided with speculative model unless the draft \
                 model config contains an n_predict parameter."
            );
        };
        if k <= 0 {
            bail!("Expected num_speculative_tokens to be greater than zero ({k}).");
        }
        if k as usize > MAX_SPECULATIVE_TOKENS {
            bail!("num_speculative_tokens={k} must be <= {MAX_SPECULATIVE_TOKENS}");
        }
        let k = k as usize;
        let per_batch_size = match (
            map.get("num_speculative_tokens_per_batch_size"),
            f.int("disable_by_batch_size")?,
        ) {
            (Some(v), Some(_)) if !v.is_null() => bail!(
                "disable_by_batch_size: give either it or num_speculative_tokens_per_batch_size, \
                 not both"
            ),
            (Some(v), _) if !v.is_null() => Some(
                parse_schedule(v)
                    .map_err(|e| anyhow!("num_speculative_tokens_per_batch_size: {e}"))?,
            ),
            (_, Some(n)) => {
                if n < 2 {
                    bail!(
                        "disable_by_batch_size: expect the batch size threshold of disabling \
                         speculative decoding is > 1, but got {n}"
                    );
                }
                let n = n as usize;
                Some(vec![(1, n, k), (n + 1, usize::MAX, 0)])
            }
            _ => None,
        };
        let synthetic_acceptance_rates = synthetic_rates(&f, map, k)?;
        Ok(SpeculativeConfig {
            method,
            num_speculative_tokens: k,
            per_batch_size,
            synthetic_acceptance_rates,
        })
    }

    /// KV slots the scheduler reserves past each step's tokens (vLLM's
    /// `num_lookahead_tokens`): a draft model writes KV for its own
    /// proposals; n-gram and suffix proposals need none.
    pub fn num_lookahead_tokens(&self) -> usize {
        match self.method {
            SpeculativeMethod::DraftModel { .. } => self.num_speculative_tokens,
            _ => 0,
        }
    }

    /// Input-budget slots each scheduled request reserves for drafting
    /// (vLLM's `max_num_new_slots_for_drafting`): a draft model keeps one
    /// unsliced input token; n-gram and suffix proposals take none.
    pub fn num_draft_slots(&self) -> usize {
        usize::from(matches!(self.method, SpeculativeMethod::DraftModel { .. }))
    }

    /// The scheduler's share of this configuration, as vLLM 0.33 derives
    /// it: k, the lookahead and draft slots, and the placeholder padding of
    /// a request admitted with one token left (on with a fixed k, off with
    /// a per-batch-size schedule).
    pub fn apply_to(&self, cfg: &mut sluice_core::SchedulerConfig) {
        cfg.num_speculative_tokens = self.num_speculative_tokens;
        cfg.num_lookahead_tokens = self.num_lookahead_tokens();
        cfg.num_draft_slots = self.num_draft_slots();
        cfg.pad_spec_decode = self.per_batch_size.is_none();
    }

    /// k for each batch size 0..=max_num_seqs (the number of requests a
    /// step ran), as vLLM's dense schedule: ranges as given, gaps and the
    /// tail carry the previous range's k, never above k.
    pub fn k_by_batch_size(&self, max_num_seqs: usize) -> Vec<usize> {
        let k = self.num_speculative_tokens;
        let mut dense = vec![k; max_num_seqs + 1];
        let Some(schedule) = &self.per_batch_size else {
            return dense;
        };
        dense[0] = 0;
        let mut last = schedule[0].2;
        let mut ranges = schedule.iter().peekable();
        for (b, slot) in dense.iter_mut().enumerate().skip(1) {
            while let Some(&&(start, end, rk)) = ranges.peek() {
                if b > end {
                    last = rk;
                    ranges.next();
                } else {
                    if b >= start {
                        last = rk;
                    }
                    break;
                }
            }
            *slot = last.min(k);
        }
        dense
    }

    /// The proposer this config asks for. A draft model is loaded from
    /// its path and gets a KV pool laid out as `draft_kv` (its block size,
    /// element type and number of blocks); `target` is the model it drafts
    /// for (the vocabularies must agree).
    pub fn drafter(
        &self,
        target: &LoadedModel,
        draft_kv: KvCacheConfig,
    ) -> Result<Box<dyn Drafter>> {
        if self.synthetic_acceptance_rates.is_some() {
            bail!(
                "rejection_sample_method: \"synthetic\" accepts drafts by chance, whatever the \
                 model says (vLLM's benchmarking mode): only the simulated executor takes it"
            );
        }
        match &self.method {
            SpeculativeMethod::Ngram { min_n, max_n } => {
                Ok(Box::new(NgramDrafter::new(*min_n, *max_n)?))
            }
            SpeculativeMethod::Suffix(p) => Ok(Box::new(SuffixDrafter::new(*p))),
            SpeculativeMethod::DraftModel { model } => {
                let spec = ModelSpec {
                    dir: Some(model.into()),
                    builtin: None,
                    load_format: LoadFormat::Auto,
                    dtype: DType::Auto,
                    seed: 0,
                    quantization: None,
                };
                let draft = load_model(&spec).with_context(|| format!("model: {model}"))?;
                // vLLM's size check first (its message), then the strings.
                let drafter = DraftModelDrafter::new(&draft, target.config.vocab_size, draft_kv)
                    .with_context(|| format!("model: {model}"))?;
                check_same_vocabulary(target, &draft)?;
                Ok(Box::new(drafter))
            }
        }
    }
}

/// Beyond vLLM's size check: two GGUF files must carry the same token
/// strings, or the draft's ids would mean other tokens.
fn check_same_vocabulary(target: &LoadedModel, draft: &LoadedModel) -> Result<()> {
    if let (Some(t), Some(d)) = (&target.gguf, &draft.gguf) {
        let (t, d) = (&t.vocab.tokens, &d.vocab.tokens);
        if let Some(i) = (0..t.len().min(d.len())).find(|&i| t[i] != d[i]) {
            bail!(
                "model: the draft's vocabulary differs from the target's (token {i} is {:?} in \
                 the draft, {:?} in the target)",
                d[i],
                t[i]
            );
        }
    }
    Ok(())
}

/// `prompt_lookup_min` / `prompt_lookup_max` with vLLM's defaults: 5 and 5
/// when neither is given, else the one given for both.
fn ngram_bounds(f: &Fields<'_>) -> Result<SpeculativeMethod> {
    let (min, max) = (f.int("prompt_lookup_min")?, f.int("prompt_lookup_max")?);
    for (name, v) in [("prompt_lookup_min", min), ("prompt_lookup_max", max)] {
        if let Some(v) = v.filter(|&v| v < 1) {
            bail!("{name}: must be >= 1, got {v}");
        }
    }
    let (min, max) = match (min, max) {
        (None, None) => (5, 5),
        (None, Some(m)) | (Some(m), None) => (m, m),
        (Some(a), Some(b)) => (a, b),
    };
    if min > max {
        bail!("prompt_lookup_min={min} must be <= prompt_lookup_max={max}");
    }
    Ok(SpeculativeMethod::Ngram {
        min_n: min as usize,
        max_n: max as usize,
    })
}

/// The `suffix_decoding_*` fields with vLLM's defaults and checks.
fn suffix_params(f: &Fields<'_>) -> Result<SuffixParams> {
    let d = SuffixParams::default();
    let depth = f.int("suffix_decoding_max_tree_depth")?;
    let depth = depth.unwrap_or(d.max_tree_depth as i64);
    let cached = f.int("suffix_decoding_max_cached_requests")?;
    let cached = cached.unwrap_or(d.max_cached_requests as i64);
    let factor = f.float("suffix_decoding_max_spec_factor")?;
    let factor = factor.unwrap_or(f64::from(d.max_spec_factor));
    let min_prob = f.float("suffix_decoding_min_token_prob")?;
    let min_prob = min_prob.unwrap_or(f64::from(d.min_token_prob));
    if depth < 1 {
        bail!("suffix_decoding_max_tree_depth={depth} must be >= 1");
    }
    if cached < 0 {
        bail!("suffix_decoding_max_cached_requests={cached} must be >= 0");
    }
    if factor < 0.0 {
        bail!("suffix_decoding_max_spec_factor={factor} must be >= 0");
    }
    if !(0.0..=1.0).contains(&min_prob) {
        bail!("suffix_decoding_min_token_prob={min_prob} must be in [0, 1]");
    }
    Ok(SuffixParams {
        max_tree_depth: depth as usize,
        max_cached_requests: cached as usize,
        max_spec_factor: factor as f32,
        min_token_prob: min_prob as f32,
    })
}

/// `rejection_sample_method` and the synthetic rates, as vLLM resolves and
/// checks them.
fn synthetic_rates(f: &Fields<'_>, map: &Map<String, Value>, k: usize) -> Result<Option<Vec<f64>>> {
    let method = f.string("rejection_sample_method")?.unwrap_or("standard");
    let rates = match map.get("synthetic_acceptance_rates") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(Value::as_f64)
                .collect::<Option<Vec<f64>>>()
                .ok_or_else(|| anyhow!("synthetic_acceptance_rates: expected a list of numbers"))?,
        ),
        Some(v) => bail!("synthetic_acceptance_rates: expected a list of numbers, got {v}"),
    };
    let length = f.float("synthetic_acceptance_length")?;
    match method {
        "standard" => {
            if rates.is_some() || length.is_some() {
                bail!(
                    "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with \
                     rejection_sample_method='synthetic'."
                );
            }
            Ok(None)
        }
        "synthetic" => {
            let rates = match (rates, length) {
                (Some(r), None) => {
                    if r.len() != k {
                        bail!("synthetic_acceptance_rates must have length {k}, got {r:?}.");
                    }
                    if !r.iter().all(|x| (0.0..=1.0).contains(x)) {
                        bail!("synthetic_acceptance_rates entries must be in [0, 1], got {r:?}.");
                    }
                    if r.windows(2).any(|w| w[1] > w[0]) {
                        bail!("synthetic_acceptance_rates must be non-increasing, got {r:?}.");
                    }
                    r
                }
                (None, Some(len)) => {
                    if !(1.0..=(k + 1) as f64).contains(&len) {
                        bail!(
                            "synthetic_acceptance_length must be in [1, {}], got {len}.",
                            k + 1
                        );
                    }
                    // vLLM's minimum-variance schedule: full positions, one
                    // partial, then none.
                    let drafts = len - 1.0;
                    let full = drafts as usize;
                    (0..k)
                        .map(|i| match i.cmp(&full) {
                            std::cmp::Ordering::Less => 1.0,
                            std::cmp::Ordering::Equal => drafts - full as f64,
                            std::cmp::Ordering::Greater => 0.0,
                        })
                        .collect()
                }
                _ => bail!(
                    "rejection_sample_method='synthetic' requires exactly one of \
                     synthetic_acceptance_rates or synthetic_acceptance_length."
                ),
            };
            Ok(Some(rates))
        }
        m @ ("block" | "fly") => bail!(
            "rejection_sample_method: {m:?} is a vLLM method sluice does not implement \
             (standard, synthetic)"
        ),
        m => bail!("rejection_sample_method: unknown method {m:?} (standard, synthetic)"),
    }
}

/// vLLM's `validate_and_normalize_dynamic_sd_schedule`, with its messages.
fn parse_schedule(v: &Value) -> Result<Vec<(usize, usize, usize)>> {
    let Value::Array(entries) = v else {
        bail!(
            "num_speculative_tokens_per_batch_size must be a non-empty list of (range_start, \
             range_end, num_speculative_tokens) entries."
        );
    };
    if entries.is_empty() {
        bail!("num_speculative_tokens_per_batch_size must not be empty.");
    }
    let mut out = Vec::new();
    for e in entries {
        let triple = e
            .as_array()
            .filter(|a| a.len() == 3)
            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>());
        let Some(t) = triple else {
            bail!(
                "Each num_speculative_tokens_per_batch_size entry must be a 3-item sequence: \
                 (range_start, range_end, num_speculative_tokens)."
            );
        };
        let (start, end, k) = (t[0], t[1], t[2]);
        if start <= 0 || end <= 0 {
            bail!("Batch-size range ({start}, {end}) must be positive.");
        }
        if start > end {
            bail!("Batch-size range start must be <= end for ({start}, {end}, {k}).");
        }
        if k < 0 {
            bail!("num_speculative_tokens_per_batch_size values must be >= 0.");
        }
        out.push((start as usize, end as usize, k as usize));
    }
    out.sort_by_key(|e| e.0);
    let mut previous_end = 0;
    for &(start, end, _) in &out {
        if start <= previous_end {
            bail!("Batch-size ranges must be non-overlapping and sorted.");
        }
        previous_end = end;
    }
    if out[0].0 != 1 {
        bail!(
            "The first batch-size range must start at 1 so every runtime batch size has a \
             defined schedule."
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
