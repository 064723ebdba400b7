//! Speculative decoding: drafts never change the output. Every scenario runs
//! the real scheduler and a `ModelExecutor` with a drafter, in the engine's
//! loop (execute → update_from_output → take_draft_token_ids →
//! update_draft_token_ids), and compares the tokens and logprobs with the
//! same executor without a drafter; greedy runs are also compared with the
//! transformers reference tokens. Right drafts must also save steps.

mod common;

use common::*;
use sluice_core::{
    Executor, FinishReason, NewRequest, RequestId, SamplingParams, Scheduler, SchedulerConfig,
    TokenId,
};
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::runner::ModelRunner;
use sluice_model::{DraftModelDrafter, DraftRequest, Drafter, ModelExecutor, NgramDrafter};
use std::collections::HashMap;

/// Drafts per request and step in these tests.
const K: usize = 3;

/// How the scripted drafter spoils the expected continuation.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// The expected tokens.
    Right,
    /// Every draft differs from the expected token.
    Wrong,
    /// The i-th proposal is right up to position `i % (K + 1)` and wrong
    /// there (all right when that is K): every acceptance count occurs.
    Mixed,
    /// The expected tokens, but the second one replaced by a token id
    /// outside the vocabulary.
    OutOfVocab,
}

/// Proposes each request's expected outputs (from a run without drafts),
/// spoiled as its [`Script`] says; past the expected outputs it proposes
/// token 1, so requests near their end get drafts they must drop.
struct Scripted {
    expected: HashMap<String, Vec<TokenId>>,
    script: Script,
    vocab: u32,
    proposals: usize,
}

impl Drafter for Scripted {
    fn propose(&mut self, req: &DraftRequest<'_>, k: usize, drafts: &mut Vec<TokenId>) {
        let expected = &self.expected[&**req.req_id];
        let done = req.token_ids.len() - req.num_prompt_tokens;
        for j in 0..k {
            let right = expected.get(done + j).copied().unwrap_or(1);
            let spoil = match self.script {
                Script::Right => false,
                Script::Wrong => true,
                Script::Mixed => j == self.proposals % (k + 1),
                Script::OutOfVocab => {
                    drafts.push(if j == 1 { self.vocab + 5 } else { right });
                    continue;
                }
            };
            drafts.push(if spoil {
                (right + 1) % self.vocab
            } else {
                right
            });
        }
        self.proposals += 1;
    }
}

/// What one request produced.
#[derive(Clone, Debug, Default, PartialEq)]
struct Outcome {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
}

/// How a run went.
struct Run {
    outcomes: HashMap<String, Outcome>,
    steps: usize,
    /// Drafts the scheduler scheduled, over all steps.
    drafts_scheduled: usize,
}

/// Runs `reqs` to completion through the scheduler and `exec`, the way the
/// engine does.
fn run_all(
    mut exec: ModelExecutor,
    config: SchedulerConfig,
    reqs: &[(String, Vec<u32>, SamplingParams)],
) -> Run {
    let mut sched = Scheduler::new(config).expect("scheduler");
    let mut results: HashMap<String, Outcome> = HashMap::new();
    for (id, prompt, params) in reqs {
        sched
            .add_request(NewRequest::new(id.as_str(), prompt.clone(), params.clone()))
            .expect("request accepted");
        results.insert(id.clone(), Outcome::default());
    }
    let mut steps = 0;
    let mut drafts_scheduled = 0;
    loop {
        let so = sched.schedule();
        drafts_scheduled += so
            .scheduled_spec_decode_tokens
            .iter()
            .map(|(_, d)| d.len())
            .sum::<usize>();
        let out = exec.execute(&so).expect("execute");
        for u in sched.update_from_output(&so, &out) {
            let r = results.get_mut(&*u.req_id).expect("known request");
            r.tokens.extend_from_slice(&u.new_token_ids);
            if let Some(lp) = out.sample_logprobs(u.index) {
                // Only the tokens the scheduler kept.
                let kept = lp.iter().take(u.new_token_ids.len());
                r.logprobs
                    .extend(kept.map(|l| l.as_ref().expect("logprobs").sampled.logprob));
            }
            if u.finish_reason.is_some() {
                r.finish = u.finish_reason;
            }
        }
        if let Some(drafts) = exec.take_draft_token_ids() {
            sched.update_draft_token_ids(&drafts);
        }
        steps += 1;
        if !sched.has_unfinished_requests() {
            break;
        }
        assert!(steps < 10_000, "runaway loop");
    }
    // One more step hands the last finished ids to the runner.
    exec.execute(&sched.schedule()).expect("final execute");
    assert_eq!(exec.runner().num_requests(), 0, "finished requests dropped");
    Run {
        outcomes: results,
        steps,
        drafts_scheduled,
    }
}

/// [`run_all`]'s outcomes and step count.
fn run(
    exec: ModelExecutor,
    config: SchedulerConfig,
    reqs: &[(String, Vec<u32>, SamplingParams)],
) -> (HashMap<String, Outcome>, usize) {
    let r = run_all(exec, config, reqs);
    (r.outcomes, r.steps)
}

fn executor(f: &Fixture, config: &SchedulerConfig) -> ModelExecutor {
    let kv = KvCacheConfig::new(config.block_size, config.num_gpu_blocks);
    ModelExecutor::from_runner(ModelRunner::new(&f.loaded, kv).expect("runner"))
}

fn spec_config(base: SchedulerConfig) -> SchedulerConfig {
    SchedulerConfig {
        num_lookahead_tokens: K,
        ..base
    }
}

fn scripted(f: &Fixture, expected: &HashMap<String, Outcome>, script: Script) -> Box<dyn Drafter> {
    Box::new(Scripted {
        expected: expected
            .iter()
            .map(|(id, o)| (id.clone(), o.tokens.clone()))
            .collect(),
        script,
        vocab: f.loaded.config.vocab_size as u32,
        proposals: 0,
    })
}

fn greedy_reqs(f: &Fixture) -> Vec<(String, Vec<u32>, SamplingParams)> {
    f.prompts
        .iter()
        .map(|p| (p.name.clone(), p.input_ids.clone(), greedy_params(32)))
        .collect()
}

/// Same tokens and finish reasons, logprobs within the f32 tolerance.
fn assert_same(got: &HashMap<String, Outcome>, want: &HashMap<String, Outcome>, what: &str) {
    assert_eq!(got.len(), want.len());
    for (id, w) in want {
        let g = &got[id];
        assert_eq!(g.tokens, w.tokens, "{what}: {id} tokens");
        assert_eq!(g.finish, w.finish, "{what}: {id} finish reason");
        assert_eq!(g.logprobs.len(), w.logprobs.len(), "{what}: {id} logprobs");
        for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
            assert!((a - b).abs() <= ATOL, "{what}: {id} logprob {a} vs {b}");
        }
    }
}

#[test]
fn greedy_drafts_right_wrong_and_mixed() {
    for name in FIXTURES {
        let f = fixture(name);
        let config = scheduler_config(16, 128);
        let reqs = greedy_reqs(&f);
        let (plain, plain_steps) = run(executor(&f, &config), config.clone(), &reqs);
        for p in &f.prompts {
            assert_eq!(
                plain[&p.name].tokens, p.greedy_token_ids,
                "{name}/{}",
                p.name
            );
        }
        for script in [Script::Right, Script::Wrong, Script::Mixed] {
            let exec = executor(&f, &config).with_drafter(scripted(&f, &plain, script), K);
            let (got, steps) = run(exec, spec_config(config.clone()), &reqs);
            assert_same(&got, &plain, &format!("{name} {script:?}"));
            match script {
                // 1 prefill step + 31 more tokens at K + 1 per step.
                Script::Right => assert_eq!(steps, 1 + 31usize.div_ceil(K + 1), "{name}"),
                Script::Wrong => assert_eq!(steps, plain_steps, "{name}"),
                Script::Mixed | Script::OutOfVocab => {
                    assert!(steps < plain_steps, "{name}: {steps}")
                }
            }
        }
    }
}

#[test]
fn seeded_random_sampling_with_drafts() {
    let f = fixture("tiny-qwen2");
    let config = scheduler_config(16, 128);
    let reqs: Vec<_> = f
        .prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let params = SamplingParams {
                temperature: 0.9,
                top_p: 0.9,
                top_k: if i % 2 == 0 { 0 } else { 50 },
                seed: Some(1000 + i as u64),
                repetition_penalty: 1.3,
                frequency_penalty: 0.2,
                ignore_eos: true,
                logprobs: Some(2),
                ..SamplingParams::greedy(24)
            };
            (p.name.clone(), p.input_ids.clone(), params)
        })
        .collect();
    let (plain, plain_steps) = run(executor(&f, &config), config.clone(), &reqs);
    // The sampling is really random: not the greedy tokens.
    assert!(f
        .prompts
        .iter()
        .any(|p| plain[&p.name].tokens[..] != p.greedy_token_ids[..24]));
    for script in [Script::Right, Script::Wrong, Script::Mixed] {
        let exec = executor(&f, &config).with_drafter(scripted(&f, &plain, script), K);
        let (got, steps) = run(exec, spec_config(config.clone()), &reqs);
        assert_same(&got, &plain, &format!("random {script:?}"));
        if !matches!(script, Script::Wrong) {
            assert!(steps < plain_steps, "{script:?}: {steps} vs {plain_steps}");
        }
    }
}

/// A token budget smaller than a request's drafts: prefill in chunks mixed
/// with verification steps, drafts cut to what the budget leaves.
#[test]
fn chunked_prefill_with_a_tight_budget() {
    let f = fixture("tiny-llama");
    let reqs = greedy_reqs(&f);
    let (plain, _) = run(
        executor(&f, &scheduler_config(16, 128)),
        scheduler_config(16, 128),
        &reqs,
    );
    for budget in [2, 5] {
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: 3,
            ..scheduler_config(16, 128)
        };
        for script in [Script::Right, Script::Mixed] {
            let exec = executor(&f, &config).with_drafter(scripted(&f, &plain, script), K);
            let r = run_all(exec, spec_config(config.clone()), &reqs);
            assert!(
                r.drafts_scheduled > 0,
                "budget {budget}: drafts were verified"
            );
            assert_same(&r.outcomes, &plain, &format!("budget {budget} {script:?}"));
        }
    }
}

/// Drafts that run past a request's stop token or its max_tokens are
/// dropped: the same tokens and finish reason as without drafts.
#[test]
fn drafts_past_stop_or_max_tokens_are_dropped() {
    let f = fixture("tiny-qwen2");
    let config = scheduler_config(16, 128);
    let p = &f.prompts[0];
    // Stop at the greedy output's 6th token (its first occurrence).
    let stop = p.greedy_token_ids[5];
    let stop_at = p.greedy_token_ids.iter().position(|&t| t == stop).unwrap();
    let mut reqs = Vec::new();
    for max_tokens in [1, 2, 5, 9] {
        reqs.push((
            format!("max{max_tokens}"),
            p.input_ids.clone(),
            greedy_params(max_tokens),
        ));
    }
    reqs.push((
        "stop".to_string(),
        p.input_ids.clone(),
        SamplingParams {
            stop_token_ids: vec![stop],
            ..greedy_params(32)
        },
    ));
    let (plain, _) = run(executor(&f, &config), config.clone(), &reqs);
    assert_eq!(plain["stop"].tokens.len(), stop_at + 1);
    assert!(matches!(plain["stop"].finish, Some(FinishReason::Stop)));
    assert_eq!(plain["max5"].tokens.len(), 5);
    // Right drafts continue past the end (token 1 beyond the expected
    // outputs), so every request is offered drafts it must not keep.
    let mut long = plain.clone();
    for (id, o) in &mut long {
        if id == "stop" {
            o.tokens = p.greedy_token_ids.clone();
        }
    }
    for script in [Script::Right, Script::Mixed] {
        let exec = executor(&f, &config).with_drafter(scripted(&f, &long, script), K);
        let (got, _) = run(exec, spec_config(config.clone()), &reqs);
        assert_same(&got, &plain, &format!("{script:?}"));
    }
}

/// vLLM's n-gram drafter end to end: the same tokens as transformers.
#[test]
fn ngram_drafter_keeps_the_reference_tokens() {
    let f = fixture("tiny-qwen3");
    let config = scheduler_config(16, 128);
    let reqs = greedy_reqs(&f);
    let (plain, _) = run(executor(&f, &config), config.clone(), &reqs);
    let ngram = Box::new(NgramDrafter::new(1, 3).unwrap());
    let r = run_all(
        executor(&f, &config).with_drafter(ngram, K),
        spec_config(config),
        &reqs,
    );
    assert!(r.drafts_scheduled > 0, "the n-gram drafter found matches");
    let got = r.outcomes;
    assert_same(&got, &plain, "ngram");
    for p in &f.prompts {
        assert_eq!(got[&p.name].tokens, p.greedy_token_ids, "{}", p.name);
    }
}

/// vLLM's draft-model method end to end: the fixture drafting for itself
/// (its greedy drafts are the target's tokens: kernels are bit-identical
/// across batch shapes, so every draft is accepted) and a draft of the same
/// shape with random weights (almost every draft rejected, so the draft's
/// own KV is rolled back each step) both keep the reference tokens.
#[test]
fn draft_model_keeps_the_reference_tokens() {
    let f = fixture("tiny-qwen3");
    let config = scheduler_config(16, 128);
    let reqs = greedy_reqs(&f);
    let (plain, _) = run(executor(&f, &config), config.clone(), &reqs);
    let vocab = f.loaded.config.vocab_size;
    let random = sluice_model::load_dummy(
        f.loaded.config.clone(),
        f.loaded.generation_config.clone(),
        sluice_model::DType::F32,
        7,
    )
    .unwrap();
    for (what, draft, all_accepted) in [("itself", &f.loaded, true), ("random", &random, false)] {
        let drafter = DraftModelDrafter::new(draft, vocab, KvCacheConfig::new(16, 64)).unwrap();
        let r = run_all(
            executor(&f, &config).with_drafter(Box::new(drafter), K),
            SchedulerConfig {
                num_lookahead_tokens: K,
                ..config.clone()
            },
            &reqs,
        );
        assert!(r.drafts_scheduled > 0, "{what}: drafts were scheduled");
        assert_same(&r.outcomes, &plain, what);
        for p in &f.prompts {
            assert_eq!(
                r.outcomes[&p.name].tokens, p.greedy_token_ids,
                "{what}: {}",
                p.name
            );
        }
        // Each greedy request of 32 tokens: with every draft accepted, a
        // step makes K + 1 tokens.
        if all_accepted {
            assert!(
                r.steps <= 32usize.div_ceil(K + 1) + 4,
                "{what}: {} steps",
                r.steps
            );
        }
    }
    // A draft with another vocabulary is refused, naming both sizes.
    let mut small = f.loaded.config.clone();
    small.vocab_size = vocab + 1;
    let other = sluice_model::load_dummy(
        small,
        f.loaded.generation_config.clone(),
        sluice_model::DType::F32,
        1,
    )
    .unwrap();
    let e = DraftModelDrafter::new(&other, vocab, KvCacheConfig::new(16, 64))
        .err()
        .unwrap();
    let e = format!("{e:#}");
    assert!(
        e.contains(&format!("Target model vocab_size={vocab}")),
        "{e}"
    );
}

/// Sampled outputs keep their distribution under speculation, tested as a
/// distribution (independent seeds in each arm, unlike the same-seed test
/// above): 3,000 requests sample 3 tokens at temperature 1 without drafts
/// and 3,000 others with the model's own greedy drafts (accepted when the
/// sampled token is the argmax, often rejected), and a chi-square
/// homogeneity test compares the (2nd, 3rd) token pairs (the positions
/// verification decides) over the 8 most frequent pairs and "other". At
/// α = 0.001 (critical χ²₈ = 26.12) it fails wrongly once in 1,000 seeds
/// sets; moving 4 % of the mass between two categories of 20 % each gives
/// a noncentrality of 1,500 · 2 · 0.04² / 0.2 = 24, detected with power
/// about 0.7 (0.99 at 6 %).
#[test]
fn sampled_distribution_unchanged_by_drafts() {
    const N: usize = 3000;
    let f = fixture("tiny-qwen2");
    let config = SchedulerConfig {
        max_num_seqs: 256,
        ..scheduler_config(16, 4096)
    };
    let prompt = f.prompts[0].input_ids.clone();
    let reqs = |seed0: u64| -> Vec<(String, Vec<u32>, SamplingParams)> {
        (0..N as u64)
            .map(|i| {
                let params = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed0 + i),
                    ignore_eos: true,
                    ..SamplingParams::greedy(3)
                };
                (format!("r{i}"), prompt.clone(), params)
            })
            .collect()
    };
    let (plain, _) = run(executor(&f, &config), config.clone(), &reqs(0));
    let drafter = DraftModelDrafter::new(
        &f.loaded,
        f.loaded.config.vocab_size,
        KvCacheConfig::new(16, 4096),
    )
    .unwrap();
    let r = run_all(
        executor(&f, &config).with_drafter(Box::new(drafter), 2),
        SchedulerConfig {
            num_lookahead_tokens: 2,
            ..config.clone()
        },
        &reqs(1_000_000),
    );
    assert!(
        r.drafts_scheduled > N,
        "drafts were verified: {}",
        r.drafts_scheduled
    );
    let pairs = |o: &HashMap<String, Outcome>| -> Vec<(u32, u32)> {
        o.values().map(|x| (x.tokens[1], x.tokens[2])).collect()
    };
    let (a, b) = (pairs(&plain), pairs(&r.outcomes));
    let mut pooled: HashMap<(u32, u32), usize> = HashMap::new();
    for p in a.iter().chain(&b) {
        *pooled.entry(*p).or_default() += 1;
    }
    let mut top: Vec<_> = pooled.into_iter().collect();
    top.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let cats: Vec<(u32, u32)> = top.iter().take(8).map(|x| x.0).collect();
    let bucket = |p: &(u32, u32)| cats.iter().position(|c| c == p).unwrap_or(8);
    let mut counts = [[0f64; 9]; 2];
    for (arm, ps) in [&a, &b].into_iter().enumerate() {
        for p in ps {
            counts[arm][bucket(p)] += 1.0;
        }
    }
    // Two samples of equal size: expected count per arm is the pooled mean.
    let chi2: f64 = (0..9)
        .map(|c| {
            let e = (counts[0][c] + counts[1][c]) / 2.0;
            if e == 0.0 {
                0.0
            } else {
                (counts[0][c] - e).powi(2) / e + (counts[1][c] - e).powi(2) / e
            }
        })
        .sum();
    assert!(chi2 < 26.12, "chi-square {chi2:.1} over {counts:?}");
    // The categories are not degenerate: the test can see a difference.
    assert!(counts[0][0] < 0.9 * N as f64, "{counts:?}");
}

/// A drafter's token outside the vocabulary ends its proposal there: the
/// drafts before it are still verified, the step does not fail.
#[test]
fn drafts_outside_the_vocabulary_are_cut() {
    let f = fixture("tiny-qwen2");
    let config = scheduler_config(16, 128);
    let reqs = greedy_reqs(&f);
    let (plain, plain_steps) = run(executor(&f, &config), config.clone(), &reqs);
    let exec = executor(&f, &config).with_drafter(scripted(&f, &plain, Script::OutOfVocab), K);
    let r = run_all(exec, spec_config(config), &reqs);
    assert_same(&r.outcomes, &plain, "out of vocabulary");
    // One right draft per step: two tokens per step after the prefill.
    assert_eq!(r.steps, 1 + 31usize.div_ceil(2));
    assert!(r.steps < plain_steps);
}

/// Without a drafter nothing is proposed.
#[test]
fn no_drafter_no_drafts() {
    let f = fixture("tiny-qwen2");
    let mut exec = executor(&f, &scheduler_config(16, 16));
    assert!(exec.take_draft_token_ids().is_none());
}

/// Drafts that do not match the scheduled tokens, or that meet a
/// structured-output bitmask, are errors naming the request, not panics.
#[test]
fn inconsistent_drafts_are_errors() {
    let f = fixture("tiny-qwen2");
    let config = spec_config(scheduler_config(16, 64));
    let p = &f.prompts[0];
    let mut sched = Scheduler::new(config.clone()).unwrap();
    sched
        .add_request(NewRequest::new("a", p.input_ids.clone(), greedy_params(8)))
        .unwrap();
    let right: Vec<TokenId> = p.greedy_token_ids[1..=K].to_vec();
    let mut exec = executor(&f, &config);
    let so = sched.schedule();
    let out = exec.execute(&so).unwrap();
    sched.update_from_output(&so, &out);

    // One draft more than was scheduled.
    let id: RequestId = "a".into();
    sched.update_draft_token_ids(&[(id.clone(), right.clone())]);
    let mut so = sched.schedule();
    assert_eq!(so.scheduled_spec_decode_tokens.len(), 1);
    so.scheduled_spec_decode_tokens[0].1.push(7);
    let e = exec.execute(&so).unwrap_err().to_string();
    assert!(e.contains("request a") && e.contains("drafts"), "{e}");

    // A structured-output request with drafts needs one row per sampled
    // position; one row for 3 drafts is refused.
    let mut so2 = so.clone();
    so2.scheduled_spec_decode_tokens[0].1.pop();
    let words = f.loaded.config.vocab_size.div_ceil(32);
    let mut mask = sluice_core::GrammarBitmask::new(words);
    mask.req_ids.push(id);
    mask.words.resize(words, u32::MAX);
    so2.grammar_bitmask = Some(mask);
    let e = exec.execute(&so2).unwrap_err().to_string();
    assert!(e.contains("grammar bitmask rows"), "{e}");
}
