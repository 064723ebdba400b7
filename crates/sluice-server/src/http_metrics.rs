//! HTTP request metrics, as vLLM exposes them through
//! prometheus-fastapi-instrumentator 8.1 (`Instrumentator(...).add()`, its
//! default metrics): `http_requests_total{handler,method,status}`,
//! `http_request_size_bytes{handler}` and `http_response_size_bytes
//! {handler}` (summaries of Content-Length), the unlabelled
//! `http_request_duration_highr_seconds` and `http_request_duration_seconds
//! {handler,method}` histograms, each with its `_created` gauge.
//!
//! Rules taken from the instrumentator and vLLM's use of it:
//! - `handler` is the route template (axum's `MatchedPath`, present for a
//!   wrong method too: vLLM's route walk takes the partial match), `none`
//!   for a path no route matches;
//! - requests whose handler (or, unmatched, whose path) contains one of
//!   `/metrics`, `/health`, `/load`, `/ping`, `/version`, `/server_info` are
//!   not counted (the instrumentator `re.search`es those patterns);
//! - `status` is grouped: `2xx`, `4xx`, ...;
//! - sizes are the Content-Length a message carries, 0 without one (a
//!   streamed response); the response's is the length it goes out with;
//! - the duration runs until the response body has been sent (or dropped:
//!   a client that hangs up mid-stream is counted, with the status already
//!   sent).
//!
//! Where it sits (`router()`): inside the CORS and API key layers, as the
//! instrumentator sits inside vLLM's CORS and authentication middleware,
//! so neither a preflight nor a 401 is counted; outside the body limits,
//! so a 413 is. One difference: a method outside the standard nine is
//! counted as `method="other"`, so that clients cannot grow the label set
//! without bound (the instrumentator keeps any method string).

use crate::body_end::OnBodyEnd;
use crate::metrics::Exposition;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use sluice_engine::Histogram;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// vLLM's excluded handlers.
const EXCLUDED: [&str; 6] = [
    "/metrics",
    "/health",
    "/load",
    "/ping",
    "/version",
    "/server_info",
];

/// The instrumentator's default `latency_highr_buckets`.
pub const HIGHR_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    7.5, 10.0, 30.0, 60.0,
];
/// The instrumentator's default `latency_lowr_buckets`.
pub const LOWR_BUCKETS: &[f64] = &[0.1, 0.5, 1.0];

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One labelled child: its labels, value and creation time (the
/// instrumentator creates children on first use).
struct Child<V> {
    labels: Vec<(&'static str, String)>,
    value: V,
    created: f64,
}

/// Children in creation order (as prometheus_client lists them); the sets
/// are small (routes × methods × status classes), so a scan is enough.
struct Family<V> {
    children: Vec<Child<V>>,
}

impl<V> Default for Family<V> {
    fn default() -> Self {
        Family {
            children: Vec::new(),
        }
    }
}

impl<V> Family<V> {
    fn get(&mut self, labels: &[(&'static str, &str)], new: impl FnOnce() -> V) -> &mut V {
        let same = |c: &Child<V>| {
            c.labels.len() == labels.len()
                && c.labels
                    .iter()
                    .zip(labels)
                    .all(|((k1, v1), (k2, v2))| k1 == k2 && v1 == v2)
        };
        let i = match self.children.iter().position(same) {
            Some(i) => i,
            None => {
                self.children.push(Child {
                    labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
                    value: new(),
                    created: unix_now(),
                });
                self.children.len() - 1
            }
        };
        &mut self.children[i].value
    }
}

#[derive(Default)]
struct Summary {
    count: u64,
    sum: f64,
}

struct Families {
    requests: Family<u64>,
    request_size: Family<Summary>,
    response_size: Family<Summary>,
    duration_highr: Histogram,
    duration_highr_created: f64,
    duration: Family<Histogram>,
}

/// The HTTP families of one server (cheap to clone, shared by the
/// middleware and the `/metrics` handler).
#[derive(Clone)]
pub struct HttpMetrics {
    inner: Arc<Mutex<Families>>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics::new()
    }
}

impl std::fmt::Debug for HttpMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpMetrics")
    }
}

/// What one finished request contributes.
struct Observation {
    handler: String,
    method: &'static str,
    status: String,
    request_size: f64,
    response_size: f64,
    seconds: f64,
}

impl HttpMetrics {
    pub fn new() -> Self {
        HttpMetrics {
            inner: Arc::new(Mutex::new(Families {
                requests: Family::default(),
                request_size: Family::default(),
                response_size: Family::default(),
                // Unlabelled: it exists (with zeros) from the start.
                duration_highr: Histogram::new(HIGHR_BUCKETS),
                duration_highr_created: unix_now(),
                duration: Family::default(),
            })),
        }
    }

    fn record(&self, o: &Observation) {
        let Ok(mut f) = self.inner.lock() else {
            return;
        };
        let handler = o.handler.as_str();
        *f.requests.get(
            &[
                ("handler", handler),
                ("method", o.method),
                ("status", &o.status),
            ],
            || 0,
        ) += 1;
        let s = f
            .request_size
            .get(&[("handler", handler)], Summary::default);
        s.count += 1;
        s.sum += o.request_size;
        let s = f
            .response_size
            .get(&[("handler", handler)], Summary::default);
        s.count += 1;
        s.sum += o.response_size;
        f.duration_highr.observe(o.seconds);
        f.duration
            .get(&[("handler", handler), ("method", o.method)], || {
                Histogram::new(LOWR_BUCKETS)
            })
            .observe(o.seconds);
    }

    /// Writes the five families (and their `_created` gauges).
    pub fn render(&self, w: &mut Exposition) {
        let Ok(f) = self.inner.lock() else {
            return;
        };
        fn labels<V>(c: &Child<V>) -> Vec<(&str, &str)> {
            c.labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
        }
        let requests: Vec<_> = f.requests.children.iter().map(labels).collect();
        let children: Vec<_> = f
            .requests
            .children
            .iter()
            .zip(&requests)
            .map(|(c, l)| (&l[..], c.value as f64, c.created))
            .collect();
        w.counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            &children,
        );
        for (name, help, family) in [
            (
                "http_request_size_bytes",
                "Content length of incoming requests by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ",
                &f.request_size,
            ),
            (
                "http_response_size_bytes",
                "Content length of outgoing responses by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ",
                &f.response_size,
            ),
        ] {
            let ls: Vec<_> = family.children.iter().map(labels).collect();
            let children: Vec<_> = family
                .children
                .iter()
                .zip(&ls)
                .map(|(c, l)| (&l[..], c.value.count, c.value.sum, c.created))
                .collect();
            w.summary(name, help, &children);
        }
        w.histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
            &[(&[], &f.duration_highr, f.duration_highr_created)],
        );
        let ls: Vec<_> = f.duration.children.iter().map(labels).collect();
        let children: Vec<_> = f
            .duration
            .children
            .iter()
            .zip(&ls)
            .map(|(c, l)| (&l[..], &c.value, c.created))
            .collect();
        w.histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
            &children,
        );
    }
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// The Content-Length header's value; 0 when absent or not a number (the
/// instrumentator's `int(headers.get("Content-Length", 0))`).
fn content_length(headers: &HeaderMap) -> f64 {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0.0, |n| n as f64)
}

fn is_excluded(handler: &str) -> bool {
    EXCLUDED.iter().any(|p| handler.contains(p))
}

/// Middleware (see the module docs): counts the request once its response
/// body is done.
pub async fn track(State(metrics): State<HttpMetrics>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let excluded = is_excluded(matched.as_deref().unwrap_or(req.uri().path()));
    // The `/metrics` handler renders these families from the extension.
    req.extensions_mut().insert(metrics.clone());
    if excluded {
        return next.run(req).await;
    }
    let method = method_label(req.method());
    let request_size = content_length(req.headers());
    let resp = next.run(req).await;
    let status = format!("{}xx", resp.status().as_u16() / 100);
    let (parts, body) = resp.into_parts();
    // Hyper writes the exact size of a fixed body as its Content-Length.
    let response_size = if parts.headers.contains_key(header::CONTENT_LENGTH) {
        content_length(&parts.headers)
    } else {
        http_body::Body::size_hint(&body)
            .exact()
            .map_or(0.0, |n| n as f64)
    };
    let pending = Pending {
        metrics,
        start,
        observation: Observation {
            handler: matched.unwrap_or_else(|| "none".to_owned()),
            method,
            status,
            request_size,
            response_size,
            seconds: 0.0,
        },
    };
    Response::from_parts(
        parts,
        OnBodyEnd::wrap(body, move || {
            let mut p = pending;
            p.observation.seconds = p.start.elapsed().as_secs_f64();
            p.metrics.record(&p.observation);
        }),
    )
}

/// An observation waiting for its response body to finish.
struct Pending {
    metrics: HttpMetrics,
    start: Instant,
    observation: Observation,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excluded_handlers_match_anywhere_as_re_search_does() {
        for h in ["/metrics", "/metrics/x", "/health", "/version", "/a/ping"] {
            assert!(is_excluded(h), "{h}");
        }
        for h in ["/v1/completions", "/ready", "/tokenize", "none"] {
            assert!(!is_excluded(h), "{h}");
        }
    }

    #[test]
    fn families_render_with_sorted_labels_and_created() {
        let m = HttpMetrics::new();
        for status in ["2xx", "2xx", "4xx"] {
            m.record(&Observation {
                handler: "/v1/completions".into(),
                method: "POST",
                status: status.into(),
                request_size: 10.0,
                response_size: 100.0,
                seconds: 0.2,
            });
        }
        let mut w = Exposition::new();
        m.render(&mut w);
        let text = w.finish();
        for line in [
            "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"2xx\"} 2.0",
            "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"4xx\"} 1.0",
            "# TYPE http_requests_created gauge",
            "http_request_size_bytes_count{handler=\"/v1/completions\"} 3.0",
            "http_request_size_bytes_sum{handler=\"/v1/completions\"} 30.0",
            "http_response_size_bytes_sum{handler=\"/v1/completions\"} 300.0",
            "http_request_duration_highr_seconds_bucket{le=\"0.25\"} 3.0",
            "http_request_duration_highr_seconds_bucket{le=\"0.1\"} 0.0",
            "http_request_duration_highr_seconds_count 3.0",
            "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"0.5\",method=\"POST\"} 3.0",
            "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"+Inf\",method=\"POST\"} 3.0",
            "# TYPE http_request_size_bytes summary",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    #[test]
    fn status_classes_and_methods() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "other");
        let mut h = HeaderMap::new();
        assert_eq!(content_length(&h), 0.0);
        h.insert(header::CONTENT_LENGTH, "42".parse().unwrap());
        assert_eq!(content_length(&h), 42.0);
    }
}
