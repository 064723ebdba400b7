//! A benchmark, not a check: how long `GET /metrics` takes while 256
//! requests are running (a router scrapes every replica every ~50 ms, so
//! a slow exposition under load would delay its picture of the pool).
//! Prints the median and p99 of 300 sequential scrapes; asserts only that
//! the load was really there. `cargo test -p sluice-server --release
//! --test metrics_latency -- --nocapture` for figures worth quoting.

mod common;

use common::{Options, TestServer};
use futures::StreamExt;
use std::time::{Duration, Instant};

const RUNNING: usize = 256;
const SCRAPES: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_latency_at_256_running_requests() {
    let server = TestServer::start_with(Options {
        // Slow steps keep every request running through the scrapes (the
        // delay is per sequence: a step of 256 takes ~256 ms).
        step_delay: Duration::from_millis(1),
        max_num_seqs: RUNNING,
        // Room for every request's blocks: no preemption mid-measurement.
        num_blocks: 8192,
        ..Options::default()
    })
    .await;
    let client = reqwest::Client::new();
    let mut readers = Vec::new();
    for i in 0..RUNNING {
        let (client, base) = (client.clone(), server.base());
        readers.push(tokio::spawn(async move {
            let r = client
                .post(format!("{base}/v1/completions"))
                .json(&serde_json::json!({
                    "prompt": format!("request {i}"),
                    "max_tokens": 200,
                    "stream": true,
                }))
                .send()
                .await
                .expect("the request is sent");
            assert_eq!(r.status(), 200);
            // Read the stream, as a client would, so nothing backs up.
            let mut body = r.bytes_stream();
            while body.next().await.is_some() {}
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.engine.stats().num_running_reqs < RUNNING {
        assert!(Instant::now() < deadline, "{:?}", server.engine.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let url = format!("{}/metrics", server.base());
    let mut took = Vec::with_capacity(SCRAPES);
    let mut bytes = 0;
    for _ in 0..SCRAPES {
        let t = Instant::now();
        let r = client.get(&url).send().await.expect("scrape");
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("exposition");
        took.push(t.elapsed());
        bytes = text.len();
    }
    let still = server.engine.stats().num_running_reqs;
    assert_eq!(still, RUNNING, "the load lasted through the scrapes");
    took.sort();
    let pct = |p: f64| took[((took.len() - 1) as f64 * p).round() as usize];
    println!(
        "GET /metrics at {RUNNING} running requests ({} build), {SCRAPES} scrapes of {bytes} \
         bytes: median {:?}, p99 {:?}, max {:?}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        pct(0.5),
        pct(0.99),
        took[took.len() - 1],
    );
    for r in readers {
        r.abort();
    }
    server.shutdown_within(Duration::from_secs(30)).await;
}
