//! llama.cpp's vocabulary test files against `Tokenizer::from_gguf_vocab`:
//! `models/ggml-vocab-NAME.gguf` (vocabulary-only GGUFs) with `.inp` texts
//! and `.out` ids, which llama.cpp's `convert_hf_to_gguf_update.py` wrote with
//! each model's Hugging Face tokenizer (`encode(text, add_special_tokens =
//! False)`). They are too big to commit, so this runs only when asked:
//!
//!     SLUICE_LLAMA_CPP_MODELS=/path/to/llama.cpp/models \
//!         cargo test -p sluice-tokenizer --test llama_cpp_vocabs -- --ignored

mod common;

use sluice_tokenizer::Tokenizer;
use std::path::PathBuf;

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
#[ignore = "needs llama.cpp's models/ directory in SLUICE_LLAMA_CPP_MODELS"]
fn llama_cpp_vocabularies_match_hugging_face() {
    let dir = PathBuf::from(
        std::env::var_os("SLUICE_LLAMA_CPP_MODELS")
            .expect("set SLUICE_LLAMA_CPP_MODELS to llama.cpp's models/ directory"),
    );
    let mut failures = Vec::new();
    for name in VOCABS {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let tok = Tokenizer::from_gguf_vocab(&common::read_vocab(&path))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let want: Vec<&str> = out.split('\n').collect();
        let mut bad = 0;
        for (text, want) in texts.iter().zip(&want) {
            let want: Vec<u32> = want
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            let got = tok.encode(text, false).unwrap();
            if got != want {
                bad += 1;
                failures.push(format!("{name}: {text:?}: got {got:?}, want {want:?}"));
            }
        }
        eprintln!("{name}: {} texts, {bad} wrong", texts.len().min(want.len()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
