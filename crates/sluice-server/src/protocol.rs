//! The OpenAI wire format: request bodies as clients send them and the
//! response / stream-chunk bodies they expect. Deserialisation accepts what
//! the OpenAI and vLLM APIs accept (unknown fields are ignored, as OpenAI
//! clients send extras); validation lives in `params.rs`.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// `prompt` of `/v1/completions`: text, several texts, token ids, or several
/// token-id lists.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

impl StopInput {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopInput::One(s) => vec![s],
            StopInput::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling fields shared by both endpoints (OpenAI's plus vLLM's extras).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub n: Option<i64>,
    pub stop: Option<StopInput>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub priority: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

impl SamplingFields {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// `stream_options.include_usage`: a usage chunk ends the stream.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Option<PromptInput>,
    pub max_tokens: Option<i64>,
    /// Number of top logprobs per token (0 = only the sampled token's).
    pub logprobs: Option<i64>,
    pub prompt_logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    /// OpenAI's end-user id: a client key when no header names one.
    pub user: Option<String>,
    /// Parsed from the same body separately (`json::parse_request`): with
    /// `#[serde(flatten)]`, serde would lose the name of a field whose type
    /// is wrong.
    #[serde(skip)]
    pub sampling: SamplingFields,
}

/// A chat message's `content`: a string or a list of parts (only text parts
/// are supported).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Clone, Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub add_generation_prompt: Option<bool>,
    pub tools: Option<serde_json::Value>,
    pub response_format: Option<serde_json::Value>,
    /// OpenAI's end-user id: a client key when no header names one.
    pub user: Option<String>,
    /// Parsed from the same body separately (`json::parse_request`): with
    /// `#[serde(flatten)]`, serde would lose the name of a field whose type
    /// is wrong.
    #[serde(skip)]
    pub sampling: SamplingFields,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// Legacy completions logprobs (parallel arrays).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<HashMap<String, f32>>>,
    pub text_offset: Vec<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// The stop string or token that ended the choice (vLLM's extension).
    pub stop_reason: Option<serde_json::Value>,
    /// vLLM's extension, with `prompt_logprobs` set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// `null` when a tool parser found calls and no text around them.
    pub content: Option<String>,
    /// The thinking, with `--reasoning-parser` (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::tools::ToolCall>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::tools::ToolCallDelta>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// vLLM's extension: what the model was loaded from (`vllm bench
    /// serve` reads it as the model id when given no `--model`).
    pub root: String,
    /// vLLM's extension: the base model of a LoRA adapter; always null.
    pub parent: Option<String>,
    pub max_model_len: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// `POST /tokenize`: text (optionally as chat messages) to ids.
#[derive(Clone, Debug, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
