//! One benchmark request, timed as vLLM's `openai` / `openai-chat` request
//! functions time it (`vllm/benchmarks/lib/endpoint_request_func.py`):
//! the payload they send, the chunks that count as generated output, and
//! TTFT, ITL and latency taken at those chunks.
//!
//! - TTFT: from just before the request is sent to the first chunk that
//!   carries output: for completions any chunk with a non-empty `choices`
//!   (its text may be empty, e.g. a special token); for chat a chunk whose
//!   `delta` has content, reasoning or tool calls, or an empty `content`
//!   without `role` (the opening `role` chunk is not output).
//! - ITL: between consecutive output chunks.
//! - Latency (E2EL): from the start to the last output chunk (the trailing
//!   usage chunk and `[DONE]` do not move it), so `latency - ttft` is the
//!   sum of the ITLs.
//! - Output tokens: `usage.completion_tokens` of the usage chunk
//!   (`stream_options.include_usage` is always sent); `prompt_tokens` there
//!   replaces the dataset's prompt length.
//!
//! A request fails on a non-2xx status, a transport error, an event whose
//! JSON has an `error` member (vLLM's client ignores those; here an error
//! mid-stream is a failure, not a short success), data that is not JSON, a
//! stream without output, or one that ends without `[DONE]`. Generated text
//! is never inspected for words like "error".

use super::args::Backend;
use super::sse::SseParser;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use std::time::Instant;

/// What is sent, per request.
#[derive(Clone, Debug)]
pub struct RequestInput {
    pub prompt: String,
    pub prompt_len: usize,
    pub output_len: usize,
    pub request_id: String,
    /// Hang up after the first output chunk (`--disconnect-fraction`).
    pub hang_up: bool,
}

/// What is sent to every request alike.
#[derive(Clone, Debug)]
pub struct RequestConfig {
    pub backend: Backend,
    pub api_url: String,
    /// The `model` field of the payload.
    pub model: String,
    pub logprobs: Option<u32>,
    pub ignore_eos: bool,
    /// Sampling parameters, merged into the payload last.
    pub extra_body: Map<String, Value>,
    /// `Authorization: Bearer` from `OPENAI_API_KEY`, as vLLM sends it.
    pub api_key: Option<String>,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failed,
    /// HTTP 503: the server shed load. A failure to vLLM's figures, and
    /// also counted on its own.
    Overloaded,
    /// The client hung up on purpose; neither a success nor a failure.
    Disconnected,
}

/// One request's measurements; times in seconds.
#[derive(Clone, Debug)]
pub struct RequestOutput {
    pub outcome: Outcome,
    pub generated_text: String,
    pub latency: f64,
    /// `usage.completion_tokens`; `None` when the server sent no usage.
    pub output_tokens: Option<u64>,
    pub ttft: f64,
    pub itl: Vec<f64>,
    pub prompt_len: usize,
    pub error: String,
    /// When it was sent, in seconds since the benchmark's clock origin.
    pub start_time: f64,
    /// Time spent waiting for a `--max-concurrency` slot.
    pub client_queue_time: f64,
}

impl RequestOutput {
    pub fn success(&self) -> bool {
        self.outcome == Outcome::Success
    }

    fn new(prompt_len: usize, start_time: f64) -> Self {
        RequestOutput {
            outcome: Outcome::Failed,
            generated_text: String::new(),
            latency: 0.0,
            output_tokens: None,
            ttft: 0.0,
            itl: Vec::new(),
            prompt_len,
            error: String::new(),
            start_time,
            client_queue_time: 0.0,
        }
    }
}

/// The request body vLLM's request function builds.
pub fn payload(cfg: &RequestConfig, input: &RequestInput) -> Value {
    let mut body = match cfg.backend {
        Backend::Openai => json!({
            "model": cfg.model,
            "prompt": input.prompt,
            "repetition_penalty": 1.0,
            "max_tokens": input.output_len,
            "logprobs": cfg.logprobs,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
        Backend::OpenaiChat => json!({
            "model": cfg.model,
            "messages": [{
                "role": "user",
                "content": [{"type": "text", "text": input.prompt}],
            }],
            "max_completion_tokens": input.output_len,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
    };
    if let Some(obj) = body.as_object_mut() {
        if cfg.ignore_eos {
            obj.insert("ignore_eos".into(), Value::Bool(true));
        }
        for (k, v) in &cfg.extra_body {
            obj.insert(k.clone(), v.clone());
        }
    }
    body
}

/// What one event's data means to the benchmark.
#[derive(Debug, PartialEq)]
pub enum Chunk {
    /// Generated output (the text may be empty).
    Output(String),
    Usage {
        completion_tokens: Option<u64>,
        prompt_tokens: Option<u64>,
    },
    /// A JSON `error` member: the server reports a failure in-stream.
    Error(String),
    Done,
    /// Anything else (e.g. the chat `role` chunk).
    Other,
}

/// Python truthiness of a JSON value, which vLLM's checks rely on.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|x| x != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// vLLM's `_choice_has_streamed_output`.
fn chat_choice_has_output(choice: &Value) -> bool {
    let Some(delta) = choice.get("delta").filter(|d| d.is_object()) else {
        return false;
    };
    if ["content", "reasoning", "tool_calls", "function_call"]
        .iter()
        .any(|k| truthy(delta.get(*k)))
    {
        return true;
    }
    // A token that decodes to "" (a special token) still is output; the
    // opening chunk carries `role` and is not.
    delta.get("content").and_then(Value::as_str) == Some("") && delta.get("role").is_none()
}

/// Classifies one event's data. `Err` when it is not JSON (vLLM's client
/// fails the request on that too).
pub fn classify(backend: Backend, data: &str) -> Result<Chunk, String> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(Chunk::Done);
    }
    let v: Value = serde_json::from_str(data).map_err(|e| {
        let head: String = data.chars().take(200).collect();
        format!("an event's data is not JSON ({e}): {head}")
    })?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string());
        return Ok(Chunk::Error(msg));
    }
    let first = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    match (backend, first) {
        (Backend::Openai, Some(choice)) => {
            let text = choice.get("text").and_then(Value::as_str).unwrap_or("");
            return Ok(Chunk::Output(text.to_string()));
        }
        (Backend::OpenaiChat, Some(choice)) if chat_choice_has_output(choice) => {
            let text = choice
                .get("delta")
                .and_then(|d| d.get("content"))
                .and_then(Value::as_str)
                .unwrap_or("");
            return Ok(Chunk::Output(text.to_string()));
        }
        _ => {}
    }
    // vLLM reads usage only from a chunk without output (`elif usage`).
    if truthy(v.get("usage")) {
        let field = |k: &str| v["usage"].get(k).and_then(Value::as_u64);
        return Ok(Chunk::Usage {
            completion_tokens: field("completion_tokens"),
            prompt_tokens: field("prompt_tokens"),
        });
    }
    Ok(Chunk::Other)
}

/// The per-request timing state, fed one event at a time; separate from
/// the HTTP code so that its arithmetic is testable with made-up clocks.
pub struct StreamTimer {
    backend: Backend,
    start: f64,
    last: f64,
    first_output: bool,
    pub out: RequestOutput,
    done: bool,
    error: Option<String>,
}

/// What the caller does after an event.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The first output chunk just arrived.
    FirstOutput,
    /// Stop reading: an error was reported.
    Stop,
}

impl StreamTimer {
    pub fn new(backend: Backend, prompt_len: usize, start: f64) -> Self {
        StreamTimer {
            backend,
            start,
            last: start,
            first_output: false,
            out: RequestOutput::new(prompt_len, start),
            done: false,
            error: None,
        }
    }

    /// One event's data, received at `now`.
    pub fn on_data(&mut self, data: &str, now: f64) -> Flow {
        match classify(self.backend, data) {
            Ok(Chunk::Output(text)) => {
                let first = !self.first_output;
                if first {
                    self.first_output = true;
                    self.out.ttft = now - self.start;
                } else {
                    self.out.itl.push(now - self.last);
                }
                self.last = now;
                self.out.generated_text.push_str(&text);
                if first {
                    return Flow::FirstOutput;
                }
            }
            Ok(Chunk::Usage {
                completion_tokens,
                prompt_tokens,
            }) => {
                self.out.output_tokens = completion_tokens;
                if let Some(p) = prompt_tokens {
                    self.out.prompt_len = p as usize;
                }
            }
            Ok(Chunk::Done) => self.done = true,
            Ok(Chunk::Other) => {}
            Ok(Chunk::Error(msg)) => {
                self.error = Some(format!("the server reported an error: {msg}"));
                return Flow::Stop;
            }
            Err(msg) => {
                self.error = Some(msg);
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// The stream ended (or was stopped); `transport` is a read error.
    pub fn finish(mut self, transport: Option<String>) -> RequestOutput {
        self.out.latency = self.last - self.start;
        let error = self.error.take().or(transport).or_else(|| {
            if !self.first_output {
                Some(
                    "Never received a valid chunk to calculate TTFT.\
                     This response will be marked as failed!"
                        .to_string(),
                )
            } else if !self.done {
                Some("the stream ended without `data: [DONE]`".to_string())
            } else {
                None
            }
        });
        match error {
            Some(e) => {
                self.out.outcome = Outcome::Failed;
                self.out.error = e;
            }
            None => self.out.outcome = Outcome::Success,
        }
        self.out
    }

    /// The client hangs up after the first output (`--disconnect-fraction`).
    pub fn disconnect(mut self) -> RequestOutput {
        self.out.latency = self.last - self.start;
        self.out.outcome = Outcome::Disconnected;
        self.out.error = "the client hung up after the first chunk (--disconnect-fraction)".into();
        self.out
    }
}

/// Sends one request and times its stream. Never panics on what the server
/// sends; every problem becomes the output's `error`.
pub async fn send(
    client: &reqwest::Client,
    cfg: &RequestConfig,
    input: &RequestInput,
    origin: Instant,
) -> RequestOutput {
    let now = || origin.elapsed().as_secs_f64();
    let body = payload(cfg, input);
    let mut req = client
        .post(&cfg.api_url)
        .header("x-request-id", &input.request_id)
        .json(&body);
    if let Some(key) = &cfg.api_key {
        req = req.bearer_auth(key);
    }
    let start = now();
    let mut timer = StreamTimer::new(cfg.backend, input.prompt_len, start);
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return timer.finish(Some(format!("request failed: {e}"))),
    };
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let head: String = text.chars().take(500).collect();
        let mut out = timer.finish(Some(format!("HTTP {status}: {head}")));
        if status.as_u16() == 503 {
            out.outcome = Outcome::Overloaded;
        }
        return out;
    }
    let mut parser = SseParser::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => return timer.finish(Some(format!("the stream broke: {e}"))),
        };
        for ev in parser.feed(&bytes) {
            if ev.event.as_deref() == Some("error") {
                let msg = format!("the server sent an error event: {}", ev.data);
                return timer.finish(Some(msg));
            }
            match timer.on_data(&ev.data, now()) {
                Flow::Continue => {}
                Flow::FirstOutput if input.hang_up => {
                    // Dropping the body closes the connection mid-stream.
                    drop(body);
                    return timer.disconnect();
                }
                Flow::FirstOutput => {}
                Flow::Stop => return timer.finish(None),
            }
        }
    }
    for ev in parser.finish() {
        if timer.on_data(&ev.data, now()) == Flow::Stop {
            break;
        }
    }
    timer.finish(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(text: &str) -> String {
        json!({"id": "x", "object": "text_completion",
               "choices": [{"index": 0, "text": text, "finish_reason": null}]})
        .to_string()
    }

    const USAGE: &str = r#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

    #[test]
    fn ttft_itl_and_latency_come_from_output_chunks() {
        let mut t = StreamTimer::new(Backend::Openai, 10, 100.0);
        assert_eq!(t.on_data(&completion("a"), 100.5), Flow::FirstOutput);
        assert_eq!(t.on_data(&completion("b"), 100.75), Flow::Continue);
        assert_eq!(t.on_data(&completion(""), 101.0), Flow::Continue);
        // The usage chunk and [DONE] arrive later and move nothing.
        t.on_data(USAGE, 105.0);
        t.on_data("[DONE]", 106.0);
        let out = t.finish(None);
        assert!(out.success(), "{}", out.error);
        assert_eq!(out.ttft, 0.5);
        assert_eq!(out.itl, vec![0.25, 0.25]);
        assert_eq!(out.latency, 1.0);
        assert_eq!(out.generated_text, "ab");
        assert_eq!(out.output_tokens, Some(3));
        assert_eq!(out.prompt_len, 12, "usage.prompt_tokens wins");
        let sum: f64 = out.itl.iter().sum();
        assert!((out.latency - out.ttft - sum).abs() < 1e-12);
    }

    #[test]
    fn the_word_error_in_generated_text_is_not_a_failure() {
        let mut t = StreamTimer::new(Backend::Openai, 1, 0.0);
        t.on_data(&completion("an error occurred"), 1.0);
        t.on_data(&completion(" {\"error\": 1}"), 2.0);
        t.on_data("[DONE]", 3.0);
        let out = t.finish(None);
        assert!(out.success(), "{}", out.error);
        assert_eq!(out.generated_text, "an error occurred {\"error\": 1}");

        let chat = json!({"choices": [{"index": 0, "delta": {"content": "error: none"}}]});
        assert_eq!(
            classify(Backend::OpenaiChat, &chat.to_string()),
            Ok(Chunk::Output("error: none".into()))
        );
    }

    #[test]
    fn an_error_event_is_a_failure() {
        let mut t = StreamTimer::new(Backend::Openai, 1, 0.0);
        t.on_data(&completion("a"), 1.0);
        let err = r#"{"error":{"message":"generation failed: boom","type":"internal_error"}}"#;
        assert_eq!(t.on_data(err, 2.0), Flow::Stop);
        let out = t.finish(None);
        assert_eq!(out.outcome, Outcome::Failed);
        assert!(
            out.error.contains("generation failed: boom"),
            "{}",
            out.error
        );
    }

    #[test]
    fn streams_without_output_or_done_fail() {
        let mut t = StreamTimer::new(Backend::Openai, 1, 0.0);
        t.on_data(USAGE, 1.0);
        t.on_data("[DONE]", 1.0);
        let out = t.finish(None);
        assert_eq!(out.outcome, Outcome::Failed);
        assert!(out.error.starts_with("Never received a valid chunk"));

        let mut t = StreamTimer::new(Backend::Openai, 1, 0.0);
        t.on_data(&completion("a"), 1.0);
        assert!(t.finish(None).error.contains("[DONE]"));

        let mut t = StreamTimer::new(Backend::Openai, 1, 0.0);
        assert_eq!(t.on_data("{not json", 1.0), Flow::Stop);
        assert!(t.finish(None).error.contains("not JSON"));
    }

    #[test]
    fn chat_role_chunk_is_not_output_but_an_empty_content_token_is() {
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(classify(Backend::OpenaiChat, role), Ok(Chunk::Other));
        let empty = r#"{"choices":[{"index":0,"delta":{"content":""}}]}"#;
        assert_eq!(
            classify(Backend::OpenaiChat, empty),
            Ok(Chunk::Output(String::new()))
        );
        let reasoning = r#"{"choices":[{"index":0,"delta":{"reasoning":"hmm"}}]}"#;
        assert_eq!(
            classify(Backend::OpenaiChat, reasoning),
            Ok(Chunk::Output(String::new()))
        );
        let mut t = StreamTimer::new(Backend::OpenaiChat, 1, 0.0);
        assert_eq!(t.on_data(role, 0.1), Flow::Continue);
        assert_eq!(
            t.on_data(r#"{"choices":[{"delta":{"content":"x"}}]}"#, 0.4),
            Flow::FirstOutput
        );
        assert_eq!(t.out.ttft, 0.4);
    }

    #[test]
    fn payloads_match_vllm() {
        let mut extra = Map::new();
        extra.insert("temperature".into(), json!(0.0));
        let cfg = RequestConfig {
            backend: Backend::Openai,
            api_url: "http://x/v1/completions".into(),
            model: "m".into(),
            logprobs: None,
            ignore_eos: true,
            extra_body: extra,
            api_key: None,
        };
        let input = RequestInput {
            prompt: "p".into(),
            prompt_len: 1,
            output_len: 7,
            request_id: "bench-0".into(),
            hang_up: false,
        };
        assert_eq!(
            payload(&cfg, &input),
            json!({"model": "m", "prompt": "p", "repetition_penalty": 1.0, "max_tokens": 7,
                   "logprobs": null, "stream": true, "stream_options": {"include_usage": true},
                   "ignore_eos": true, "temperature": 0.0})
        );
        let chat = RequestConfig {
            backend: Backend::OpenaiChat,
            ignore_eos: false,
            extra_body: Map::new(),
            ..cfg
        };
        assert_eq!(
            payload(&chat, &input),
            json!({"model": "m",
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "p"}]}],
                   "max_completion_tokens": 7, "stream": true,
                   "stream_options": {"include_usage": true}})
        );
    }
}
