//! llama.cpp's vocabulary test files against `Tokenizer::from_gguf_vocab`:
//! `models/ggml-vocab-NAME.gguf` (vocabulary-only GGUFs) with `.inp` texts
//! and `.out` ids, which llama.cpp's `convert_hf_to_gguf_update.py` wrote with
//! each model's Hugging Face tokenizer (`encode(text, add_special_tokens =
//! False)`). They are too big to commit: `.ci/test` extracts llama.cpp's
//! `models/` from the source distribution of PyPI's `llama-cpp-python`
//! (pinned, checked by sha256) and points `SLUICE_LLAMA_CPP_MODELS` at it;
//! without it the test fails saying so.
//!
//!     SLUICE_LLAMA_CPP_MODELS=DIR/models cargo test -p sluice-tokenizer --test llama_cpp_vocabs

mod common;

use sluice_tokenizer::Tokenizer;
use std::path::Path;

/// Every vocabulary whose `tokenizer.ggml.model` / `pre` sluice supports.
const VOCABS: &[&str] = &[
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "starcoder",
    "refact",
    "deepseek-coder",
    "falcon",
    "llama-spm",
    "phi-3",
];

#[test]
fn llama_cpp_vocabularies_match_hugging_face() {
    let dir = common::llama_cpp_models();
    let read = |path: &Path| {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let mut failures = Vec::new();
    for name in VOCABS {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let tok = Tokenizer::from_gguf_vocab(&common::read_vocab(&path))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let inp = read(&path.with_extension("gguf.inp"));
        let out = read(&path.with_extension("gguf.out"));
        // Each text ends with the separator line, each id list with a
        // newline: both split into the same number of pieces, the last empty.
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let want: Vec<&str> = out.split('\n').collect();
        assert_eq!(
            texts.len(),
            want.len(),
            "{name}: {} texts but {} id lists",
            texts.len(),
            want.len()
        );
        let mut bad = 0;
        for (text, want) in texts.iter().zip(&want) {
            let want: Vec<u32> = want
                .split_whitespace()
                .map(|x| {
                    x.parse()
                        .unwrap_or_else(|e| panic!("{name}.out: {x:?}: {e}"))
                })
                .collect();
            let got = tok.encode(text, false).unwrap();
            if got != want {
                bad += 1;
                failures.push(format!("{name}: {text:?}: got {got:?}, want {want:?}"));
            }
        }
        eprintln!("{name}: {} texts, {bad} wrong", texts.len());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The vocabularies of llama.cpp's test set sluice does not support are
/// refused at load, naming the metadata key and its value, not mis-tokenized.
#[test]
fn unsupported_llama_cpp_vocabularies_are_refused_naming_the_key() {
    let dir = common::llama_cpp_models();
    for (name, key, value) in [
        ("mpt", "tokenizer.ggml.pre", "\"mpt\""),
        ("command-r", "tokenizer.ggml.pre", "\"command-r\""),
        ("deepseek-llm", "tokenizer.ggml.pre", "\"deepseek-llm\""),
        ("bert-bge", "tokenizer.ggml.model", "\"bert\""),
    ] {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let err = match Tokenizer::from_gguf_vocab(&common::read_vocab(&path)) {
            Ok(_) => panic!("{name}: loaded, but sluice has no {key} = {value}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(key) && err.contains(value), "{name}: {err}");
    }
}
