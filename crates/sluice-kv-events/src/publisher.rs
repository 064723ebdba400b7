//! `ZmqEventPublisher`: vLLM 0.33's publisher of the same name, on its own
//! thread.
//!
//! - PUB socket: one multipart message per batch,
//!   `[topic, seq as 8-byte big-endian, msgpack payload]`, `seq` counting
//!   from 0 (vLLM's `itertools.count()`).
//! - Replay ROUTER socket (optional): a client sends
//!   `[empty delimiter, start seq as 8-byte big-endian]` (what a REQ socket
//!   sends, a DEALER must add the empty frame itself) and gets back every
//!   buffered batch with `seq >= start`, each as
//!   `[empty, topic, seq, payload]`, then the end marker
//!   `[empty, empty, -1 as 8-byte big-endian, empty]`. The last
//!   `buffer_steps` batches are kept.
//!
//! Promise: [`ZmqEventPublisher::publish`] never waits: it hands the batch
//! to a bounded queue (`max_queue_size`) and, when that is full, drops it
//! and counts it. (vLLM's `Queue.put` would block the scheduler there; the
//! engine step must not.) A subscriber that never reads cannot hold the
//! publisher thread back either: PUB drops for a full subscriber queue, and
//! a replay send that cannot go out within [`REPLAY_SEND_TIMEOUT`] ends
//! that client's replay. Encoding happens on the publisher thread.

use crate::config::{ConfigError, KvEventsConfig};
use crate::encode::KvEventBatch;
use bytes::Bytes;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's `SHUTDOWN_TIMEOUT`: how long shutdown waits for queued batches
/// to go out.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one replay message may wait for a slow replay client.
pub const REPLAY_SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// vLLM's `END_SEQ`: `(-1).to_bytes(8, "big", signed=True)`.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// Why the publisher could not start.
#[derive(Debug)]
pub enum PublisherError {
    Config(ConfigError),
    /// A socket could not bind / connect (the endpoint is named).
    Socket {
        endpoint: String,
        message: String,
    },
    Thread(String),
}

impl fmt::Display for PublisherError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublisherError::Config(e) => write!(f, "{e}"),
            PublisherError::Socket { endpoint, message } => write!(f, "{endpoint}: {message}"),
            PublisherError::Thread(m) => write!(f, "KV events publisher thread: {m}"),
        }
    }
}

impl std::error::Error for PublisherError {}

impl From<ConfigError> for PublisherError {
    fn from(e: ConfigError) -> Self {
        PublisherError::Config(e)
    }
}

/// Counters, readable while the publisher runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub published: u64,
    /// Batches dropped because the queue to the publisher thread was full
    /// (or the thread had stopped).
    pub dropped: u64,
}

#[derive(Default)]
struct Counters {
    published: AtomicU64,
    dropped: AtomicU64,
}

/// The last `buffer_steps` batches, for replay.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

pub struct ZmqEventPublisher {
    queue: Option<mpsc::Sender<KvEventBatch>>,
    counters: Arc<Counters>,
    data_parallel_rank: u32,
    endpoint: String,
    replay_endpoint: Option<String>,
    thread: Option<JoinHandle<()>>,
    /// Closed (sender dropped) when the thread's loop has ended.
    finished: std::sync::mpsc::Receiver<()>,
}

impl ZmqEventPublisher {
    /// Binds (or connects) the sockets on a new thread and returns once
    /// they are ready, or with the error that stopped them. Endpoint ports
    /// are offset by `data_parallel_rank` as vLLM does.
    pub fn start(
        config: &KvEventsConfig,
        data_parallel_rank: u32,
    ) -> Result<ZmqEventPublisher, PublisherError> {
        config.validate()?;
        let endpoint = offset_endpoint_port(&config.endpoint, data_parallel_rank);
        let replay_endpoint = config
            .replay_endpoint
            .as_deref()
            .map(|e| offset_endpoint_port(e, data_parallel_rank));
        let (tx, rx) = mpsc::channel(config.max_queue_size);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (finished_tx, finished) = std::sync::mpsc::channel::<()>();
        let counters = Arc::new(Counters::default());
        let task = PublisherTask {
            endpoint,
            replay_endpoint,
            buffer_steps: config.buffer_steps,
            topic: Bytes::from(config.topic.clone().into_bytes()),
            counters: counters.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("sluice-kv-events".into())
            .spawn(move || {
                let _finished = finished_tx;
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(PublisherError::Thread(e.to_string())));
                        return;
                    }
                };
                rt.block_on(task.run(rx, ready_tx));
            })
            .map_err(|e| PublisherError::Thread(e.to_string()))?;
        let (endpoint, replay_endpoint) = match ready_rx.recv() {
            Ok(Ok(bound)) => bound,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(PublisherError::Thread(
                    "exited before its sockets were ready".into(),
                ));
            }
        };
        Ok(ZmqEventPublisher {
            queue: Some(tx),
            counters,
            data_parallel_rank,
            endpoint,
            replay_endpoint,
            thread: Some(thread),
            finished,
        })
    }

    /// Queues one batch; never blocks. Returns false when it was dropped
    /// (queue full, or the publisher stopped). A batch without a rank gets
    /// this publisher's, as vLLM's `publish` does.
    pub fn publish(&self, mut batch: KvEventBatch) -> bool {
        if batch.data_parallel_rank.is_none() {
            batch.data_parallel_rank = Some(self.data_parallel_rank);
        }
        let sent = self
            .queue
            .as_ref()
            .is_some_and(|q| q.try_send(batch).is_ok());
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    pub fn stats(&self) -> PublisherStats {
        PublisherStats {
            published: self.counters.published.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
        }
    }

    /// The PUB endpoint as bound (a port of 0 resolved) or connected.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay endpoint as bound.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Stops taking batches, lets the thread send what is queued for up to
    /// [`SHUTDOWN_TIMEOUT`], then closes the sockets. Dropping the
    /// publisher does the same.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        // Closing the queue ends the thread's loop once it is drained.
        self.queue = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        match self.finished.recv_timeout(SHUTDOWN_TIMEOUT) {
            // Disconnected: the thread has dropped its end, it is exiting.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) | Ok(()) => {
                let _ = thread.join();
            }
            // Still sending: left to finish on its own (it owns everything
            // it uses), as vLLM's daemon thread is.
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

impl Drop for ZmqEventPublisher {
    fn drop(&mut self) {
        self.stop();
    }
}

type Ready = std::sync::mpsc::Sender<Result<(String, Option<String>), PublisherError>>;

struct PublisherTask {
    endpoint: String,
    replay_endpoint: Option<String>,
    buffer_steps: usize,
    topic: Bytes,
    counters: Arc<Counters>,
}

impl PublisherTask {
    async fn run(self, mut rx: mpsc::Receiver<KvEventBatch>, ready: Ready) {
        let mut pub_socket = PubSocket::new();
        let endpoint = if is_bind_endpoint(&self.endpoint) {
            match pub_socket.bind(&bind_address(&self.endpoint)).await {
                Ok(bound) => bound_name(&self.endpoint, &bound),
                Err(e) => return fail(&ready, &self.endpoint, e),
            }
        } else {
            match pub_socket.connect(&self.endpoint).await {
                Ok(()) => self.endpoint.clone(),
                Err(e) => return fail(&ready, &self.endpoint, e),
            }
        };
        let buffer: ReplayBuffer = Arc::new(Mutex::new(VecDeque::new()));
        let mut replay_endpoint = None;
        let mut replay_task = None;
        if let Some(requested) = &self.replay_endpoint {
            let mut router = RouterSocket::new();
            match router.bind(&bind_address(requested)).await {
                Ok(bound) => replay_endpoint = Some(bound_name(requested, &bound)),
                Err(e) => return fail(&ready, requested, e),
            }
            // Its own task, so a slow replay client never holds up PUB.
            replay_task = Some(tokio::spawn(serve_replay(
                router,
                buffer.clone(),
                self.topic.clone(),
            )));
        }
        if ready.send(Ok((endpoint, replay_endpoint))).is_err() {
            return;
        }
        let mut seq: u64 = 0;
        while let Some(batch) = rx.recv().await {
            let payload = Bytes::from(batch.encode());
            let frames = vec![
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            // Three frames: never the empty-message error.
            if let Ok(message) = ZmqMessage::try_from(frames) {
                match pub_socket.send(message).await {
                    Ok(()) => {
                        self.counters.published.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("sluice: KV events: publishing batch {seq} failed: {e}"),
                }
            }
            if self.buffer_steps > 0 {
                let mut b = lock(&buffer);
                if b.len() == self.buffer_steps {
                    b.pop_front();
                }
                b.push_back((seq, payload));
            }
            seq += 1;
        }
        if let Some(t) = replay_task {
            t.abort();
        }
        // Close the sockets now (not when the runtime is torn down).
        let _ = pub_socket.close().await;
    }
}

fn fail(ready: &Ready, endpoint: &str, e: zeromq::ZmqError) {
    let _ = ready.send(Err(PublisherError::Socket {
        endpoint: endpoint.to_string(),
        message: e.to_string(),
    }));
}

fn lock(buffer: &ReplayBuffer) -> std::sync::MutexGuard<'_, VecDeque<(u64, Bytes)>> {
    // A panic elsewhere while holding it leaves a usable deque.
    buffer.lock().unwrap_or_else(|p| p.into_inner())
}

async fn serve_replay(mut router: RouterSocket, buffer: ReplayBuffer, topic: Bytes) {
    loop {
        let request = match router.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                eprintln!("sluice: KV events: replay socket: {e}");
                return;
            }
        };
        // [client identity, empty delimiter, start seq], as vLLM expects.
        let [client, _, start] = request.as_slice() else {
            eprintln!(
                "sluice: KV events: invalid replay request ({} frames, expected 3)",
                request.len()
            );
            continue;
        };
        let start = start_seq(start);
        // Payloads are reference-counted: the snapshot copies no bytes and
        // the lock is not held while sending.
        let batches: Vec<(u64, Bytes)> = match start {
            Some(start) => lock(&buffer)
                .iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let mut sent_all = true;
        for (seq, payload) in batches {
            let frames = vec![
                client.clone(),
                Bytes::new(),
                topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            if !send_replay(&mut router, frames).await {
                sent_all = false;
                break;
            }
        }
        if sent_all {
            let end = vec![
                client.clone(),
                Bytes::new(),
                Bytes::new(),
                Bytes::from_static(&END_SEQ),
                Bytes::new(),
            ];
            send_replay(&mut router, end).await;
        }
    }
}

/// Whether the message went out in time.
async fn send_replay(router: &mut RouterSocket, frames: Vec<Bytes>) -> bool {
    let Ok(message) = ZmqMessage::try_from(frames) else {
        return false;
    };
    match tokio::time::timeout(REPLAY_SEND_TIMEOUT, router.send(message)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            eprintln!("sluice: KV events: replay send failed: {e}");
            false
        }
        Err(_) => {
            eprintln!("sluice: KV events: replay client too slow; its replay was cut short");
            false
        }
    }
}

/// Python's `int.from_bytes(frame, "big")`: any length, unsigned. A number
/// past u64 is after every sequence number (`None`: nothing to replay).
fn start_seq(frame: &[u8]) -> Option<u64> {
    frame
        .iter()
        .try_fold(0u64, |n, &b| n.checked_mul(256)?.checked_add(u64::from(b)))
}

/// vLLM's `_is_bind_endpoint` (tcp only here: see the config's check).
fn is_bind_endpoint(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::")
}

/// libzmq's `*` is every IPv4 interface; the zeromq crate resolves the host
/// as a name, so it is spelled out.
fn bind_address(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_string(),
    }
}

/// The endpoint to report: the requested one, with the port the OS chose
/// when it asked for port 0 (and `*` kept, as the user wrote it).
fn bound_name(requested: &str, bound: &zeromq::Endpoint) -> String {
    match (requested.rsplit_once(':'), bound) {
        (Some((base, "0")), zeromq::Endpoint::Tcp(_, port)) => format!("{base}:{port}"),
        _ => requested.to_string(),
    }
}

/// vLLM's `offset_endpoint_port`: rank r publishes on port + r (port 0 is
/// left for the OS).
fn offset_endpoint_port(endpoint: &str, data_parallel_rank: u32) -> String {
    if data_parallel_rank == 0 {
        return endpoint.to_string();
    }
    match endpoint.rsplit_once(':') {
        Some((base, port)) => match port.parse::<u32>() {
            Ok(0) | Err(_) => endpoint.to_string(),
            Ok(p) => format!("{base}:{}", p.saturating_add(data_parallel_rank)),
        },
        None => endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_seq_reads_big_endian_of_any_length() {
        assert_eq!(start_seq(&5u64.to_be_bytes()), Some(5));
        assert_eq!(start_seq(&[1, 0]), Some(256));
        assert_eq!(start_seq(&[]), Some(0));
        assert_eq!(start_seq(&[1; 9]), None);
    }

    #[test]
    fn endpoints_as_vllm_offsets_and_binds_them() {
        assert_eq!(offset_endpoint_port("tcp://*:5557", 0), "tcp://*:5557");
        assert_eq!(offset_endpoint_port("tcp://*:5557", 2), "tcp://*:5559");
        assert_eq!(offset_endpoint_port("tcp://*:0", 2), "tcp://*:0");
        assert!(is_bind_endpoint("tcp://*:5557"));
        assert!(!is_bind_endpoint("tcp://10.0.0.1:5557"));
        assert_eq!(bind_address("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(bind_address("tcp://127.0.0.1:0"), "tcp://127.0.0.1:0");
    }
}
