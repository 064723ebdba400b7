//! `Tokenizer::from_gguf_vocab` on small vocabularies built here: byte-level
//! (`gpt2`) and SentencePiece (`llama`) ones, the pre-tokenizer choice, token
//! types, BOS handling, an embedded tokenizer.json, and the errors.

use sluice_tokenizer::gguf::token_type::{BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED};
use sluice_tokenizer::{ChatMessage, GgufVocab, Tokenizer};

/// GPT-2's byte ↦ character table.
fn byte_char(b: u8) -> char {
    let mut next = 256u32;
    for x in 0..=255u8 {
        let printable = matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable { x as u32 } else { next };
        if !printable {
            next += 1;
        }
        if x == b {
            return char::from_u32(code).unwrap();
        }
    }
    unreachable!()
}

/// A byte-level vocabulary: ids 0..=255 the bytes, then the merged tokens
/// of `merges` (in order), then `<|endoftext|>` (control) and `<think>`
/// (user-defined).
fn gpt2_vocab(pre: &str, merges: &[&str]) -> GgufVocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![NORMAL; tokens.len()];
    tokens.push("<|endoftext|>".into());
    types.push(CONTROL);
    tokens.push("<think>".into());
    types.push(USER_DEFINED);
    let eos = tokens.len() as u32 - 2;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges.iter().map(|m| m.to_string()).collect()),
        bos_token_id: Some(eos),
        eos_token_id: Some(eos),
        chat_template: Some(
            "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                .into(),
        ),
        ..Default::default()
    }
}

fn id(tok: &Tokenizer, s: &str) -> u32 {
    tok.token_to_id(s)
        .unwrap_or_else(|| panic!("{s:?} not in the vocabulary"))
}

#[test]
fn gpt2_vocabulary_encodes_with_merges_and_added_tokens() {
    let tok = Tokenizer::from_gguf_vocab(&gpt2_vocab("gpt-2", &["h e", "Ġ he", "Ġhe y"])).unwrap();
    let (endoftext, think) = (id(&tok, "<|endoftext|>"), id(&tok, "<think>"));
    let text = " hey he<think>x<|endoftext|>";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(
        ids,
        vec![
            id(&tok, "Ġhey"),
            id(&tok, "Ġhe"),
            think,
            b'x' as u32,
            endoftext
        ]
    );
    // gpt2 vocabularies add no BOS unless the file asks.
    assert!(!tok.add_bos_token());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // Control tokens are special; user-defined ones are text.
    assert_eq!(tok.decode(&ids, true).unwrap(), " hey he<think>x");
    assert!(tok.is_special(endoftext) && !tok.is_special(think));
    assert_eq!(tok.vocab_size(), 256 + 3 + 2);
    // Bytes that are not UTF-8 decode to U+FFFD.
    assert_eq!(tok.decode(&[0xC3], false).unwrap(), "\u{FFFD}");
    // The chat template from the file, with the BOS's text in scope.
    let chat = tok
        .apply_chat_template(&[ChatMessage::new("user", "hi")], false)
        .unwrap();
    assert_eq!(chat, "<|endoftext|><user>hi");
}

#[test]
fn the_pre_tokenizer_decides_the_split() {
    // GPT-2 keeps " 12" one piece (so "Ġ12" is reachable); Qwen2 and SmolLM
    // split every digit, and the space alone; Llama 3 keeps up to three
    // digits together, apart from the space.
    let merges = ["Ġ 1", "Ġ1 2", "1 2"];
    let gpt2 = Tokenizer::from_gguf_vocab(&gpt2_vocab("gpt-2", &merges)).unwrap();
    assert_eq!(gpt2.encode(" 12", false).unwrap(), vec![id(&gpt2, "Ġ12")]);
    let space = u32::from(b' ');
    for pre in ["qwen2", "smollm"] {
        let tok = Tokenizer::from_gguf_vocab(&gpt2_vocab(pre, &merges)).unwrap();
        assert_eq!(
            tok.encode(" 12", false).unwrap(),
            vec![space, u32::from(b'1'), u32::from(b'2')],
            "{pre}"
        );
    }
    let llama3 = Tokenizer::from_gguf_vocab(&gpt2_vocab("llama-bpe", &merges)).unwrap();
    assert_eq!(
        llama3.encode(" 12", false).unwrap(),
        vec![space, id(&llama3, "12")]
    );
}

#[test]
fn llama3_ignores_merges_and_adds_the_bos() {
    // "abc" is a token with no merges that build it: only Llama 3's
    // `ignore_merges` finds it.
    let mut vocab = gpt2_vocab("llama-bpe", &[]);
    vocab.tokens.push("abc".into());
    vocab.token_types.as_mut().unwrap().push(NORMAL);
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let abc = id(&tok, "abc");
    let bos = tok.bos_token_id().unwrap();
    assert!(tok.add_bos_token());
    assert_eq!(tok.encode("abc", true).unwrap(), vec![bos, abc]);
    assert_eq!(tok.encode("abc", false).unwrap(), vec![abc]);

    // The file's add_bos_token wins over llama.cpp's default.
    vocab.add_bos_token = Some(false);
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    assert!(!tok.add_bos_token());
    assert_eq!(tok.encode("abc", true).unwrap(), vec![abc]);

    let mut gpt2 = vocab.clone();
    gpt2.pre = Some("gpt-2".into());
    gpt2.add_bos_token = None;
    gpt2.add_eos_token = Some(true);
    let tok = Tokenizer::from_gguf_vocab(&gpt2).unwrap();
    assert_eq!(
        tok.encode("abc", true).unwrap(),
        vec![
            b'a' as u32,
            b'b' as u32,
            b'c' as u32,
            tok.eos_token_id().unwrap()
        ]
    );
}

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte
/// tokens, then pieces with scores (higher merges first).
fn llama_vocab() -> GgufVocab {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
        scores.push(0.0);
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -3.0),
        ("e", -4.0),
        ("l", -5.0),
        ("o", -6.0),
        ("▁h", -7.0),
        ("▁hi", -8.0),
        ("hi", -9.0),
        ("ll", -10.0),
        ("▁he", -11.0),
        ("▁hell", -12.0),
        ("▁hello", -13.0),
        ("▁▁", -14.0),
    ] {
        tokens.push(piece.into());
        types.push(NORMAL);
        scores.push(score);
    }
    GgufVocab {
        model: "llama".into(),
        pre: Some("default".into()),
        tokens,
        token_types: Some(types),
        scores: Some(scores),
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unknown_token_id: Some(0),
        ..Default::default()
    }
}

#[test]
fn llama_vocabulary_is_sentencepiece_with_byte_fallback() {
    let tok = Tokenizer::from_gguf_vocab(&llama_vocab()).unwrap();
    let p = |s: &str| id(&tok, s);
    // The dummy prefix makes "hello" "▁hello"; the BOS is llama's default.
    assert!(tok.add_bos_token());
    assert_eq!(
        tok.encode("hello hi", true).unwrap(),
        vec![1, p("▁hello"), p("▁hi")]
    );
    // A leading space is kept besides the dummy prefix: "▁▁hi".
    assert_eq!(tok.encode(" hi", false).unwrap(), vec![p("▁"), p("▁hi")]);
    // After a special token the text gets its dummy prefix again (as in
    // llama.cpp and Llama 2's tokenizer.json).
    assert_eq!(tok.encode("<s>hi", false).unwrap(), vec![1, p("▁hi")]);
    // Characters without a piece fall back to their UTF-8 bytes.
    let e_acute = tok.encode("é", false).unwrap();
    assert_eq!(e_acute, vec![p("▁"), p("<0xC3>"), p("<0xA9>")]);
    assert_eq!(tok.decode(&e_acute, false).unwrap(), "é");
    // Decoding drops the dummy prefix's space and skips specials on request.
    let ids = tok.encode("hello hi", true).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello hi");
    assert!(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
    assert!(!tok.is_special(p("▁hi")));
    assert_eq!(tok.vocab_size(), 3 + 256 + 14);

    // Without the dummy prefix, "hi" is the bare piece.
    let mut vocab = llama_vocab();
    vocab.add_space_prefix = Some(false);
    vocab.add_bos_token = Some(false);
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap(), vec![id(&tok, "hi")]);
    assert_eq!(tok.decode(&[id(&tok, "▁hi")], false).unwrap(), " hi");
}

#[test]
fn embedded_tokenizer_json_wins() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-qwen2");
    let json = std::fs::read_to_string(format!("{dir}/tokenizer.json")).unwrap();
    let from_dir = Tokenizer::from_dir(std::path::Path::new(dir)).unwrap();
    let tokens: Vec<String> = (0..from_dir.vocab_size() as u32)
        .map(|i| from_dir.id_to_token(i).unwrap())
        .collect();
    let vocab = GgufVocab {
        // A model the GGUF path could not build: the JSON is used instead.
        model: "t5".into(),
        tokens,
        eos_token_id: from_dir.eos_token_id(),
        huggingface_json: Some(json),
        ..Default::default()
    };
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    for text in [
        "Hello, world!",
        "<|im_start|>user\n数字 123<|im_end|>",
        "  e\u{301}  ",
    ] {
        assert_eq!(
            tok.encode(text, true).unwrap(),
            from_dir.encode(text, true).unwrap(),
            "{text:?}"
        );
    }
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert!(tok.is_special(999));
    assert!(format!("{tok:?}").contains("tokenizer.huggingface.json"));
}

fn error(vocab: &GgufVocab) -> String {
    format!("{:#}", Tokenizer::from_gguf_vocab(vocab).unwrap_err())
}

#[test]
fn unknown_pre_tokenizer_is_an_error_naming_it() {
    let err = error(&gpt2_vocab("nonesuch-bpe", &[]));
    assert!(
        err.contains("tokenizer.ggml.pre") && err.contains("nonesuch-bpe"),
        "{err}"
    );
    assert!(err.contains("smollm"), "lists the known values: {err}");
}

#[test]
fn missing_pre_tokenizer_is_llama_cpps_default() {
    let mut vocab = gpt2_vocab("default", &["1 2"]);
    vocab.pre = None;
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    // default splits runs of digits from what precedes them.
    assert_eq!(
        tok.encode("a12", false).unwrap(),
        vec![b'a' as u32, id(&tok, "12")]
    );
}

#[test]
fn gpt2_without_merges_is_a_clear_error() {
    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.merges = None;
    let err = error(&vocab);
    assert!(err.contains("tokenizer.ggml.merges is missing"), "{err}");
}

#[test]
fn bad_metadata_is_an_error_naming_the_key() {
    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.model = "t5".into();
    let err = error(&vocab);
    assert!(
        err.contains("tokenizer.ggml.model") && err.contains("t5"),
        "{err}"
    );

    let mut vocab = llama_vocab();
    vocab.scores = None;
    assert!(error(&vocab).contains("tokenizer.ggml.scores is missing"));

    let mut vocab = llama_vocab();
    vocab.scores.as_mut().unwrap().pop();
    assert!(error(&vocab).contains("tokenizer.ggml.scores has"));

    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.token_types.as_mut().unwrap().pop();
    assert!(error(&vocab).contains("tokenizer.ggml.token_type has"));

    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.eos_token_id = Some(100_000);
    let err = error(&vocab);
    assert!(
        err.contains("tokenizer.ggml.eos_token_id = 100000"),
        "{err}"
    );

    let mut vocab = gpt2_vocab("gpt-2", &["x y"]);
    vocab.merges = Some(vec!["xy".into()]);
    assert!(error(&vocab).contains("tokenizer.ggml.merges[0]"));

    // A merge whose result is not a token.
    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.merges = Some(vec!["a b".into()]);
    assert!(error(&vocab).contains("tokenizer.ggml.merges"));

    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.chat_template = Some("{% for %}".into());
    assert!(error(&vocab).contains("tokenizer.chat_template"));

    assert!(error(&GgufVocab::default()).contains("tokenizer.ggml.tokens"));
}

#[test]
fn stray_optional_ids_are_warnings() {
    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.padding_token_id = Some(vocab.tokens.len() as u32);
    vocab.eot_token_id = Some(vocab.tokens.len() as u32 - 2);
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    assert_eq!(tok.warnings().len(), 1);
    assert!(tok.warnings()[0].contains("tokenizer.ggml.padding_token_id"));
    // EOS and EOT are the same token here: one stop id.
    assert_eq!(tok.stop_token_ids(), vec![tok.eos_token_id().unwrap()]);
}

#[test]
fn untyped_vocabulary_makes_the_special_ids_special() {
    let mut vocab = gpt2_vocab("gpt-2", &[]);
    vocab.token_types = None;
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let eos = tok.eos_token_id().unwrap();
    assert!(tok.is_special(eos));
    assert_eq!(
        tok.encode("a<|endoftext|>", false).unwrap(),
        vec![b'a' as u32, eos]
    );
    // <think> has no type, so it is ordinary text now.
    assert!(tok.encode("<think>", false).unwrap().len() > 1);
}

#[test]
fn gguf_vocab_reads_from_json() {
    let vocab: GgufVocab = serde_json::from_str(
        r#"{"model": "gpt2", "pre": "gpt-2", "tokens": ["a", "b", "ab"], "merges": ["a b"]}"#,
    )
    .unwrap();
    assert_eq!(vocab.bos_token_id, None);
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), vec![2]);
}
