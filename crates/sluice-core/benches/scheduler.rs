//! Scheduler overhead per step on synthetic workloads shaped like
//! `tests/data/bench/`: steady decode with 64 / 256 / 1024 running
//! requests, and a mixed workload with arrivals, shared system prefixes and
//! chunked prefill. One iteration = one `schedule()` + scripted model +
//! `update_from_output()`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice_core::{ModelRunnerOutput, NewRequest, SamplingParams, Scheduler, SchedulerConfig};
use std::time::{Duration, Instant};

/// Deterministic xorshift for workload shapes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn config(max_num_seqs: usize, num_gpu_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 16,
        num_gpu_blocks,
        max_num_batched_tokens: 8192,
        max_num_seqs,
        max_model_len: 1 << 20,
        enable_chunked_prefill: true,
        enable_prefix_caching: true,
        ..SchedulerConfig::default()
    }
}

fn step(s: &mut Scheduler, tok: &mut u32) {
    let out = s.schedule();
    let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
    for e in &out.num_scheduled_tokens {
        let r = s.request(e.handle).expect("live");
        if r.num_computed_tokens() >= r.num_tokens() {
            *tok = tok.wrapping_mul(1_103_515_245).wrapping_add(12345) % 50_000;
            mro.push(&[*tok]);
        } else {
            mro.push(&[]);
        }
    }
    s.update_from_output(&out, &mro);
}

/// `n` requests with 500-524-token prompts, prefilled, all decoding.
fn decode_state(n: usize) -> Scheduler {
    let mut s = Scheduler::new(config(n, n * 200 + 16)).expect("config");
    let mut rng = Rng(7);
    for i in 0..n {
        let len = rng.range(500, 525) as u32;
        let prompt = (0..len).map(|t| (t * 31 + i as u32 * 7) % 50_000).collect();
        s.add_request(NewRequest::new(
            format!("req-{i}"),
            prompt,
            SamplingParams::greedy(1 << 19),
        ))
        .expect("request");
    }
    let mut tok = 1;
    while s.get_request_counts().1 > 0
        || s.get_request(&format!("req-{}", n - 1))
            .is_some_and(|r| r.num_output_tokens() == 0)
    {
        step(&mut s, &mut tok);
    }
    s
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_step");
    g.measurement_time(Duration::from_secs(5));
    for n in [64usize, 256, 1024] {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let mut s = decode_state(n);
            let mut steps = 0;
            let mut tok = 3;
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if steps > 2000 {
                        s = decode_state(n);
                        steps = 0;
                    }
                    let t = Instant::now();
                    step(&mut s, &mut tok);
                    total += t.elapsed();
                    steps += 1;
                }
                total
            });
        });
    }
    g.finish();
}

/// Arrivals each step (prompts 128-2048, half sharing one of four 256-token
/// system prefixes, outputs 32-256), chunked prefill, prefix caching.
struct Mixed {
    s: Scheduler,
    rng: Rng,
    next_id: u64,
    per_step_x2: u64,
    tok: u32,
}

impl Mixed {
    fn new(max_num_seqs: usize, per_step_x2: u64) -> Self {
        let blocks = max_num_seqs * 2304 / 16 + 64;
        Mixed {
            s: Scheduler::new(SchedulerConfig {
                max_model_len: 4096,
                ..config(max_num_seqs, blocks)
            })
            .expect("config"),
            rng: Rng(11),
            next_id: 0,
            per_step_x2,
            tok: 5,
        }
    }

    fn arrive(&mut self) {
        let n = self.per_step_x2 / 2 + u64::from(self.rng.next() % 2 < self.per_step_x2 % 2);
        for _ in 0..n {
            let len = self.rng.range(128, 2048) as u32;
            let mut prompt: Vec<u32> = Vec::with_capacity(len as usize);
            if self.rng.next().is_multiple_of(2) {
                let sys = (self.rng.next() % 4) as u32;
                prompt.extend((0..256).map(|t| 60_000 + sys * 256 + t));
            }
            let salt = self.next_id as u32;
            while prompt.len() < len as usize {
                prompt.push((salt.wrapping_mul(2_654_435_761) ^ prompt.len() as u32) % 50_000);
            }
            let out_len = self.rng.range(32, 256) as usize;
            self.s
                .add_request(NewRequest::new(
                    format!("m-{}", self.next_id),
                    prompt,
                    SamplingParams::greedy(out_len),
                ))
                .expect("request");
            self.next_id += 1;
        }
    }
}

fn bench_mixed(c: &mut Criterion) {
    let mut g = c.benchmark_group("mixed_step");
    g.measurement_time(Duration::from_secs(5));
    for (seqs, per_step_x2) in [(256usize, 3u64), (1024, 12)] {
        g.bench_with_input(BenchmarkId::from_parameter(seqs), &seqs, |b, _| {
            let mut m = Mixed::new(seqs, per_step_x2);
            for _ in 0..200 {
                m.arrive();
                step(&mut m.s, &mut m.tok);
            }
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    m.arrive();
                    let t = Instant::now();
                    step(&mut m.s, &mut m.tok);
                    total += t.elapsed();
                }
                total
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench_decode, bench_mixed);
criterion_main!(benches);
