//! The access log: one line per HTTP request, written when its response
//! is done (the last byte sent, or the client gone), as uvicorn's access
//! log in vLLM.
//!
//! Every line has the request line (method, path, HTTP version), the
//! status and the duration (arrival to response done). A generation
//! request (`/v1/completions`, `/v1/chat/completions`) that reached the
//! engine adds its request id (the response's `id`), client key, prompt
//! and output tokens (the response's `usage`; for a stream cut short, the
//! tokens sent), its time to first token and its finish reasons. Through
//! a [`AccessNote`] the middleware puts on the request, which the
//! handlers fill in ([`AccessNote::watch`]).
//!
//! `/health`, `/ready` and `/metrics` are logged at debug only: kubelet
//! probes and Prometheus call them every few seconds, and at info their
//! lines would bury the requests' (vLLM added a filter for the same
//! noise). Sits outermost (`router()`), so 401s, CORS preflights and 413s
//! get their lines too. Query strings are left out: they can hold
//! secrets.

use crate::body_end::OnBodyEnd;
use crate::logging::{self, Level};
use crate::submit::Event;
use axum::extract::Request;
use axum::http::{Method, StatusCode, Version};
use axum::middleware::Next;
use axum::response::Response;
use futures::stream::{BoxStream, StreamExt};
use serde_json::Value;
use sluice_engine::Usage;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Paths polled by probes and scrapers: logged at debug.
const PROBES: [&str; 3] = ["/health", "/ready", "/metrics"];

/// What a generation handler tells the access log about its request; a
/// clone goes into the request's extensions.
#[derive(Clone, Debug)]
pub struct AccessNote {
    inner: Arc<Mutex<Note>>,
}

#[derive(Debug)]
struct Note {
    start: Instant,
    generation: Option<Generation>,
}

/// A generation request as far as it got.
#[derive(Debug, Default)]
struct Generation {
    request_id: String,
    client_key: Option<String>,
    /// Prompts submitted, their tokens, and completions expected (× `n`).
    prompts: usize,
    prompt_tokens: usize,
    choices: usize,
    ttft: Option<Duration>,
    /// Tokens seen in outputs (the count for a stream cut short).
    streamed_tokens: usize,
    /// Prompts whose usage came, and that usage summed.
    prompts_done: usize,
    usage: Usage,
    /// Completions finished, and their distinct reasons in order.
    finished: usize,
    reasons: Vec<&'static str>,
}

/// What one submitted generation request is.
pub struct Submitted<'a> {
    pub request_id: &'a str,
    pub client_key: Option<String>,
    pub prompts: usize,
    pub prompt_tokens: usize,
    /// Prompts × `n`.
    pub choices: usize,
}

impl AccessNote {
    fn new(start: Instant) -> Self {
        AccessNote {
            inner: Arc::new(Mutex::new(Note {
                start,
                generation: None,
            })),
        }
    }

    /// Records `submitted` and returns `events`, observed on their way to
    /// the response: the first output with tokens is the time to first
    /// token, each prompt's usage and each completion's finish reason are
    /// counted.
    pub fn watch(
        &self,
        submitted: Submitted<'_>,
        events: BoxStream<'static, Event>,
    ) -> BoxStream<'static, Event> {
        if let Ok(mut n) = self.inner.lock() {
            n.generation = Some(Generation {
                request_id: submitted.request_id.to_string(),
                client_key: submitted.client_key,
                prompts: submitted.prompts,
                prompt_tokens: submitted.prompt_tokens,
                choices: submitted.choices,
                ..Generation::default()
            });
        }
        let note = self.inner.clone();
        events
            .inspect(move |ev| {
                let Ok(mut n) = note.lock() else {
                    return;
                };
                let start = n.start;
                if let Some(g) = n.generation.as_mut() {
                    g.observe(start, ev);
                }
            })
            .boxed()
    }
}

/// [`AccessNote::watch`] when the access log is on (`note` is the
/// request's), `events` as they are otherwise.
pub fn observe(
    note: Option<&AccessNote>,
    submitted: Submitted<'_>,
    events: BoxStream<'static, Event>,
) -> BoxStream<'static, Event> {
    match note {
        Some(note) => note.watch(submitted, events),
        None => events,
    }
}

impl Generation {
    fn observe(&mut self, start: Instant, ev: &Event) {
        match ev {
            Event::Output { out, .. } => {
                if !out.token_ids.is_empty() && self.ttft.is_none() {
                    self.ttft = Some(start.elapsed());
                }
                self.streamed_tokens += out.token_ids.len();
                if let Some(f) = &out.finished {
                    self.finished += 1;
                    let r = f.reason.as_str();
                    if !self.reasons.contains(&r) {
                        self.reasons.push(r);
                    }
                }
            }
            Event::Done { usage, .. } => {
                self.prompts_done += 1;
                crate::submit::add_usage(&mut self.usage, usage);
            }
        }
    }

    /// The usage as the response has it, or what was sent of a response
    /// cut short.
    fn tokens(&self) -> (usize, usize) {
        if self.prompts_done == self.prompts {
            (self.usage.prompt_tokens, self.usage.completion_tokens)
        } else {
            (self.prompt_tokens, self.streamed_tokens)
        }
    }

    /// `stop`, `length,stop`, ...; completions that never finished (the
    /// client went away first) count as `abort`.
    fn finish_reason(&self) -> String {
        let mut reasons = self.reasons.clone();
        if self.finished < self.choices && !reasons.contains(&"abort") {
            reasons.push("abort");
        }
        reasons.join(",")
    }
}

/// Middleware (see the module docs).
pub async fn track(mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let path = req.uri().path().to_owned();
    let level = if PROBES.contains(&path.as_str()) {
        Level::Debug
    } else {
        Level::Info
    };
    if !logging::enabled(level) {
        return next.run(req).await;
    }
    let note = AccessNote::new(start);
    req.extensions_mut().insert(note.clone());
    let request_line = RequestLine {
        method: req.method().clone(),
        path,
        version: req.version(),
    };
    let resp = next.run(req).await;
    let pending = Pending {
        note,
        level,
        request_line,
        status: resp.status(),
    };
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, OnBodyEnd::wrap(body, move || pending.write()))
}

struct RequestLine {
    method: Method,
    path: String,
    version: Version,
}

/// A line waiting for its response to be done.
struct Pending {
    note: AccessNote,
    level: Level,
    request_line: RequestLine,
    status: StatusCode,
}

impl Pending {
    fn write(self) {
        let Ok(note) = self.note.inner.lock() else {
            return;
        };
        let (msg, fields) = line(
            &self.request_line,
            self.status,
            note.start.elapsed(),
            note.generation.as_ref(),
        );
        logging::log(self.level, &msg, &fields);
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// The access line: its text and its fields.
fn line(
    r: &RequestLine,
    status: StatusCode,
    duration: Duration,
    generation: Option<&Generation>,
) -> (String, Vec<(&'static str, Value)>) {
    let mut msg = format!(
        "\"{} {} {:?}\" {} {}",
        r.method,
        r.path,
        r.version,
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let mut fields: Vec<(&'static str, Value)> = vec![
        ("event", "access".into()),
        ("method", r.method.as_str().into()),
        ("path", r.path.as_str().into()),
        ("status", status.as_u16().into()),
    ];
    if let Some(g) = generation {
        let (prompt_tokens, output_tokens) = g.tokens();
        let finish = g.finish_reason();
        let ttft = g.ttft.map(ms);
        msg.push_str(&format!(
            " request_id={} client_key={} prompt_tokens={prompt_tokens} \
             output_tokens={output_tokens} ttft_ms={}",
            g.request_id,
            // Quoted: a client-chosen `user` could hold a space or a newline.
            g.client_key
                .as_ref()
                .map_or_else(|| "-".to_string(), |k| format!("{k:?}")),
            ttft.map_or_else(|| "-".to_string(), |t| format!("{t:.1}")),
        ));
        fields.extend([
            ("request_id", g.request_id.as_str().into()),
            ("client_key", g.client_key.clone().into()),
            ("prompt_tokens", prompt_tokens.into()),
            ("output_tokens", output_tokens.into()),
            ("ttft_ms", ttft.into()),
            ("finish_reason", finish.as_str().into()),
        ]);
        msg.push_str(&format!(
            " duration_ms={:.1} finish_reason={finish}",
            ms(duration)
        ));
    } else {
        msg.push_str(&format!(" duration_ms={:.1}", ms(duration)));
    }
    fields.push(("duration_ms", ms(duration).into()));
    (msg, fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_line(method: Method, path: &str) -> RequestLine {
        RequestLine {
            method,
            path: path.into(),
            version: Version::HTTP_11,
        }
    }

    #[test]
    fn a_short_line_without_a_generation() {
        let (msg, fields) = line(
            &request_line(Method::GET, "/v1/models"),
            StatusCode::OK,
            Duration::from_micros(1234),
            None,
        );
        assert_eq!(msg, "\"GET /v1/models HTTP/1.1\" 200 OK duration_ms=1.2");
        assert!(fields.iter().any(|(k, v)| *k == "status" && *v == 200));
    }

    #[test]
    fn a_generation_line_with_its_usage_and_reasons() {
        let mut g = Generation {
            request_id: "cmpl-1".into(),
            client_key: Some("tenant a".into()),
            prompts: 1,
            prompt_tokens: 5,
            choices: 2,
            ..Generation::default()
        };
        g.reasons = vec!["length"];
        g.finished = 1;
        g.ttft = Some(Duration::from_millis(12));
        g.streamed_tokens = 3;
        let (msg, _) = line(
            &request_line(Method::POST, "/v1/completions"),
            StatusCode::OK,
            Duration::from_millis(40),
            Some(&g),
        );
        assert_eq!(
            msg,
            "\"POST /v1/completions HTTP/1.1\" 200 OK request_id=cmpl-1 \
             client_key=\"tenant a\" prompt_tokens=5 output_tokens=3 ttft_ms=12.0 \
             duration_ms=40.0 finish_reason=length,abort"
        );
        g.prompts_done = 1;
        g.usage = Usage {
            prompt_tokens: 5,
            completion_tokens: 4,
            cached_tokens: 0,
        };
        assert_eq!(g.tokens(), (5, 4));
    }
}
