//! The tokenizer and its chat templates against `transformers`' output.

use super::*;

use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn reference(name: &str) -> JsonValue {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &JsonValue) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_fixture(name: &str) {
    let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
    let r = reference(name);
    let prompts = r["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 6);
    for p in prompts {
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&p["input_ids"]),
            "{name}: prompt {:?}",
            p["name"]
        );
    }
    let chat = &r["chat"];
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let rendered = tok
        .apply_chat_template(&messages, chat["add_generation_prompt"].as_bool().unwrap())
        .unwrap();
    assert_eq!(rendered, chat["rendered_prompt"].as_str().unwrap());
    assert_eq!(
        tok.encode_chat(&messages, true).unwrap(),
        ids(&chat["input_ids"])
    );
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_fixture("tiny-qwen2");
    let tok = Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap();
    assert_eq!(tok.bos_token(), None);
    assert_eq!(tok.bos_token_id(), None);
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_id(), Some(999));
    assert!(tok.is_special(997) && tok.is_special(999) && !tok.is_special(5));
    assert_eq!(tok.vocab_size(), 1000);
}

#[test]
fn tiny_llama_matches_transformers() {
    check_fixture("tiny-llama");
    let tok = Tokenizer::from_dir(&fixture("tiny-llama")).unwrap();
    assert_eq!(tok.bos_token_id(), Some(1020));
    assert_eq!(tok.eos_token_id(), Some(1023));
}

#[test]
fn decode_round_trips_and_skips_specials() {
    let tok = Tokenizer::from_dir(&fixture("tiny-qwen2")).unwrap();
    let r = reference("tiny-qwen2");
    for p in r["prompts"].as_array().unwrap() {
        // Its NFC normalizer composes the "unicode" prompt's "e\u{301}".
        if p["name"] == "unicode" {
            continue;
        }
        let text = p["text"].as_str().unwrap();
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids, true).unwrap(), text);
    }
    let ids = tok.encode("<|im_start|>hi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&998));
    assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<|im_start|>hi<|im_end|>");
    // An id past the vocabulary decodes to nothing rather than failing.
    assert_eq!(tok.decode(&[5000], true).unwrap(), "");
}

#[test]
fn builtin_is_byte_level() {
    let tok = Tokenizer::builtin();
    let ids = tok.encode("é<|im_end|>a", true).unwrap();
    assert_eq!(ids, vec![0xC3, 0xA9, 258, b'a' as u32]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "é<|im_end|>a");
    assert_eq!(tok.decode(&ids, true).unwrap(), "éa");
    // Half a character decodes to the replacement character.
    assert_eq!(tok.decode(&[0xC3], true).unwrap(), "\u{FFFD}");
    assert_eq!(tok.decode(&[300], false).unwrap(), "");
    assert_eq!(tok.eos_token_id(), Some(258));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(257));
    assert_eq!(tok.vocab_size(), 259);
    assert!(tok.is_special(256) && !tok.is_special(255));
    let chat = tok
        .encode_chat(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(
        tok.decode(&chat, false).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn fallback_template_and_template_errors() {
    let tmp = std::env::temp_dir().join(format!("sluice-tok-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(
        fixture("tiny-llama").join("tokenizer.json"),
        tmp.join("tokenizer.json"),
    )
    .unwrap();
    // No tokenizer_config.json: no special tokens, the fallback template.
    let tok = Tokenizer::from_dir(&tmp).unwrap();
    assert!(tok.chat_template().is_none());
    let out = tok
        .apply_chat_template(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(out, "user: hi\nassistant: ");

    // A list-form template, raise_exception, tojson, Python methods.
    let config = serde_json::json!({
        "bos_token": {"content": "<|begin_of_text|>", "__type": "AddedToken"},
        "eos_token": "<|im_end|>",
        "chat_template": [
            {"name": "tool_use", "template": "unused"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}{{ m.content.strip() | upper }}|{{ m | tojson }}{% endfor %}"}
        ]
    });
    std::fs::write(
        tmp.join("tokenizer_config.json"),
        serde_json::to_string(&config).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&tmp).unwrap();
    assert_eq!(tok.bos_token_id(), Some(1020));
    let out = tok
        .apply_chat_template(&[ChatMessage::new("user", " <b> ")], false)
        .unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><B>|{\"role\": \"user\", \"content\": \" <b> \"}"
    );
    let err = tok
        .apply_chat_template(&[ChatMessage::new("bad", "x")], false)
        .unwrap_err();
    assert_eq!(err.message, "roles must alternate");
    std::fs::remove_dir_all(&tmp).ok();
}

/// A tokenizer over tiny-qwen2's vocabulary with `template`.
fn with_template(tag: &str, template: &str) -> (Tokenizer, PathBuf) {
    let tmp = std::env::temp_dir().join(format!("sluice-tok-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(
        fixture("tiny-qwen2").join("tokenizer.json"),
        tmp.join("tokenizer.json"),
    )
    .unwrap();
    let config = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template});
    std::fs::write(tmp.join("tokenizer_config.json"), config.to_string()).unwrap();
    (Tokenizer::from_dir(&tmp).unwrap(), tmp)
}

#[test]
fn qwen25_template_renders_tools() {
    let template = std::fs::read_to_string(fixture("templates/qwen2.5-7b-instruct.jinja")).unwrap();
    let (tok, tmp) = with_template("qwen25", &template);
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather <now>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    // As the server passes them: arguments parsed to objects, null
    // content as "".
    let messages = serde_json::json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
    ]);
    let messages = messages.as_array().unwrap();
    let out = tok
        .apply_chat_template_with_tools(messages, Some(&tools), true)
        .unwrap();
    let want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather <now>\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(out, want);
    // Without tools: the plain system prompt (`tools` is none).
    let out = tok
        .apply_chat_template_with_tools(&messages[..1], None, false)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    );
    // `tools` is none, not undefined, for the old entry point too.
    let (tok, tmp2) = with_template("none", "{{ tools is none }}|{{ tools is defined }}");
    assert_eq!(
        tok.apply_chat_template(&[ChatMessage::new("user", "x")], false)
            .unwrap(),
        "True|True"
    );
    std::fs::remove_dir_all(&tmp).ok();
    std::fs::remove_dir_all(&tmp2).ok();
}

#[test]
fn missing_tokenizer_names_the_file() {
    let err = Tokenizer::from_dir(Path::new("/nonexistent-dir")).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn strftime_formats_dates() {
    // 2024-11-30 12:34:56 UTC
    assert_eq!(
        strftime("%d %b %Y %H:%M:%S %B %%", 1_732_970_096),
        "30 Nov 2024 12:34:56 November %"
    );
}
