//! `Tokenizer::token_bytes`: the bytes of the tokens of `encode(text)`
//! concatenate to the text, for the byte-level fixtures (tiny-qwen2,
//! tiny-llama), a SentencePiece (GGUF `llama`) vocabulary with byte
//! fallback, and the built-in byte tokenizer; special tokens are flagged.

use sluice_tokenizer::gguf::token_type::{BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED};
use sluice_tokenizer::{GgufVocab, Tokenizer};
use std::path::PathBuf;

/// NFC text (tiny-qwen2 normalizes to NFC) with accents, CJK, emoji,
/// spaces, tabs and newlines.
pub const TEXTS: &[&str] = &[
    "hello world",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n",
    "café déjà vu, naïve Ørsted",
    "日本語のテキストと中文",
    "emoji 🦀🎉👍🏽 and ZWJ 👩‍💻",
    "{\"key\": [1, 2.5e-3, true, null]}",
    "x",
    " ",
    "\u{7f}\u{0}\u{1b}[0m",
];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn concat_bytes(tok: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&id| {
            tok.token_bytes(id)
                .unwrap_or_else(|| panic!("token {id} has no bytes"))
        })
        .collect()
}

fn check_round_trip(tok: &Tokenizer, texts: &[&str]) {
    for text in texts {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&concat_bytes(tok, &ids)),
            *text,
            "ids {ids:?}"
        );
    }
}

/// Every id has bytes; none is empty except where the vocabulary says so.
fn check_every_id(tok: &Tokenizer) {
    for id in 0..tok.vocab_size() as u32 {
        let b = tok.token_bytes(id).unwrap_or_else(|| panic!("id {id}"));
        assert!(!b.is_empty(), "id {id} has no bytes");
    }
    assert_eq!(tok.token_bytes(tok.vocab_size() as u32 + 7), None);
}

#[test]
fn tiny_qwen2_token_bytes_concatenate_to_the_text() {
    let tok = Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap();
    check_every_id(&tok);
    check_round_trip(&tok, TEXTS);
    // Specials are flagged and their bytes are their text.
    for (id, text) in [
        (997, "<|endoftext|>"),
        (998, "<|im_start|>"),
        (999, "<|im_end|>"),
    ] {
        assert!(tok.is_special(id));
        assert_eq!(tok.token_bytes(id).unwrap(), text.as_bytes());
    }
    let ids = tok.encode("<|im_start|>hi é<|im_end|>", false).unwrap();
    assert_eq!(
        concat_bytes(&tok, &ids),
        "<|im_start|>hi é<|im_end|>".as_bytes()
    );
    // Byte-level: "Ġ" is a space, "Ċ" a newline.
    let space = tok.token_to_id("Ġ").unwrap();
    assert_eq!(tok.token_bytes(space).unwrap(), b" ");
    assert!(!tok.is_special(space));
}

#[test]
fn tiny_llama_token_bytes_concatenate_to_the_text() {
    let tok = Tokenizer::from_dir(&fixture("tiny-llama")).unwrap();
    check_every_id(&tok);
    check_round_trip(&tok, TEXTS);
    for id in 1020..1024 {
        assert!(tok.is_special(id), "{id}");
    }
    assert!(!tok.is_special(5));
}

#[test]
fn every_byte_level_byte_is_reachable() {
    // The 256 single-byte tokens of a byte-level vocabulary map to the 256
    // bytes, each once.
    let tok = Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap();
    let mut seen = [false; 256];
    for id in 0..tok.vocab_size() as u32 {
        if tok.is_special(id) {
            continue;
        }
        let b = tok.token_bytes(id).unwrap();
        if let [b] = b[..] {
            seen[b as usize] = true;
        }
    }
    assert!(seen.iter().all(|&s| s));
}

/// A SentencePiece vocabulary with byte fallback and the dummy prefix, as
/// GGUF `llama` files have, plus a non-special added token.
fn llama_vocab() -> GgufVocab {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
    }
    for piece in [
        "▁", "h", "i", "e", "l", "o", "▁h", "▁hi", "hi", "ll", "▁he", "▁hell", "▁hello", "▁▁",
    ] {
        tokens.push(piece.into());
        types.push(NORMAL);
    }
    tokens.push("<think>".into());
    types.push(USER_DEFINED);
    let n = tokens.len();
    GgufVocab {
        model: "llama".into(),
        pre: Some("default".into()),
        tokens,
        token_types: Some(types),
        scores: Some((0..n).map(|i| -(i as f32)).collect()),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unknown_token_id: Some(0),
        ..Default::default()
    }
}

#[test]
fn sentencepiece_token_bytes_map_the_space_marker_and_byte_fallback() {
    let tok = Tokenizer::from_gguf_vocab(&llama_vocab()).unwrap();
    let id = |s: &str| tok.token_to_id(s).unwrap();
    assert_eq!(tok.token_bytes(id("▁hello")).unwrap(), b" hello");
    assert_eq!(tok.token_bytes(id("▁▁")).unwrap(), b"  ");
    assert_eq!(tok.token_bytes(id("<0x0A>")).unwrap(), b"\n");
    assert_eq!(tok.token_bytes(id("<0xC3>")).unwrap(), [0xC3]);
    assert_eq!(tok.token_bytes(id("<think>")).unwrap(), b"<think>");
    assert!(!tok.is_special(id("<think>")));
    assert!(tok.is_special(1) && tok.is_special(2));
    assert_eq!(tok.token_bytes(2).unwrap(), b"</s>");
    // encode prepends the dummy "▁": the bytes are the text after a space.
    for text in TEXTS {
        let ids = tok.encode(text, false).unwrap();
        let bytes = concat_bytes(&tok, &ids);
        assert_eq!(bytes, format!(" {text}").as_bytes(), "{text:?}: {ids:?}");
    }
}

#[test]
fn builtin_token_bytes_are_the_bytes() {
    let tok = Tokenizer::builtin();
    for b in 0..=255u8 {
        assert_eq!(tok.token_bytes(b.into()).unwrap(), [b]);
        assert!(!tok.is_special(b.into()));
    }
    assert_eq!(tok.token_bytes(258).unwrap(), b"<|im_end|>");
    assert!(tok.is_special(258));
    assert_eq!(tok.token_bytes(259), None);
    check_round_trip(&tok, TEXTS);
}
