//! The publisher over real sockets, with subscribers from the same ZeroMQ
//! crate: every batch arrives in sequence order and decodes into vLLM's
//! schema, replay returns missed batches and the end marker, and a
//! subscriber that never reads does not slow the caller of `publish`.

use bytes::Bytes;
use rmpv::Value;
use sluice_kv_events::{KvCacheEvent, KvEventBatch, KvEventsConfig, ZmqEventPublisher};
use std::time::{Duration, Instant};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

fn config(replay: bool, max_queue_size: usize) -> KvEventsConfig {
    KvEventsConfig {
        enable_kv_cache_events: true,
        publisher: sluice_kv_events::PublisherKind::Zmq,
        // `*`: bound, as vLLM decides; the OS picks the ports.
        endpoint: "tcp://*:0".into(),
        replay_endpoint: replay.then(|| "tcp://*:0".into()),
        buffer_steps: 4,
        hwm: 10,
        max_queue_size,
        topic: "kv".into(),
    }
}

/// Where a client on this host reaches a `tcp://*:PORT` endpoint.
fn local(endpoint: &str) -> String {
    endpoint.replace('*', "127.0.0.1")
}

fn batch(i: u64, tokens: usize) -> KvEventBatch {
    KvEventBatch {
        ts: 1000.0 + i as f64,
        events: vec![
            KvCacheEvent::BlockStored {
                block_hashes: vec![i, u64::MAX - i],
                parent_block_hash: (i > 0).then(|| i - 1),
                token_ids: (0..tokens as u32).collect(),
                block_size: 16,
                lora_id: None,
                medium: None,
                group: None,
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![i + 7],
                medium: Some("GPU".into()),
                group_idx: None,
            },
        ],
        data_parallel_rank: None,
    }
}

fn seq(frame: &Bytes) -> u64 {
    u64::from_be_bytes(frame.as_ref().try_into().expect("8-byte seq"))
}

fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
    map.as_map()
        .expect("event is a map")
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in {map}"))
}

/// Decodes a payload as vLLM's KVEventBatch and checks it is batch `i`.
fn check_payload(payload: &[u8], i: u64) {
    let v = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let a = v.as_array().expect("array_like batch");
    assert_eq!(a.len(), 3);
    assert_eq!(a[0].as_f64(), Some(1000.0 + i as f64));
    assert_eq!(a[2].as_u64(), Some(0), "rank filled in by the publisher");
    let events = a[1].as_array().expect("events");
    assert_eq!(field(&events[0], "type").as_str(), Some("BlockStored"));
    let hashes: Vec<u64> = field(&events[0], "block_hashes")
        .as_array()
        .expect("hashes")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(hashes, vec![i, u64::MAX - i]);
    assert_eq!(field(&events[0], "block_size").as_u64(), Some(16));
    assert!(field(&events[0], "lora_name").is_nil());
    assert_eq!(field(&events[1], "type").as_str(), Some("BlockRemoved"));
    assert_eq!(field(&events[1], "medium").as_str(), Some("GPU"));
}

async fn subscriber(endpoint: &str) -> SubSocket {
    let mut sub = SubSocket::new();
    sub.connect(&local(endpoint)).await.expect("connect");
    sub.subscribe("kv").await.expect("subscribe");
    sub
}

async fn recv_timeout(sub: &mut SubSocket, t: Duration) -> Option<Vec<Bytes>> {
    tokio::time::timeout(t, sub.recv())
        .await
        .ok()
        .map(|m| m.expect("recv").into_vec())
}

/// PUB drops what it sends before a subscription has arrived (the slow
/// joiner): publishes probes until one gets through, returns the next
/// batch number to publish.
async fn join(publisher: &ZmqEventPublisher, sub: &mut SubSocket) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    loop {
        assert!(Instant::now() < deadline, "subscriber never joined");
        publisher.publish(batch(i, 4));
        i += 1;
        if recv_timeout(sub, Duration::from_millis(50)).await.is_some() {
            break;
        }
    }
    // Drain probes still in flight.
    while recv_timeout(sub, Duration::from_millis(200))
        .await
        .is_some()
    {}
    i
}

#[tokio::test]
async fn subscriber_gets_every_batch_in_sequence_in_vllms_schema() {
    let publisher = ZmqEventPublisher::start(&config(false, 1000), 0).expect("start");
    let mut sub = subscriber(publisher.endpoint()).await;
    let first = join(&publisher, &mut sub).await;
    for i in first..first + 50 {
        assert!(publisher.publish(batch(i, 40)));
    }
    for i in first..first + 50 {
        let frames = recv_timeout(&mut sub, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("batch {i} never arrived"));
        assert_eq!(frames.len(), 3, "[topic, seq, payload]");
        assert_eq!(&frames[0][..], b"kv");
        // Sequence numbers start at 0 and count every batch published.
        assert_eq!(seq(&frames[1]), i);
        check_payload(&frames[2], i);
        assert_eq!(frames[2][..], batch(i, 40).with_rank(0).encode()[..]);
    }
    assert_eq!(publisher.stats().dropped, 0);
    publisher.shutdown();
}

trait WithRank {
    fn with_rank(self, r: u32) -> Self;
}
impl WithRank for KvEventBatch {
    fn with_rank(mut self, r: u32) -> Self {
        self.data_parallel_rank = Some(r);
        self
    }
}

async fn replay(dealer: &mut DealerSocket, start: u64) -> Vec<(u64, Vec<u8>)> {
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&start.to_be_bytes()),
    ])
    .expect("frames");
    dealer.send(request).await.expect("send");
    let mut got = Vec::new();
    loop {
        let frames = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("replay reply")
            .expect("recv")
            .into_vec();
        assert_eq!(frames.len(), 4, "[empty, topic, seq, payload]");
        assert!(frames[0].is_empty());
        if frames[2][..] == [0xff; 8] {
            assert!(frames[1].is_empty() && frames[3].is_empty(), "end marker");
            return got;
        }
        assert_eq!(&frames[1][..], b"kv");
        got.push((seq(&frames[2]), frames[3].to_vec()));
    }
}

#[tokio::test]
async fn replay_returns_missed_batches_from_a_sequence_number() {
    let publisher = ZmqEventPublisher::start(&config(true, 1000), 0).expect("start");
    for i in 0..6 {
        publisher.publish(batch(i, 8));
    }
    // Wait until the thread has sent (and buffered) all six.
    let deadline = Instant::now() + Duration::from_secs(10);
    while publisher.stats().published < 6 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&local(
            publisher.replay_endpoint().expect("replay endpoint"),
        ))
        .await
        .expect("connect");
    // buffer_steps = 4: batches 2..=5 are kept.
    let got = replay(&mut dealer, 3).await;
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    for (s, payload) in &got {
        check_payload(payload, *s);
    }
    let got = replay(&mut dealer, 0).await;
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![2, 3, 4, 5]
    );
    // Past the end: just the marker.
    assert!(replay(&mut dealer, 99).await.is_empty());
    publisher.shutdown();
}

#[tokio::test]
async fn a_stalled_subscriber_does_not_slow_publish() {
    let publisher = ZmqEventPublisher::start(&config(false, 8), 0).expect("start");
    // Subscribes, then never reads.
    let _stalled = subscriber(publisher.endpoint()).await;
    let mut live = subscriber(publisher.endpoint()).await;
    let first = join(&publisher, &mut live).await;
    let before = publisher.stats();
    let pushes = 3000u64;
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in first..first + pushes {
        // ~12 KB a batch: the stalled subscriber's buffers fill quickly.
        let b = batch(i, 4096);
        let t = Instant::now();
        publisher.publish(b);
        slowest = slowest.max(t.elapsed());
    }
    let elapsed = started.elapsed();
    // A hang detector, not a benchmark: a publish that waited on a socket
    // would take as long as the stalled subscriber stalls (forever).
    assert!(
        elapsed < Duration::from_secs(10),
        "{pushes} publishes took {elapsed:?}"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "one publish took {slowest:?}"
    );
    let stats = publisher.stats();
    assert!(
        stats.dropped > before.dropped,
        "a full queue drops and counts: {stats:?}"
    );
    // The publisher thread is not stuck on the stalled subscriber either:
    // the live one still gets fresh batches.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = first + pushes;
    loop {
        assert!(Instant::now() < deadline, "the live subscriber starved");
        publisher.publish(batch(i, 4));
        i += 1;
        if let Some(frames) = recv_timeout(&mut live, Duration::from_millis(50)).await {
            if frames[2].len() < 1000 {
                break;
            }
        }
    }
    publisher.shutdown();
}

#[test]
fn a_port_in_use_is_an_error_naming_the_endpoint() {
    let first = ZmqEventPublisher::start(&config(false, 8), 0).expect("start");
    let mut c = config(false, 8);
    c.endpoint = first.endpoint().to_string();
    let e = ZmqEventPublisher::start(&c, 0)
        .err()
        .expect("address in use");
    assert!(e.to_string().contains(first.endpoint()), "{e}");
}
