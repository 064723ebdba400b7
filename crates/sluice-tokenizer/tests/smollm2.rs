//! SmolLM2-135M-Instruct's tokenizer from its real GGUF file against Hugging
//! Face's (tests/data/smollm2_reference.json, written by
//! tests/data/make_smollm2_reference.py): encode with and without special
//! tokens, decode with and without skipping them, the chat template.

mod common;

use serde_json::Value;
use sluice_tokenizer::{ChatMessage, Tokenizer};

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/smollm2_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn smollm2() -> Tokenizer {
    let vocab = common::read_vocab(&common::smollm2_gguf());
    assert_eq!(vocab.model, "gpt2");
    assert_eq!(vocab.pre.as_deref(), Some("smollm"));
    Tokenizer::from_gguf_vocab(&vocab).unwrap()
}

#[test]
fn smollm2_matches_hugging_face() {
    let tok = smollm2();
    let r = reference();
    assert_eq!(tok.vocab_size() as u64, r["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos_token(), r["bos_token"].as_str());
    assert_eq!(tok.eos_token(), r["eos_token"].as_str());
    let texts = r["texts"].as_array().unwrap();
    assert!(texts.len() >= 30);
    let mut failures = Vec::new();
    for t in texts {
        let (name, text) = (t["name"].as_str().unwrap(), t["text"].as_str().unwrap());
        let with = tok.encode(text, true).unwrap();
        let without = tok.encode(text, false).unwrap();
        if with != ids(&t["ids"]) {
            failures.push(format!(
                "{name}: encode(.., true) = {with:?}, want {:?}",
                t["ids"]
            ));
        }
        if without != ids(&t["ids_no_special"]) {
            failures.push(format!(
                "{name}: encode(.., false) = {without:?}, want {:?}",
                t["ids_no_special"]
            ));
        }
        let ref_ids = ids(&t["ids"]);
        let decoded = tok.decode(&ref_ids, false).unwrap();
        if decoded != t["decoded"].as_str().unwrap() {
            failures.push(format!(
                "{name}: decode(.., false) = {decoded:?}, want {:?}",
                t["decoded"]
            ));
        }
        let skipped = tok.decode(&ref_ids, true).unwrap();
        if skipped != t["decoded_skip_special"].as_str().unwrap() {
            failures.push(format!(
                "{name}: decode(.., true) = {skipped:?}, want {:?}",
                t["decoded_skip_special"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_chat_template_matches_hugging_face() {
    let tok = smollm2();
    let chat = &reference()["chat"];
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let add_generation_prompt = chat["add_generation_prompt"].as_bool().unwrap();
    let rendered = tok
        .apply_chat_template(&messages, add_generation_prompt)
        .unwrap();
    assert_eq!(rendered, chat["rendered"].as_str().unwrap());
    assert_eq!(
        tok.encode_chat(&messages, add_generation_prompt).unwrap(),
        ids(&chat["ids"])
    );
}

#[test]
fn smollm2_special_tokens() {
    let tok = smollm2();
    // tokenizer.ggml.bos/eos/unknown/padding ids: 1, 2, 0, 2; no BOS added
    // (add_bos_token = false), no EOT key.
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_id(), Some(2));
    assert_eq!(tok.eot_token_id(), None);
    assert_eq!(tok.stop_token_ids(), vec![2]);
    assert!(!tok.add_bos_token());
    assert!(tok.warnings().is_empty(), "{:?}", tok.warnings());
    // The 17 control tokens (<|endoftext|> .. <empty_output>) are special.
    assert!((0..17).all(|id| tok.is_special(id)));
    assert!(!tok.is_special(17));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
}

#[test]
fn smollm2_token_bytes_concatenate_to_the_text() {
    let tok = smollm2();
    for id in 0..tok.vocab_size() as u32 {
        assert!(tok.token_bytes(id).is_some_and(|b| !b.is_empty()), "{id}");
    }
    for text in [
        "hello world",
        "café déjà vu, naïve Ørsted",
        "日本語のテキストと中文",
        "emoji 🦀🎉👍🏽 and ZWJ 👩‍💻",
        "tabs\tand\nnewlines\r\n\n  ",
        "{\"key\": [1, 2.5e-3, true, null]}",
        "<|im_start|>user\nhi<|im_end|>",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_bytes(id).unwrap())
            .collect();
        assert_eq!(bytes, text.as_bytes(), "{text:?}: {ids:?}");
    }
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(tok.is_special(im_end));
    assert_eq!(tok.token_bytes(im_end).unwrap(), b"<|im_end|>");
}
