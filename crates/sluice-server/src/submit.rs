//! Submitting prompts to the engine and reading their outputs back, shared
//! by the completions and chat endpoints.
//!
//! One engine request per prompt; choice `i` of prompt `p` is choice
//! `p * n + i` of the response, as in vLLM. Dropping the returned streams
//! aborts whatever is still running (a client that disconnects mid-stream
//! frees its KV blocks at once).

use crate::error::ApiError;
use crate::state::AppState;
use futures::stream::{self, BoxStream, StreamExt};
use sluice_engine::{Engine, EngineError, GenerateRequest, RequestOutput, SamplingParams, Usage};
use sluice_structured::Constraint;

pub fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Invalid(f) => ApiError::invalid(f.field, f.to_string()),
        EngineError::Overloaded { .. } | EngineError::OverloadedTokens { .. } => {
            ApiError::overloaded(e.to_string(), 1)
        }
        EngineError::ShuttingDown => ApiError::overloaded(e.to_string(), 5),
        EngineError::Dead => ApiError::internal(e.to_string()),
    }
}

/// Refuses a request that would start more sequences (prompts × `n`) than
/// one request may.
pub fn check_sequences(state: &AppState, num_prompts: usize, n: usize) -> Result<(), ApiError> {
    let max = state.inner.max_sequences_per_request;
    let total = num_prompts.saturating_mul(n);
    if total > max {
        return Err(ApiError::invalid(
            if num_prompts > 1 { "prompt" } else { "n" },
            format!(
                "this request would start {num_prompts} prompt(s) × n = {n}, {total} sequences; at \
                 most {max} are accepted per request (--max-sequences-per-request)"
            ),
        ));
    }
    Ok(())
}

/// What a merged response stream yields.
pub enum Event {
    /// An output of prompt `prompt`'s completion `out.index`.
    Output { prompt: usize, out: RequestOutput },
    /// Prompt `prompt` finished all its completions.
    Done { prompt: usize, usage: Usage },
}

/// The engine requests `submit` makes of the prompts: one per prompt,
/// with the id `id` (one prompt) or `id-p` (vLLM's naming). The render
/// endpoints answer with these, so what they show is what would run.
pub fn engine_requests(
    id: &str,
    prompts: Vec<Vec<u32>>,
    params: &SamplingParams,
    priority: i64,
    constraint: Option<&Constraint>,
) -> Vec<GenerateRequest> {
    let many = prompts.len() > 1;
    prompts
        .into_iter()
        .enumerate()
        .map(|(p, prompt)| {
            let mut req = GenerateRequest::new(prompt, params.clone());
            req.priority = priority;
            req.structured = constraint.cloned();
            req.request_id = Some(if many {
                format!("{id}-{p}")
            } else {
                id.to_string()
            });
            req
        })
        .collect()
}

/// Submits every prompt with the same parameters, each carrying the
/// request's client key; fails (and aborts the ones already submitted) if
/// any is refused. With `--enable-log-requests`, each is logged as it
/// arrives, before the engine accepts or refuses it.
/// A request's constraint, and the tokens after which it holds (a
/// reasoning parser's end of thinking; `None`: from the first token).
pub struct Structured<'a> {
    pub constraint: &'a Constraint,
    pub after: Option<&'a [u32]>,
}

pub fn submit(
    state: &AppState,
    id: &str,
    prompts: Vec<Vec<u32>>,
    params: &SamplingParams,
    priority: i64,
    structured: Option<Structured<'_>>,
    client_key: Option<String>,
) -> Result<BoxStream<'static, Event>, ApiError> {
    let engine: &Engine = state.engine();
    let constraint = structured.as_ref().map(|s| s.constraint);
    let structured_after = structured.and_then(|s| s.after);
    let requests = engine_requests(id, prompts, params, priority, constraint);
    let mut streams = Vec::with_capacity(requests.len());
    for (p, mut req) in requests.into_iter().enumerate() {
        req.client_key.clone_from(&client_key);
        if req.structured.is_some() {
            req.structured_after = structured_after.map(<[u32]>::to_vec);
        }
        if state.inner.log_requests {
            crate::logging::info(&request_log_line(&req));
        }
        let s = engine.generate(req).map_err(engine_error)?;
        let events = stream::unfold(Some(s), move |state| async move {
            let mut s = state?;
            match s.next().await {
                Some(out) => Some((Event::Output { prompt: p, out }, Some(s))),
                None => {
                    let usage = s.usage();
                    Some((Event::Done { prompt: p, usage }, None))
                }
            }
        });
        streams.push(events.boxed());
    }
    Ok(stream::select_all(streams).boxed())
}

/// The request log's line for one engine request (vLLM's "Received
/// request" line, in brief): id, client key (`-` for none), prompt and
/// max tokens, then the sampling fields that most change what runs.
pub fn request_log_line(req: &GenerateRequest) -> String {
    let sp = &req.sampling_params;
    let seed = sp
        .seed
        .map_or_else(|| "none".to_string(), |s| s.to_string());
    format!(
        "request {id}: client_key={client} prompt_tokens={prompt} max_tokens={max} \
         n={n} temperature={t} top_p={top_p} top_k={top_k} seed={seed} stop={stops} \
         priority={priority} structured={structured}",
        id = req.request_id.as_deref().unwrap_or("-"),
        // Quoted: a client-chosen `user` could hold a newline.
        client = req
            .client_key
            .as_ref()
            .map_or_else(|| "-".to_string(), |k| format!("{k:?}")),
        prompt = req.prompt_token_ids.len(),
        max = sp.max_tokens,
        n = sp.n,
        t = sp.temperature,
        top_p = sp.top_p,
        top_k = sp.top_k,
        stops = sp.stop.len() + sp.stop_token_ids.len(),
        priority = req.priority,
        structured = req.structured.is_some(),
    )
}

/// Adds one prompt's usage into the response total.
pub fn add_usage(total: &mut Usage, u: &Usage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.cached_tokens += u.cached_tokens;
}

pub fn usage_json(u: &Usage) -> crate::protocol::Usage {
    crate::protocol::Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.total_tokens(),
        prompt_tokens_details: (u.cached_tokens > 0).then_some(
            crate::protocol::PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
        ),
    }
}

/// How a choice ended: `(finish_reason, stop_reason)`, or the 500 a model
/// error becomes.
pub type FinishFields = (Option<&'static str>, Option<serde_json::Value>);

pub fn finish_fields(f: &sluice_engine::Finished) -> Result<FinishFields, ApiError> {
    if let Some(err) = &f.error {
        return Err(finish_error(err));
    }
    Ok((Some(f.reason.as_str()), stop_reason_json(f)))
}

pub fn stop_reason_json(f: &sluice_engine::Finished) -> Option<serde_json::Value> {
    f.stop_reason.as_ref().map(|r| match r {
        sluice_engine::StopReason::Token(t) => serde_json::Value::from(*t),
        sluice_engine::StopReason::String(s) => serde_json::Value::from(s.clone()),
    })
}

/// The error a failed completion answers with: a constraint that failed to
/// compile in the engine is the client's fault (400, as vLLM), anything
/// else the server's.
pub fn finish_error(err: &str) -> ApiError {
    if err.starts_with("Invalid structured outputs") {
        ApiError::bad_request(err)
    } else {
        ApiError::internal(format!("generation failed: {err}"))
    }
}
