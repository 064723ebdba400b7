//! Text ↔ token ids, and chat templates.
//!
//! Owns one tokenizer: a Hugging Face `tokenizer.json` (through the
//! `tokenizers` crate, 0.22.x) with the special tokens and chat template of
//! its `tokenizer_config.json`; the vocabulary of a GGUF file
//! ([`GgufVocab`], rebuilt as the model's `tokenizer.json` would be, see
//! [`gguf`]); or the built-in byte-level tokenizer of the built-in models
//! (ids 0..=255 are the 256 bytes, then `<|endoftext|>`, `<|im_start|>`,
//! `<|im_end|>`).
//!
//! Its own crate so that the engine (and a simulator) can tokenize without
//! depending on the CPU model runner; `sluice_model::tokenizer` re-exports it.
//!
//! Promises:
//! - `encode` matches `transformers`' `tokenizer(text, add_special_tokens=..)`
//!   (special tokens written in the text are matched, as HF does);
//! - `decode` never fails on an id it does not know (it decodes to nothing),
//!   and bytes that are not valid UTF-8 decode to U+FFFD, which is what the
//!   engine's incremental detokenizer relies on to hold back split characters;
//! - `apply_chat_template` renders the model's Jinja template the way
//!   `transformers`' `apply_chat_template(tokenize=False)` does (trim_blocks,
//!   lstrip_blocks, `raise_exception`, `tojson` with Python's separators,
//!   Python string methods); the rendered prompt already holds any BOS, so it
//!   is encoded with `add_special_tokens = false` (`encode_chat` does both).

use anyhow::{bail, Context, Result};
use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value as JsonValue;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;

mod builtin;
mod bytes;
mod chat;
mod config;
pub mod gguf;
#[cfg(test)]
mod tests;

use builtin::*;
use bytes::*;
use chat::*;
pub use chat::{ChatMessage, ChatTemplateError, FALLBACK_CHAT_TEMPLATE};
use config::*;
pub use gguf::{supported_pre_tokenizers, GgufVocab};

enum Backend {
    Hf(Box<tokenizers::Tokenizer>),
    /// Byte-level: id = byte, then `BUILTIN_SPECIALS`.
    Bytes,
}

/// A model's tokenizer: encoding, decoding, special tokens, chat template.
/// `Send + Sync`: one instance is shared by the server and the engine thread.
pub struct Tokenizer {
    backend: Backend,
    /// Where it came from, for `Debug`.
    source: &'static str,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
    /// GGUF's end-of-turn / end-of-message ids (other stop tokens).
    eot_token_id: Option<u32>,
    eom_token_id: Option<u32>,
    /// Whether `encode(.., true)` starts with the BOS.
    add_bos_token: bool,
    special_ids: HashSet<u32>,
    /// What loading ignored (e.g. a GGUF special id past the vocabulary).
    warnings: Vec<String>,
    /// Every added token's id (special or not): their bytes are their text.
    added_ids: HashSet<u32>,
    /// How a vocabulary string maps to the bytes it stands for (`token_bytes`).
    pieces: PieceBytes,
    /// The model's template; `None` when it has none (the fallback renders).
    chat_template: Option<String>,
    env: Environment<'static>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a Hugging Face model directory, with the
    /// special tokens and chat template of `tokenizer_config.json` (falling
    /// back to `special_tokens_map.json`, `chat_template.jinja`,
    /// `chat_template.json`). A `null` BOS or EOS is legal.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.exists() {
            bail!(
                "{}: missing (sluice needs a Hugging Face fast tokenizer file)",
                tok_path.display()
            );
        }
        let hf = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", tok_path.display()))?;

        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?.unwrap_or(JsonValue::Null);
        let map = read_json(&dir.join("special_tokens_map.json"))?.unwrap_or(JsonValue::Null);
        let pick = |key: &str| {
            // A key present in tokenizer_config (even as null) wins: `null`
            // means the model has no such token.
            if config.get(key).is_some() {
                special_token(&config, key)
            } else {
                special_token(&map, key)
            }
        };
        let (bos_token, eos_token) = (pick("bos_token"), pick("eos_token"));
        let (pad_token, unk_token) = (pick("pad_token"), pick("unk_token"));

        let mut chat_template = config_chat_template(&config, &config_path)?;
        if chat_template.is_none() {
            let jinja = dir.join("chat_template.jinja");
            if jinja.exists() {
                chat_template = Some(
                    std::fs::read_to_string(&jinja)
                        .with_context(|| format!("reading {}", jinja.display()))?,
                );
            } else if let Some(v) = read_json(&dir.join("chat_template.json"))? {
                chat_template = config_chat_template(&v, &dir.join("chat_template.json"))?;
            }
        }

        let special_ids = hf
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let id_of = |t: &Option<String>| t.as_deref().and_then(|t| hf.token_to_id(t));
        let (bos_token_id, eos_token_id) = (id_of(&bos_token), id_of(&eos_token));
        if eos_token.is_some() && eos_token_id.is_none() {
            bail!(
                "{}: eos_token {:?} is not in the vocabulary of tokenizer.json",
                config_path.display(),
                eos_token.as_deref().unwrap_or_default()
            );
        }
        Self::assemble(
            Backend::Hf(Box::new(hf)),
            [bos_token, eos_token, pad_token, unk_token],
            [bos_token_id, eos_token_id],
            special_ids,
            chat_template,
        )
    }

    /// The tokenizer of a GGUF file, from its metadata (see [`gguf`] for
    /// what is supported and how it matches Hugging Face). Errors name the
    /// GGUF key at fault: an unsupported `tokenizer.ggml.model`, an unknown
    /// `tokenizer.ggml.pre`, missing merges or scores, a BOS / EOS id past
    /// the vocabulary, a chat template that does not compile.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self> {
        let b = gguf::build(vocab)?;
        let mut tok = Self::assemble(
            Backend::Hf(Box::new(b.hf)),
            [b.bos_token, b.eos_token, b.pad_token, b.unk_token],
            [b.bos_token_id, b.eos_token_id],
            b.special_ids,
            vocab.chat_template.clone(),
        )
        .context("tokenizer.chat_template")?;
        tok.source = if vocab.huggingface_json.is_some() {
            "GGUF tokenizer.huggingface.json"
        } else {
            "GGUF vocabulary"
        };
        tok.eot_token_id = b.eot_token_id;
        tok.eom_token_id = b.eom_token_id;
        tok.warnings = b.warnings;
        Ok(tok)
    }

    /// The built-in byte-level tokenizer: ids 0..=255 are the bytes, 256
    /// `<|endoftext|>`, 257 `<|im_start|>`, 258 `<|im_end|>` (the EOS), with
    /// a ChatML chat template.
    pub fn builtin() -> Self {
        let specials = (0..BUILTIN_SPECIALS.len() as u32)
            .map(|i| BUILTIN_FIRST_SPECIAL + i)
            .collect();
        let eos = "<|im_end|>".to_string();
        Self::assemble(
            Backend::Bytes,
            [None, Some(eos), Some("<|endoftext|>".to_string()), None],
            [None, Some(BUILTIN_FIRST_SPECIAL + 2)],
            specials,
            Some(CHATML_TEMPLATE.to_string()),
        )
        .expect("the built-in chat template compiles")
    }

    fn assemble(
        backend: Backend,
        [bos_token, eos_token, pad_token, unk_token]: [Option<String>; 4],
        [bos_token_id, eos_token_id]: [Option<u32>; 2],
        special_ids: HashSet<u32>,
        chat_template: Option<String>,
    ) -> Result<Self> {
        let env = template_env(
            chat_template
                .clone()
                .unwrap_or_else(|| FALLBACK_CHAT_TEMPLATE.to_string()),
        )
        .map_err(|e| anyhow::anyhow!("chat_template does not compile: {e:#}"))?;
        let (added_ids, pieces) = match &backend {
            Backend::Hf(t) => (
                t.get_added_tokens_decoder().into_keys().collect(),
                t.get_decoder().map_or_else(PieceBytes::raw, PieceBytes::of),
            ),
            Backend::Bytes => (HashSet::new(), PieceBytes::raw()),
        };
        let mut tok = Tokenizer {
            backend,
            source: "tokenizer.json",
            bos_token,
            eos_token,
            pad_token,
            unk_token,
            bos_token_id,
            eos_token_id,
            eot_token_id: None,
            eom_token_id: None,
            add_bos_token: false,
            special_ids,
            warnings: Vec::new(),
            added_ids,
            pieces,
            chat_template,
            env,
        };
        if matches!(tok.backend, Backend::Bytes) {
            tok.source = "builtin byte-level";
        }
        // Asked of the post-processor itself rather than of a config flag,
        // so it is right for every source.
        tok.add_bos_token =
            bos_token_id.is_some() && tok.encode("", true)?.first().copied() == bos_token_id;
        Ok(tok)
    }

    /// Token ids of `text`. With `add_special_tokens`, the tokenizer's
    /// post-processor adds what the model expects (e.g. Llama's BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Hf(t) => {
                let enc = t
                    .encode(text, add_special_tokens)
                    .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
                Ok(enc.get_ids().to_vec())
            }
            Backend::Bytes => Ok(builtin_encode(text)),
        }
    }

    /// Text of `ids`. Unknown ids decode to nothing; invalid UTF-8 to U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        match &self.backend {
            Backend::Hf(t) => t
                .decode(ids, skip_special_tokens)
                .map_err(|e| anyhow::anyhow!("decoding: {e}")),
            Backend::Bytes => {
                let mut bytes = Vec::with_capacity(ids.len());
                for &id in ids {
                    if let Ok(b) = u8::try_from(id) {
                        bytes.push(b);
                    } else if !skip_special_tokens {
                        if let Some(s) = builtin_special(id) {
                            bytes.extend_from_slice(s.as_bytes());
                        }
                    }
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    /// Vocabulary size including added tokens (the model's embedding may be
    /// larger: padded rows decode to nothing).
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Hf(t) => t.get_vocab_size(true),
            Backend::Bytes => BUILTIN_FIRST_SPECIAL as usize + BUILTIN_SPECIALS.len(),
        }
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::Hf(t) => t.token_to_id(token),
            Backend::Bytes => BUILTIN_SPECIALS
                .iter()
                .position(|s| *s == token)
                .map(|i| BUILTIN_FIRST_SPECIAL + i as u32)
                .or_else(|| match token.as_bytes() {
                    [b] => Some(u32::from(*b)),
                    _ => None,
                }),
        }
    }

    /// The token's vocabulary string (byte-level tokens in their mapped form
    /// for HF tokenizers), `None` for unknown ids.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::Hf(t) => t.id_to_token(id),
            Backend::Bytes => match u8::try_from(id) {
                Ok(b) => Some(String::from_utf8_lossy(&[b]).into_owned()),
                Err(_) => builtin_special(id).map(str::to_string),
            },
        }
    }

    /// The raw bytes token `id` contributes to the text, `None` for ids the
    /// vocabulary does not have. The constraint engine (`sluice-structured`)
    /// builds its token trie from these, so the bytes of the tokens of
    /// `encode(text, false)` concatenate to `text` (after the tokenizer's
    /// normalizer, e.g. NFC) for the vocabularies sluice loads.
    ///
    /// - Added tokens (special or not): their content as UTF-8; special ones
    ///   are flagged by `is_special`, and callers decide how to mark them.
    /// - Byte-level BPE (the `tokenizers` decoder is, or contains, `ByteLevel`:
    ///   GPT-2, Qwen, Llama 3, SmolLM2): each char of the vocabulary string
    ///   through the inverse GPT-2 byte ↔ char table; a string with a char
    ///   outside the table stands for its own UTF-8, as the decoder does.
    /// - SentencePiece style (`Metaspace`, or a `Sequence` of `Replace`s and
    ///   `ByteFallback`, as Llama 2 / GGUF `llama` vocabularies have): each
    ///   `Replace` with a plain-string pattern applied in order (`▁` → space),
    ///   and with `ByteFallback` an exact `<0xNN>` piece is that one byte.
    ///   The `Strip` of the dummy prefix space is not applied: it depends on
    ///   the token's position, and the constraint engine sees the space.
    /// - Any other decoder (WordPiece, CTC, none): the string's UTF-8.
    /// - The built-in tokenizer: the byte itself; specials their text.
    ///
    /// The decoder was chosen over a guess from the vocabulary's strings
    /// because it is what `decode` applies, so the two agree by construction.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match &self.backend {
            Backend::Hf(t) => {
                let piece = t.id_to_token(id)?;
                if self.added_ids.contains(&id) {
                    return Some(piece.into_bytes());
                }
                Some(self.pieces.bytes(piece))
            }
            Backend::Bytes => match u8::try_from(id) {
                Ok(b) => Some(vec![b]),
                Err(_) => builtin_special(id).map(|s| s.as_bytes().to_vec()),
            },
        }
    }

    /// Whether `id` is a special (control) token, skipped by
    /// `decode(.., skip_special_tokens = true)`.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }
    /// The tokenizer's EOS (the engine's primary EOS; a generation config
    /// may add more).
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// GGUF's `tokenizer.ggml.eot_token_id` (end of turn: a stop token besides
    /// the EOS, e.g. `<|eot_id|>`); `None` elsewhere.
    pub fn eot_token_id(&self) -> Option<u32> {
        self.eot_token_id
    }
    /// GGUF's `tokenizer.ggml.eom_token_id` (end of message); `None`
    /// elsewhere.
    pub fn eom_token_id(&self) -> Option<u32> {
        self.eom_token_id
    }
    /// The EOS, EOT and EOM ids the tokenizer knows, without repeats: the
    /// tokens that end a generation unless the request says otherwise.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        let mut ids = Vec::new();
        for id in [self.eos_token_id, self.eot_token_id, self.eom_token_id]
            .into_iter()
            .flatten()
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }
    /// Whether `encode(.., add_special_tokens = true)` starts with the BOS.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos_token
    }
    /// What loading ignored rather than refused (for the log), e.g. a GGUF
    /// padding id past the vocabulary.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}
