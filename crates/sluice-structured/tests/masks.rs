//! Masks against brute force: for choice, regex, JSON-enum and Lark
//! constraints over small finite languages, every step of seeded random
//! walks allows exactly the tokens that keep the output a prefix of the
//! language, stop ids exactly where it is complete, only stop ids after it;
//! rollback restores the masks; validate_tokens counts without advancing.

mod common;

use common::*;
use serde_json::json;
use sluice_structured::{Constraint, JsonFormat, StructuredVocab};

fn choice(items: &[&str]) -> Constraint {
    Constraint::Choice(items.iter().map(|s| s.to_string()).collect())
}

fn check(vocab: &StructuredVocab, c: Constraint, lang: &[String], walks: usize) {
    let compiler = compiler(vocab);
    let g = compiler
        .compile(&c)
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let lang = Language::new(lang.iter().map(|s| s.as_bytes()));
    let texts = check_walks(vocab, &g, &lang, walks, 0x5EED ^ walks as u64);
    // The walks reach more than one string.
    let distinct: std::collections::HashSet<_> = texts.iter().collect();
    assert!(distinct.len() > 1 || lang.strings.len() == 1, "{c:?}");
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const CHOICES: &[&str] = &[
    "yes",
    "no",
    "maybe",
    "yes please",
    "é🦀",
    "a\"b\\c\u{7f}",
    "ab",
    "abc",
];

#[test]
fn choice_masks_match_brute_force_on_qwen2() {
    check(&qwen_vocab(), choice(CHOICES), &strings(CHOICES), 30);
}

#[test]
fn choice_masks_match_brute_force_on_bytes() {
    check(&builtin_vocab(), choice(CHOICES), &strings(CHOICES), 30);
}

#[test]
fn choice_with_the_empty_string() {
    check(
        &builtin_vocab(),
        choice(&["", "x", "xy"]),
        &strings(&["", "x", "xy"]),
        10,
    );
}

fn regex_language() -> Vec<String> {
    let mut out = Vec::new();
    for a in ["ab", "cd"] {
        for x in ["", "x"] {
            out.push(format!("{a}{x}"));
            for b in ["ab", "cd"] {
                out.push(format!("{a}{b}{x}"));
            }
        }
    }
    out
}

#[test]
fn regex_masks_match_brute_force() {
    let c = Constraint::Regex("(ab|cd){1,2}x?".into());
    check(&qwen_vocab(), c.clone(), &regex_language(), 25);
    check(&builtin_vocab(), c, &regex_language(), 25);
}

#[test]
fn regex_with_classes_and_counts() {
    let lang: Vec<String> = (0..100)
        .flat_map(|n| ["a", "b", "c"].map(|l| format!("{n:02}-{l}")))
        .collect();
    check(
        &qwen_vocab(),
        Constraint::Regex("[0-9]{2}-[a-c]".into()),
        &lang,
        25,
    );
}

#[test]
fn json_enum_masks_match_brute_force() {
    let c = json(json!({"enum": ["red", "green", 42, true, null, "a\"q"]}));
    let lang = strings(&["\"red\"", "\"green\"", "42", "true", "null", "\"a\\\"q\""]);
    check(&qwen_vocab(), c, &lang, 30);
}

#[test]
fn json_object_without_whitespace_matches_brute_force() {
    let c = Constraint::Json {
        schema: json!({
            "type": "object",
            "properties": {"a": {"enum": ["x", "yz"]}, "b": {"type": "boolean"}},
            "required": ["a", "b"],
            "additionalProperties": false
        }),
        format: JsonFormat::pattern(""),
    };
    let mut lang = Vec::new();
    for a in ["x", "yz"] {
        for b in ["true", "false"] {
            lang.push(format!("{{\"a\":\"{a}\",\"b\":{b}}}"));
        }
    }
    check(&qwen_vocab(), c, &lang, 20);
}

#[test]
fn lark_masks_match_brute_force() {
    let c = Constraint::Grammar("start: \"n=\" digit (\"!\")?\ndigit: /[0-9]/".into());
    let lang: Vec<String> = (0..10)
        .flat_map(|d| [format!("n={d}"), format!("n={d}!")])
        .collect();
    check(&qwen_vocab(), c, &lang, 20);
}

#[test]
fn stop_ids_only_where_the_grammar_can_end() {
    let vocab = qwen_vocab();
    let compiler = compiler(&vocab);
    let g = compiler.compile(&choice(&["ab", "abc"])).unwrap();
    let mut m = g.matcher();
    let w = vocab.mask_words();
    let stops = [QWEN_IM_END, QWEN_ENDOFTEXT];
    let has_stop = |mask: &[u32]| {
        stops
            .iter()
            .all(|&s| mask[s as usize / 32] >> (s % 32) & 1 == 1)
    };
    assert!(!has_stop(&mask_of(&mut m, w)));
    assert!(!m.can_stop());
    // A stop id before the grammar can end is refused and fails the matcher.
    let mut early = g.matcher();
    assert_eq!(early.validate_tokens(&[QWEN_IM_END]), 0);
    assert!(!early.accept_token(QWEN_IM_END));
    assert!(early.is_error());
    // Its mask is then the stop ids only (the sequence can end).
    assert_eq!(
        allowed(&mask_of(&mut early, w), vocab.vocab_size()),
        sorted(&stops)
    );

    let tok = vocab_token(&vocab, b"ab");
    assert!(m.accept_token(tok));
    let mask = mask_of(&mut m, w);
    assert!(has_stop(&mask));
    assert!(!m.is_terminated() && m.can_stop());
    // "c" completes "abc": nothing but stop ids after that.
    assert!(m.accept_token(vocab_token(&vocab, b"c")));
    assert!(m.is_terminated());
    assert_eq!(
        allowed(&mask_of(&mut m, w), vocab.vocab_size()),
        sorted(&stops)
    );
    // Any further text token is refused; stop ids are taken, repeatedly.
    assert_eq!(m.validate_tokens(&[QWEN_ENDOFTEXT, QWEN_IM_END, tok]), 2);
    assert!(m.accept_tokens(&[QWEN_ENDOFTEXT, QWEN_IM_END]));
    assert_eq!(m.num_accepted(), 4);
    assert!(m.rollback(3));
    assert!(!m.is_terminated() && m.can_stop());
    assert!(m.accept_token(QWEN_IM_END));
    assert!(m.is_terminated());
    assert!(!m.accept_token(tok));
    assert!(m.is_error());
}

/// The id whose trie bytes are exactly `bytes`.
fn vocab_token(vocab: &StructuredVocab, bytes: &[u8]) -> u32 {
    (0..vocab.vocab_size() as u32)
        .find(|&t| vocab.trie_bytes(t) == bytes)
        .unwrap_or_else(|| panic!("no token {:?}", String::from_utf8_lossy(bytes)))
}

#[test]
fn validate_tokens_counts_without_advancing() {
    let vocab = builtin_vocab();
    let compiler = compiler(&vocab);
    let g = compiler.compile(&choice(&["hello", "help"])).unwrap();
    let mut m = g.matcher();
    let ids = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
    let before = mask_of(&mut m, vocab.mask_words());
    assert_eq!(m.validate_tokens(&ids("helxo")), 3);
    assert_eq!(m.validate_tokens(&ids("help")), 4);
    let mut with_stop = ids("help");
    with_stop.extend([258, 258, b'x' as u32]);
    assert_eq!(m.validate_tokens(&with_stop), 6);
    // Out-of-range ids end the count without failing the matcher.
    assert_eq!(m.validate_tokens(&[b'h' as u32, 5000, b'e' as u32]), 1);
    assert_eq!(m.validate_tokens(&[]), 0);
    assert!(!m.is_error());
    assert_eq!(m.num_accepted(), 0);
    assert_eq!(mask_of(&mut m, vocab.mask_words()), before);
    // Speculative use: accept the valid prefix, roll back a rejected tail.
    assert!(m.accept_tokens(&ids("hel")));
    assert!(m.rollback(2));
    assert_eq!(m.validate_tokens(&ids("elp")), 3);
    assert!(!m.rollback(5));
    assert!(!m.accept_token(5000));
    assert!(m.is_error());
    assert!(m.error().unwrap().contains("5000"));
    assert_eq!(m.validate_tokens(&ids("elp")), 0);
    assert!(!m.rollback(1));
}

#[test]
fn padding_and_special_ids_are_never_allowed() {
    let vocab = qwen_vocab();
    let compiler = compiler(&vocab);
    // A grammar allowing any text.
    let g = compiler
        .compile(&Constraint::Regex("(.|\\n)*".into()))
        .unwrap();
    let mut m = g.matcher();
    let got = allowed(&mask_of(&mut m, vocab.mask_words()), vocab.vocab_size());
    assert!(got.iter().all(|&t| t < 1000));
    assert!(
        !got.contains(&998),
        "<|im_start|> is special, not a stop id"
    );
    assert!(got.contains(&QWEN_IM_END) && got.contains(&QWEN_ENDOFTEXT));
    assert!(got.len() > 900);
    // The last word's bits past the vocabulary are clear.
    let mask = mask_of(&mut m, vocab.mask_words());
    assert_eq!(mask.len(), 33);
    assert_eq!(mask[32] >> (QWEN_LOGITS % 32), 0);
    // A short `out` gets what fits; a long one zeros past mask_words.
    let mut long = vec![u32::MAX; 40];
    m.fill_bitmask(&mut long);
    assert_eq!(&long[..33], &mask[..]);
    assert!(long[33..].iter().all(|&w| w == 0));
    let mut short = vec![0u32; 3];
    m.fill_bitmask(&mut short);
    assert_eq!(&short[..], &mask[..3]);
}

#[test]
fn lark_grammar_can_name_a_special_token() {
    let vocab = qwen_vocab();
    let compiler = compiler(&vocab);
    let g = compiler
        .compile(&Constraint::Grammar(
            "start: \"hi\" <|im_start|> \"x\"".into(),
        ))
        .unwrap();
    let mut m = g.matcher();
    for &b in b"hi" {
        assert!(m.accept_token(vocab_token(&vocab, &[b])));
    }
    let got = allowed(&mask_of(&mut m, vocab.mask_words()), vocab.vocab_size());
    assert_eq!(got, vec![998]);
    assert!(m.accept_token(998));
    assert!(m.accept_token(vocab_token(&vocab, b"x")));
    assert!(m.is_terminated());
}
