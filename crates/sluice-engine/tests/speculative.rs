//! Speculative decoding through the engine, with a scripted drafter: the
//! executor proposes drafts after each step, the engine hands them to the
//! scheduler, the next step verifies them. Drafts change how many steps a
//! completion takes, never its tokens: every test compares with the same
//! request run without a drafter.

mod common;

use common::*;
use sluice_engine::{
    Engine, EngineCore, FinishReason, RequestStream, SamplingParams, ScriptedExecutor, SeqView,
    TokenId, Tokenizer,
};
use sluice_structured::Constraint;
use std::sync::Arc;

const TEXT: &str = "the quick brown fox jumps over the lazy dog";

/// Proposes the next `k` bytes of `text` after what the sequence has said.
fn oracle(text: &'static str, k: usize) -> impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send {
    move |v| {
        let done = v.output.len();
        text.bytes().skip(done).take(k).map(u32::from).collect()
    }
}

/// A drafter that is always wrong.
fn wrong(k: usize) -> impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send {
    move |_| vec![u32::from(b'#'); k]
}

fn core_with(exec: ScriptedExecutor) -> (EngineCore, Engine) {
    let config = config(scheduler_config());
    EngineCore::new(config, Box::new(exec), Arc::new(Tokenizer::builtin())).unwrap()
}

/// Runs one request to its end; returns its text, finish reason and the
/// number of engine steps that ran.
fn run(
    exec: ScriptedExecutor,
    req: sluice_engine::GenerateRequest,
) -> (String, FinishReason, usize) {
    let (mut core, engine) = core_with(exec);
    let mut stream: RequestStream = engine.generate(req).unwrap();
    let mut text = String::new();
    let mut steps = 0;
    for _ in 0..10_000 {
        while let Some(out) = stream.try_next() {
            text.push_str(&out.text);
            if let Some(f) = out.finished {
                return (text, f.reason, steps);
            }
        }
        if core.step() {
            steps += 1;
        }
    }
    panic!("the request did not finish: {text:?}");
}

fn scripted() -> ScriptedExecutor {
    ScriptedExecutor::new(64, say(TEXT)).with_vocab_size(384)
}

#[test]
fn right_drafts_give_the_same_text_in_fewer_steps() {
    let req = || request("Q: ", params(200));
    let (plain, reason, plain_steps) = run(scripted(), req());
    assert_eq!(plain, TEXT);
    assert_eq!(reason, FinishReason::Stop);
    let (spec, spec_reason, spec_steps) = run(scripted().with_drafter(oracle(TEXT, 3)), req());
    assert_eq!(spec, plain);
    assert_eq!(spec_reason, reason);
    // Each verifying step yields the three accepted drafts and one more.
    assert!(
        spec_steps * 3 < plain_steps,
        "{spec_steps} steps with drafts, {plain_steps} without"
    );
}

#[test]
fn wrong_drafts_change_nothing_but_the_work() {
    let req = || request("Q: ", params(200));
    let (plain, _, plain_steps) = run(scripted(), req());
    let (spec, _, spec_steps) = run(scripted().with_drafter(wrong(4)), req());
    assert_eq!(spec, plain);
    assert_eq!(spec_steps, plain_steps);
}

#[test]
fn drafts_past_max_tokens_are_not_emitted() {
    let req = || request("Q: ", params(6));
    let (plain, reason, _) = run(scripted(), req());
    assert_eq!((plain.as_str(), reason), ("the qu", FinishReason::Length));
    let (spec, spec_reason, _) = run(scripted().with_drafter(oracle(TEXT, 4)), req());
    assert_eq!(
        (spec.as_str(), spec_reason),
        ("the qu", FinishReason::Length)
    );
}

#[test]
fn a_stop_string_inside_accepted_drafts_cuts_there() {
    let params = SamplingParams {
        stop: vec!["brown".into()],
        ..params(200)
    };
    let (plain, reason, _) = run(scripted(), request("Q: ", params.clone()));
    assert_eq!((plain.as_str(), reason), ("the quick ", FinishReason::Stop));
    let (spec, spec_reason, _) = run(
        scripted().with_drafter(oracle(TEXT, 5)),
        request("Q: ", params),
    );
    assert_eq!((spec, spec_reason), (plain, reason));
}

#[test]
fn a_structured_output_request_keeps_only_drafts_its_grammar_accepts() {
    // The drafter proposes the model's own bytes, which the grammar
    // forbids past "no": the engine cuts the drafts where the grammar
    // refuses them and masks every verified position, so the output is
    // the grammar's, as without drafts.
    let constraint = Constraint::Choice(vec!["yes".into(), "no".into()]);
    let req = || request("Q?", params(16)).with_constraint(constraint.clone());
    let model = || ScriptedExecutor::new(64, say("nox")).with_vocab_size(384);
    let (plain, reason, _) = run(model(), req());
    assert_eq!(plain, "no");
    let (spec, spec_reason, _) = run(model().with_drafter(oracle("nox", 2)), req());
    assert_eq!((spec, spec_reason), (plain, reason));
    // The draft "o" the grammar accepts was verified and accepted; "x",
    // which it refuses, never reached the scheduler.
    let stats = stats_for(model().with_drafter(oracle("nox", 2)), req());
    assert_eq!(
        (
            stats.spec_decode_num_draft_tokens,
            stats.spec_decode_num_accepted_tokens
        ),
        (1, 1),
        "{stats:?}"
    );
}

/// Runs one request to its end on `exec`; returns the engine's stats.
fn stats_after(exec: ScriptedExecutor, max_tokens: usize) -> sluice_engine::EngineStats {
    stats_for(exec, request("Q: ", params(max_tokens)))
}

/// Runs `req` to its end on `exec`; returns the engine's stats.
fn stats_for(
    exec: ScriptedExecutor,
    req: sluice_engine::GenerateRequest,
) -> sluice_engine::EngineStats {
    let (mut core, engine) = core_with(exec);
    let mut stream: RequestStream = engine.generate(req).unwrap();
    for _ in 0..10_000 {
        while let Some(out) = stream.try_next() {
            if out.finished.is_some() {
                return engine.stats();
            }
        }
        core.step();
    }
    panic!("the request did not finish");
}

#[test]
fn the_stats_count_drafts_verified_and_accepted() {
    let none = stats_after(scripted(), 200);
    assert_eq!(none.spec_decode_num_drafts, 0);
    assert!(none.spec_decode_accepted_per_pos.is_empty());

    // Always wrong: every draft verified, none accepted.
    let wrong = stats_after(scripted().with_drafter(wrong(4)), 200);
    assert!(wrong.spec_decode_num_drafts > 0);
    assert_eq!(
        wrong.spec_decode_num_draft_tokens,
        4 * wrong.spec_decode_num_drafts
    );
    assert_eq!(wrong.spec_decode_num_accepted_tokens, 0);
    assert_eq!(wrong.spec_decode_accepted_per_pos, vec![0; 4]);

    // Always right: each verification takes its drafts (the oracle runs
    // out at the text's end, so the last ones may be shorter) and yields
    // one more token, so accepted + verifications = the tokens generated
    // in verifying steps, at most all of them.
    let right = stats_after(scripted().with_drafter(oracle(TEXT, 3)), 200);
    let n = right.spec_decode_num_drafts;
    assert!(n > 0);
    assert_eq!(
        right.spec_decode_num_accepted_tokens,
        right.spec_decode_num_draft_tokens
    );
    assert!(right.spec_decode_num_accepted_tokens + n <= right.generation_tokens);
    let per_pos = &right.spec_decode_accepted_per_pos;
    assert_eq!(per_pos.len(), 3);
    assert_eq!(
        per_pos.iter().sum::<u64>(),
        right.spec_decode_num_accepted_tokens
    );
    assert!(
        per_pos[0] >= per_pos[1] && per_pos[1] >= per_pos[2],
        "{per_pos:?}"
    );
}
