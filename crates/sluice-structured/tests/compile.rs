//! Compiling: errors carry a short useful message, the cache hits on a
//! second compile (errors too) and evicts past its capacity, compile_async
//! gives what compile gives, the pool survives bad constraints, and the
//! types are Send / Sync as the engine needs.

mod common;

use common::*;
use serde_json::json;
use sluice_structured::{
    CompileError, CompiledGrammar, Constraint, GrammarCompiler, GrammarMatcher, JsonFormat,
    PendingGrammar, StructuredVocab,
};
use std::sync::Arc;

fn error_of(c: &GrammarCompiler, constraint: Constraint) -> CompileError {
    match c.compile(&constraint) {
        Ok(_) => panic!("{constraint:?} compiled"),
        Err(e) => e,
    }
}

/// Short: no parser-state or grammar dump.
fn assert_short(e: &CompileError) {
    assert!(e.message.len() < 600, "{}", e.message);
    assert!(e.message.lines().count() <= 6, "{}", e.message);
    assert!(!e.message.contains("<state>") && !e.message.contains("<grammar>"));
}

#[test]
fn compile_errors_carry_a_useful_message() {
    let c = compiler(&builtin_vocab());
    let cases = [
        (json(json!({"type": "strin"})), "strin"),
        (
            json(json!({"type": "object", "properties": {"a": {"minimum": "x"}}})),
            "minimum",
        ),
        (
            json(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "",
        ),
        (Constraint::Regex("(ab".into()), ""),
        (Constraint::Regex("a{3,1}".into()), ""),
        (Constraint::Grammar("start: foo".into()), "foo"),
        (Constraint::Grammar("start: (\"a\"".into()), ""),
        (Constraint::Grammar("x: \"a\"".into()), "start"),
        (Constraint::Grammar("start: <|nope|>".into()), "nope"),
        (Constraint::Choice(vec![]), "at least one"),
        (
            Constraint::Json {
                schema: json!(false),
                format: JsonFormat::pattern(" "),
            },
            "false",
        ),
        (
            Constraint::JsonObject {
                format: JsonFormat::pattern("("),
            },
            "",
        ),
    ];
    for (constraint, needle) in cases {
        let e = error_of(&c, constraint.clone());
        eprintln!("{}: {}", constraint.kind(), e.message);
        assert!(!e.message.is_empty(), "{constraint:?}");
        assert!(
            e.message.to_lowercase().contains(needle),
            "{constraint:?}: {}",
            e.message
        );
        assert_short(&e);
        assert_eq!(e.to_string(), e.message);
    }
}

#[test]
fn the_cache_hits_on_a_second_compile_and_keeps_errors() {
    let c = compiler(&builtin_vocab());
    let a = json(json!({"type": "string", "maxLength": 3}));
    c.compile(&a).unwrap();
    assert_eq!(c.cache_stats(), (0, 1));
    c.compile(&a).unwrap();
    assert_eq!(c.cache_stats(), (1, 1));
    let bad = Constraint::Regex("(".into());
    let e1 = c.compile(&bad).unwrap_err();
    let e2 = c.compile(&bad).unwrap_err();
    assert_eq!(e1, e2);
    assert_eq!(c.cache_stats(), (2, 2));
    // Clones share the cache.
    c.clone().compile(&a).unwrap();
    assert_eq!(c.cache_stats(), (3, 2));
}

#[test]
fn the_cache_is_bounded() {
    let c = GrammarCompiler::new(builtin_vocab(), 1, 2).unwrap();
    let rx = |i: usize| Constraint::Regex(format!("a{{{i}}}"));
    c.compile(&rx(1)).unwrap();
    c.compile(&rx(2)).unwrap();
    c.compile(&rx(1)).unwrap(); // hit; 2 is now the oldest
    c.compile(&rx(3)).unwrap(); // evicts 2
    assert_eq!(c.cache_stats(), (1, 3));
    c.compile(&rx(1)).unwrap();
    c.compile(&rx(3)).unwrap();
    assert_eq!(c.cache_stats(), (3, 3));
    c.compile(&rx(2)).unwrap();
    assert_eq!(c.cache_stats(), (3, 4));
    // Capacity 0 caches nothing.
    let none = GrammarCompiler::new(builtin_vocab(), 1, 0).unwrap();
    none.compile(&rx(1)).unwrap();
    none.compile(&rx(1)).unwrap();
    assert_eq!(none.cache_stats(), (0, 2));
}

/// Every token's mask along one fixed path.
fn masks_along(vocab: &StructuredVocab, g: &CompiledGrammar, path: &[u32]) -> Vec<Vec<u32>> {
    let mut m = g.matcher();
    let mut out = vec![mask_of(&mut m, vocab.mask_words())];
    for &t in path {
        assert!(m.accept_token(t));
        out.push(mask_of(&mut m, vocab.mask_words()));
    }
    out
}

#[test]
fn compile_async_gives_what_compile_gives() {
    let vocab = builtin_vocab();
    let sync = GrammarCompiler::new(vocab.clone(), 1, 0).unwrap();
    let pool = GrammarCompiler::new(vocab.clone(), 3, 0).unwrap();
    let schema = json(
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    );
    let path: Vec<u32> = b"{\"n\":12}".iter().map(|&b| u32::from(b)).collect();
    let want = masks_along(&vocab, &sync.compile(&schema).unwrap(), &path);
    // Several at once, polled.
    let mut pending: Vec<PendingGrammar> =
        (0..6).map(|_| pool.compile_async(schema.clone())).collect();
    let mut done = Vec::new();
    while !pending.is_empty() {
        pending.retain_mut(|p| match p.try_take() {
            Some(r) => {
                done.push(r.unwrap());
                false
            }
            None => true,
        });
        std::thread::yield_now();
    }
    for g in &done {
        assert_eq!(masks_along(&vocab, g, &path), want);
    }
    // wait() blocks; errors come back the same way; try_take after taking
    // is None.
    assert_eq!(
        masks_along(
            &vocab,
            &pool.compile_async(schema.clone()).wait().unwrap(),
            &path
        ),
        want
    );
    let bad = Constraint::Regex("[".into());
    assert_eq!(
        pool.compile_async(bad.clone()).wait().unwrap_err(),
        sync.compile(&bad).unwrap_err()
    );
    let mut p = pool.compile_async(Constraint::Regex("x".into()));
    let r = loop {
        if let Some(r) = p.try_take() {
            break r;
        }
        std::thread::yield_now();
    };
    assert!(r.is_ok());
    assert!(p.try_take().is_none());
    // A cached grammar is ready at once.
    let cached = GrammarCompiler::new(vocab, 1, 4).unwrap();
    cached.compile(&schema).unwrap();
    assert!(cached.compile_async(schema).try_take().is_some());
}

#[test]
fn the_pool_survives_bad_constraints_and_outlives_nothing() {
    let c = GrammarCompiler::new(builtin_vocab(), 1, 0).unwrap();
    for i in 0..20 {
        let p = c.compile_async(Constraint::Grammar(format!("start: x{i}")));
        assert!(p.wait().is_err());
    }
    assert!(c
        .compile_async(Constraint::Regex("ok".into()))
        .wait()
        .is_ok());
    // A pending result outlives the compiler that made it.
    let p = c.compile_async(Constraint::Regex("later".into()));
    drop(c);
    assert!(p.wait().is_ok());
}

#[test]
fn matchers_are_independent_and_cross_threads() {
    let vocab = builtin_vocab();
    let c = compiler(&vocab);
    let g = c
        .compile(&Constraint::Choice(vec!["abc".into(), "abd".into()]))
        .unwrap();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let g = g.clone();
            let shared = i % 2 == 0;
            std::thread::spawn(move || {
                let mut m = if shared {
                    g.matcher_sharing_lexer()
                } else {
                    g.matcher()
                };
                let last = if i < 2 { b'c' } else { b'd' };
                for _ in 0..50 {
                    let mut out = vec![0; 9];
                    m.fill_bitmask(&mut out);
                    assert!(m.accept_tokens(&[u32::from(b'a'), u32::from(b'b'), u32::from(last)]));
                    assert!(m.is_terminated());
                    assert!(m.rollback(3));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // The template is untouched by its matchers.
    let mut m = g.matcher();
    assert_eq!(allowed(&mask_of(&mut m, 9), 259), vec![u32::from(b'a')]);
}

#[test]
fn vocab_rejects_bad_stop_ids() {
    let tok = Arc::new(sluice_tokenizer::Tokenizer::builtin());
    assert!(StructuredVocab::new(tok.clone(), 259, &[]).is_err());
    let e = StructuredVocab::new(tok.clone(), 259, &[259]).unwrap_err();
    assert!(e.to_string().contains("259"), "{e}");
    assert!(StructuredVocab::new(tok.clone(), 0, &[0]).is_err());
    // A logits width below the tokenizer's just leaves the rest out.
    let v = StructuredVocab::new(tok.clone(), 200, &[10]).unwrap();
    assert_eq!((v.vocab_size(), v.mask_words()), (200, 7));
    let v = StructuredVocab::new(tok, 320, &[258, 258, 256]).unwrap();
    assert_eq!(v.stop_ids(), &[258, 256]);
    assert_eq!(v.mask_words(), 10);
    assert!(v.trie_bytes(300).is_empty() && v.trie_bytes(9999).is_empty());
    assert_eq!(v.trie_bytes(258), b"\xff<|im_end|>");
    let c = GrammarCompiler::new(v, 1, 1).unwrap();
    assert_eq!((c.vocab_size(), c.mask_words()), (320, 10));
}

#[test]
fn types_are_send_and_sync_where_promised() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    sync::<GrammarCompiler>();
    sync::<CompiledGrammar>();
    sync::<StructuredVocab>();
    send::<PendingGrammar>();
    send::<GrammarMatcher>();
}
