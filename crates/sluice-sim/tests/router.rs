//! The routers' promises on crafted replica views: each policy picks what
//! its rule says, ties break as documented, the random ones are seeded,
//! and every router stays in range.

use proptest::prelude::*;
use sluice_core::block_hash::BlockHash;
use sluice_sim::router::{
    LeastKv, LeastRequests, PowerOfTwo, PrefixAware, Random, RoundRobin, UnknownRouter,
};
use sluice_sim::{ReplicaView, RouteRequest, Router, RouterKind};
use std::cell::Cell;

/// A replica with fixed load and a prefix cache holding `cached` blocks.
#[derive(Clone, Debug, Default)]
struct Fake {
    running: usize,
    waiting: usize,
    kv: f64,
    cached: Vec<BlockHash>,
    /// How often the router asked for its prefix.
    prefix_queries: Cell<usize>,
}

impl ReplicaView for Fake {
    fn num_running(&self) -> usize {
        self.running
    }
    fn num_waiting(&self) -> usize {
        self.waiting
    }
    fn kv_usage(&self) -> f64 {
        self.kv
    }
    fn cached_prefix_blocks(&self, hashes: &[BlockHash]) -> usize {
        self.prefix_queries.set(self.prefix_queries.get() + 1);
        hashes
            .iter()
            .take_while(|h| self.cached.contains(h))
            .count()
    }
}

fn load(running: usize, waiting: usize) -> Fake {
    Fake {
        running,
        waiting,
        ..Fake::default()
    }
}

/// A chained-looking hash: block `i` of a prompt in group `group`.
fn h(group: u8, i: u8) -> BlockHash {
    let mut b = [0u8; 32];
    b[0] = group;
    b[1] = i;
    BlockHash(b)
}

fn blocks(group: u8, n: u8) -> Vec<BlockHash> {
    (0..n).map(|i| h(group, i)).collect()
}

fn req(hashes: &[BlockHash]) -> RouteRequest<'_> {
    RouteRequest {
        index: 0,
        prompt_len: hashes.len() * 16,
        block_hashes: hashes,
    }
}

fn views(replicas: &[Fake]) -> Vec<&dyn ReplicaView> {
    replicas.iter().map(|r| r as &dyn ReplicaView).collect()
}

fn route(router: &mut dyn Router, hashes: &[BlockHash], replicas: &[Fake]) -> usize {
    router.route(&req(hashes), &views(replicas))
}

#[test]
fn round_robin_cycles_whatever_the_load() {
    let replicas = [load(9, 9), load(0, 0), load(5, 0)];
    let mut r = RoundRobin::new();
    let picks: Vec<usize> = (0..7).map(|_| route(&mut r, &[], &replicas)).collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn least_requests_counts_running_and_waiting_and_ties_low() {
    // Totals 5, 3, 4, 3: replicas 1 and 3 tie, the lower wins.
    let replicas = [load(5, 0), load(1, 2), load(0, 4), load(3, 0)];
    assert_eq!(route(&mut LeastRequests, &[], &replicas), 1);
    // Waiting counts as much as running.
    let replicas = [load(0, 2), load(1, 0)];
    assert_eq!(route(&mut LeastRequests, &[], &replicas), 1);
    let all_equal = [load(2, 0), load(1, 1), load(0, 2)];
    assert_eq!(route(&mut LeastRequests, &[], &all_equal), 0);
}

#[test]
fn least_kv_picks_lowest_usage_then_fewer_requests_then_index() {
    let kv = |kv: f64, running: usize| Fake {
        kv,
        running,
        ..Fake::default()
    };
    assert_eq!(
        route(&mut LeastKv, &[], &[kv(0.5, 0), kv(0.2, 9), kv(0.3, 0)]),
        1
    );
    // 0.2 ties: fewer requests wins.
    assert_eq!(
        route(&mut LeastKv, &[], &[kv(0.2, 4), kv(0.9, 0), kv(0.2, 2)]),
        2
    );
    // Full tie: lowest index.
    assert_eq!(
        route(&mut LeastKv, &[], &[kv(0.4, 1), kv(0.2, 1), kv(0.2, 1)]),
        1
    );
}

#[test]
fn power_of_two_never_takes_the_busier_sample_and_covers_every_replica() {
    // Distinct loads: the pick is the less loaded of two distinct samples,
    // so the busiest replica can never win and the idlest wins whenever
    // drawn (in 2/n of the calls).
    let replicas: Vec<Fake> = (0..6).map(|i| load(i * 2, 0)).collect();
    let mut r = PowerOfTwo::new(3);
    let mut counts = [0usize; 6];
    for _ in 0..6000 {
        counts[route(&mut r, &[], &replicas)] += 1;
    }
    assert_eq!(counts[5], 0, "{counts:?}");
    assert!((1800..2200).contains(&counts[0]), "{counts:?}");
    // Each pick beats as many replicas as its rank allows: pick k wins
    // only against higher loads, so counts fall with load.
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");

    // Equal loads: ties go to the first draw, so all replicas get traffic.
    let equal: Vec<Fake> = (0..6).map(|_| load(1, 1)).collect();
    let mut counts = [0usize; 6];
    for _ in 0..6000 {
        counts[route(&mut r, &[], &equal)] += 1;
    }
    assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
}

#[test]
fn power_of_two_with_one_replica_is_zero() {
    let mut r = PowerOfTwo::new(0);
    for _ in 0..10 {
        assert_eq!(route(&mut r, &[], &[load(3, 3)]), 0);
    }
}

#[test]
fn random_is_deterministic_for_a_seed_and_roughly_uniform() {
    let replicas: Vec<Fake> = (0..8).map(|i| load(i, 0)).collect();
    let draw = |seed: u64| -> Vec<usize> {
        let mut r = Random::new(seed);
        (0..80_000).map(|_| route(&mut r, &[], &replicas)).collect()
    };
    let a = draw(11);
    assert_eq!(a, draw(11));
    assert_ne!(a, draw(12));
    let mut counts = [0usize; 8];
    for &i in &a {
        counts[i] += 1;
    }
    // 10,000 expected each; the standard deviation is about 94.
    assert!(
        counts.iter().all(|&c| (9_500..10_500).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn prefix_aware_picks_the_longest_prefix_even_when_busier() {
    let prompt = blocks(1, 8);
    let cached = |n: usize, running: usize| Fake {
        running,
        cached: prompt[..n].to_vec(),
        ..Fake::default()
    };
    let replicas = [cached(2, 0), cached(6, 10), cached(4, 1)];
    assert_eq!(route(&mut PrefixAware::new(), &prompt, &replicas), 1);
    // Blocks held out of order do not count: only a leading chain does.
    let mut gappy = cached(0, 0);
    gappy.cached = prompt[1..].to_vec();
    let replicas = [gappy, cached(1, 5)];
    assert_eq!(route(&mut PrefixAware::new(), &prompt, &replicas), 1);
}

#[test]
fn prefix_aware_ties_go_to_the_least_loaded_then_the_lowest_index() {
    let prompt = blocks(2, 4);
    let with = |n: usize, running: usize, waiting: usize| Fake {
        running,
        waiting,
        cached: prompt[..n].to_vec(),
        ..Fake::default()
    };
    let replicas = [with(3, 4, 0), with(3, 1, 2), with(1, 0, 0), with(3, 2, 1)];
    assert_eq!(route(&mut PrefixAware::new(), &prompt, &replicas), 1);
    // No prefix anywhere (or prefix caching off): least loaded, low index.
    let replicas = [with(0, 2, 0), with(0, 1, 0), with(0, 0, 1)];
    assert_eq!(route(&mut PrefixAware::new(), &prompt, &replicas), 1);
    assert_eq!(route(&mut PrefixAware::new(), &[], &replicas), 1);
}

#[test]
fn prefix_aware_without_hashes_does_not_ask_the_caches() {
    let replicas = [load(1, 0), load(0, 0)];
    assert_eq!(route(&mut PrefixAware::new(), &[], &replicas), 1);
    assert!(replicas.iter().all(|r| r.prefix_queries.get() == 0));
}

#[test]
fn a_burst_goes_by_load_without_the_pending_window_and_follows_its_prefix_with_it() {
    // Nothing is cached yet and the views do not change between calls:
    // a burst that arrives before any request is scheduled.
    let replicas = [load(0, 0), load(0, 0), load(0, 0)];
    let (a, b) = (blocks(7, 5), blocks(8, 5));

    // The view alone: no hit anywhere, so every request goes to the
    // least loaded, lowest index (the views here never see them queue).
    let mut plain = PrefixAware::new();
    assert_eq!(plain.pending_window(), 0);
    assert_eq!(route(&mut plain, &a, &replicas), 0);
    assert_eq!(route(&mut plain, &b, &replicas), 0);

    // The pending window remembers where `a` went; `b` shares nothing
    // with it and goes by load; a second `a`-group request follows `a`.
    let busy = [load(0, 0), load(3, 0), load(0, 1)];
    let mut spec = PrefixAware::with_pending_window(4);
    assert_eq!(route(&mut spec, &a, &busy), 0);
    let busy_now = [load(0, 2), load(3, 0), load(0, 1)];
    assert_eq!(route(&mut spec, &b, &busy_now), 2);
    let mut a2 = a[..3].to_vec();
    a2.push(h(9, 9));
    assert_eq!(route(&mut spec, &a2, &busy_now), 0);
    // A real cache hit longer than the remembered one wins: replica 1
    // holds 6 blocks of a longer `a`-group prompt, replica 0 was sent 5.
    let a_long = blocks(7, 6);
    let mut cached = busy_now.to_vec();
    cached[1].cached = a_long.clone();
    assert_eq!(route(&mut spec, &a_long, &cached), 1);
}

#[test]
fn the_pending_window_forgets_after_k_routings() {
    let replicas = [load(0, 1), load(0, 0)];
    let a = blocks(1, 3);
    let mut r = PrefixAware::with_pending_window(2);
    // `a` goes to 1 (idle); the views never change.
    assert_eq!(route(&mut r, &a, &replicas), 1);
    let flip = [load(0, 0), load(0, 1)];
    // Remembered: `a` again follows to 1 though 0 is now idler.
    assert_eq!(route(&mut r, &a, &flip), 1);
    // Two unrelated routings push both `a` entries out of the window.
    route(&mut r, &blocks(2, 3), &flip);
    route(&mut r, &blocks(3, 3), &flip);
    assert_eq!(route(&mut r, &a, &flip), 0);
}

#[test]
fn router_kinds_parse_exactly_their_cli_names() {
    let names = [
        "round-robin",
        "random",
        "least-requests",
        "least-kv",
        "power-of-two",
        "prefix-aware",
    ];
    for (kind, name) in RouterKind::ALL.into_iter().zip(names) {
        assert_eq!(kind.to_string(), name);
        assert_eq!(name.parse::<RouterKind>(), Ok(kind));
    }
    let err = "least_requests".parse::<RouterKind>().unwrap_err();
    assert_eq!(err, UnknownRouter("least_requests".into()));
    let message = err.to_string();
    assert!(message.contains("`least_requests`"), "{message}");
    for name in names {
        assert!(message.contains(name), "{message} lacks {name}");
    }
    assert!("Round-Robin".parse::<RouterKind>().is_err());
    assert!("".parse::<RouterKind>().is_err());
}

#[test]
fn built_routers_follow_their_kind() {
    let replicas = [load(4, 0), load(1, 0), load(2, 0)];
    let pick = |kind: RouterKind| route(kind.build(0).as_mut(), &[], &replicas);
    assert_eq!(pick(RouterKind::RoundRobin), 0);
    assert_eq!(pick(RouterKind::LeastRequests), 1);
    assert_eq!(pick(RouterKind::PrefixAware), 1);
    let mut a = RouterKind::Random.build(5);
    let mut b = RouterKind::Random.build(5);
    let (x, y): (Vec<usize>, Vec<usize>) = (0..50)
        .map(|_| {
            (
                route(a.as_mut(), &[], &replicas),
                route(b.as_mut(), &[], &replicas),
            )
        })
        .unzip();
    assert_eq!(x, y);
}

#[test]
fn a_hundred_thousand_routings_over_eight_replicas() {
    // Not timed: checks the hot path copes with a realistic run's count,
    // using every policy, with the pending window on.
    let replicas: Vec<Fake> = (0..8)
        .map(|i| Fake {
            running: i % 3,
            waiting: i % 2,
            kv: i as f64 / 10.0,
            cached: blocks(i as u8 % 4, 16),
            ..Fake::default()
        })
        .collect();
    let views = views(&replicas);
    let prompts: Vec<Vec<BlockHash>> = (0..4).map(|g| blocks(g, 32)).collect();
    let mut routers: Vec<Box<dyn Router>> = RouterKind::ALL.iter().map(|k| k.build(1)).collect();
    routers.push(Box::new(PrefixAware::with_pending_window(64)));
    for r in &mut routers {
        let mut counts = [0usize; 8];
        for i in 0..100_000 {
            counts[r.route(&req(&prompts[i % 4]), &views)] += 1;
        }
        assert_eq!(counts.iter().sum::<usize>(), 100_000);
    }
}

fn arb_replica() -> impl Strategy<Value = Fake> {
    (0usize..50, 0usize..50, 0.0f64..=1.0, 0u8..6).prop_map(|(running, waiting, kv, n)| Fake {
        running,
        waiting,
        kv,
        cached: blocks(0, n),
        ..Fake::default()
    })
}

proptest! {
    #[test]
    fn every_router_stays_in_range(
        replicas in prop::collection::vec(arb_replica(), 1..12),
        prompt_blocks in 0u8..8,
        seed in any::<u64>(),
        calls in 1usize..20,
    ) {
        let prompt = blocks(0, prompt_blocks);
        let views = views(&replicas);
        let mut routers: Vec<Box<dyn Router>> =
            RouterKind::ALL.iter().map(|k| k.build(seed)).collect();
        routers.push(Box::new(PrefixAware::with_pending_window(3)));
        for r in &mut routers {
            for _ in 0..calls {
                let i = r.route(&req(&prompt), &views);
                prop_assert!(i < replicas.len());
            }
        }
    }

    #[test]
    fn least_requests_and_prefix_aware_are_minimal(
        replicas in prop::collection::vec(arb_replica(), 1..12),
        prompt_blocks in 0u8..8,
    ) {
        let prompt = blocks(0, prompt_blocks);
        let n = |r: &Fake| r.running + r.waiting;
        let i = route(&mut LeastRequests, &prompt, &replicas);
        prop_assert!(replicas.iter().all(|r| n(r) >= n(&replicas[i])));
        prop_assert!(replicas[..i].iter().all(|r| n(r) > n(&replicas[i])));
        let p = |r: &Fake| r.cached_prefix_blocks(&prompt);
        let j = route(&mut PrefixAware::new(), &prompt, &replicas);
        prop_assert!(replicas.iter().all(|r| p(r) < p(&replicas[j])
            || (p(r) == p(&replicas[j]) && n(r) >= n(&replicas[j]))));
    }
}
