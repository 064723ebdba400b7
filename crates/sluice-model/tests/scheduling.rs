//! The runner gives every request the same tokens whatever the scheduler
//! does around it: batching all prompts together, chunked prefill (chunks
//! of 1, 3 and 16 tokens, mixed with decodes), prefix-cache hits (the
//! prompt's leading blocks computed by an earlier request), and preemption
//! followed by recompute. Each scenario runs through the real scheduler and
//! is compared token for token with the single-request runs (which
//! `reference.rs` checks against transformers).

mod common;

use common::*;
use sluice_core::SchedulerConfig;

fn assert_same_as_single(f: &Fixture, d: &Driver, singles: &[Finished], what: &str) {
    for (p, single) in f.prompts.iter().zip(singles) {
        let got = &d.results[&p.name];
        assert_eq!(got.tokens, single.tokens, "{}/{}: {what}", f.name, p.name);
        assert_eq!(
            got.tokens, p.greedy_token_ids,
            "{}/{}: {what}",
            f.name, p.name
        );
        for (a, b) in got.logprobs.iter().zip(&single.logprobs) {
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            assert!((a.sampled.logprob - b.sampled.logprob).abs() <= ATOL);
        }
    }
}

fn add_all(d: &mut Driver, f: &Fixture) {
    for p in &f.prompts {
        d.add(&p.name, &p.input_ids, greedy_params(32));
    }
}

#[test]
fn all_prompts_in_one_batch() {
    for name in FIXTURES {
        let f = fixture(name);
        let singles = single_runs(&f, 32);
        let mut d = Driver::new(&f.loaded, scheduler_config(16, 128));
        add_all(&mut d, &f);
        d.run();
        // 32 decode steps after one step that prefills everything.
        assert_eq!(d.steps, 33, "{name}: all six prefilled in one step");
        assert_same_as_single(&f, &d, &singles, "batched");
        assert_eq!(d.runner.num_requests(), 0, "finished requests are dropped");
    }
}

#[test]
fn chunked_prefill_mixed_with_decodes() {
    for name in FIXTURES {
        let f = fixture(name);
        let singles = single_runs(&f, 32);
        for chunk in [1, 3, 16] {
            let config = SchedulerConfig {
                max_num_batched_tokens: chunk,
                max_num_seqs: chunk.min(6),
                ..scheduler_config(16, 128)
            };
            let mut d = Driver::new(&f.loaded, config);
            add_all(&mut d, &f);
            d.run();
            let prompt_tokens: usize = f.prompts.iter().map(|p| p.input_ids.len()).sum();
            assert!(
                d.steps >= prompt_tokens / chunk,
                "{name}: chunk {chunk} must really split the prefill ({} steps)",
                d.steps
            );
            assert_same_as_single(&f, &d, &singles, &format!("chunk {chunk}"));
        }
    }
}

/// A request whose prompt was computed before: its leading full blocks come
/// from the prefix cache, both after the first request finished and while
/// it is still running (blocks shared).
#[test]
fn prefix_cache_hits() {
    for name in FIXTURES {
        let f = fixture(name);
        let singles = single_runs(&f, 32);
        let long = f.prompts.iter().position(|p| p.name == "long").unwrap();
        let p = &f.prompts[long];

        let mut d = Driver::new(&f.loaded, scheduler_config(16, 128));
        d.add("first", &p.input_ids, greedy_params(32));
        d.run();
        d.add("after", &p.input_ids, greedy_params(32));
        d.run();
        // Concurrent: "during" arrives while "first2" decodes.
        d.add("first2", &p.input_ids, greedy_params(32));
        for _ in 0..4 {
            d.step();
        }
        d.add("during", &p.input_ids, greedy_params(32));
        d.run();

        let full_blocks = (p.input_ids.len() - 1) / 16 * 16;
        for id in ["after", "first2", "during"] {
            let r = &d.results[id];
            assert_eq!(r.num_cached_tokens, full_blocks, "{name}/{id}: prefix hit");
            assert_eq!(r.tokens, singles[long].tokens, "{name}/{id}");
        }
        assert_eq!(d.results["first"].tokens, singles[long].tokens);

        // A different prompt sharing only the leading blocks.
        let mut other = p.input_ids[..64].to_vec();
        other.extend_from_slice(&f.prompts[1].input_ids[..20]);
        let mut fresh = Driver::new(
            &f.loaded,
            SchedulerConfig {
                enable_prefix_caching: false,
                ..scheduler_config(16, 128)
            },
        );
        fresh.add("other", &other, greedy_params(32));
        fresh.run();
        d.add("other", &other, greedy_params(32));
        d.run();
        assert_eq!(d.results["other"].num_cached_tokens, 64, "{name}");
        assert_eq!(
            d.results["other"].tokens, fresh.results["other"].tokens,
            "{name}"
        );
    }
}

/// A pool too small for all six requests: the scheduler preempts, the
/// runner recomputes the victims from their tokens, and nobody's output
/// changes.
#[test]
fn preemption_and_recompute() {
    for name in FIXTURES {
        let f = fixture(name);
        let singles = single_runs(&f, 32);
        // Block size 4: the long prompt alone needs 57 blocks with its
        // outputs, everything together about 155.
        let mut d = Driver::new(&f.loaded, scheduler_config(4, 80));
        add_all(&mut d, &f);
        d.run();
        let stats = d.sched.make_stats();
        assert!(
            stats.num_preemptions_total > 0,
            "{name}: the test must preempt"
        );
        assert_same_as_single(&f, &d, &singles, "preempted");
        assert_eq!(d.runner.num_requests(), 0);
    }
}

/// A seeded, randomly sampled request gets the same tokens alone and in a
/// batch with other (seeded and unseeded) requests, chunked or not.
#[test]
fn seeded_sampling_ignores_batch_composition() {
    use sluice_core::SamplingParams;
    let f = fixture("tiny-qwen2");
    let seeded = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: Some(seed),
        ignore_eos: true,
        max_tokens: 24,
        ..SamplingParams::default()
    };
    let p = &f.prompts[2].input_ids;
    let mut alone = Driver::new(&f.loaded, scheduler_config(16, 128));
    alone.add("r", p, seeded(42));
    alone.run();

    let config = SchedulerConfig {
        max_num_batched_tokens: 7,
        max_num_seqs: 7,
        ..scheduler_config(16, 128)
    };
    let mut crowd = Driver::new(&f.loaded, config);
    for (i, q) in f.prompts.iter().enumerate() {
        let params = SamplingParams {
            seed: (i % 2 == 0).then_some(i as u64),
            ..seeded(0)
        };
        crowd.add(&format!("other{i}"), &q.input_ids, params);
    }
    crowd.add("r", p, seeded(42));
    crowd.run();
    assert_eq!(alone.results["r"].tokens.len(), 24);
    assert_eq!(crowd.results["r"].tokens, alone.results["r"].tokens);
    // The seed matters (the check above is not vacuous).
    let mut other_seed = Driver::new(&f.loaded, scheduler_config(16, 128));
    other_seed.add("r", p, seeded(43));
    other_seed.run();
    assert_ne!(other_seed.results["r"].tokens, alone.results["r"].tokens);
}
