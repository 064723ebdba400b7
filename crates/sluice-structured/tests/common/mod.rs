//! Test helpers: vocabularies (the tiny-qwen2 fixture's byte-level BPE with
//! padded logits, the built-in byte tokenizer), a seeded generator, and the
//! brute-force mask check against an enumerated finite language.

#![allow(dead_code)]

use sluice_structured::{
    CompiledGrammar, Constraint, GrammarCompiler, GrammarMatcher, JsonFormat, StructuredVocab,
};
use sluice_tokenizer::Tokenizer;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

/// tiny-qwen2's logits are padded past its 1000 tokens to this.
pub const QWEN_LOGITS: usize = 1030;
pub const QWEN_IM_END: u32 = 999;
pub const QWEN_ENDOFTEXT: u32 = 997;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-model/tests/data")
        .join(name)
}

pub fn qwen_tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap())
}

pub fn qwen_vocab() -> StructuredVocab {
    StructuredVocab::new(
        qwen_tokenizer(),
        QWEN_LOGITS,
        &[QWEN_IM_END, QWEN_ENDOFTEXT],
    )
    .unwrap()
}

pub fn builtin_vocab() -> StructuredVocab {
    StructuredVocab::new(Arc::new(Tokenizer::builtin()), 259, &[258]).unwrap()
}

pub fn compiler(vocab: &StructuredVocab) -> GrammarCompiler {
    GrammarCompiler::new(vocab.clone(), 2, 16).unwrap()
}

/// xorshift64*: reproducible walks without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub fn allowed(mask: &[u32], vocab_size: usize) -> Vec<u32> {
    (0..vocab_size as u32)
        .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
        .collect()
}

pub fn mask_of(m: &mut GrammarMatcher, words: usize) -> Vec<u32> {
    let mut out = vec![0xDEAD_BEEF; words];
    m.fill_bitmask(&mut out);
    out
}

/// A finite language and every prefix of its strings.
pub struct Language {
    pub strings: HashSet<Vec<u8>>,
    pub prefixes: HashSet<Vec<u8>>,
}

impl Language {
    pub fn new<S: AsRef<[u8]>>(strings: impl IntoIterator<Item = S>) -> Self {
        let strings: HashSet<Vec<u8>> = strings.into_iter().map(|s| s.as_ref().to_vec()).collect();
        let mut prefixes = HashSet::new();
        for s in &strings {
            for i in 0..=s.len() {
                prefixes.insert(s[..i].to_vec());
            }
        }
        Language { strings, prefixes }
    }

    /// `text` is in the language and nothing longer is.
    pub fn is_maximal(&self, text: &[u8]) -> bool {
        self.strings.contains(text)
            && !self
                .prefixes
                .iter()
                .any(|p| p.len() > text.len() && p.starts_with(text))
    }

    /// The mask the language implies after `text`: a text token where
    /// text + its bytes is still a prefix, a stop id where text is complete.
    pub fn expected(&self, vocab: &StructuredVocab, text: &[u8]) -> Vec<u32> {
        (0..vocab.vocab_size() as u32)
            .filter(|&t| {
                if vocab.stop_ids().contains(&t) {
                    return self.strings.contains(text);
                }
                let b = vocab.trie_bytes(t);
                if b.is_empty() || b[0] == 0xFF {
                    return false;
                }
                let mut next = text.to_vec();
                next.extend_from_slice(b);
                self.prefixes.contains(&next)
            })
            .collect()
    }
}

/// Random walks through `grammar`, checking every step's mask against the
/// language by brute force over the whole vocabulary; then rolls each walk
/// back step by step and checks the masks come back. Returns the texts.
pub fn check_walks(
    vocab: &StructuredVocab,
    grammar: &CompiledGrammar,
    lang: &Language,
    walks: usize,
    seed: u64,
) -> Vec<Vec<u8>> {
    let words = vocab.mask_words();
    let mut rng = Rng(seed);
    let mut texts = Vec::new();
    for w in 0..walks {
        let mut m = grammar.matcher();
        let mut text = Vec::new();
        let mut masks = Vec::new();
        loop {
            let mask = mask_of(&mut m, words);
            let got = allowed(&mask, vocab.vocab_size());
            let want = lang.expected(vocab, &text);
            assert_eq!(
                got,
                want,
                "walk {w}: after {:?}",
                String::from_utf8_lossy(&text)
            );
            assert!(!got.is_empty(), "walk {w}: empty mask");
            masks.push(mask);
            assert_eq!(m.is_terminated(), lang.is_maximal(&text), "walk {w}");
            assert_eq!(m.can_stop(), lang.strings.contains(&text), "walk {w}");
            // Prefer text tokens so walks go somewhere; stop when only
            // stops are left or now and then where one is allowed.
            let text_tokens: Vec<u32> = got
                .iter()
                .copied()
                .filter(|t| !vocab.stop_ids().contains(t))
                .collect();
            let tok =
                if text_tokens.is_empty() || rng.below(5) == 0 && got.len() > text_tokens.len() {
                    *got.iter().find(|t| vocab.stop_ids().contains(t)).unwrap()
                } else {
                    text_tokens[rng.below(text_tokens.len())]
                };
            assert_eq!(m.validate_tokens(&[tok]), 1);
            assert!(m.accept_token(tok), "walk {w}: token {tok} refused");
            if vocab.stop_ids().contains(&tok) {
                break;
            }
            text.extend_from_slice(vocab.trie_bytes(tok));
        }
        assert!(
            lang.strings.contains(&text),
            "{:?}",
            String::from_utf8_lossy(&text)
        );
        // After the stop: only stop ids, any number of them.
        let stops = allowed(&mask_of(&mut m, words), vocab.vocab_size());
        assert_eq!(stops, sorted(vocab.stop_ids()));
        assert!(m.accept_token(vocab.stop_ids()[0]));
        assert!(!m.is_error());
        // Roll back to each earlier step: the masks come back.
        assert!(m.rollback(1));
        for (i, mask) in masks.iter().enumerate().rev() {
            assert!(m.rollback(1), "walk {w}: rollback to step {i}");
            assert_eq!(
                &mask_of(&mut m, words),
                mask,
                "walk {w}: step {i} after rollback"
            );
        }
        assert!(!m.rollback(1), "rolled back past the start");
        assert!(!m.is_error());
        texts.push(text);
    }
    texts
}

pub fn sorted(ids: &[u32]) -> Vec<u32> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v
}

pub fn json(schema: serde_json::Value) -> Constraint {
    Constraint::Json {
        schema,
        format: JsonFormat::default(),
    }
}
