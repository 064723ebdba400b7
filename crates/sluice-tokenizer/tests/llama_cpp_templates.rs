//! Chat templates too restrictively licensed to commit, from llama.cpp's
//! `models/templates/` (`$SLUICE_LLAMA_CPP_MODELS/templates`, which
//! `.ci/test` extracts from PyPI's `llama-cpp-python` source distribution):
//! rendered through `Tokenizer::apply_chat_template_with_tools` as the
//! server calls it, against what transformers' `apply_chat_template` writes
//! for the same messages and tools.

mod common;

use sluice_tokenizer::Tokenizer;
use std::path::PathBuf;

/// A tokenizer directory: tiny-qwen2's `tokenizer.json` with `template` as
/// its chat template, in a fresh temporary directory (removed on drop).
struct WithTemplate {
    tok: Tokenizer,
    dir: PathBuf,
}

impl Drop for WithTemplate {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn with_template(tag: &str, template: &str) -> WithTemplate {
    let dir = std::env::temp_dir().join(format!("sluice-tok-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-qwen2");
    std::fs::copy(data.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let config = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    WithTemplate { tok, dir }
}

fn template(file: &str) -> String {
    let path = common::llama_cpp_models().join("templates").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Llama 3.1's template (Llama 3.1 Community License): tools in the system
/// turn as indented JSON, a tool call as `{"name", "parameters"}`, a tool
/// result as an `ipython` turn holding the content as a JSON string.
#[test]
fn llama31_template_renders_tools() {
    let t = with_template(
        "llama31",
        &template("meta-llama-Llama-3.1-8B-Instruct.jinja"),
    );
    let tools = serde_json::json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}}]);
    let messages = serde_json::json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21"},
    ]);
    let messages = messages.as_array().unwrap();
    let out = t
        .tok
        .apply_chat_template_with_tools(messages, Some(&tools), true)
        .unwrap();
    assert!(
        out.contains(
            "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\""
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
        ),
        "{out}"
    );
    assert!(
        out.contains("<|start_header_id|>ipython<|end_header_id|>\n\n\"21\"<|eot_id|>"),
        "{out}"
    );
    let plain = t
        .tok
        .apply_chat_template_with_tools(&messages[..1], None, true)
        .unwrap();
    assert!(!plain.contains("get_weather"), "{plain}");
}

/// Qwen3's template (Apache-2.0) with `chat_template_kwargs`: thinking on
/// by default (the generation prompt ends at the assistant turn, the model
/// writes `<think>`), off with `enable_thinking: false`, where the template
/// writes an empty thinking block itself (as transformers renders it).
#[test]
fn qwen3_template_reads_enable_thinking_from_the_kwargs() {
    let t = with_template("qwen3-thinking", &template("Qwen-Qwen3-0.6B.jinja"));
    let messages = serde_json::json!([{"role": "user", "content": "Hi"}]);
    let messages = messages.as_array().unwrap();
    let on = t
        .tok
        .apply_chat_template_with_kwargs(messages, None, true, None)
        .unwrap();
    assert_eq!(
        on,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let kwargs = serde_json::json!({"enable_thinking": false});
    let off = t
        .tok
        .apply_chat_template_with_kwargs(messages, None, true, kwargs.as_object())
        .unwrap();
    assert_eq!(
        off,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    // The kwargs cannot replace the template's own variables.
    let kwargs = serde_json::json!({"messages": [], "add_generation_prompt": false});
    let same = t
        .tok
        .apply_chat_template_with_kwargs(messages, None, true, kwargs.as_object())
        .unwrap();
    assert_eq!(same, on);
}
