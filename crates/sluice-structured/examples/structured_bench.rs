//! Prints what structured outputs cost: building the vocabulary and the
//! compiler, compiling constraints (first time and cached), making a
//! matcher (deep copy vs shared lexer), and `fill_bitmask` per decode step
//! along seeded JSON walks, on tiny-qwen2's vocabulary and, when
//! `SLUICE_SMOLLM2_GGUF` names the file, SmolLM2's 49k one.
//!
//! `cargo run --release -p sluice-structured --example structured_bench`
//! (figures from a debug build say little about llguidance).

// The GGUF metadata reader of sluice-tokenizer's tests, reused rather than
// copied (sluice-gguf's reader lives behind sluice-model's loader).
// (It allows its own dead code.)
#[path = "../../sluice-tokenizer/tests/common/mod.rs"]
mod gguf_common;

use serde_json::json;
use sluice_structured::{
    CompiledGrammar, Constraint, GrammarCompiler, JsonFormat, StructuredVocab,
};
use sluice_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn schema() -> Constraint {
    Constraint::Json {
        schema: json!({
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
                        "note": {"type": "string", "maxLength": 40}
                    },
                    "required": ["zip", "country"]
                },
                "scores": {"type": "array", "items": {"type": "number"}},
                "ok": {"type": "boolean"}
            },
            "required": ["name", "age", "tags", "address", "scores"]
        }),
        format: JsonFormat::pattern("[ ]?"),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
    }
}

/// Seeded walks; returns every fill_bitmask duration.
fn walk_times(
    vocab: &StructuredVocab,
    g: &CompiledGrammar,
    walks: usize,
    deep: bool,
) -> Vec<Duration> {
    let mut rng = Rng(7);
    let mut times = Vec::new();
    let mut mask = vec![0u32; vocab.mask_words()];
    for _ in 0..walks {
        let mut m = if deep {
            g.matcher()
        } else {
            g.matcher_sharing_lexer()
        };
        for _ in 0..400 {
            let t0 = Instant::now();
            m.fill_bitmask(&mut mask);
            times.push(t0.elapsed());
            let allowed: Vec<u32> = (0..vocab.vocab_size() as u32)
                .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
                .collect();
            let stops: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|t| vocab.stop_ids().contains(t))
                .collect();
            let words: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|t| !stops.contains(t))
                .collect();
            if words.is_empty() || !stops.is_empty() && rng.below(4) == 0 {
                break;
            }
            let tok = words[rng.below(words.len())];
            if !m.accept_token(tok) {
                panic!("refused an allowed token");
            }
        }
    }
    times
}

fn summary(label: &str, mut t: Vec<Duration>) {
    t.sort();
    let n = t.len();
    let mean = t.iter().sum::<Duration>() / n as u32;
    println!(
        "  {label}: {n} calls, mean {}, median {}, p90 {}, p99 {}, max {}",
        us(mean),
        us(t[n / 2]),
        us(t[n * 9 / 10]),
        us(t[n * 99 / 100]),
        us(t[n - 1])
    );
}

fn bench(name: &str, tok: Tokenizer, logits: usize) {
    println!("== {name}: {} tokens, {logits} logits", tok.vocab_size());
    let stops = tok.stop_token_ids();
    let t0 = Instant::now();
    let vocab = StructuredVocab::new(Arc::new(tok), logits, &stops).unwrap();
    println!("  StructuredVocab::new: {}", ms(t0.elapsed()));
    let t0 = Instant::now();
    let c = GrammarCompiler::new(vocab.clone(), 2, 64).unwrap();
    println!(
        "  GrammarCompiler::new (parser factory, slicer): {}",
        ms(t0.elapsed())
    );

    let constraints = [
        ("json schema", schema()),
        (
            "json_object",
            Constraint::JsonObject {
                format: JsonFormat::default(),
            },
        ),
        (
            "regex",
            Constraint::Regex(r"\d{3}-\d{4} [A-Za-z ]{1,20}".into()),
        ),
        (
            "choice",
            Constraint::Choice(vec!["positive".into(), "negative".into(), "neutral".into()]),
        ),
        (
            "lark",
            Constraint::Grammar(
                "start: \"SELECT \" col (\", \" col)* \" FROM t\"\ncol: /[a-z_]{1,12}/".into(),
            ),
        ),
    ];
    for (label, con) in &constraints {
        let t0 = Instant::now();
        c.compile(con).unwrap();
        let first = t0.elapsed();
        let t0 = Instant::now();
        c.compile(con).unwrap();
        let cached = t0.elapsed();
        println!(
            "  compile {label}: first {}, cached {}",
            ms(first),
            us(cached)
        );
    }

    let g = c.compile(&schema()).unwrap();
    let n = 200;
    let t0 = Instant::now();
    for _ in 0..n {
        std::hint::black_box(g.matcher());
    }
    let deep = t0.elapsed() / n;
    let t0 = Instant::now();
    for _ in 0..n {
        std::hint::black_box(g.matcher_sharing_lexer());
    }
    let shallow = t0.elapsed() / n;
    println!(
        "  matcher(): {} (deep copy); matcher_sharing_lexer(): {}",
        us(deep),
        us(shallow)
    );

    summary(
        "fill_bitmask, json schema, matcher()",
        walk_times(&vocab, &g, 20, true),
    );
    summary(
        "fill_bitmask, json schema, shared lexer",
        walk_times(&vocab, &g, 20, false),
    );
    let g = c
        .compile(&Constraint::JsonObject {
            format: JsonFormat::default(),
        })
        .unwrap();
    summary(
        "fill_bitmask, json_object, matcher()",
        walk_times(&vocab, &g, 20, true),
    );

    // Two threads on one grammar: own lexers vs one shared lexer.
    let g = c.compile(&schema()).unwrap();
    for deep in [true, false] {
        let t0 = Instant::now();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let (vocab, g) = (vocab.clone(), g.clone());
                std::thread::spawn(move || walk_times(&vocab, &g, 20, deep).len())
            })
            .collect();
        let calls: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        let label = if deep { "matcher()" } else { "shared lexer" };
        println!(
            "  2 threads, {label}: {calls} masks (with walking) in {}",
            ms(t0.elapsed())
        );
    }
}

fn main() {
    let qwen =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/data/tiny-qwen2");
    bench("tiny-qwen2", Tokenizer::from_dir(&qwen).unwrap(), 1030);
    if let Some(path) = std::env::var_os("SLUICE_SMOLLM2_GGUF") {
        let vocab = gguf_common::read_vocab(std::path::Path::new(&path));
        let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
        let n = tok.vocab_size();
        bench("SmolLM2-135M", tok, n);
    } else {
        println!("(SLUICE_SMOLLM2_GGUF unset: SmolLM2 skipped)");
    }
}
