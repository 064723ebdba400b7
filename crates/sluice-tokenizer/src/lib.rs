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

pub mod gguf;
pub use gguf::{supported_pre_tokenizers, GgufVocab};

/// Name of the template inside the tokenizer's Jinja environment.
const TEMPLATE_NAME: &str = "chat";

/// The built-in tokenizer's special tokens, in id order from 256.
const BUILTIN_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// First id after the 256 byte tokens.
const BUILTIN_FIRST_SPECIAL: u32 = 256;

/// ChatML, the format the built-in model's special tokens were named after.
const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// For models without a chat template: `role: content` lines, the BOS first
/// when the model has one (the rendered prompt is encoded without special
/// tokens, so nobody else adds it).
pub const FALLBACK_CHAT_TEMPLATE: &str = "{{- bos_token if bos_token else '' -}}\
{%- for message in messages -%}\
{{- message['role'] + ': ' + message['content'] + '\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}";

/// One chat message in the OpenAI / Hugging Face shape. Templates see any
/// serializable message; this is the common case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat template that failed to render: a syntax error in the model's
/// template, or the template's own `raise_exception(...)` refusing the
/// messages (e.g. roles that do not alternate). The message is meant for the
/// client: the server answers 400 with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplateError {
    pub message: String,
}

impl fmt::Display for ChatTemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chat template: {}", self.message)
    }
}

impl std::error::Error for ChatTemplateError {}

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

/// A special token in `tokenizer_config.json`: `null`, a string, or an
/// `AddedToken` object (`{"content": "...", ...}`).
fn special_token(config: &JsonValue, key: &str) -> Option<String> {
    match config.get(key)? {
        JsonValue::String(s) => Some(s.clone()),
        JsonValue::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Result<Option<JsonValue>> {
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", path.display()))?;
    Ok(Some(value))
}

/// The chat template of `tokenizer_config.json`: a string, or a list of
/// `{name, template}` (the one named `default` is the chat template).
fn config_chat_template(config: &JsonValue, path: &Path) -> Result<Option<String>> {
    match config.get("chat_template") {
        None | Some(JsonValue::Null) => Ok(None),
        Some(JsonValue::String(s)) => Ok(Some(s.clone())),
        Some(JsonValue::Array(items)) => {
            let named = |name: &str| {
                items.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == name)
                        .then(|| t.get("template")?.as_str().map(str::to_string))
                        .flatten()
                })
            };
            match named("default") {
                Some(t) => Ok(Some(t)),
                None => bail!(
                    "{}: chat_template is a list without a template named \"default\"",
                    path.display()
                ),
            }
        }
        Some(_) => bail!(
            "{}: chat_template must be a string or a list of {{name, template}}",
            path.display()
        ),
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

    /// The model's own chat template, `None` when it has none (then
    /// `apply_chat_template` uses `FALLBACK_CHAT_TEMPLATE`).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders `messages` (anything serializable to a list of message
    /// objects, usually `ChatMessage`s or OpenAI JSON messages) with the chat
    /// template. `bos_token`, `eos_token`, `pad_token`, `unk_token`,
    /// `messages` and `add_generation_prompt` are in scope.
    pub fn apply_chat_template<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }

    /// `apply_chat_template` with the `tools` variable: the request's tools
    /// as a list of `{"type": "function", "function": {...}}` objects, or
    /// `None`, which the template sees as `none` (transformers passes
    /// `tools=None`; templates test `tools is not none`, which an undefined
    /// variable would pass).
    pub fn apply_chat_template_with_tools<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&JsonValue>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError {
                message: e.to_string(),
            })?;
        let ctx = minijinja::context! {
            messages => JinjaValue::from_serialize(messages),
            tools => JinjaValue::from_serialize(tools),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref().unwrap_or(""),
            eos_token => self.eos_token.as_deref().unwrap_or(""),
            pad_token => self.pad_token.as_deref().unwrap_or(""),
            unk_token => self.unk_token.as_deref().unwrap_or(""),
        };
        template.render(ctx).map_err(|e| ChatTemplateError {
            message: render_error_message(&e),
        })
    }

    /// `apply_chat_template`, then `encode(.., add_special_tokens = false)`:
    /// the template already wrote any BOS.
    pub fn encode_chat<M: Serialize>(
        &self,
        messages: &[M],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, add_generation_prompt)?;
        self.encode(&text, false)
    }
}

/// How `token_bytes` turns a vocabulary string into bytes, read once from
/// the `tokenizers` decoder.
#[derive(Clone, Debug, PartialEq)]
enum PieceBytes {
    /// GPT-2's byte ↔ char table.
    ByteLevel,
    /// Plain text after `replaces` (pattern, content) in order; with
    /// `byte_fallback`, `<0xNN>` is one byte.
    Text {
        replaces: Vec<(String, String)>,
        byte_fallback: bool,
    },
}

impl PieceBytes {
    fn raw() -> Self {
        PieceBytes::Text {
            replaces: Vec::new(),
            byte_fallback: false,
        }
    }

    fn of(decoder: &tokenizers::DecoderWrapper) -> Self {
        let mut out = Self::raw();
        out.add(decoder);
        out
    }

    fn add(&mut self, decoder: &tokenizers::DecoderWrapper) {
        use tokenizers::DecoderWrapper as D;
        // Byte-level wins over anything else in a sequence: its table
        // already accounts for every byte.
        let PieceBytes::Text {
            replaces,
            byte_fallback,
        } = self
        else {
            return;
        };
        match decoder {
            D::ByteLevel(_) => *self = PieceBytes::ByteLevel,
            D::Metaspace(m) => replaces.push((m.get_replacement().to_string(), " ".to_string())),
            D::ByteFallback(_) => *byte_fallback = true,
            D::Replace(r) => {
                // The pattern is private; its serialized form is
                // `{"pattern": {"String": ..} | {"Regex": ..}, "content": ..}`.
                // Regex patterns are not applied (no vocabulary sluice
                // loads uses one).
                if let Ok(v) = serde_json::to_value(r) {
                    if let Some(pat) = v["pattern"]["String"].as_str() {
                        if !pat.is_empty() {
                            replaces.push((pat.to_string(), r.content.clone()));
                        }
                    }
                }
            }
            D::Sequence(seq) => {
                for d in seq.get_decoders() {
                    self.add(d);
                }
            }
            D::BPE(_) | D::WordPiece(_) | D::CTC(_) | D::Fuse(_) | D::Strip(_) => {}
        }
    }

    fn bytes(&self, piece: String) -> Vec<u8> {
        match self {
            PieceBytes::ByteLevel => {
                let mut out = Vec::with_capacity(piece.len());
                for c in piece.chars() {
                    match gpt2_char_byte(c) {
                        Some(b) => out.push(b),
                        // As the ByteLevel decoder: a string with a char
                        // outside the table stands for its own UTF-8.
                        None => return piece.into_bytes(),
                    }
                }
                out
            }
            PieceBytes::Text {
                replaces,
                byte_fallback,
            } => {
                if *byte_fallback {
                    if let Some(b) = byte_fallback_piece(&piece) {
                        return vec![b];
                    }
                }
                let mut text = piece;
                for (pat, content) in replaces {
                    if text.contains(pat.as_str()) {
                        text = text.replace(pat.as_str(), content);
                    }
                }
                text.into_bytes()
            }
        }
    }
}

/// Whether GPT-2's byte-level table maps byte `b` to itself.
fn gpt2_printable(b: u32) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte GPT-2's byte-level table maps to `c`: printable bytes are
/// their own char, the other 68 bytes are U+0100.. in byte order.
fn gpt2_char_byte(c: char) -> Option<u8> {
    static SHIFTED: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let code = u32::from(c);
    if code < 256 {
        return gpt2_printable(code).then_some(code as u8);
    }
    let shifted =
        SHIFTED.get_or_init(|| (0..=255u8).filter(|&b| !gpt2_printable(b.into())).collect());
    let i = usize::try_from(code - 256).ok()?;
    shifted.get(i).copied()
}

/// `<0xNN>` (SentencePiece's byte-fallback piece) → the byte.
fn byte_fallback_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn builtin_special(id: u32) -> Option<&'static str> {
    let i = id.checked_sub(BUILTIN_FIRST_SPECIAL)? as usize;
    BUILTIN_SPECIALS.get(i).copied()
}

/// Bytes to ids, matching the special tokens written in the text.
fn builtin_encode(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    let mut ids = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let special = (bytes[i] == b'<')
            .then(|| {
                BUILTIN_SPECIALS
                    .iter()
                    .position(|s| bytes[i..].starts_with(s.as_bytes()))
            })
            .flatten();
        match special {
            Some(k) => {
                ids.push(BUILTIN_FIRST_SPECIAL + k as u32);
                i += BUILTIN_SPECIALS[k].len();
            }
            None => {
                ids.push(u32::from(bytes[i]));
                i += 1;
            }
        }
    }
    ids
}

/// The template's message without minijinja's source listing; a
/// `raise_exception` message comes through as the template wrote it.
fn render_error_message(e: &minijinja::Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        _ => e.to_string(),
    }
}

/// A Jinja environment configured as `transformers` renders chat templates.
fn template_env(source: String) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    // transformers: jinja2 ImmutableSandboxedEnvironment(trim_blocks=True,
    // lstrip_blocks=True).
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, _> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE_NAME, source)?;
    Ok(env)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`:
/// separators `", "` and `": "` (`","` at line ends when indenting), no HTML
/// escaping (minijinja's own `tojson` escapes `<`, `>`, `&`, `'`).
fn tojson(value: JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    // Serialized straight from the Jinja value: a detour through
    // serde_json::Value would sort the keys.
    let json = &value;
    let mut out = Vec::new();
    let res = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            json.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            json.serialize(&mut ser)
        }
    };
    res.map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(JinjaValue::from_safe_string(text))
}

/// serde_json's compact output with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `strftime_now(format)` (Llama 3 templates print today's date): the UTC
/// date with `%d %m %Y %y %b %B %H %M %S %%`.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (y, m, d) = civil_from_days((unix_secs / 86_400) as i64);
    let tod = unix_secs % 86_400;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name)
    }

    fn reference(name: &str) -> JsonValue {
        let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn ids(v: &JsonValue) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    fn check_fixture(name: &str) {
        let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
        let r = reference(name);
        let prompts = r["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 6);
        for p in prompts {
            let text = p["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(text, true).unwrap(),
                ids(&p["input_ids"]),
                "{name}: prompt {:?}",
                p["name"]
            );
        }
        let chat = &r["chat"];
        let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let rendered = tok
            .apply_chat_template(&messages, chat["add_generation_prompt"].as_bool().unwrap())
            .unwrap();
        assert_eq!(rendered, chat["rendered_prompt"].as_str().unwrap());
        assert_eq!(
            tok.encode_chat(&messages, true).unwrap(),
            ids(&chat["input_ids"])
        );
    }

    #[test]
    fn tiny_qwen2_matches_transformers() {
        check_fixture("tiny-qwen2");
        let tok = Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap();
        assert_eq!(tok.bos_token(), None);
        assert_eq!(tok.bos_token_id(), None);
        assert_eq!(tok.eos_token(), Some("<|im_end|>"));
        assert_eq!(tok.eos_token_id(), Some(999));
        assert!(tok.is_special(997) && tok.is_special(999) && !tok.is_special(5));
        assert_eq!(tok.vocab_size(), 1000);
    }

    #[test]
    fn tiny_llama_matches_transformers() {
        check_fixture("tiny-llama");
        let tok = Tokenizer::from_dir(&fixture("tiny-llama")).unwrap();
        assert_eq!(tok.bos_token_id(), Some(1020));
        assert_eq!(tok.eos_token_id(), Some(1023));
    }

    #[test]
    fn decode_round_trips_and_skips_specials() {
        let tok = Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap();
        let r = reference("tiny-qwen2");
        for p in r["prompts"].as_array().unwrap() {
            // Its NFC normalizer composes the "unicode" prompt's "e\u{301}".
            if p["name"] == "unicode" {
                continue;
            }
            let text = p["text"].as_str().unwrap();
            let ids = tok.encode(text, true).unwrap();
            assert_eq!(tok.decode(&ids, true).unwrap(), text);
        }
        let ids = tok.encode("<|im_start|>hi<|im_end|>", false).unwrap();
        assert_eq!(ids.first(), Some(&998));
        assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
        assert_eq!(tok.decode(&ids, false).unwrap(), "<|im_start|>hi<|im_end|>");
        // An id past the vocabulary decodes to nothing rather than failing.
        assert_eq!(tok.decode(&[5000], true).unwrap(), "");
    }

    #[test]
    fn builtin_is_byte_level() {
        let tok = Tokenizer::builtin();
        let ids = tok.encode("é<|im_end|>a", true).unwrap();
        assert_eq!(ids, vec![0xC3, 0xA9, 258, b'a' as u32]);
        assert_eq!(tok.decode(&ids, false).unwrap(), "é<|im_end|>a");
        assert_eq!(tok.decode(&ids, true).unwrap(), "éa");
        // Half a character decodes to the replacement character.
        assert_eq!(tok.decode(&[0xC3], true).unwrap(), "\u{FFFD}");
        assert_eq!(tok.decode(&[300], false).unwrap(), "");
        assert_eq!(tok.eos_token_id(), Some(258));
        assert_eq!(tok.token_to_id("<|im_start|>"), Some(257));
        assert_eq!(tok.vocab_size(), 259);
        assert!(tok.is_special(256) && !tok.is_special(255));
        let chat = tok
            .encode_chat(&[ChatMessage::new("user", "hi")], true)
            .unwrap();
        assert_eq!(
            tok.decode(&chat, false).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn fallback_template_and_template_errors() {
        let tmp = std::env::temp_dir().join(format!("sluice-tok-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::copy(
            fixture("tiny-llama").join("tokenizer.json"),
            tmp.join("tokenizer.json"),
        )
        .unwrap();
        // No tokenizer_config.json: no special tokens, the fallback template.
        let tok = Tokenizer::from_dir(&tmp).unwrap();
        assert!(tok.chat_template().is_none());
        let out = tok
            .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
            .unwrap();
        assert_eq!(out, "user: hi\nassistant: ");

        // A list-form template, raise_exception, tojson, Python methods.
        let config = serde_json::json!({
            "bos_token": {"content": "<|begin_of_text|>", "__type": "AddedToken"},
            "eos_token": "<|im_end|>",
            "chat_template": [
                {"name": "tool_use", "template": "unused"},
                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}{{ m.content.strip() | upper }}|{{ m | tojson }}{% endfor %}"}
            ]
        });
        std::fs::write(
            tmp.join("tokenizer_config.json"),
            serde_json::to_string(&config).unwrap(),
        )
        .unwrap();
        let tok = Tokenizer::from_dir(&tmp).unwrap();
        assert_eq!(tok.bos_token_id(), Some(1020));
        let out = tok
            .apply_chat_template(&[ChatMessage::new("user", " <b> ")], false)
            .unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|><B>|{\"role\": \"user\", \"content\": \" <b> \"}"
        );
        let err = tok
            .apply_chat_template(&[ChatMessage::new("bad", "x")], false)
            .unwrap_err();
        assert_eq!(err.message, "roles must alternate");
        std::fs::remove_dir_all(&tmp).ok();
    }

    /// A tokenizer over tiny-qwen2's vocabulary with `template`.
    fn with_template(tag: &str, template: &str) -> (Tokenizer, PathBuf) {
        let tmp = std::env::temp_dir().join(format!("sluice-tok-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::copy(
            fixture("tiny-qwen2").join("tokenizer.json"),
            tmp.join("tokenizer.json"),
        )
        .unwrap();
        let config = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template});
        std::fs::write(tmp.join("tokenizer_config.json"), config.to_string()).unwrap();
        (Tokenizer::from_dir(&tmp).unwrap(), tmp)
    }

    #[test]
    fn qwen25_template_renders_tools() {
        let template =
            std::fs::read_to_string(fixture("templates/qwen2.5-7b-instruct.jinja")).unwrap();
        let (tok, tmp) = with_template("qwen25", &template);
        let tools = serde_json::json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Weather <now>",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        // As the server passes them: arguments parsed to objects, null
        // content as "".
        let messages = serde_json::json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
        ]);
        let messages = messages.as_array().unwrap();
        let out = tok
            .apply_chat_template_with_tools(messages, Some(&tools), true)
            .unwrap();
        let want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather <now>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(out, want);
        // Without tools: the plain system prompt (`tools` is none).
        let out = tok
            .apply_chat_template_with_tools(&messages[..1], None, false)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        );
        // `tools` is none, not undefined, for the old entry point too.
        let (tok, tmp2) = with_template("none", "{{ tools is none }}|{{ tools is defined }}");
        assert_eq!(
            tok.apply_chat_template(&[ChatMessage::new("user", "x")], false)
                .unwrap(),
            "True|True"
        );
        std::fs::remove_dir_all(&tmp).ok();
        std::fs::remove_dir_all(&tmp2).ok();
    }

    #[test]
    fn missing_tokenizer_names_the_file() {
        let err = Tokenizer::from_dir(Path::new("/nonexistent-dir")).unwrap_err();
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-11-30 12:34:56 UTC
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %B %%", 1_732_970_096),
            "30 Nov 2024 12:34:56 November %"
        );
    }
}
