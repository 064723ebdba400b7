//! Connections: the accept loop, one task per connection, and what bounds
//! each connection's life.
//!
//! Promises:
//! - every accepted socket has `TCP_NODELAY`: a streamed token is one small
//!   write, and with Nagle's algorithm on it would wait for the client's
//!   delayed ACK (about 40 ms per event on Linux);
//! - a connection with no request in flight is closed `keep_alive` after it
//!   became idle if no byte of a next request arrived, or `header_read`
//!   after the first byte of a request whose headers never completed
//!   (slowloris);
//! - a connection whose writes have been blocked for `write_stall` (a client
//!   that stopped reading) is closed;
//! - request bodies are bounded in time and size by `body.rs`, before any
//!   handler runs;
//! - on shutdown the listener closes, idle connections close at once, and
//!   connections with a request in flight get keep-alive turned off so they
//!   close after their response; [`Phase::Closing`] then closes every
//!   connection still open, whatever it is doing.
//!
//! The timeouts are checked by a watchdog inside each connection's task
//! (one timer per connection, no shared state), from counters the socket
//! wrapper and the request guard keep.

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tower::ServiceExt;

/// Connection timeouts (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Idle time after a response (or after accept) before the connection
    /// is closed when no byte of a next request arrived. uvicorn's
    /// `timeout_keep_alive`, 5 s under vLLM.
    pub keep_alive: Duration,
    /// From the first byte of a request to the end of its headers (and for
    /// the TLS handshake).
    pub header_read: Duration,
    /// From the end of the headers to the end of the body.
    pub body_read: Duration,
    /// How long writes may stay blocked (the client reads nothing) before
    /// the connection is closed.
    pub write_stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            keep_alive: Duration::from_secs(5),
            header_read: Duration::from_secs(30),
            body_read: Duration::from_secs(60),
            write_stall: Duration::from_secs(60),
        }
    }
}

/// Where the server is in its life; connections watch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// Shutting down: idle connections close, busy ones finish their
    /// response without keep-alive.
    Draining,
    /// Every connection closes now.
    Closing,
}

const NONE: u64 = u64::MAX;

/// Per-connection counters, written by the socket wrapper and the request
/// guard, read by the watchdog. Times are milliseconds since `epoch`.
struct ConnState {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// When the connection last had no request in flight.
    ready_since: AtomicU64,
    /// When the first byte of a next request arrived while idle (`NONE`
    /// while nothing arrived).
    first_byte: AtomicU64,
    /// Since when writes are blocked (`NONE` when not blocked).
    write_blocked_since: AtomicU64,
}

impl ConnState {
    fn new() -> Self {
        ConnState {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            ready_since: AtomicU64::new(0),
            first_byte: AtomicU64::new(NONE),
            write_blocked_since: AtomicU64::new(NONE),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn on_read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.first_byte.compare_exchange(
                NONE,
                self.now(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn on_write(&self, blocked: bool) {
        if blocked {
            let _ = self.write_blocked_since.compare_exchange(
                NONE,
                self.now(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        } else {
            self.write_blocked_since.store(NONE, Ordering::Release);
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.first_byte.store(NONE, Ordering::Release);
    }

    fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ready_since.store(self.now(), Ordering::Release);
            self.first_byte.store(NONE, Ordering::Release);
        }
    }

    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Why the connection must close now, if it must.
    fn expired(&self, t: &Timeouts) -> Option<&'static str> {
        let now = self.now();
        let since = |at: u64| Duration::from_millis(now.saturating_sub(at));
        let blocked = self.write_blocked_since.load(Ordering::Acquire);
        if blocked != NONE && since(blocked) >= t.write_stall {
            return Some("the client read nothing");
        }
        if !self.is_idle() {
            return None;
        }
        match self.first_byte.load(Ordering::Acquire) {
            NONE if since(self.ready_since.load(Ordering::Acquire)) >= t.keep_alive => {
                Some("idle keep-alive")
            }
            NONE => None,
            first if since(first) >= t.header_read => Some("request headers not received"),
            _ => None,
        }
    }
}

/// The socket, counting reads and blocked writes for the watchdog.
struct Tracked<I> {
    io: I,
    state: Arc<ConnState>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.on_read();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.state.on_write(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.state.on_write(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.state.on_write(r.is_pending());
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Marks a request in flight from the moment hyper hands it over until its
/// response body is dropped (sent, or abandoned with the connection).
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(state: &Arc<ConnState>) -> Self {
        state.request_started();
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that keeps its request marked in flight.
struct GuardedBody {
    body: Body,
    _guard: InFlight,
}

impl http_body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// How often the watchdog looks: often enough that a timeout fires within
/// a quarter of its length, rarely enough to cost nothing.
fn watchdog_period(t: &Timeouts) -> Duration {
    let shortest = t.keep_alive.min(t.header_read).min(t.write_stall);
    (shortest / 4).clamp(Duration::from_millis(20), Duration::from_millis(500))
}

/// Serves one connection until it ends, a timeout closes it, or the
/// server's phase says so. `io` is a TCP stream (with `TCP_NODELAY` set) or
/// a TLS stream over one.
pub async fn serve_connection<I>(
    io: I,
    app: Router,
    timeouts: Timeouts,
    mut phase: watch::Receiver<Phase>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(ConnState::new());
    let io = TokioIo::new(Tracked {
        io,
        state: state.clone(),
    });
    let service_state = state.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = InFlight::new(&service_state);
        let app = app.clone();
        async move {
            let resp = app.oneshot(req.map(Body::new)).await?;
            Ok::<_, std::convert::Infallible>(resp.map(|body| GuardedBody {
                body,
                _guard: guard,
            }))
        }
    });
    // No hyper header timer: the watchdog below owns every timeout, so that
    // idle keep-alive and slow headers have separate limits.
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(watchdog_period(&timeouts));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining = false;
    // Set once a draining connection is idle: hyper closes it itself after
    // flushing the last response; this only bounds how long that may take
    // (a request that ended a moment ago may still be in hyper's buffer).
    let mut close_at: Option<tokio::time::Instant> = None;
    loop {
        let deadline = async {
            match close_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = deadline => return,
            _ = tick.tick() => {
                if state.expired(&timeouts).is_some() {
                    return;
                }
            }
            changed = phase.changed() => {
                let now = if changed.is_err() { Phase::Closing } else { *phase.borrow() };
                match now {
                    Phase::Running => {}
                    Phase::Draining if !draining => {
                        draining = true;
                        // Idle: closes now. Busy: no keep-alive after the
                        // response in flight.
                        conn.as_mut().graceful_shutdown();
                    }
                    Phase::Draining => {}
                    Phase::Closing => return,
                }
            }
        }
        if draining && close_at.is_none() && state.is_idle() {
            // Nothing accepted on this connection (or a request still
            // sending its headers, which hyper would wait for): go.
            close_at = Some(tokio::time::Instant::now() + FLUSH_BEFORE_CLOSE);
        }
    }
}

/// How long a draining, idle connection may take to flush before it is
/// dropped.
const FLUSH_BEFORE_CLOSE: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts() -> Timeouts {
        Timeouts {
            keep_alive: Duration::from_millis(100),
            header_read: Duration::from_millis(300),
            body_read: Duration::from_secs(1),
            write_stall: Duration::from_millis(200),
        }
    }

    fn at(ms: u64) -> u64 {
        ms
    }

    /// A state whose clock reads `now_ms`: epoch moved back by that much.
    fn state_at(now_ms: u64) -> ConnState {
        let s = ConnState::new();
        ConnState {
            epoch: s.epoch - Duration::from_millis(now_ms),
            ..s
        }
    }

    #[test]
    fn idle_connection_expires_after_keep_alive() {
        let t = timeouts();
        let s = state_at(50);
        assert_eq!(s.expired(&t), None);
        let s = state_at(150);
        assert_eq!(s.expired(&t), Some("idle keep-alive"));
    }

    #[test]
    fn partial_headers_get_the_header_timeout_instead() {
        let t = timeouts();
        let s = state_at(1000);
        s.ready_since.store(at(900), Ordering::Release);
        s.first_byte.store(at(950), Ordering::Release);
        // 100 ms idle, but a request has started arriving: not expired.
        assert_eq!(s.expired(&t), None);
        s.first_byte.store(at(650), Ordering::Release);
        assert_eq!(s.expired(&t), Some("request headers not received"));
    }

    #[test]
    fn a_request_in_flight_is_not_idle_but_a_stalled_writer_expires() {
        let t = timeouts();
        let s = state_at(10_000);
        s.request_started();
        assert_eq!(s.expired(&t), None);
        s.write_blocked_since.store(at(9_900), Ordering::Release);
        assert_eq!(s.expired(&t), None);
        s.write_blocked_since.store(at(9_700), Ordering::Release);
        assert_eq!(s.expired(&t), Some("the client read nothing"));
        s.on_write(false);
        assert_eq!(s.expired(&t), None);
        s.request_ended();
        assert!(s.is_idle());
        // Idle from the end of the request on.
        assert_eq!(s.expired(&t), None);
    }
}
