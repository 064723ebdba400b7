//! Tokenizers from a GGUF file's `tokenizer.*` metadata.
//!
//! A GGUF carries no `tokenizer.json`: it stores the vocabulary, merges,
//! scores, token types and special ids under llama.cpp's key names. This
//! module rebuilds from them the `tokenizers` pipeline that the model's own
//! Hugging Face `tokenizer.json` describes, so that a model tokenizes the same
//! from its GGUF file as from its Hugging Face directory:
//!
//! - `tokenizer.ggml.model = gpt2`: byte-level BPE from `tokens` + `merges`,
//!   split first by the pre-tokenizer that `tokenizer.ggml.pre` names (the
//!   table behind [`supported_pre_tokenizers`]; the names are llama.cpp's, see
//!   `llama-vocab.cpp`);
//! - `tokenizer.ggml.model = llama`: SentencePiece-style BPE with byte
//!   fallback (`<0xNN>` tokens), the `▁` space marker and the dummy prefix,
//!   its merges recovered from the scores as `transformers` does;
//! - a `tokenizer.huggingface.json` in the file wins over both.
//!
//! Token types: control (3) and unknown (2) tokens become special added
//! tokens (matched whole in text, skipped by `decode(.., true)`),
//! user-defined (4) ones non-special added tokens (matched whole in text, as
//! llama.cpp and Hugging Face both do).
//!
//! Where llama.cpp and Hugging Face differ, this follows the model's Hugging
//! Face `tokenizer.json` (the reference the tests compare against):
//! - `qwen2` text is NFC-normalized first (Qwen2's `tokenizer.json` has an NFC
//!   normalizer; llama.cpp does not normalize);
//! - the split regexes are the Hugging Face originals (`(?i:'s|'t|...)`),
//!   not llama.cpp's `[sS]` rewrites (they differ only on exotic case folds
//!   such as `'ſ`);
//! - special tokens found in the text are always matched (llama.cpp only with
//!   `parse_special`).
//!
//! `transformers`' own GGUF loader (5.x) differs from both in three places,
//! and this module sides with the model's `tokenizer.json` and llama.cpp:
//! - it does not know `smollm` (nor `starcoder`, `refact`, ...) and splits
//!   with plain GPT-2 rules, where SmolLM2's `tokenizer.json` and llama.cpp
//!   first split every digit alone: the same ids for ASCII digits (the
//!   vocabulary has no multi-digit merges), different ones for numerals such
//!   as `١٢٣` or `½`;
//! - for `llama` (SentencePiece) vocabularies it prepends the dummy `▁` only
//!   at the very start of the text (Metaspace `prepend_scheme = first`),
//!   where Llama 2's `tokenizer.json` (a Prepend normalizer) and llama.cpp
//!   prepend it to every piece of text, after special tokens too
//!   (`<s>[INST]` → `<s>`, `▁[`, ...), and to text that already starts with a
//!   space (`" hi"` → `▁▁hi`);
//! - it ignores `tokenizer.ggml.add_space_prefix` and `add_bos_token` (it
//!   adds no BOS to a Llama 2 vocabulary).
//!
//! Decoding is the `tokenizers` decoder's, as for a `tokenizer.json`:
//! transformers' `clean_up_tokenization_spaces` and llama.cpp's
//! `clean_spaces` are not applied.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as JsonValue};
use std::collections::{HashMap, HashSet};
use tokenizers::models::bpe::BPE;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
};

/// A GGUF token type (`tokenizer.ggml.token_type`), as llama.cpp numbers them.
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The tokenizer metadata of a GGUF file, independent of any GGUF reader:
/// the model loader fills it from the file's keys (named on each field) and
/// hands it to [`crate::Tokenizer::from_gguf_vocab`]. Deserializable, so a
/// test can keep one as JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` or `llama` (others are refused).
    pub model: String,
    /// `tokenizer.ggml.pre` (`gpt2` vocabularies only; absent means
    /// `default`, as in llama.cpp).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (see [`token_type`]), one per token.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores`, one per token (`llama` vocabularies).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`: `"left right"` strings, best first.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn).
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message, Llama 3.1 tool calls).
    pub eom_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; absent: llama.cpp's default for the
    /// vocabulary (yes for `llama` and the Llama 3 pre-tokenizers).
    pub add_bos_token: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; absent: no.
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece's
    /// `add_dummy_prefix`); absent: yes for `llama`, unused for `gpt2`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.huggingface.json`: a whole `tokenizer.json`; when present
    /// it is the tokenizer, and the fields above give only the special ids
    /// and the chat template.
    pub huggingface_json: Option<String>,
}

/// How a `gpt2` vocabulary splits text before BPE.
#[derive(Clone, Copy, Debug)]
enum Split {
    /// GPT-2's own regex inside the ByteLevel pre-tokenizer
    /// (`ByteLevel { use_regex: true }`).
    Gpt2,
    /// Each digit alone, then GPT-2's regex (StarCoder's `tokenizer.json`).
    DigitsThenGpt2,
    /// These regexes in turn (each one splits the pieces of the one before,
    /// keeping what it does not match as pieces too, as llama.cpp's
    /// `unicode_regex_split` does), then the byte mapping.
    Regexes(&'static [&'static str]),
}

/// One `tokenizer.ggml.pre` value.
struct PreTokenizer {
    names: &'static [&'static str],
    /// NFC first (Qwen2's `tokenizer.json`).
    nfc: bool,
    split: Split,
    /// A pre-token that is itself in the vocabulary is one token, whatever
    /// the merges say (`ignore_merges` in Llama 3's `tokenizer.json`; llama.cpp
    /// sets it for the same names).
    ignore_merges: bool,
    /// llama.cpp's BOS default when the file has no `add_bos_token`.
    add_bos: bool,
}

/// GPT-2's split regex, as llama.cpp writes it for `default` (the final
/// `\s+` of Hugging Face's version makes no difference: text a regex does not
/// match stays a piece of its own either way).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` values this crate knows, each checked against
/// the Hugging Face tokenizer of a model that uses it (llama.cpp's
/// `models/ggml-vocab-*.gguf` with their `.inp`/`.out` pairs, which hold
/// Hugging Face's ids; `smollm` against SmolLM2's). Any other value is an
/// error naming it rather than a silently different tokenization.
const PRE_TOKENIZERS: &[PreTokenizer] = &[
    PreTokenizer {
        // llama.cpp's fallback for files converted without a known
        // pre-tokenizer; there is no Hugging Face counterpart to match.
        names: &["default"],
        nfc: false,
        split: Split::Regexes(&[
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2_REGEX,
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ]),
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        // llama.cpp spells it `gpt-2`; `gpt2` is accepted too.
        names: &["gpt-2", "gpt2"],
        nfc: false,
        split: Split::Gpt2,
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["llama3", "llama-v3", "llama-bpe"],
        nfc: false,
        split: Split::Regexes(&[LLAMA3_REGEX]),
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizer {
        names: &["qwen2"],
        nfc: true,
        split: Split::Regexes(&[QWEN2_REGEX]),
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        // Qwen3.5 dropped Qwen2's NFC normalizer (its reference ids keep
        // "e\u{301}" apart).
        names: &["qwen35"],
        nfc: false,
        split: Split::Regexes(&[QWEN35_REGEX]),
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["smollm", "starcoder", "refact"],
        nfc: false,
        split: Split::DigitsThenGpt2,
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["deepseek-coder"],
        nfc: false,
        split: Split::Regexes(&[
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ]),
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["falcon"],
        nfc: false,
        split: Split::Regexes(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"[0-9][0-9][0-9]"]),
        ignore_merges: false,
        add_bos: false,
    },
];

/// The `tokenizer.ggml.pre` values [`crate::Tokenizer::from_gguf_vocab`]
/// accepts for `gpt2` vocabularies.
pub fn supported_pre_tokenizers() -> Vec<&'static str> {
    PRE_TOKENIZERS
        .iter()
        .flat_map(|p| p.names.iter().copied())
        .collect()
}

fn find_pre(name: &str) -> Result<&'static PreTokenizer> {
    PRE_TOKENIZERS
        .iter()
        .find(|p| p.names.contains(&name))
        .ok_or_else(|| {
            anyhow!(
                "tokenizer.ggml.pre = {name:?} is not a pre-tokenizer sluice knows (known: {})",
                supported_pre_tokenizers().join(", ")
            )
        })
}

/// What [`build`] hands back to `Tokenizer`.
pub(crate) struct Built {
    pub hf: tokenizers::Tokenizer,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub eot_token_id: Option<u32>,
    pub eom_token_id: Option<u32>,
    pub special_ids: HashSet<u32>,
    pub warnings: Vec<String>,
}

/// The special ids of `vocab`, checked against its size: an EOS or BOS past
/// the vocabulary is an error (the model could not stop, or starts wrong);
/// the others are dropped with a warning, as llama.cpp does (files with a
/// padding id one past the vocabulary are common).
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
}

fn special_ids(vocab: &GgufVocab, n: usize, warnings: &mut Vec<String>) -> Result<SpecialIds> {
    let strict = |key: &str, id: Option<u32>| -> Result<Option<u32>> {
        match id {
            Some(id) if id as usize >= n => bail!(
                "tokenizer.ggml.{key} = {id} is past the vocabulary ({n} tokens in tokenizer.ggml.tokens)"
            ),
            other => Ok(other),
        }
    };
    let mut lenient = |key: &str, id: Option<u32>| match id {
        Some(id) if id as usize >= n => {
            warnings.push(format!(
                "tokenizer.ggml.{key} = {id} is past the vocabulary ({n} tokens); ignored"
            ));
            None
        }
        other => other,
    };
    Ok(SpecialIds {
        eot: lenient("eot_token_id", vocab.eot_token_id),
        eom: lenient("eom_token_id", vocab.eom_token_id),
        unk: lenient("unknown_token_id", vocab.unknown_token_id),
        pad: lenient("padding_token_id", vocab.padding_token_id),
        bos: strict("bos_token_id", vocab.bos_token_id)?,
        eos: strict("eos_token_id", vocab.eos_token_id)?,
    })
}

/// Builds the `tokenizers` pipeline and the special tokens of `vocab`.
pub(crate) fn build(vocab: &GgufVocab) -> Result<Built> {
    let n = vocab.tokens.len();
    if n == 0 {
        bail!("tokenizer.ggml.tokens is missing or empty");
    }
    if let Some(types) = &vocab.token_types {
        if types.len() != n {
            bail!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            );
        }
    }
    let mut warnings = Vec::new();
    let ids = special_ids(vocab, n, &mut warnings)?;
    // llama.cpp renames empty tokens so that every token has a distinct,
    // non-empty text (an empty added token would match everywhere).
    let tokens: Vec<String> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            }
        })
        .collect();
    let type_of = |id: usize| -> i32 {
        vocab
            .token_types
            .as_ref()
            .map_or(token_type::NORMAL, |t| t[id])
    };

    let mut hf = if let Some(json) = &vocab.huggingface_json {
        json.parse::<tokenizers::Tokenizer>()
            .map_err(|e| anyhow!("tokenizer.huggingface.json: {e}"))?
    } else {
        let hf = match vocab.model.as_str() {
            "gpt2" => byte_level_bpe(vocab, &tokens, &type_of)?,
            "llama" => sentencepiece_bpe(vocab, &tokens, &ids)?,
            "" => bail!("tokenizer.ggml.model is missing"),
            other => bail!(
                "tokenizer.ggml.model = {other:?} is not supported (sluice reads \"gpt2\" \
                 byte-level BPE and \"llama\" SentencePiece vocabularies)"
            ),
        };
        add_typed_tokens(hf, &tokens, &type_of, vocab.token_types.is_some(), &ids)
    };
    let text_of = |id: Option<u32>| id.map(|id| tokens[id as usize].clone());
    let special_ids: HashSet<u32> = hf
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .collect();
    // An embedded tokenizer.json brings its own post-processor.
    if vocab.huggingface_json.is_none() {
        hf.with_post_processor(post_processor(vocab, &tokens, &ids)?);
    }
    Ok(Built {
        hf,
        bos_token: text_of(ids.bos),
        eos_token: text_of(ids.eos),
        pad_token: text_of(ids.pad),
        unk_token: text_of(ids.unk),
        bos_token_id: ids.bos,
        eos_token_id: ids.eos,
        eot_token_id: ids.eot,
        eom_token_id: ids.eom,
        special_ids,
        warnings,
    })
}

/// GPT-2's byte ↦ printable character table (`bytes_to_unicode`): the
/// alphabet byte-level vocabularies are written in.
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every code is below 0x200, so always a valid char.
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

fn bpe_error(key: &str, e: tokenizers::Error) -> anyhow::Error {
    anyhow!("{key}: {e}")
}

fn byte_level_bpe(
    vocab: &GgufVocab,
    tokens: &[String],
    type_of: &dyn Fn(usize) -> i32,
) -> Result<tokenizers::Tokenizer> {
    let pre_name = vocab.pre.as_deref().unwrap_or("default");
    let pre = find_pre(pre_name)?;
    let Some(merges) = &vocab.merges else {
        bail!(
            "tokenizer.ggml.merges is missing: a \"gpt2\" (byte-level BPE) vocabulary needs its merges"
        );
    };
    let alphabet = byte_alphabet();
    let in_alphabet: HashSet<char> = alphabet.iter().copied().collect();
    let mut map = ahash::AHashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        // Ordinary tokens outside the byte alphabet (files that stored them
        // as plain text) are respelled in it, as transformers' GGUF loader
        // does; added tokens stay as written, which is how they are matched.
        // Without token types nothing is known to be ordinary.
        let respell = vocab.token_types.is_some()
            && type_of(i) == token_type::NORMAL
            && !t.chars().all(|c| in_alphabet.contains(&c));
        let key = if respell {
            t.bytes().map(|b| alphabet[b as usize]).collect()
        } else {
            t.clone()
        };
        map.insert(key, i as u32);
    }
    let merges = parse_merges(merges)?;
    let bpe = BPE::builder()
        .vocab_and_merges(map, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| bpe_error("tokenizer.ggml.merges", e))?;
    let mut hf = tokenizers::Tokenizer::new(bpe);
    if pre.nfc {
        hf.with_normalizer(Some(wrapper::<NormalizerWrapper>(json!({"type": "NFC"}))?));
    }
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": use_regex});
    let pretokenizers: Vec<JsonValue> = match pre.split {
        Split::Gpt2 => vec![byte_level(true)],
        Split::DigitsThenGpt2 => vec![
            json!({"type": "Digits", "individual_digits": true}),
            byte_level(true),
        ],
        Split::Regexes(regexes) => regexes
            .iter()
            .map(|r| {
                json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false})
            })
            .chain([byte_level(false)])
            .collect(),
    };
    let pre_tokenizer: PreTokenizerWrapper =
        wrapper(json!({"type": "Sequence", "pretokenizers": pretokenizers}))
            .with_context(|| format!("tokenizer.ggml.pre = {pre_name:?}"))?;
    hf.with_pre_tokenizer(Some(pre_tokenizer));
    hf.with_decoder(Some(wrapper::<DecoderWrapper>(byte_level(true))?));
    Ok(hf)
}

fn sentencepiece_bpe(
    vocab: &GgufVocab,
    tokens: &[String],
    ids: &SpecialIds,
) -> Result<tokenizers::Tokenizer> {
    let mut map = ahash::AHashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        map.insert(t.clone(), i as u32);
    }
    let merges = match (&vocab.merges, &vocab.scores) {
        // A file converted from a tokenizer.json may carry its merges.
        (Some(m), _) => parse_merges(m)?,
        (None, Some(scores)) => {
            if scores.len() != tokens.len() {
                bail!(
                    "tokenizer.ggml.scores has {} entries for {} tokens",
                    scores.len(),
                    tokens.len()
                );
            }
            merges_from_scores(tokens, scores)
        }
        (None, None) => bail!(
            "tokenizer.ggml.scores is missing: a \"llama\" (SentencePiece) vocabulary without \
             tokenizer.ggml.merges needs its scores"
        ),
    };
    let mut builder = BPE::builder()
        .vocab_and_merges(map, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = ids.unk {
        builder = builder.unk_token(tokens[unk as usize].clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| bpe_error("tokenizer.ggml.merges (from the scores)", e))?;
    let mut hf = tokenizers::Tokenizer::new(bpe);
    let dummy_prefix = vocab.add_space_prefix.unwrap_or(true);
    // Llama 2's tokenizer.json: the prefix is a normalizer, so every piece
    // of text between special tokens gets one, as in llama.cpp.
    let mut normalizers = Vec::new();
    if dummy_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    hf.with_normalizer(Some(wrapper::<NormalizerWrapper>(
        json!({"type": "Sequence", "normalizers": normalizers}),
    )?));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if dummy_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    hf.with_decoder(Some(wrapper::<DecoderWrapper>(
        json!({"type": "Sequence", "decoders": decoders}),
    )?));
    Ok(hf)
}

/// `"left right"` → `(left, right)`, split at the first space after the
/// first character as llama.cpp does (a byte-level token never holds a
/// space; a SentencePiece one may start with `▁`, never with a space).
fn parse_merges(merges: &[String]) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let first = m.chars().next().map_or(0, char::len_utf8);
            match m[first..].find(' ') {
                Some(pos) => Ok((
                    m[..first + pos].to_string(),
                    m[first + pos + 1..].to_string(),
                )),
                None => bail!("tokenizer.ggml.merges[{i}] = {m:?} is not \"left right\""),
            }
        })
        .collect()
}

/// The merges a SentencePiece vocabulary implies, exactly as transformers'
/// `generate_merges(vocab, vocab_scores)`: every split of every token into
/// two tokens of the vocabulary, ranked by the whole token's score (best
/// first), then by the lengths of the halves (longer left first), ties kept
/// in vocabulary order. llama.cpp merges by score at run time instead, which
/// gives the same tokens.
fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    // transformers' dicts: `vocab` keeps the last id of a repeated token,
    // `vocab_scores` its first position with the last score.
    let mut id_of: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        id_of.insert(t.as_str(), i);
    }
    let mut order: Vec<(&str, f32)> = Vec::with_capacity(tokens.len());
    let mut position: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (t, &s) in tokens.iter().zip(scores) {
        match position.get(t.as_str()) {
            Some(&p) => order[p].1 = s,
            None => {
                position.insert(t.as_str(), order.len());
                order.push((t.as_str(), s));
            }
        }
    }
    // (left, right, score, chars of left, chars of right)
    let mut merges: Vec<(&str, &str, f32, usize, usize)> = Vec::new();
    for (token, score) in order {
        let start = merges.len();
        for (at, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(at);
            if id_of.contains_key(l) && id_of.contains_key(r) {
                merges.push((l, r, score, l.chars().count(), r.chars().count()));
            }
        }
        merges[start..].sort_by_key(|m| (id_of[m.0], id_of[m.1]));
    }
    // Python's `sorted(.., reverse=True)` is stable: equal keys keep their
    // order, which a stable sort on the reversed comparison also does.
    // A total order (a NaN score in a hostile file must not make the sort
    // panic), with -0.0 equal to 0.0 as in Python.
    let key = |s: f32| if s == 0.0 { 0.0 } else { s };
    merges.sort_by(|a, b| {
        key(b.2)
            .total_cmp(&key(a.2))
            .then(b.3.cmp(&a.3))
            .then(b.4.cmp(&a.4))
    });
    merges
        .into_iter()
        .map(|(l, r, ..)| (l.to_string(), r.to_string()))
        .collect()
}

/// Control and unknown tokens as special added tokens, user-defined ones as
/// plain added tokens; without token types, the special ids' tokens are
/// special.
fn add_typed_tokens(
    mut hf: tokenizers::Tokenizer,
    tokens: &[String],
    type_of: &dyn Fn(usize) -> i32,
    typed: bool,
    ids: &SpecialIds,
) -> tokenizers::Tokenizer {
    let mut special = Vec::new();
    let mut user = Vec::new();
    if typed {
        for (i, t) in tokens.iter().enumerate() {
            match type_of(i) {
                token_type::CONTROL | token_type::UNKNOWN => {
                    special.push(AddedToken::from(t.clone(), true).normalized(false))
                }
                token_type::USER_DEFINED => {
                    user.push(AddedToken::from(t.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
    } else {
        let mut seen = HashSet::new();
        for id in [ids.bos, ids.eos, ids.eot, ids.eom, ids.unk]
            .into_iter()
            .flatten()
        {
            if seen.insert(id) {
                special.push(AddedToken::from(tokens[id as usize].clone(), true).normalized(false));
            }
        }
    }
    // The tokens are in the model's vocabulary, so they keep their ids.
    hf.add_special_tokens(&special);
    hf.add_tokens(&user);
    hf
}

/// BOS / EOS added by `encode(.., add_special_tokens = true)`.
fn post_processor(
    vocab: &GgufVocab,
    tokens: &[String],
    ids: &SpecialIds,
) -> Result<Option<PostProcessorWrapper>> {
    let default_bos = match vocab.model.as_str() {
        "llama" => true,
        _ => vocab
            .pre
            .as_deref()
            .and_then(|p| find_pre(p).ok())
            .is_some_and(|p| p.add_bos),
    };
    let bos = ids
        .bos
        .filter(|_| vocab.add_bos_token.unwrap_or(default_bos));
    let eos = ids.eos.filter(|_| vocab.add_eos_token.unwrap_or(false));
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    // Keyed by role, not by the token's text, so that any text works.
    let mut single = Vec::new();
    let mut special_tokens = serde_json::Map::new();
    let mut add = |key: &str, id: u32, single: &mut Vec<JsonValue>| {
        single.push(json!({"SpecialToken": {"id": key, "type_id": 0}}));
        special_tokens.insert(
            key.to_string(),
            json!({"id": key, "ids": [id], "tokens": [tokens[id as usize]]}),
        );
    };
    if let Some(id) = bos {
        add("bos", id, &mut single);
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some(id) = eos {
        add("eos", id, &mut single);
    }
    let mut pair = single.clone();
    pair.extend(single.iter().map(|p| {
        let mut p = p.clone();
        if let Some(seq) = p.get_mut("Sequence") {
            seq["id"] = json!("B");
        }
        p
    }));
    Ok(Some(wrapper(json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": special_tokens,
    }))?))
}

/// A `tokenizers` component from its `tokenizer.json` form.
fn wrapper<T: serde::de::DeserializeOwned>(value: JsonValue) -> Result<T> {
    serde_json::from_value(value).map_err(|e| anyhow!("building the tokenizer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let a = byte_alphabet();
        assert_eq!(a[b'A' as usize], 'A');
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[0], 'Ā');
        assert_eq!(a[0xAD], 'Ń');
        assert_eq!(a.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn merges_split_at_the_first_inner_space() {
        let m = parse_merges(&["Ġ t".into(), "▁ ▁".into()]).unwrap();
        assert_eq!(m, vec![("Ġ".into(), "t".into()), ("▁".into(), "▁".into())]);
        let err = parse_merges(&["ab".into()]).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.merges[0]"),
            "{err}"
        );
    }

    #[test]
    fn merges_from_scores_rank_like_transformers() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -0.5, -2.0];
        let m = merges_from_scores(&tokens, &scores);
        let m: Vec<(&str, &str)> = m.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        // bc (-0.5) before ab (-1); abc's splits "ab c" (longer left) then "a bc".
        assert_eq!(m, vec![("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
    }

    #[test]
    fn every_pre_tokenizer_compiles() {
        for name in supported_pre_tokenizers() {
            let vocab = GgufVocab {
                model: "gpt2".into(),
                pre: Some(name.into()),
                tokens: vec!["a".into()],
                merges: Some(vec![]),
                ..Default::default()
            };
            build(&vocab).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
    }
}
