//! `POST /v1/chat/completions`: messages rendered with the model's chat
//! template, then generated like a completion. `prepare` is the rendering
//! and validation it shares with `POST /v1/chat/completions/render`.

use crate::access_log::{self, AccessNote, Submitted};
use crate::client::{client_key, ApiKeyClient};
use crate::error::ApiError;
use crate::json::type_error;
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
use crate::tools::choice::{ToolChoice, ToolConfig};
use crate::turn::{ToolMode, Turn, TurnStream};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use serde_json::{Map, Value};
use sluice_engine::Usage;
use sluice_structured::{Constraint, JsonFormat};
use std::collections::HashMap;

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

/// The request's messages as the chat template takes them: each raw
/// message (so `tool_calls`, `tool_call_id` and `name` reach the template)
/// with its content flattened to text, prepared as vLLM prepares them.
fn template_values(
    raw: &Map<String, Value>,
    flat: &[sluice_engine::ChatMessage],
) -> Result<Vec<Value>, ApiError> {
    let raw_messages = match raw.get("messages") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(crate::json::type_error("messages", "an array", v)),
        None => {
            return Err(ApiError::invalid(
                "messages",
                "messages: the field is required",
            ))
        }
    };
    let values: Vec<Value> = raw_messages
        .iter()
        .zip(flat)
        .map(|(m, f)| {
            let mut o = m.as_object().cloned().unwrap_or_default();
            let v = serde_json::to_value(f).unwrap_or(Value::Null);
            if let Some(content) = v.get("content") {
                o.insert("content".into(), content.clone());
            }
            if o.get("content").is_some_and(|c| c.as_str() == Some(""))
                && m.get("content").is_none_or(Value::is_null)
            {
                o.insert("content".into(), Value::Null);
            }
            Value::Object(o)
        })
        .collect();
    crate::tools::messages::prepare(&values)
}

/// A chat request checked and rendered (messages + tools → the chat
/// template → ids), ready to run: what `POST /v1/chat/completions` submits
/// and `POST /v1/chat/completions/render` answers with. One function makes
/// it for both, so that render shows the ids generation runs with and
/// refuses what generation refuses.
pub(crate) struct Prepared {
    /// The body as JSON (render reads `tools`, `tool_choice` from it).
    pub raw: Map<String, Value>,
    pub req: ChatCompletionRequest,
    pub prompt: Vec<u32>,
    pub params: sluice_engine::SamplingParams,
    pub priority: i64,
    pub structured: Option<crate::structured::Requested>,
    /// With a reasoning parser: the constraint holds after these tokens.
    pub structured_after: Option<Vec<u32>>,
    /// How the output is read: thinking, answer, tool calls.
    pub turn: Turn,
    want_logprobs: bool,
    top_n: usize,
}

/// Parses and validates a chat body and renders its prompt.
pub(crate) async fn prepare(state: &AppState, body: &Bytes) -> Result<Prepared, ApiError> {
    let mut req: ChatCompletionRequest = crate::json::parse(body)?;
    req.sampling = crate::json::parse(body)?;
    let raw: Map<String, Value> = crate::json::parse(body)?;
    state.check_model(req.model.as_deref())?;
    let tool_config = ToolConfig::from_request(&raw)?;
    let Some(messages) = req.messages.as_ref() else {
        return Err(ApiError::invalid("messages", "messages is required"));
    };
    let flat = template_messages(messages)?;
    let values = template_values(&raw, &flat)?;
    let tok = state.engine().tokenizer().clone();
    let template_tools = tool_config.template_tools();
    let kwargs = match raw.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(v) => return Err(type_error("chat_template_kwargs", "an object", v)),
    };
    let include_reasoning =
        crate::json::opt_bool(raw.get("include_reasoning"), "include_reasoning")?.unwrap_or(true);
    let prompt = tok
        .apply_chat_template_with_kwargs(
            &values,
            template_tools.as_ref(),
            req.add_generation_prompt.unwrap_or(true),
            kwargs,
        )
        .map_err(|e| e.to_string())
        .and_then(|text| tok.encode(&text, false).map_err(|e| e.to_string()))
        .map_err(|e| {
            ApiError::invalid("messages", format!("cannot apply the chat template: {e}"))
        })?;

    // Tool calling: a forced choice is a grammar (vLLM's JSON-schema path);
    // auto is parsed from the text by the server's tool parser.
    let has_tools = tool_config.tools.as_ref().is_some_and(|t| !t.is_empty());
    let mut structured = crate::structured::from_body(&raw, &state.inner.json_format)?;
    let mode = match (&tool_config.choice, has_tools) {
        (ToolChoice::Required | ToolChoice::Named(_), true) => {
            if let Some(schema) = tool_config.forced_schema()? {
                if structured.is_some() {
                    crate::logging::warn(
                        "structured outputs are ignored because tool_choice forces a tool call",
                    );
                }
                structured = Some(crate::structured::Requested {
                    // The server's whitespace; strict tools' parameters
                    // are closed in the schema itself.
                    constraint: Constraint::Json {
                        schema,
                        format: JsonFormat {
                            strict: false,
                            ..state.inner.json_format.clone()
                        },
                    },
                    field: "tools",
                });
            }
            ToolMode::Forced(tool_config.choice.clone())
        }
        (ToolChoice::Auto, true) => match state.inner.auto_tool_parser {
            Some(kind) => ToolMode::Auto(kind),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "\"auto\" tool choice requires --enable-auto-tool-choice and \
                     --tool-call-parser to be set",
                ))
            }
        },
        _ => ToolMode::Plain,
    };

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
    check_sequences(state, 1, sp.n)?;
    if let Some(r) = &structured {
        crate::structured::check(state.engine(), r).await?;
    }
    let priority = req.sampling.priority.unwrap_or(0);
    // Thinking first, then the answer: the constraint holds once thinking
    // has ended (vLLM's structured outputs with a reasoning parser).
    let thinking = crate::reasoning::thinking_enabled(raw.get("chat_template_kwargs"));
    let reasoning = state.inner.reasoning.as_ref();
    let structured_after = reasoning
        .filter(|_| structured.is_some())
        .and_then(|r| r.structured_after(&prompt, thinking));
    let keeps_calls = tool_config.keeps_tool_calls(state.inner.auto_tool_parser.is_some());
    let turn = Turn {
        mode,
        tool_config,
        reasoning: reasoning.map(|r| (r.kind, thinking)),
        include_reasoning,
        keeps_calls,
    };
    Ok(Prepared {
        raw,
        req,
        prompt,
        params: sp,
        priority,
        structured,
        structured_after,
        turn,
        want_logprobs,
        top_n,
    })
}

/// Who sent a request: what its client key and access-log line are made
/// of (the handler's extractors).
pub(crate) struct Caller<'a> {
    pub headers: &'a HeaderMap,
    pub api_key: Option<&'a Extension<ApiKeyClient>>,
    pub access: Option<&'a Extension<AccessNote>>,
}

impl Prepared {
    /// Submits the request as `id`, with its client key (header, `user`,
    /// API key) and the access log's note: the stream of its outputs.
    pub(crate) fn start(
        &self,
        state: &AppState,
        id: &str,
        caller: &Caller<'_>,
    ) -> Result<futures::stream::BoxStream<'static, Event>, ApiError> {
        let client_key = client_key(
            caller.headers,
            &state.inner.client_id_header,
            self.req.user.as_deref(),
            caller.api_key.map(|Extension(k)| k),
        );
        let submitted = Submitted {
            request_id: id,
            client_key: client_key.clone(),
            prompts: 1,
            prompt_tokens: self.prompt.len(),
            choices: self.params.n,
        };
        let events = submit(
            state,
            id,
            vec![self.prompt.clone()],
            &self.params,
            self.priority,
            self.structured.as_ref().map(|r| crate::submit::Structured {
                constraint: &r.constraint,
                after: self.structured_after.as_deref(),
            }),
            client_key,
        )?;
        Ok(access_log::observe(
            caller.access.map(|Extension(a)| a),
            submitted,
            events,
        ))
    }
}

pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    api_key: Option<Extension<ApiKeyClient>>,
    access: Option<Extension<AccessNote>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let p = prepare(&state, &body).await?;
    let id = state.new_id("chatcmpl");
    let caller = Caller {
        headers: &headers,
        api_key: api_key.as_ref(),
        access: access.as_ref(),
    };
    let events = p.start(&state, &id, &caller)?;
    let Prepared {
        req,
        params: sp,
        turn,
        want_logprobs,
        top_n,
        ..
    } = p;
    let tok = state.engine().tokenizer().clone();
    let n = sp.n;
    if req.sampling.stream() {
        let include_usage = req.sampling.include_usage();
        return Ok(stream_response(
            &state,
            id,
            n,
            want_logprobs.then_some(top_n),
            include_usage,
            events,
            turn,
        ));
    }

    let mut choices: Vec<ChatChoice> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
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
                            content: None,
                            reasoning: None,
                            tool_calls: Vec::new(),
                        },
                        logprobs: want_logprobs.then(ChatLogprobs::default),
                        finish_reason: None,
                        stop_reason: None,
                    });
                    texts.push(String::new());
                }
                texts[out.index].push_str(&out.text);
                let c = &mut choices[out.index];
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
    for (c, text) in choices.iter_mut().zip(texts) {
        let out = turn.complete(text);
        c.message.reasoning = out.reasoning;
        c.message.content = out.content;
        if let Some(reason) = c.finish_reason {
            c.finish_reason = Some(turn.finish_reason(reason, !out.tool_calls.is_empty()));
        }
        c.message.tool_calls = out.tool_calls;
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
    turn: Turn,
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
    let mut streams: HashMap<usize, TurnStream> = HashMap::new();
    let on_output = move |_prompt: usize, out: sluice_engine::RequestOutput| {
        let mut chunks = Vec::new();
        let i = out.index;
        if let std::collections::hash_map::Entry::Vacant(e) = streams.entry(i) {
            e.insert(turn.stream());
            // Each choice opens with the assistant role, as OpenAI does.
            chunks.push(chunk(
                vec![ChatChunkChoice {
                    index: i,
                    delta: ChatDelta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        reasoning: None,
                        tool_calls: Vec::new(),
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                None,
            ));
        }
        if let Some(err) = out.finished.as_ref().and_then(|f| f.error.as_ref()) {
            chunks.push(crate::submit::finish_error(err).body_json());
            return chunks;
        }
        let fin = out.finished.as_ref();
        let Some(stream) = streams.get_mut(&i) else {
            return chunks;
        };
        let delta = stream.push(out.text, fin.is_some(), out.token_ids.len());
        if delta.is_empty() && fin.is_none() && out.logprobs.is_empty() {
            return chunks;
        }
        let logprobs = logprobs_top.map(|top| ChatLogprobs {
            content: logprobs::chat_content(&tok, &out.logprobs, top),
        });
        let finish_reason = fin.map(|f| stream.finish_reason(f.reason.as_str()));
        chunks.push(chunk(
            vec![ChatChunkChoice {
                index: i,
                delta: ChatDelta {
                    role: None,
                    content: delta.content,
                    reasoning: delta.reasoning,
                    tool_calls: delta.tool_calls,
                },
                logprobs,
                finish_reason,
                stop_reason: fin.and_then(stop_reason_json),
            }],
            None,
        ));
        chunks
    };
    sse::respond(events, on_output, usage_chunk)
}
