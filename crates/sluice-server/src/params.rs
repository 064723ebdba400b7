//! Turns the sampling fields of an OpenAI request into `SamplingParams`,
//! validating each against vLLM 0.33's rules and naming the field at fault.
//!
//! As vLLM: temperature in [0, 2] (a positive one below 0.01 is raised to
//! 0.01), `n` > 1 needs a sampling temperature, `seed: -1` means no seed,
//! logit biases are clamped to [-100, 100], `max_tokens` beyond the room
//! the prompt leaves is clamped to it (only `max_tokens` > `max_model_len`
//! is an error), `prompt_logprobs` cannot stream. Where sluice is stricter
//! (n ≤ 128, stop-string and logit-bias counts, sequences per request) the
//! limit is named in the message; see docs/validation.md.

use crate::error::ApiError;
use crate::protocol::SamplingFields;
use sluice_core::SamplingParams;

/// Most top logprobs a request may ask for (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: i64 = 20;

/// How many tokens a request may generate when it does not say.
#[derive(Clone, Copy, Debug)]
pub enum DefaultMaxTokens {
    /// `/v1/completions`: 16, as OpenAI and vLLM.
    Fixed(usize),
    /// `/v1/chat/completions`: up to the end of the context.
    RestOfContext,
}

fn non_negative(param: &str, v: Option<f64>, default: f64) -> Result<f64, ApiError> {
    let v = v.unwrap_or(default);
    if !v.is_finite() || v < 0.0 {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be a finite number >= 0, got {v}"),
        ));
    }
    Ok(v)
}

/// The length and logprob fields, which differ in name between endpoints.
#[derive(Clone, Copy, Debug)]
pub struct TokenFields<'a> {
    pub max_tokens: Option<i64>,
    /// `max_tokens` or `max_completion_tokens`, for error messages.
    pub max_tokens_param: &'a str,
    pub default_max_tokens: DefaultMaxTokens,
    pub logprobs: Option<i64>,
    /// `logprobs` or `top_logprobs`.
    pub logprobs_param: &'a str,
    pub prompt_logprobs: Option<i64>,
}

/// Builds and validates the sampling parameters of one request whose prompt
/// has `prompt_len` tokens.
pub fn build(
    f: &SamplingFields,
    t: &TokenFields<'_>,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<SamplingParams, ApiError> {
    let max_tokens = max_tokens(t, prompt_len, max_model_len)?;

    let n = f.n.unwrap_or(1);
    if !(1..=128).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n must be between 1 and 128, got {n}"),
        ));
    }
    let mut temperature = non_negative("temperature", f.temperature, 1.0)?;
    if temperature > 2.0 {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be in [0, 2], got {temperature}"),
        ));
    }
    if temperature > 0.0 && temperature < 0.01 {
        // vLLM's floor: smaller ones overflow the softmax in practice.
        temperature = 0.01;
    }
    if n > 1 && temperature < 1e-5 {
        return Err(ApiError::invalid(
            "n",
            format!("n must be 1 when using greedy sampling (temperature 0), got {n}"),
        ));
    }
    let top_p = f.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = f.top_k.unwrap_or(0);
    if top_k < -1 || top_k > i64::from(i32::MAX) {
        return Err(ApiError::invalid(
            "top_k",
            format!("top_k must be -1 (disable) or >= 0, got {top_k}"),
        ));
    }
    let min_p = f.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid(
            "min_p",
            format!("min_p must be in [0, 1], got {min_p}"),
        ));
    }
    let presence_penalty = f.presence_penalty.unwrap_or(0.0);
    if !(-2.0..=2.0).contains(&presence_penalty) {
        return Err(ApiError::invalid(
            "presence_penalty",
            format!("presence_penalty must be in [-2, 2], got {presence_penalty}"),
        ));
    }
    let frequency_penalty = f.frequency_penalty.unwrap_or(0.0);
    if !(-2.0..=2.0).contains(&frequency_penalty) {
        return Err(ApiError::invalid(
            "frequency_penalty",
            format!("frequency_penalty must be in [-2, 2], got {frequency_penalty}"),
        ));
    }
    let repetition_penalty = f.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            format!("repetition_penalty must be > 0, got {repetition_penalty}"),
        ));
    }
    let min_tokens = f.min_tokens.unwrap_or(0);
    if min_tokens < 0 || min_tokens as u64 > max_tokens as u64 {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("min_tokens must be in [0, max_tokens = {max_tokens}], got {min_tokens}"),
        ));
    }
    let (logprobs, prompt_logprobs) = logprobs(t)?;
    let logit_bias = logit_bias(f)?;
    let stop = stream_and_stop(f, prompt_logprobs)?;

    let params = SamplingParams {
        n: n as usize,
        max_tokens,
        min_tokens: min_tokens as usize,
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k: top_k as i32,
        min_p: min_p as f32,
        // vLLM: -1 means "no seed".
        seed: f.seed.filter(|&s| s != -1).map(|s| s as u64),
        presence_penalty: presence_penalty as f32,
        frequency_penalty: frequency_penalty as f32,
        repetition_penalty: repetition_penalty as f32,
        eos_token_id: None,
        ignore_eos: f.ignore_eos.unwrap_or(false),
        stop_token_ids: f.stop_token_ids.clone().unwrap_or_default(),
        stop,
        include_stop_str_in_output: f.include_stop_str_in_output.unwrap_or(false),
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
        logprobs,
        prompt_logprobs,
        logit_bias,
    };
    params
        .validate()
        .map_err(|e| ApiError::invalid(e.field, e.to_string()))?;
    Ok(params)
}

/// The prompt's length against the context, then `max_tokens` (or its
/// default) clamped to the room the prompt leaves.
fn max_tokens(
    t: &TokenFields<'_>,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<usize, ApiError> {
    let (max_tokens, max_tokens_param, default_max_tokens) =
        (t.max_tokens, t.max_tokens_param, t.default_max_tokens);
    if prompt_len == 0 {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if prompt_len >= max_model_len {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your \
                 prompt has {prompt_len} tokens, which leaves no room for a completion."
            ),
        ));
    }
    let room = max_model_len - prompt_len;
    Ok(match max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                max_tokens_param,
                format!("{max_tokens_param} must be at least 1, got {m}"),
            ))
        }
        Some(m) => {
            let m = usize::try_from(m).unwrap_or(usize::MAX);
            if m > max_model_len {
                return Err(ApiError::invalid(
                    max_tokens_param,
                    format!(
                        "{max_tokens_param}={m} cannot be greater than max_model_len={max_model_len}. \
                         Please request fewer output tokens."
                    ),
                ));
            }
            // vLLM clamps to the room the prompt leaves rather than refuse.
            m.min(room)
        }
        None => match default_max_tokens {
            DefaultMaxTokens::Fixed(d) => d.min(room),
            DefaultMaxTokens::RestOfContext => room,
        },
    })
}

/// `logprobs` (under the endpoint's name) and `prompt_logprobs`, each at
/// most `MAX_LOGPROBS`.
fn logprobs(t: &TokenFields<'_>) -> Result<(Option<usize>, Option<usize>), ApiError> {
    let (logprobs, logprobs_param, prompt_logprobs) =
        (t.logprobs, t.logprobs_param, t.prompt_logprobs);
    let logprobs = match logprobs {
        None => None,
        Some(k) if !(0..=MAX_LOGPROBS).contains(&k) => {
            return Err(ApiError::invalid(
                logprobs_param,
                format!("{logprobs_param} must be between 0 and {MAX_LOGPROBS}, got {k}"),
            ))
        }
        Some(k) => Some(k as usize),
    };
    let prompt_logprobs = match prompt_logprobs {
        None => None,
        Some(k) if !(0..=MAX_LOGPROBS).contains(&k) => {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                format!("prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}"),
            ))
        }
        Some(k) => Some(k as usize),
    };
    Ok((logprobs, prompt_logprobs))
}

/// `logit_bias`: token-id keys, biases clamped to [-100, 100], by id.
fn logit_bias(f: &SamplingFields) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut logit_bias = Vec::new();
    if let Some(map) = &f.logit_bias {
        for (k, &v) in map {
            let Ok(id) = k.parse::<u32>() else {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("key {k:?} is not a token id"),
                ));
            };
            // Clamped, as vLLM (and OpenAI's documented range) does.
            logit_bias.push((id, v.clamp(-100.0, 100.0) as f32));
        }
        logit_bias.sort_by_key(|&(id, _)| id);
    }
    Ok(logit_bias)
}

/// What streaming allows (`stream_options`, prompt logprobs), then the
/// stop strings, none empty.
fn stream_and_stop(
    f: &SamplingFields,
    prompt_logprobs: Option<usize>,
) -> Result<Vec<String>, ApiError> {
    if f.stream_options.is_some() && !f.stream() {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options can only be given with stream: true",
        ));
    }
    if prompt_logprobs.is_some_and(|k| k > 0) && f.stream() {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            "prompt_logprobs are not available when stream is true",
        ));
    }
    let stop = f.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).expect("fields")
    }

    fn fields16(max_tokens: Option<i64>, default: DefaultMaxTokens) -> TokenFields<'static> {
        TokenFields {
            max_tokens,
            max_tokens_param: "max_tokens",
            default_max_tokens: default,
            logprobs: None,
            logprobs_param: "logprobs",
            prompt_logprobs: None,
        }
    }

    fn build_simple(
        f: &SamplingFields,
        max_tokens: Option<i64>,
    ) -> Result<SamplingParams, ApiError> {
        build(
            f,
            &fields16(max_tokens, DefaultMaxTokens::Fixed(16)),
            10,
            100,
        )
    }

    #[test]
    fn defaults() {
        let p = build_simple(&fields("{}"), None).unwrap();
        assert_eq!(p.max_tokens, 16);
        assert_eq!(p.temperature, 1.0);
        assert_eq!(p.n, 1);
        let p = build(
            &fields("{}"),
            &fields16(None, DefaultMaxTokens::RestOfContext),
            10,
            100,
        )
        .unwrap();
        assert_eq!(p.max_tokens, 90);
    }

    #[test]
    fn vllm_leniencies() {
        // max_tokens beyond the prompt's room is clamped to it.
        assert_eq!(
            build_simple(&fields("{}"), Some(95)).unwrap().max_tokens,
            90
        );
        let p = build_simple(&fields(r#"{"logit_bias": {"3": 250}, "seed": -1}"#), None).unwrap();
        assert_eq!(p.logit_bias, vec![(3, 100.0)]);
        assert_eq!(p.seed, None);
        let p = build_simple(&fields(r#"{"temperature": 0.001}"#), None).unwrap();
        assert_eq!(p.temperature, 0.01);
        let p = build_simple(&fields(r#"{"seed": 7}"#), None).unwrap();
        assert_eq!(p.seed, Some(7));
    }

    #[test]
    fn errors_name_the_param() {
        let cases = [
            (r#"{}"#, Some(-1), "max_tokens"),
            (r#"{}"#, Some(101), "max_tokens"),
            (r#"{"temperature": 2.5}"#, None, "temperature"),
            (r#"{"n": 2, "temperature": 0}"#, None, "n"),
            (r#"{"stream_options": {}}"#, None, "stream_options"),
            (r#"{"temperature": -0.5}"#, None, "temperature"),
            (r#"{"top_p": 0}"#, None, "top_p"),
            (r#"{"n": 0}"#, None, "n"),
            (r#"{"min_tokens": 20}"#, Some(5), "min_tokens"),
            (r#"{"presence_penalty": 3}"#, None, "presence_penalty"),
            (r#"{"logit_bias": {"-1": 1}}"#, None, "logit_bias"),
            (r#"{"logit_bias": {"abc": 1}}"#, None, "logit_bias"),
            (r#"{"stop": ""}"#, None, "stop"),
        ];
        for (json, max, param) in cases {
            let e = build_simple(&fields(json), max).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}: {e}");
            assert_eq!(e.status.as_u16(), 400);
        }
        let e = build(
            &fields("{}"),
            &fields16(None, DefaultMaxTokens::Fixed(16)),
            100,
            100,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
