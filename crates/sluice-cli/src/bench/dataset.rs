//! The `random` dataset of vLLM's `RandomDataset`
//! (`vllm/benchmarks/datasets/datasets.py`), draw for draw: per-request
//! input and output lengths uniform in the range-ratio interval, a
//! vocabulary offset per request, an optional shared random prefix, prompt
//! `i` the allowed tokens `(offset + i + 0..len) % n_allowed`, then
//! decoded, re-encoded and padded or cut until it re-encodes to its length.
//! With the same tokenizer and seed the prompts equal vLLM's.
//!
//! Also the tokenizer view the dataset needs ([`BenchTokenizer`]): the
//! base vocabulary size (without added tokens, as `tokenizer.vocab_size` is
//! in transformers), the special ids, and the special tokens encoding adds.

use super::rng::Generator;
use anyhow::{bail, Context, Result};
use sluice_tokenizer::Tokenizer;
use std::path::Path;

pub struct BenchTokenizer {
    tok: Tokenizer,
    vocab_size: usize,
    num_special_tokens_to_add: usize,
    /// What the result file records as `tokenizer_id`.
    pub id: String,
}

impl BenchTokenizer {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok = Tokenizer::from_dir(dir)?;
        // transformers' `vocab_size` leaves out added tokens: the model
        // section of tokenizer.json.
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not valid JSON", path.display()))?;
        let base = match &json["model"]["vocab"] {
            serde_json::Value::Object(m) => m.len(),
            serde_json::Value::Array(a) => a.len(),
            _ => tok.vocab_size(),
        };
        Self::new(tok, Some(base), dir.display().to_string())
    }

    /// The tokenizer a GGUF file carries (`path`: the file, the first part
    /// of a split set, or a directory holding one), the one `sluice serve
    /// --model` builds from the same file. Its base vocabulary, as
    /// transformers counts `vocab_size`, stops before the control and
    /// user-defined tokens that close the list (a converter appends the
    /// added tokens there).
    pub fn from_gguf(path: &Path) -> Result<Self> {
        let file = sluice_model::gguf::resolve(path)?;
        let vocab = sluice_model::gguf::GgufModel::open(&file)?.vocab;
        let tok = Tokenizer::from_gguf_vocab(&vocab)?;
        let base = base_vocab_size(vocab.tokens.len(), vocab.token_types.as_deref());
        Self::new(tok, Some(base), file.display().to_string())
    }

    /// The built-in byte-level tokenizer, its vocabulary taken as the 128
    /// ASCII bytes: random bytes above them rarely form valid UTF-8, so
    /// prompts would decode to U+FFFD and re-encode to other lengths.
    pub fn builtin() -> Result<Self> {
        Self::new(Tokenizer::builtin(), Some(128), "builtin".to_string())
    }

    fn new(tok: Tokenizer, base_vocab: Option<usize>, id: String) -> Result<Self> {
        let with = tok.encode("", true)?.len();
        let without = tok.encode("", false)?.len();
        Ok(BenchTokenizer {
            vocab_size: base_vocab.unwrap_or_else(|| tok.vocab_size()),
            num_special_tokens_to_add: with.saturating_sub(without),
            tok,
            id,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Special tokens encoding adds (a BOS, say), counted in the server's
    /// `prompt_tokens` and in `--random-input-len`.
    pub fn num_special_tokens_to_add(&self) -> usize {
        self.num_special_tokens_to_add
    }

    /// Tokens of `text` without special tokens (how vLLM counts).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tok.encode(text, false)
    }

    /// Text of `ids`, special tokens kept (transformers' default).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tok.decode(ids, false)
    }

    /// The vocabulary without special ids, ascending (vLLM's
    /// `allowed_tokens`; its set difference of small ints iterates in
    /// order).
    fn allowed_tokens(&self) -> Vec<u32> {
        (0..self.vocab_size as u32)
            .filter(|&id| !self.tok.is_special(id))
            .collect()
    }
}

/// llama.cpp's token types of the added tokens: control (3) and
/// user-defined (4).
const ADDED_TOKEN_TYPES: [i32; 2] = [3, 4];

/// The vocabulary without the added tokens at its end.
fn base_vocab_size(n: usize, token_types: Option<&[i32]>) -> usize {
    match token_types {
        Some(types) if types.len() == n => types
            .iter()
            .rposition(|t| !ADDED_TOKEN_TYPES.contains(t))
            .map_or(n, |last| last + 1),
        _ => n,
    }
}

/// One prompt of the dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRequest {
    pub prompt: String,
    pub prompt_len: usize,
    pub expected_output_len: usize,
    pub request_id: String,
}

#[derive(Clone, Debug)]
pub struct RandomParams {
    pub num_requests: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub prefix_len: usize,
    pub range_ratio: (f64, f64),
    pub seed: u32,
    pub request_id_prefix: String,
}

/// vLLM's `get_sampling_params`: the closed intervals of the input and
/// output lengths.
pub fn length_bounds(
    p: &RandomParams,
    num_special: usize,
) -> Result<((usize, usize), (usize, usize))> {
    let (ri, ro) = p.range_ratio;
    let real_input = p.input_len.saturating_sub(num_special) as f64;
    let input = (
        (real_input * (1.0 - ri)).floor() as usize,
        (real_input * (1.0 + ri)).ceil() as usize,
    );
    let out_len = p.output_len as f64;
    let output = (
        ((out_len * (1.0 - ro)).floor() as usize).max(1),
        ((out_len * (1.0 + ro)).ceil() as usize).max(1),
    );
    if p.prefix_len + input.0 < 1 {
        bail!(
            "--random-input-len is too small: with {num_special} special tokens and input \
             range ratio {ri}, the shortest prompt (prefix + sampled) would have {} tokens; \
             raise --random-input-len or --random-prefix-len, or lower --random-range-ratio",
            p.prefix_len + input.0
        );
    }
    Ok((input, output))
}

/// vLLM's `gen_prompt_decode_to_target_len`: decode, re-encode, and pad
/// (random ids) or cut until the text re-encodes to `target` tokens, at
/// most 10 retries. Returns the text and its tokens.
fn decode_to_target_len(
    tok: &BenchTokenizer,
    mut seq: Vec<u32>,
    target: usize,
    rng: &mut Generator,
) -> Result<(String, Vec<u32>)> {
    let mut tries_left = 10;
    loop {
        let prompt = tok.decode(&seq)?;
        seq = tok.encode(&prompt)?;
        if tries_left == 0 || seq.len() == target {
            return Ok((prompt, seq));
        }
        if seq.len() < target {
            let extra = rng.integers(0, tok.vocab_size() as i64, target - seq.len());
            seq.extend(extra.into_iter().map(|t| t as u32));
        } else {
            seq.truncate(target);
        }
        tries_left -= 1;
    }
}

/// The dataset: `num_requests` prompts, deterministic for a seed.
pub fn sample_random(tok: &BenchTokenizer, p: &RandomParams) -> Result<Vec<SampleRequest>> {
    let mut rng = Generator::new(u64::from(p.seed));
    let ((in_lo, in_hi), (out_lo, out_hi)) = length_bounds(p, tok.num_special_tokens_to_add)?;
    let n = p.num_requests;
    let input_lens = rng.integers(in_lo as i64, in_hi as i64 + 1, n);
    let output_lens = rng.integers(out_lo as i64, out_hi as i64 + 1, n);
    let offsets = rng.integers(0, tok.vocab_size() as i64, n);

    let allowed = tok.allowed_tokens();
    if allowed.is_empty() {
        bail!("--tokenizer: the vocabulary has no non-special token to build prompts from");
    }
    let prefix: Vec<u32> = if p.prefix_len == 0 {
        Vec::new()
    } else {
        let picks = rng.integers(0, allowed.len() as i64, p.prefix_len);
        let seq = picks.iter().map(|&i| allowed[i as usize]).collect();
        decode_to_target_len(tok, seq, p.prefix_len, &mut rng)?.1
    };

    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let len = input_lens[i] as usize;
        let start = offsets[i] as usize + i;
        let mut seq = prefix.clone();
        seq.extend((0..len).map(|k| allowed[(start + k) % allowed.len()]));
        // vLLM targets the nominal prefix length plus the sampled length,
        // even when the prefix itself re-encoded shorter or longer.
        let (prompt, ids) = decode_to_target_len(tok, seq, p.prefix_len + len, &mut rng)?;
        out.push(SampleRequest {
            prompt,
            prompt_len: ids.len(),
            expected_output_len: output_lens[i] as usize,
            request_id: format!("{}{i}", p.request_id_prefix),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: usize, input: usize, output: usize, ratio: f64, seed: u32) -> RandomParams {
        RandomParams {
            num_requests: n,
            input_len: input,
            output_len: output,
            prefix_len: 0,
            range_ratio: (ratio, ratio),
            seed,
            request_id_prefix: "r-".into(),
        }
    }

    fn tiny_qwen2() -> BenchTokenizer {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/data/tiny-qwen2");
        BenchTokenizer::from_dir(&dir).unwrap()
    }

    #[test]
    fn lengths_stay_within_the_range_ratio() {
        let tok = tiny_qwen2();
        assert_eq!(
            tok.vocab_size(),
            997,
            "transformers' vocab_size: no added tokens"
        );
        let p = params(64, 100, 40, 0.5, 3);
        let reqs = sample_random(&tok, &p).unwrap();
        assert_eq!(reqs.len(), 64);
        for r in &reqs {
            assert!(
                (20..=60).contains(&r.expected_output_len),
                "{}",
                r.expected_output_len
            );
            // The re-encoding loop can miss by a token or two on a
            // byte-level BPE; the sampled length itself is in [50, 150].
            assert!((45..=155).contains(&r.prompt_len), "{}", r.prompt_len);
            assert_eq!(tok.encode(&r.prompt).unwrap().len(), r.prompt_len);
        }
        assert_eq!(reqs[5].request_id, "r-5");
        let lens: std::collections::HashSet<_> =
            reqs.iter().map(|r| r.expected_output_len).collect();
        assert!(lens.len() > 5, "lengths vary: {lens:?}");
    }

    #[test]
    fn a_zero_ratio_gives_exact_lengths() {
        let tok = BenchTokenizer::builtin().unwrap();
        let reqs = sample_random(&tok, &params(8, 16, 8, 0.0, 0)).unwrap();
        for r in &reqs {
            assert_eq!(r.expected_output_len, 8);
            assert_eq!(r.prompt_len, 16);
            assert_eq!(tok.encode(&r.prompt).unwrap().len(), 16);
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let tok = tiny_qwen2();
        let mut p = params(16, 32, 16, 0.3, 7);
        p.prefix_len = 5;
        let a = sample_random(&tok, &p).unwrap();
        let b = sample_random(&tok, &p).unwrap();
        assert_eq!(a, b);
        p.seed = 8;
        let c = sample_random(&tok, &p).unwrap();
        assert_ne!(a, c);
        // The shared prefix opens every prompt.
        let first = tok.encode(&a[0].prompt).unwrap();
        let second = tok.encode(&a[1].prompt).unwrap();
        assert_eq!(first[..4], second[..4]);
    }

    #[test]
    fn prompts_equal_vllms() {
        // Printed by vLLM 0.33.0's RandomDataset with the same tokenizer.
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("testdata/vllm_random_dataset.json")).unwrap();
        let tok = tiny_qwen2();
        for case in fixture["cases"].as_array().unwrap() {
            let n = |k: &str| case[k].as_u64().unwrap() as usize;
            let p = RandomParams {
                num_requests: n("num_requests"),
                input_len: n("input_len"),
                output_len: n("output_len"),
                prefix_len: n("prefix_len"),
                range_ratio: (
                    case["range_ratio"].as_f64().unwrap(),
                    case["range_ratio"].as_f64().unwrap(),
                ),
                seed: n("seed") as u32,
                request_id_prefix: "r-".into(),
            };
            let got = sample_random(&tok, &p).unwrap();
            let want = case["requests"].as_array().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.prompt, w[0].as_str().unwrap(), "seed {}", p.seed);
                assert_eq!(g.prompt_len, w[1].as_u64().unwrap() as usize);
                assert_eq!(g.expected_output_len, w[2].as_u64().unwrap() as usize);
            }
        }
    }

    #[test]
    fn added_tokens_at_the_end_are_not_the_base_vocabulary() {
        // Qwen2's layout: normal tokens, then control / user-defined ones.
        assert_eq!(base_vocab_size(6, Some(&[1, 1, 1, 1, 3, 4])), 4);
        // SmolLM2's: control tokens first, normal ones after.
        assert_eq!(base_vocab_size(5, Some(&[3, 3, 1, 1, 1])), 5);
        assert_eq!(base_vocab_size(5, None), 5);
    }

    #[test]
    fn bounds_follow_vllm() {
        let p = params(1, 10, 4, 0.5, 0);
        assert_eq!(length_bounds(&p, 1).unwrap(), ((4, 14), (2, 6)));
        let p = params(1, 10, 0, 0.0, 0);
        assert_eq!(length_bounds(&p, 0).unwrap().1, (1, 1), "output at least 1");
        let p = params(1, 1, 4, 0.0, 0);
        assert!(format!("{:#}", length_bounds(&p, 1).unwrap_err()).contains("--random-input-len"));
    }
}
