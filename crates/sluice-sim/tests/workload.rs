//! The generators' promises: their distributions' moments (tolerances
//! derived from the sample size, about five standard errors, so a correct
//! generator fails with negligible probability and a wrong mean or spread
//! does not pass), vLLM's uniform rule, arrival processes, prefix groups,
//! conversation structure and determinism for a seed.

use sluice_core::SchedulerConfig;
use sluice_sim::conversation::{ConversationSummary, ConversationWorkload, ThinkTime};
use sluice_sim::lengths::{Empirical, LengthDist};
use sluice_sim::sim::output_token;
use sluice_sim::workload::{PrefixGroupChoice, RandomWorkload, Rng, WorkloadError};
use sluice_sim::{ConstantStepTime, SimRequest, Simulator};
use std::path::Path;

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, var.sqrt())
}

fn draws(d: &LengthDist, n: usize, seed: u64, max: usize) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| d.sample(&mut rng, max) as f64).collect()
}

/// Asserts `got` is within `k` standard errors of `want`.
fn within(what: &str, got: f64, want: f64, se: f64, k: f64) {
    assert!(
        (got - want).abs() <= k * se,
        "{what}: {got} is {:.1} standard errors ({se}) from {want}",
        (got - want).abs() / se
    );
}

#[test]
fn normal_lengths_have_their_mean_and_std() {
    let (mean, std) = (500.0, 50.0);
    let d = LengthDist::Normal { mean, std };
    let n = 40_000;
    let xs = draws(&d, n, 11, 100_000);
    let (m, s) = mean_std(&xs);
    // Rounding adds a uniform(−½, ½) error: variance 1/12.
    let std_r = (std * std + 1.0 / 12.0_f64).sqrt();
    within("normal mean", m, mean, std_r / (n as f64).sqrt(), 5.0);
    // For a normal sample, SE(s) ≈ σ / √(2n).
    within("normal std", s, std_r, std_r / (2.0 * n as f64).sqrt(), 5.0);
    assert!(xs.iter().all(|&x| x >= 1.0 && x.fract() == 0.0));
}

#[test]
fn lognormal_lengths_have_the_mean_and_std_they_were_given() {
    let (mean, std) = (300.0, 150.0);
    let d = LengthDist::LogNormal { mean, std };
    let n = 60_000;
    let xs = draws(&d, n, 12, 1_000_000);
    let (m, s) = mean_std(&xs);
    let s2 = (1.0 + (std / mean).powi(2)).ln();
    // Excess kurtosis of the lognormal; SE(s) ≈ σ √((κ + 2) / (4n)).
    let kurt = (4.0 * s2).exp() + 2.0 * (3.0 * s2).exp() + 3.0 * (2.0 * s2).exp() - 6.0;
    within("lognormal mean", m, mean, std / (n as f64).sqrt(), 5.0);
    within(
        "lognormal std",
        s,
        std,
        std * ((kurt + 2.0) / (4.0 * n as f64)).sqrt(),
        5.0,
    );
    // Skewed right: the median (exp(mu)) is below the mean.
    let mut sorted = xs.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[n / 2];
    assert!(median < mean - 10.0, "median {median}");
}

#[test]
fn uniform_lengths_fill_vllms_closed_interval() {
    let d: LengthDist = "uniform:100,0.25".parse().unwrap();
    assert_eq!(d.uniform_bounds(), Some((75, 125)));
    let n = 30_000;
    let xs = draws(&d, n, 13, usize::MAX);
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(0.0, f64::max);
    assert_eq!(
        (lo, hi),
        (75.0, 125.0),
        "both ends are reached, none passed"
    );
    let (m, _) = mean_std(&xs);
    let sd = ((51.0f64 * 51.0 - 1.0) / 12.0).sqrt();
    within("uniform mean", m, 100.0, sd / (n as f64).sqrt(), 5.0);

    // vLLM raises the output interval's lower bound to 1 rather than
    // clamping draws: uniform:1,0.5 is [0, 2] raised to [1, 2], half each.
    let d: LengthDist = "uniform:1,0.5".parse().unwrap();
    let xs = draws(&d, n, 14, usize::MAX);
    let ones = xs.iter().filter(|&&x| x == 1.0).count() as f64 / n as f64;
    assert!(xs.iter().all(|&x| x == 1.0 || x == 2.0));
    within("P(1)", ones, 0.5, (0.25 / n as f64).sqrt(), 5.0);
}

#[test]
fn empirical_lengths_follow_their_weights() {
    let d: LengthDist = format!("empirical:{}", data("lengths.txt").display())
        .parse()
        .unwrap();
    let LengthDist::Empirical(e) = &d else {
        panic!("not empirical: {d:?}");
    };
    assert_eq!(e.points(), &[(16, 2.0), (64, 5.0), (256, 1.0), (512, 1.0)]);
    assert!(d.to_string().ends_with("tests/data/lengths.txt"));
    let n = 45_000;
    let xs = draws(&d, n, 15, usize::MAX);
    for (len, w) in [(16.0, 2.0), (64.0, 5.0), (256.0, 1.0), (512.0, 1.0)] {
        let p = w / 9.0;
        let f = xs.iter().filter(|&&x| x == len).count() as f64 / n as f64;
        within(
            &format!("frequency of {len}"),
            f,
            p,
            (p * (1.0 - p) / n as f64).sqrt(),
            5.0,
        );
    }
    // The clamp holds for empirical draws too.
    assert!(draws(&d, 1000, 16, 100).iter().all(|&x| x <= 100.0));
}

#[test]
fn empirical_file_errors_name_file_and_line() {
    let e = "empirical:/nonexistent/l.txt"
        .parse::<LengthDist>()
        .unwrap_err();
    assert!(
        e.to_string().starts_with("/nonexistent/l.txt: cannot read"),
        "{e}"
    );
    let e = Empirical::parse("out.txt", "16\n32,heavy\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "out.txt line 2: weight `heavy`: expected a finite number ≥ 0"
    );
}

fn gaps(times: &[f64]) -> Vec<f64> {
    let mut prev = 0.0;
    times
        .iter()
        .map(|&t| {
            let g = t - prev;
            prev = t;
            g
        })
        .collect()
}

fn arrivals(w: &RandomWorkload) -> Vec<f64> {
    w.generate().unwrap().iter().map(|r| r.arrival_s).collect()
}

#[test]
fn duration_mode_is_an_unscaled_poisson_process() {
    let (rate, duration) = (5.0, 2_000.0);
    let w = RandomWorkload {
        input_len: 8,
        output_len: 2,
        request_rate: rate,
        duration_s: Some(duration),
        seed: 21,
        ..RandomWorkload::default()
    };
    let t = arrivals(&w);
    let lambda = rate * duration;
    // The count is Poisson(rate · duration), not num_prompts.
    within("count", t.len() as f64, lambda, lambda.sqrt(), 5.0);
    assert!(t.windows(2).all(|p| p[0] <= p[1]));
    assert!(t.iter().all(|&x| (0.0..duration).contains(&x)));
    let g = gaps(&t);
    let n = g.len() as f64;
    let (m, s) = mean_std(&g);
    within("mean gap", m, 1.0 / rate, (1.0 / rate) / n.sqrt(), 5.0);
    // Exponential gaps: std = mean; SE(s) ≈ σ √((κ + 2) / (4n)), κ = 6.
    within(
        "gap std",
        s,
        1.0 / rate,
        (1.0 / rate) * (8.0 / (4.0 * n)).sqrt(),
        5.0,
    );
}

#[test]
fn burstiness_sets_the_gap_variance() {
    let rate = 4.0;
    for b in [0.25, 4.0] {
        let w = RandomWorkload {
            input_len: 4,
            output_len: 1,
            request_rate: rate,
            burstiness: b,
            duration_s: Some(10_000.0),
            seed: 22,
            ..RandomWorkload::default()
        };
        let g = gaps(&arrivals(&w));
        let n = g.len() as f64;
        let (m, s) = mean_std(&g);
        within(
            "mean gap",
            m,
            1.0 / rate,
            (1.0 / rate) / (b * n).sqrt(),
            5.0,
        );
        // Gamma(b, 1/(rate·b)): variance 1/(rate²·b), excess kurtosis 6/b,
        // SE(s²) ≈ σ² √((κ + 2) / n).
        let var = 1.0 / (rate * rate * b);
        let se = var * ((6.0 / b + 2.0) / n).sqrt();
        within(
            &format!("gap variance at burstiness {b}"),
            s * s,
            var,
            se,
            5.0,
        );
    }
}

#[test]
fn duration_mode_refuses_what_it_cannot_do() {
    let base = RandomWorkload {
        duration_s: Some(10.0),
        ..RandomWorkload::default()
    };
    let e = base.generate().unwrap_err();
    assert!(
        e.to_string()
            .starts_with("request_rate must be finite with a duration"),
        "{e}"
    );
    for d in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let w = RandomWorkload {
            request_rate: 1.0,
            duration_s: Some(d),
            ..base.clone()
        };
        assert_eq!(
            w.generate().unwrap_err(),
            WorkloadError::Invalid("duration_s", "finite and positive")
        );
    }
    let w = RandomWorkload {
        request_rate: 1e9,
        duration_s: Some(1e9),
        ..base
    };
    assert!(matches!(w.generate(), Err(WorkloadError::TooMany { .. })));
}

#[test]
fn the_default_distributions_are_vllms_random_dataset() {
    let w = RandomWorkload {
        num_prompts: 300,
        input_len: 64,
        output_len: 16,
        range_ratio: 0.5,
        request_rate: 10.0,
        seed: 5,
        ..RandomWorkload::default()
    };
    let explicit = RandomWorkload {
        input_dist: Some("uniform:64,0.5".parse().unwrap()),
        output_dist: Some(LengthDist::Uniform {
            len: 16,
            range_ratio: 0.5,
        }),
        ..w.clone()
    };
    let reqs = w.generate().unwrap();
    assert_eq!(reqs, explicit.generate().unwrap());
    // Count mode keeps vLLM's scaling: the last arrival is at n / rate.
    assert!((reqs[299].arrival_s - 30.0).abs() < 1e-9);
    let ((ilo, ihi), (olo, ohi)) = w.length_bounds();
    for r in &reqs {
        assert!((ilo..=ihi).contains(&r.prompt.len()));
        assert!((olo..=ohi).contains(&r.output_len));
    }
}

#[test]
fn other_length_distributions_drive_the_random_dataset() {
    let w = RandomWorkload {
        num_prompts: 2000,
        input_dist: Some(LengthDist::Normal {
            mean: 200.0,
            std: 20.0,
        }),
        output_dist: Some(LengthDist::fixed(7)),
        prefix_len: 10,
        seed: 6,
        ..RandomWorkload::default()
    };
    let reqs = w.generate().unwrap();
    assert!(reqs.iter().all(|r| r.output_len == 7));
    let own: Vec<f64> = reqs.iter().map(|r| (r.prompt.len() - 10) as f64).collect();
    let (m, _) = mean_std(&own);
    within("input mean", m, 200.0, 20.0 / (2000f64).sqrt(), 5.0);
}

#[test]
fn each_request_picks_a_prefix_group() {
    let (groups, len, n) = (4usize, 16usize, 4000usize);
    let w = RandomWorkload {
        num_prompts: n,
        input_len: 8,
        output_len: 1,
        prefix_len: len,
        num_prefix_groups: groups,
        seed: 8,
        ..RandomWorkload::default()
    };
    let reqs = w.generate().unwrap();
    let mut prefixes: Vec<&[u32]> = Vec::new();
    let mut counts = vec![0usize; groups];
    let mut picks = Vec::new();
    for r in &reqs {
        let p = &r.prompt[..len];
        let g = match prefixes.iter().position(|q| *q == p) {
            Some(g) => g,
            None => {
                prefixes.push(p);
                prefixes.len() - 1
            }
        };
        assert!(g < groups, "more distinct prefixes than groups");
        counts[g] += 1;
        picks.push(g);
    }
    let p = 1.0 / groups as f64;
    for c in &counts {
        within(
            "group share",
            *c as f64 / n as f64,
            p,
            (p * (1.0 - p) / n as f64).sqrt(),
            5.0,
        );
    }
    // Random, not round-robin: consecutive requests often share a group.
    assert!(picks.windows(2).any(|w| w[0] == w[1]));
    let rr = RandomWorkload {
        prefix_choice: PrefixGroupChoice::RoundRobin,
        ..w.clone()
    }
    .generate()
    .unwrap();
    for (i, r) in rr.iter().enumerate() {
        assert_eq!(r.prompt[..len], rr[i % groups].prompt[..len]);
    }
    assert_ne!(rr[0].prompt[..len], rr[1].prompt[..len]);
}

#[test]
fn generators_are_deterministic_for_a_seed() {
    let w = RandomWorkload {
        input_dist: Some(LengthDist::LogNormal {
            mean: 100.0,
            std: 40.0,
        }),
        request_rate: 3.0,
        burstiness: 0.5,
        duration_s: Some(60.0),
        prefix_len: 4,
        num_prefix_groups: 3,
        seed: 9,
        ..RandomWorkload::default()
    };
    assert_eq!(w.generate().unwrap(), w.generate().unwrap());
    let other = RandomWorkload {
        seed: 10,
        ..w.clone()
    };
    assert_ne!(w.generate().unwrap(), other.generate().unwrap());
    let c = chat();
    assert_eq!(c.generate().unwrap(), c.generate().unwrap());
    let other = ConversationWorkload {
        seed: 1,
        ..c.clone()
    };
    assert_ne!(c.generate().unwrap(), other.generate().unwrap());
}

fn chat() -> ConversationWorkload {
    ConversationWorkload {
        num_conversations: 60,
        conversation_rate: 2.0,
        turns: "uniform:5,0.6".parse().unwrap(),
        first_message: LengthDist::LogNormal {
            mean: 200.0,
            std: 80.0,
        },
        later_message: LengthDist::Normal {
            mean: 60.0,
            std: 20.0,
        },
        output: "uniform:80,0.5".parse().unwrap(),
        think_time: ThinkTime::Exponential { mean: 3.0 },
        system_prompt_len: 32,
        num_system_prompts: 3,
        max_model_len: 1024,
        seed: 0,
        ..ConversationWorkload::default()
    }
}

/// Every structural promise of a conversation list.
fn check_conversations(w: &ConversationWorkload, reqs: &[SimRequest]) {
    let mut systems: Vec<&[u32]> = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        assert!(
            r.prompt.len() + r.output_len <= w.max_model_len,
            "{}: {} + {} > {}",
            r.id,
            r.prompt.len(),
            r.output_len,
            w.max_model_len
        );
        assert!(r.output_len >= 1 && !r.prompt.is_empty());
        let (c, t) = r.id[1..]
            .split_once("-t")
            .map(|(c, t)| (c.parse::<usize>().unwrap(), t.parse::<usize>().unwrap()))
            .unwrap();
        match r.after {
            None => {
                assert_eq!(t, 0, "{}", r.id);
                assert_eq!(r.think_time_s, 0.0);
                if w.system_prompt_len > 0 {
                    let s = &r.prompt[..w.system_prompt_len];
                    if !systems.contains(&s) {
                        systems.push(s);
                    }
                }
            }
            Some(p) => {
                assert!(p < i, "{}: after {p} is not earlier", r.id);
                let prev = &reqs[p];
                assert_eq!(prev.id, format!("c{c}-t{}", t - 1));
                // The prefix property: the whole history leads the prompt.
                let n = prev.prompt.len();
                assert_eq!(r.prompt[..n], prev.prompt[..], "{}", r.id);
                let outs: Vec<u32> = (0..prev.output_len).map(|j| output_token(p, j)).collect();
                assert_eq!(r.prompt[n..n + outs.len()], outs[..], "{}", r.id);
                assert!(r.prompt.len() > n + outs.len(), "a new message follows");
                assert_eq!(r.arrival_s, prev.arrival_s, "turns carry the start time");
                assert!(r.think_time_s >= 0.0 && r.think_time_s.is_finite());
            }
        }
    }
    assert!(systems.len() <= w.num_system_prompts.max(1));
}

#[test]
fn conversations_grow_their_history_as_the_prefix() {
    let w = chat();
    let (reqs, s) = w.generate_with_summary().unwrap();
    check_conversations(&w, &reqs);
    assert_eq!(s.conversations, 60);
    assert_eq!(s.requests, reqs.len());
    assert!(reqs.iter().filter(|r| r.after.is_some()).count() > 100);
    // Starts follow vLLM's count-mode rule: the last at n / rate.
    let last = reqs.iter().map(|r| r.arrival_s).fold(0.0, f64::max);
    assert!((last - 30.0).abs() < 1e-9, "{last}");
    // Several configurations, including ones that cut conversations.
    for (seed, max_len) in [(1, 400), (2, 2048), (3, 300), (4, 5000)] {
        let w = ConversationWorkload {
            seed,
            max_model_len: max_len,
            turns: "uniform:8,0.5".parse().unwrap(),
            ..chat()
        };
        let (reqs, s) = w.generate_with_summary().unwrap();
        check_conversations(&w, &reqs);
        if max_len <= 400 {
            assert!(s.ended_early > 0, "{max_len}: {s:?}");
        }
    }
}

#[test]
fn a_shorter_context_only_cuts_conversations_short() {
    let long = ConversationWorkload {
        max_model_len: 8192,
        ..chat()
    };
    let short = ConversationWorkload {
        max_model_len: 700,
        ..chat()
    };
    let shape = |reqs: &[SimRequest]| {
        let mut by_conv: std::collections::BTreeMap<String, Vec<(usize, usize)>> =
            Default::default();
        for r in reqs {
            let conv = r.id.split_once("-t").unwrap().0.to_string();
            by_conv
                .entry(conv)
                .or_default()
                .push((r.prompt.len(), r.output_len));
        }
        by_conv
    };
    let (a, sa): (_, ConversationSummary) = long.generate_with_summary().unwrap();
    let (b, sb) = short.generate_with_summary().unwrap();
    assert_eq!(sa.ended_early, 0);
    assert!(sb.ended_early > 0 && b.len() < a.len());
    let (a, b) = (shape(&a), shape(&b));
    for (conv, turns) in &b {
        assert!(a[conv].starts_with(turns), "{conv}");
    }
}

#[test]
fn think_times_and_turn_counts_follow_their_distributions() {
    let w = ConversationWorkload {
        num_conversations: 3000,
        conversation_rate: f64::INFINITY,
        turns: LengthDist::fixed(3),
        first_message: LengthDist::fixed(8),
        later_message: LengthDist::fixed(4),
        output: LengthDist::fixed(4),
        think_time: ThinkTime::Exponential { mean: 2.0 },
        max_model_len: 4096,
        seed: 30,
        ..ConversationWorkload::default()
    };
    let reqs = w.generate().unwrap();
    assert_eq!(reqs.len(), 9000);
    assert!(reqs.iter().all(|r| r.arrival_s == 0.0));
    let think: Vec<f64> = reqs
        .iter()
        .filter(|r| r.after.is_some())
        .map(|r| r.think_time_s)
        .collect();
    let (m, s) = mean_std(&think);
    let n = think.len() as f64;
    within("think mean", m, 2.0, 2.0 / n.sqrt(), 5.0);
    within("think std", s, 2.0, 2.0 * (8.0 / (4.0 * n)).sqrt(), 5.0);
    // Turn k's prompt: 8 + Σ (4 outputs + 4 message) = 8 + 8k.
    for r in &reqs {
        let t: usize = r.id.rsplit_once("-t").unwrap().1.parse().unwrap();
        assert_eq!(r.prompt.len(), 8 + 8 * t);
    }
    let fixed = ConversationWorkload {
        num_conversations: 5,
        think_time: ThinkTime::Fixed { seconds: 1.5 },
        ..w
    };
    for r in fixed.generate().unwrap() {
        assert_eq!(r.think_time_s, if r.after.is_some() { 1.5 } else { 0.0 });
    }
}

#[test]
fn conversations_in_duration_mode_start_before_it_ends() {
    let w = ConversationWorkload {
        duration_s: Some(500.0),
        conversation_rate: 0.5,
        ..chat()
    };
    let (reqs, s) = w.generate_with_summary().unwrap();
    within(
        "conversations",
        s.conversations as f64,
        250.0,
        250f64.sqrt(),
        5.0,
    );
    assert!(reqs.iter().all(|r| r.arrival_s < 500.0));
    check_conversations(&w, &reqs);
}

#[test]
fn conversation_requests_run_and_hit_the_prefix_cache() {
    let w = ConversationWorkload {
        num_conversations: 8,
        ..chat()
    };
    let reqs = w.generate().unwrap();
    let config = SchedulerConfig {
        max_model_len: w.max_model_len,
        ..SchedulerConfig::default()
    };
    let res = Simulator::new(config, ConstantStepTime(0.01))
        .run(&reqs)
        .unwrap();
    assert!(res.requests.iter().all(|t| t.finish_s.is_some()));
    assert!(res.prefix_cache_hits > 0);
}
