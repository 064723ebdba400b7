//! The model's vocabulary as llguidance needs it: a token trie of every
//! logits id's bytes (special tokens behind llguidance's 0xFF marker, ids
//! past the tokenizer's vocabulary empty so they are never allowed), the stop
//! ids, and a tokenizer for the bytes a grammar forces.
//!
//! Promises: built once per model; refuses an empty or out-of-range stop
//! list and a vocabulary the trie cannot hold, with an error instead of
//! llguidance's asserts.

use anyhow::{bail, Result};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use sluice_tokenizer::Tokenizer;
use std::sync::Arc;

/// toktrie keeps a token's id in 24 bits and a subtree size in 22: about
/// 2M tokens is its limit (toktree.rs).
const MAX_VOCAB: usize = 1 << 21;

/// toktrie keeps a node's parent count in 10 bits, enough for tokens of
/// about 1 KB. A longer token (a hostile or odd vocabulary) would trip its
/// assert, so it is left out of the trie: it is never allowed.
const MAX_TOKEN_BYTES: usize = 1000;

/// What every matcher of one model shares: the trie (inside `tok_env`), the
/// logits width and the stop ids.
pub(crate) struct VocabShared {
    pub(crate) tok_env: TokEnv,
    pub(crate) vocab_size: usize,
    pub(crate) mask_words: usize,
    pub(crate) stop_ids: Vec<u32>,
    /// The bitmask with only the stop ids set.
    pub(crate) stop_mask: Vec<u32>,
}

impl VocabShared {
    pub(crate) fn is_stop(&self, token: u32) -> bool {
        self.stop_ids.contains(&token)
    }
}

/// The model's vocabulary as the constraint engine needs it (built once per
/// model).
#[derive(Clone)]
pub struct StructuredVocab {
    pub(crate) shared: Arc<VocabShared>,
}

impl std::fmt::Debug for StructuredVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StructuredVocab")
            .field("vocab_size", &self.shared.vocab_size)
            .field("stop_ids", &self.shared.stop_ids)
            .finish()
    }
}

impl StructuredVocab {
    /// `vocab_size`: the logits width (may exceed the tokenizer's vocabulary;
    /// extra ids are never allowed). `stop_ids`: EOS and other stop token
    /// ids, allowed only where the grammar can end. Errors if stop_ids is
    /// empty or out of range.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        vocab_size: usize,
        stop_ids: &[u32],
    ) -> Result<StructuredVocab> {
        if vocab_size == 0 || vocab_size > MAX_VOCAB {
            bail!("structured outputs: vocabulary size {vocab_size} is not in 1..={MAX_VOCAB}");
        }
        if stop_ids.is_empty() {
            bail!("structured outputs need at least one stop token id");
        }
        if let Some(bad) = stop_ids.iter().find(|&&id| id as usize >= vocab_size) {
            bail!("stop token id {bad} is past the vocabulary ({vocab_size} ids)");
        }
        let mut stops = Vec::with_capacity(stop_ids.len());
        for &id in stop_ids {
            if !stops.contains(&id) {
                stops.push(id);
            }
        }

        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| match tokenizer.token_bytes(id) {
                None => Vec::new(),
                Some(b) if b.len() > MAX_TOKEN_BYTES => Vec::new(),
                Some(b) if tokenizer.is_special(id) => {
                    let mut w = Vec::with_capacity(b.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(&b);
                    w
                }
                Some(b) => b,
            })
            .collect();
        let info = TokRxInfo::new(vocab_size as u32, stops[0]);
        // The limits above keep toktrie's asserts from firing; this catches
        // any that remain, so a strange vocabulary is an error, not a crash.
        let trie =
            std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(&stops))
                .map_err(|_| {
                    anyhow::anyhow!(
                        "structured outputs: the vocabulary does not fit llguidance's token trie"
                    )
                })?;

        let mask_words = vocab_size.div_ceil(32);
        let mut stop_mask = vec![0u32; mask_words];
        for &id in &stops {
            stop_mask[id as usize / 32] |= 1 << (id % 32);
        }
        let tok_env: TokEnv = Arc::new(SluiceTokEnv { trie, tokenizer });
        Ok(StructuredVocab {
            shared: Arc::new(VocabShared {
                tok_env,
                vocab_size,
                mask_words,
                stop_ids: stops,
                stop_mask,
            }),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.shared.vocab_size
    }

    /// u32 words per bitmask row: vocab_size.div_ceil(32).
    pub fn mask_words(&self) -> usize {
        self.shared.mask_words
    }

    /// The stop ids, without repeats, in the order given.
    pub fn stop_ids(&self) -> &[u32] {
        &self.shared.stop_ids
    }

    /// The bytes the trie holds for `id`: the token's text bytes, a special
    /// token's behind 0xFF, empty for ids that are never allowed (padding,
    /// out of range).
    pub fn trie_bytes(&self, id: u32) -> &[u8] {
        let trie = self.shared.tok_env.tok_trie();
        if (id as usize) < trie.vocab_size() {
            trie.token(id)
        } else {
            &[]
        }
    }
}

/// llguidance's view of the tokenizer.
struct SluiceTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for SluiceTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only reached when `tokenize_is_canonical` is true, which it is not
    /// (see there); kept correct anyway: text through the real tokenizer,
    /// invalid UTF-8 greedily through the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }

    /// False: llguidance would otherwise answer a state with forced bytes
    /// with a one-token mask holding the tokenizer's encoding of those
    /// bytes, and `encode` is not the canonical tokenization of a fragment
    /// for every vocabulary sluice loads: SentencePiece ones prepend `▁`,
    /// Qwen2's NFC-normalizes (its tokens' bytes need not be the forced
    /// bytes), and `encode` matches special tokens written in the text. With
    /// false the masks stay exact and forced bytes are enforced byte by byte
    /// through the mask; the model still picks its own tokens for them.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}
