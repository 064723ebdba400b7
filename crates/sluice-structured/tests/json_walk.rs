//! A JSON schema with nested objects, bounded arrays, enums, integer bounds
//! and string patterns: seeded walks through the allowed tokens (random
//! ones, and "longest token first" ones as a model favouring long tokens
//! would) always end in text that parses and meets the schema, checked by
//! hand.

mod common;

use common::*;
use serde_json::{json, Value};
use sluice_structured::{CompiledGrammar, Constraint, JsonFormat, StructuredVocab};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    "country": {"enum": ["FR", "DE"]},
                    "note": {"type": "string", "maxLength": 4}
                },
                "required": ["zip", "country"],
                "additionalProperties": false
            },
            "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 2},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "tags", "address", "scores"],
        "additionalProperties": false
    })
}

/// A JSON integer: `-0` is one (JSON Schema counts by value), though
/// serde_json reads it as a float.
fn int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        let f = v.as_f64()?;
        (f.fract() == 0.0 && f.abs() < 1e15).then_some(f as i64)
    })
}

fn check_value(v: &Value, text: &str) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let allowed_keys = ["name", "age", "tags", "address", "scores", "ok"];
    assert!(
        o.keys().all(|k| allowed_keys.contains(&k.as_str())),
        "{text}"
    );
    let name = o["name"].as_str().unwrap();
    let mut chars = name.chars();
    assert!(chars.next().unwrap().is_ascii_uppercase(), "{text}");
    let rest: Vec<char> = chars.collect();
    assert!(
        (1..=8).contains(&rest.len()) && rest.iter().all(|c| c.is_ascii_lowercase()),
        "{text}"
    );
    let age = int(&o["age"]).unwrap();
    assert!((0..=120).contains(&age), "{text}");
    let tags = o["tags"].as_array().unwrap();
    assert!((1..=3).contains(&tags.len()), "{text}");
    assert!(
        tags.iter()
            .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())),
        "{text}"
    );
    let addr = o["address"].as_object().unwrap();
    let zip = addr["zip"].as_str().unwrap();
    assert!(
        zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()),
        "{text}"
    );
    assert!(
        ["FR", "DE"].contains(&addr["country"].as_str().unwrap()),
        "{text}"
    );
    if let Some(note) = addr.get("note") {
        assert!(note.as_str().unwrap().chars().count() <= 4, "{text}");
    }
    assert!(
        addr.keys()
            .all(|k| ["zip", "country", "note"].contains(&k.as_str())),
        "{text}"
    );
    let scores = o["scores"].as_array().unwrap();
    assert!(scores.len() <= 2, "{text}");
    assert!(
        scores
            .iter()
            .all(|s| int(s).is_some_and(|s| (-5..=5).contains(&s))),
        "{text}"
    );
    if let Some(ok) = o.get("ok") {
        assert!(ok.is_boolean(), "{text}");
    }
}

enum Pick {
    Random,
    Longest,
    /// A token of whitespace alone whenever one is allowed (a model that
    /// has started a run of newlines and keeps going).
    Whitespace,
}

/// Walks until the grammar is complete (then takes a stop id), taking a
/// stop id where allowed now and then, preferring tokens without
/// whitespace so unbounded whitespace cannot go on forever.
fn walk(vocab: &StructuredVocab, g: &CompiledGrammar, rng: &mut Rng, pick: &Pick) -> String {
    let mut m = g.matcher();
    let mut text = Vec::new();
    for _ in 0..2000 {
        let got = allowed(&mask_of(&mut m, vocab.mask_words()), vocab.vocab_size());
        let stops: Vec<u32> = got
            .iter()
            .copied()
            .filter(|t| vocab.stop_ids().contains(t))
            .collect();
        let words: Vec<u32> = got.iter().copied().filter(|t| !stops.contains(t)).collect();
        let plain: Vec<u32> = words
            .iter()
            .copied()
            .filter(|&t| !vocab.trie_bytes(t).iter().any(u8::is_ascii_whitespace))
            .collect();
        let blank: Vec<u32> = words
            .iter()
            .copied()
            .filter(|&t| {
                let b = vocab.trie_bytes(t);
                !b.is_empty() && b.iter().all(u8::is_ascii_whitespace)
            })
            .collect();
        let pool = if matches!(pick, Pick::Whitespace) && !blank.is_empty() {
            &blank
        } else if plain.is_empty() {
            &words
        } else {
            &plain
        };
        if pool.is_empty() || !stops.is_empty() && rng.below(3) == 0 {
            assert!(
                !stops.is_empty(),
                "dead end after {:?}",
                String::from_utf8_lossy(&text)
            );
            assert!(m.accept_token(stops[0]));
            return String::from_utf8(text).unwrap();
        }
        let tok = match pick {
            Pick::Random | Pick::Whitespace => pool[rng.below(pool.len())],
            Pick::Longest => {
                let best = pool
                    .iter()
                    .map(|&t| vocab.trie_bytes(t).len())
                    .max()
                    .unwrap();
                let longest: Vec<u32> = pool
                    .iter()
                    .copied()
                    .filter(|&t| vocab.trie_bytes(t).len() == best)
                    .collect();
                longest[rng.below(longest.len())]
            }
        };
        assert!(m.accept_token(tok), "refused {tok}");
        text.extend_from_slice(vocab.trie_bytes(tok));
    }
    panic!(
        "no end after 2000 tokens: {}",
        String::from_utf8_lossy(&text)
    );
}

/// The runs of whitespace between JSON tokens (outside strings).
fn whitespace_runs(text: &str) -> Vec<String> {
    let (mut in_string, mut escaped) = (false, false);
    let (mut runs, mut run) = (Vec::new(), String::new());
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c.is_ascii_whitespace() {
            run.push(c);
        } else {
            runs.extend((!run.is_empty()).then(|| std::mem::take(&mut run)));
            in_string = c == '"';
        }
    }
    runs.extend((!run.is_empty()).then_some(run));
    runs
}

/// Every run of whitespace between JSON tokens is one space, or one or two
/// newlines and at most 20 spaces or tabs (llama.cpp's rule, the default).
fn assert_bounded_whitespace(text: &str) {
    for run in whitespace_runs(text) {
        let newlines = run.chars().take_while(|&c| c == '\n').count();
        let rest = &run[newlines..];
        let ok = run == " "
            || ((1..=2).contains(&newlines)
                && rest.len() <= 20
                && rest.chars().all(|c| c == ' ' || c == '\t'));
        assert!(ok, "whitespace {run:?} in {text:?}");
    }
}

fn run(vocab: &StructuredVocab, whitespace_pattern: Option<&str>, walks: usize, seed: u64) {
    let c = compiler(vocab);
    let g = c
        .compile(&Constraint::Json {
            schema: schema(),
            format: whitespace_pattern.map_or_else(JsonFormat::default, JsonFormat::pattern),
        })
        .unwrap();
    let mut rng = Rng(seed);
    for i in 0..walks {
        let pick = match i % 4 {
            2 => Pick::Longest,
            3 => Pick::Whitespace,
            _ => Pick::Random,
        };
        let text = walk(vocab, &g, &mut rng, &pick);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        check_value(&v, &text);
        match whitespace_pattern {
            Some("") => assert_eq!(whitespace_runs(&text), Vec::<String>::new(), "{text}"),
            None => {
                assert_bounded_whitespace(&text);
                // The whitespace-first walk reaches the bound: the check above
                // has runs to judge.
                if matches!(pick, Pick::Whitespace) {
                    let runs = whitespace_runs(&text);
                    assert!(runs.iter().any(|r| r.len() > 3), "{text:?}");
                }
            }
            Some(_) => {}
        }
        if i < 3 {
            eprintln!("{text}");
        }
    }
}

#[test]
fn json_walks_on_qwen2_meet_the_schema() {
    run(&qwen_vocab(), None, 12, 1);
    run(&qwen_vocab(), Some(" ?"), 12, 2);
}

#[test]
fn json_walks_on_bytes_meet_the_schema() {
    run(&builtin_vocab(), Some(""), 12, 3);
}

#[test]
fn json_object_walks_parse_as_objects() {
    let vocab = qwen_vocab();
    let c = compiler(&vocab);
    let g = c
        .compile(&Constraint::JsonObject {
            format: JsonFormat::pattern(""),
        })
        .unwrap();
    let mut rng = Rng(4);
    for _ in 0..10 {
        let text = walk(&vocab, &g, &mut rng, &Pick::Random);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(v.is_object(), "{text}");
    }
}
