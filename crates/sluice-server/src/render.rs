//! `POST /v1/completions/render` and `POST /v1/chat/completions/render`:
//! vLLM 0.33's render endpoints (`vllm/entrypoints/scale_out/render/`),
//! which answer with what a generation request would run — the prompt's
//! token ids and the sampling parameters — without running it. Routers
//! use them to tokenise once (prefix-aware routing hashes the ids) and to
//! hand a prepared request on.
//!
//! The promise: the ids are the ones the generation endpoint submits for
//! the same body, because both go through the same `prepare` (chat:
//! messages + tools → chat template → ids; completions: the prompts) and
//! the engine's own checks (`Engine::validate`), so a body generation
//! refuses with a 400 is refused here with the same 400.
//!
//! The answer has `GenerateRequest`'s shape (completions: a list, one per
//! prompt). Fields sluice has no counterpart for are written as vLLM
//! writes them for a text-only request (`features: null`, ...), and
//! `sampling_params` holds the fields sluice honours.

use crate::error::ApiError;
use crate::state::AppState;
use crate::submit::{engine_error, engine_requests};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use sluice_engine::{GenerateRequest, SamplingParams};

pub async fn render_completion(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let p = crate::completions::prepare(&state, &body).await?;
    let id = state.new_id("cmpl");
    let requests = engine_requests(
        &id,
        p.prompts,
        &p.params,
        p.priority,
        p.structured.as_ref().map(|r| &r.constraint),
    );
    // `prepare` parsed the body already; a JSON object by now.
    let raw: Map<String, Value> = crate::json::parse(&body)?;
    let common = Common::new(p.req.model.as_deref(), p.req.sampling.stream(), &raw);
    let list = requests
        .iter()
        .map(|r| {
            state.engine().validate(r).map_err(engine_error)?;
            Ok(generate_request(r, &common, None))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Json(Value::Array(list)))
}

pub async fn render_chat_completion(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let p = crate::chat::prepare(&state, &body).await?;
    let id = state.new_id("chatcmpl");
    let requests = engine_requests(
        &id,
        vec![p.prompt],
        &p.params,
        p.priority,
        p.structured.as_ref().map(|r| &r.constraint),
    );
    let common = Common::new(p.req.model.as_deref(), p.req.sampling.stream(), &p.raw);
    let parse_context = parse_context(&p.raw);
    let Some(r) = requests.first() else {
        return Err(ApiError::internal("no prompt was rendered"));
    };
    state.engine().validate(r).map_err(engine_error)?;
    Ok(Json(generate_request(r, &common, Some(parse_context))))
}

/// What every rendered request of one body shares.
struct Common<'a> {
    model: Option<&'a str>,
    stream: bool,
    stream_options: Value,
    structured: Value,
}

impl<'a> Common<'a> {
    fn new(model: Option<&'a str>, stream: bool, raw: &Map<String, Value>) -> Self {
        let given = |key: &str| raw.get(key).filter(|v| !v.is_null()).cloned();
        Common {
            model,
            stream,
            // Echoed only for a streaming request, as vLLM does.
            stream_options: given("stream_options")
                .filter(|_| stream)
                .unwrap_or(Value::Null),
            // The body's `structured_outputs` as given (a constraint from
            // `response_format` or the tools is still applied by
            // generation; it is not echoed here).
            structured: given("structured_outputs").unwrap_or(Value::Null),
        }
    }
}

/// vLLM's `ParseContext`: what the derender step needs to parse the output
/// of a rendered chat request.
fn parse_context(raw: &Map<String, Value>) -> Value {
    let history_tool_call_cnt: usize = raw
        .get("messages")
        .and_then(Value::as_array)
        .map(|ms| {
            ms.iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
                .map(Vec::len)
                .sum()
        })
        .unwrap_or(0);
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null()).cloned();
    json!({
        "tools": get("tools"),
        "tool_choice": get("tool_choice").unwrap_or_else(|| json!("none")),
        "parallel_tool_calls": get("parallel_tool_calls").unwrap_or(Value::Bool(true)),
        "include_reasoning": get("include_reasoning").unwrap_or(Value::Bool(true)),
        "chat_template_kwargs": get("chat_template_kwargs").unwrap_or_else(|| json!({})),
        "history_tool_call_cnt": history_tool_call_cnt,
    })
}

/// One engine request as vLLM's `GenerateRequest.model_dump()`.
fn generate_request(r: &GenerateRequest, c: &Common<'_>, parse_context: Option<Value>) -> Value {
    json!({
        "request_id": r.request_id,
        "token_ids": r.prompt_token_ids,
        "token_offsets": null,
        "features": null,
        "content_parts": null,
        "sampling_params": sampling_params(&r.sampling_params, &c.structured),
        "model": c.model,
        "reasoning_ended": null,
        "reasoning_parser_kwargs": null,
        "return_token_ids": null,
        "output_mode": "tokens",
        "parse_context": parse_context,
        "stream": c.stream,
        "stream_options": c.stream_options,
        "cache_salt": r.cache_salt,
        "priority": r.priority,
        "kv_transfer_params": null,
        "ec_transfer_params": null,
    })
}

/// vLLM's `SamplingParams` fields that sluice has, with sluice's values
/// (after its defaults: `max_tokens` is the one generation would use).
fn sampling_params(p: &SamplingParams, structured: &Value) -> Value {
    let logit_bias: Option<Map<String, Value>> = (!p.logit_bias.is_empty()).then(|| {
        p.logit_bias
            .iter()
            .map(|(id, b)| (id.to_string(), json!(b)))
            .collect()
    });
    json!({
        "n": p.n,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repetition_penalty": p.repetition_penalty,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "min_p": p.min_p,
        "seed": p.seed,
        "stop": p.stop,
        "stop_token_ids": p.stop_token_ids,
        "ignore_eos": p.ignore_eos,
        "max_tokens": p.max_tokens,
        "min_tokens": p.min_tokens,
        "logprobs": p.logprobs,
        "prompt_logprobs": p.prompt_logprobs,
        "detokenize": true,
        "skip_special_tokens": p.skip_special_tokens,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "structured_outputs": structured,
        "logit_bias": logit_bias,
    })
}
