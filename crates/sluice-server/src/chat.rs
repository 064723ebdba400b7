//! `POST /v1/chat/completions`: messages rendered with the model's chat
//! template, then generated like a completion.

use crate::error::ApiError;
use crate::logprobs;
use crate::params::{self, DefaultMaxTokens, TokenFields};
use crate::protocol::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatMessage, ChatMessageOut, MessageContent,
};
use crate::sse;
use crate::state::{unix_now, AppState};
use crate::submit::{
    add_usage, check_sequences, finish_fields, stop_reason_json, submit, usage_json, Event,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sluice_engine::Usage;
use std::collections::HashSet;

/// The messages as plain role/content pairs (only text content parts).
pub fn template_messages(
    messages: &[ChatMessage],
) -> Result<Vec<sluice_engine::ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    format!("messages[{i}].content[{j}]"),
                                    format!(
                                    "unsupported content part of type {:?}: only text is supported",
                                    p.kind
                                ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            Ok(sluice_engine::ChatMessage::new(m.role.clone(), content))
        })
        .collect()
}

pub async fn chat_completions(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut req: ChatCompletionRequest = crate::json::parse(&body)?;
    req.sampling = crate::json::parse(&body)?;
    state.check_model(req.model.as_deref())?;
    if req.tools.as_ref().is_some_and(|t| !t.is_null()) {
        return Err(ApiError::invalid("tools", "tool calling is not supported"));
    }
    if let Some(rf) = &req.response_format {
        if !rf.is_null() && rf.get("type").and_then(|t| t.as_str()) != Some("text") {
            return Err(ApiError::invalid(
                "response_format",
                "only {\"type\": \"text\"} is supported",
            ));
        }
    }
    let Some(messages) = req.messages.as_ref() else {
        return Err(ApiError::invalid("messages", "messages is required"));
    };
    let messages = template_messages(messages)?;
    let tok = state.engine().tokenizer().clone();
    let prompt = tok
        .encode_chat(&messages, req.add_generation_prompt.unwrap_or(true))
        .map_err(|e| {
            ApiError::invalid("messages", format!("cannot apply the chat template: {e}"))
        })?;

    let (max_tokens, max_param) = match req.max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (req.max_tokens, "max_tokens"),
    };
    let want_logprobs = req.logprobs.unwrap_or(false);
    if req.top_logprobs.is_some() && !want_logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        ));
    }
    let top_n = req.top_logprobs.unwrap_or(0);
    let fields = TokenFields {
        max_tokens,
        max_tokens_param: max_param,
        default_max_tokens: DefaultMaxTokens::RestOfContext,
        logprobs: want_logprobs.then_some(top_n),
        logprobs_param: "top_logprobs",
        prompt_logprobs: None,
    };
    let sp = params::build(
        &req.sampling,
        &fields,
        prompt.len(),
        state.inner.max_model_len,
    )?;
    let top_n = usize::try_from(top_n).unwrap_or(0);
    check_sequences(&state, 1, sp.n)?;
    let id = state.new_id("chatcmpl");
    let n = sp.n;
    let events = submit(
        state.engine(),
        &id,
        vec![prompt],
        &sp,
        req.sampling.priority.unwrap_or(0),
    )?;
    if req.sampling.stream() {
        let include_usage = req.sampling.include_usage();
        return Ok(stream_response(
            &state,
            id,
            n,
            want_logprobs.then_some(top_n),
            include_usage,
            events,
        ));
    }

    let mut choices: Vec<ChatChoice> = Vec::new();
    let mut usage = Usage::default();
    let mut events = events;
    while let Some(ev) = events.next().await {
        match ev {
            Event::Output { out, .. } => {
                while choices.len() <= out.index {
                    choices.push(ChatChoice {
                        index: choices.len(),
                        message: ChatMessageOut {
                            role: "assistant",
                            content: String::new(),
                        },
                        logprobs: want_logprobs.then(ChatLogprobs::default),
                        finish_reason: None,
                        stop_reason: None,
                    });
                }
                let c = &mut choices[out.index];
                c.message.content.push_str(&out.text);
                if let Some(lp) = c.logprobs.as_mut() {
                    lp.content
                        .extend(logprobs::chat_content(&tok, &out.logprobs, top_n));
                }
                if let Some(f) = &out.finished {
                    (c.finish_reason, c.stop_reason) = finish_fields(f)?;
                }
            }
            Event::Done { usage: u, .. } => add_usage(&mut usage, &u),
        }
    }
    Ok(axum::Json(ChatCompletionResponse {
        id,
        object: "chat.completion",
        created: unix_now(),
        model: state.inner.model_name.clone(),
        choices,
        usage: usage_json(&usage),
    })
    .into_response())
}

fn stream_response(
    state: &AppState,
    id: String,
    _n: usize,
    logprobs_top: Option<usize>,
    include_usage: bool,
    events: futures::stream::BoxStream<'static, Event>,
) -> Response {
    let tok = state.engine().tokenizer().clone();
    let model = state.inner.model_name.clone();
    let created = unix_now();
    let chunk = move |choices: Vec<ChatChunkChoice>, usage: Option<crate::protocol::Usage>| {
        serde_json::to_string(&ChatCompletionChunk {
            id: id.clone(),
            object: "chat.completion.chunk",
            created,
            model: model.clone(),
            choices,
            usage,
        })
        .unwrap_or_default()
    };
    let usage_chunk = {
        let chunk = chunk.clone();
        include_usage.then_some(move |u: &Usage| chunk(Vec::new(), Some(usage_json(u))))
    };
    let mut started: HashSet<usize> = HashSet::new();
    let on_output = move |_prompt: usize, out: sluice_engine::RequestOutput| {
        let mut chunks = Vec::new();
        let i = out.index;
        if started.insert(i) {
            // Each choice opens with the assistant role, as OpenAI does.
            chunks.push(chunk(
                vec![ChatChunkChoice {
                    index: i,
                    delta: ChatDelta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                None,
            ));
        }
        if let Some(err) = out.finished.as_ref().and_then(|f| f.error.as_ref()) {
            chunks.push(ApiError::internal(format!("generation failed: {err}")).body_json());
            return chunks;
        }
        let fin = out.finished.as_ref();
        if out.text.is_empty() && fin.is_none() && out.logprobs.is_empty() {
            return chunks;
        }
        let logprobs = logprobs_top.map(|top| ChatLogprobs {
            content: logprobs::chat_content(&tok, &out.logprobs, top),
        });
        chunks.push(chunk(
            vec![ChatChunkChoice {
                index: i,
                delta: ChatDelta {
                    role: None,
                    content: (!out.text.is_empty()).then_some(out.text),
                },
                logprobs,
                finish_reason: fin.map(|f| f.reason.as_str()),
                stop_reason: fin.and_then(stop_reason_json),
            }],
            None,
        ));
        chunks
    };
    sse::respond(events, on_output, usage_chunk)
}
