//! `POST /v1/completions`, and the request preparation it shares with
//! `POST /v1/completions/render` (`prepare`).

use crate::access_log::{self, AccessNote, Submitted};
use crate::client::{client_key, ApiKeyClient};
use crate::error::ApiError;
use crate::logprobs;
use crate::params::{self, DefaultMaxTokens, TokenFields};
use crate::protocol::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptInput,
};
use crate::sse;
use crate::state::{unix_now, AppState};
use crate::submit::{
    add_usage, check_sequences, finish_fields, stop_reason_json, submit, usage_json, Event,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use sluice_engine::Usage;

/// Tokenises the prompt input into one id list per prompt.
fn prompts(state: &AppState, input: PromptInput) -> Result<Vec<Vec<u32>>, ApiError> {
    let tok = state.engine().tokenizer();
    let encode = |t: &str| {
        tok.encode(t, true)
            .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize the prompt: {e}")))
    };
    let list = match input {
        PromptInput::Text(t) => vec![encode(&t)?],
        PromptInput::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        PromptInput::Tokens(ids) => vec![ids],
        PromptInput::TokenLists(lists) => lists,
    };
    if list.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    Ok(list)
}

/// A completion request checked and tokenised, ready to run: what
/// `POST /v1/completions` submits and `POST /v1/completions/render`
/// answers with. One function makes it for both, so that render shows the
/// ids generation runs with and refuses what generation refuses.
pub struct Prepared {
    pub req: CompletionRequest,
    /// One id list per prompt, as the engine gets them.
    pub prompts: Vec<Vec<u32>>,
    pub params: sluice_engine::SamplingParams,
    pub priority: i64,
    pub structured: Option<crate::structured::Requested>,
    pub echo: bool,
}

/// Parses and validates a completions body and tokenises its prompts.
pub async fn prepare(state: &AppState, body: &Bytes) -> Result<Prepared, ApiError> {
    let mut req: CompletionRequest = crate::json::parse(body)?;
    req.sampling = crate::json::parse(body)?;
    state.check_model(req.model.as_deref())?;
    if req.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    let echo = req.echo.unwrap_or(false);
    if echo && (req.logprobs.is_some() || req.sampling.stream()) {
        return Err(ApiError::invalid(
            "echo",
            "echo is only supported without logprobs and without streaming",
        ));
    }
    let Some(input) = req.prompt.clone() else {
        return Err(ApiError::invalid("prompt", "prompt is required"));
    };
    let prompts = prompts(state, input)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
    let fields = TokenFields {
        max_tokens: req.max_tokens,
        max_tokens_param: "max_tokens",
        default_max_tokens: DefaultMaxTokens::Fixed(16),
        logprobs: req.logprobs,
        logprobs_param: "logprobs",
        prompt_logprobs: req.prompt_logprobs,
    };
    let max_model_len = state.inner.max_model_len;
    // The longest prompt leaves the least room for max_tokens.
    params::build(&req.sampling, &fields, shortest.max(1), max_model_len)?;
    let sp = params::build(&req.sampling, &fields, longest, max_model_len)?;
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    check_sequences(state, prompts.len(), sp.n)?;
    let body_map: serde_json::Map<String, serde_json::Value> = crate::json::parse(body)?;
    let structured = crate::structured::from_body(&body_map, &state.inner.json_format)?;
    if let Some(r) = &structured {
        crate::structured::check(state.engine(), r).await?;
    }
    let priority = req.sampling.priority.unwrap_or(0);
    Ok(Prepared {
        req,
        prompts,
        params: sp,
        priority,
        structured,
        echo,
    })
}

pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    api_key: Option<Extension<ApiKeyClient>>,
    access: Option<Extension<AccessNote>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Prepared {
        req,
        prompts,
        params: sp,
        priority,
        structured,
        echo,
    } = prepare(&state, &body).await?;
    let id = state.new_id("cmpl");
    let n = sp.n;
    let echo_text: Vec<String> = if echo {
        let tok = state.engine().tokenizer();
        prompts
            .iter()
            .map(|p| tok.decode(p, true).unwrap_or_default())
            .collect()
    } else {
        Vec::new()
    };
    let client_key = client_key(
        &headers,
        &state.inner.client_id_header,
        req.user.as_deref(),
        api_key.as_ref().map(|Extension(k)| k),
    );
    let submitted = Submitted {
        request_id: &id,
        client_key: client_key.clone(),
        prompts: prompts.len(),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
        choices: prompts.len() * n,
    };
    let events = submit(
        &state,
        &id,
        prompts,
        &sp,
        priority,
        structured.as_ref().map(|r| crate::submit::Structured {
            constraint: &r.constraint,
            after: None,
        }),
        client_key,
    )?;
    let events = access_log::observe(access.as_ref().map(|Extension(a)| a), submitted, events);
    if req.sampling.stream() {
        let include_usage = req.sampling.include_usage();
        return Ok(stream_response(
            state,
            id,
            n,
            req.logprobs.is_some(),
            include_usage,
            events,
        ));
    }
    collect_response(state, id, n, req.logprobs.is_some(), echo_text, events)
        .await
        .map(|r| axum::Json(r).into_response())
}

async fn collect_response(
    state: AppState,
    id: String,
    n: usize,
    want_logprobs: bool,
    echo_text: Vec<String>,
    mut events: futures::stream::BoxStream<'static, Event>,
) -> Result<CompletionResponse, ApiError> {
    let tok = state.engine().tokenizer().clone();
    let mut choices: Vec<CompletionChoice> = Vec::new();
    let mut usage = Usage::default();
    let choice_at = |choices: &mut Vec<CompletionChoice>, i: usize| {
        while choices.len() <= i {
            choices.push(CompletionChoice {
                index: choices.len(),
                text: String::new(),
                logprobs: want_logprobs.then(CompletionLogprobs::default),
                finish_reason: None,
                stop_reason: None,
                prompt_logprobs: None,
            });
        }
    };
    while let Some(ev) = events.next().await {
        match ev {
            Event::Output { prompt, out } => {
                let i = prompt * n + out.index;
                choice_at(&mut choices, i);
                let c = &mut choices[i];
                if c.text.is_empty() {
                    if let Some(e) = echo_text.get(prompt) {
                        c.text.push_str(e);
                    }
                }
                if let Some(lp) = c.logprobs.as_mut() {
                    logprobs::extend_completion(&tok, lp, &out.logprobs, c.text.len());
                }
                c.text.push_str(&out.text);
                if let Some(p) = &out.prompt_logprobs {
                    c.prompt_logprobs = Some(logprobs::prompt_logprobs_json(&tok, p));
                }
                if let Some(f) = &out.finished {
                    (c.finish_reason, c.stop_reason) = finish_fields(f)?;
                }
            }
            Event::Done { usage: u, .. } => add_usage(&mut usage, &u),
        }
    }
    Ok(CompletionResponse {
        id,
        object: "text_completion",
        created: unix_now(),
        model: state.inner.model_name.clone(),
        choices,
        usage: Some(usage_json(&usage)),
    })
}

fn stream_response(
    state: AppState,
    id: String,
    n: usize,
    want_logprobs: bool,
    include_usage: bool,
    events: futures::stream::BoxStream<'static, Event>,
) -> Response {
    let tok = state.engine().tokenizer().clone();
    let model = state.inner.model_name.clone();
    let created = unix_now();
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |choices: Vec<CompletionChoice>, usage: Option<crate::protocol::Usage>| {
            serde_json::to_string(&CompletionResponse {
                id: id.clone(),
                object: "text_completion",
                created,
                model: model.clone(),
                choices,
                usage,
            })
            .unwrap_or_default()
        }
    };
    let usage_chunk = {
        let chunk = chunk.clone();
        include_usage.then_some(move |u: &Usage| chunk(Vec::new(), Some(usage_json(u))))
    };
    // Text offsets continue across chunks, per choice.
    let mut offsets: std::collections::HashMap<usize, usize> = Default::default();
    let on_output = move |prompt: usize, out: sluice_engine::RequestOutput| {
        let i = prompt * n + out.index;
        let off = offsets.entry(i).or_insert(0);
        if let Some(err) = out.finished.as_ref().and_then(|f| f.error.as_ref()) {
            return vec![crate::submit::finish_error(err).body_json()];
        }
        let fin = out.finished.as_ref();
        // vLLM streams a chunk for every output that carries tokens, also
        // when their text is empty (held back for a stop string, a partial
        // UTF-8 character, a special token); only an output with neither
        // text nor tokens (a prefill chunk) sends nothing. Clients time the
        // first chunk as TTFT, so holding empty chunks back would delay it.
        if out.text.is_empty() && out.token_ids.is_empty() && fin.is_none() {
            return Vec::new();
        }
        let logprobs = want_logprobs.then(|| {
            let mut lp = CompletionLogprobs::default();
            logprobs::extend_completion(&tok, &mut lp, &out.logprobs, *off);
            lp
        });
        *off += out.text.len();
        let choice = CompletionChoice {
            index: i,
            text: out.text,
            logprobs,
            finish_reason: fin.map(|f| f.reason.as_str()),
            stop_reason: fin.and_then(stop_reason_json),
            prompt_logprobs: out
                .prompt_logprobs
                .as_ref()
                .map(|p| logprobs::prompt_logprobs_json(&tok, p)),
        };
        vec![chunk(vec![choice], None)]
    };
    sse::respond(events, on_output, usage_chunk)
}
