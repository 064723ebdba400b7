//! Structured outputs through the engine: the grammar's bitmask reaches the
//! (scripted) model every step, each completion's matcher follows its own
//! tokens, and the text obeys the constraint whatever the model would
//! rather say — with `n > 1`, stop strings, preemption, and a grammar that
//! does not compile.

mod common;

use common::*;
use sluice_engine::{FinishReason, SamplingParams};
use sluice_structured::{Constraint, JsonFormat};

fn choice(options: &[&str]) -> Constraint {
    Constraint::Choice(options.iter().map(|s| s.to_string()).collect())
}

#[tokio::test]
async fn a_choice_holds_whatever_the_model_prefers() {
    // The model wants to say "maybe"; the grammar allows "yes" or "no".
    let engine = start(config(scheduler_config()), 64, say("maybe"));
    let req = request("Q?", params(16)).with_constraint(choice(&["yes", "no"]));
    let out = collect(engine.generate(req).unwrap()).await;
    assert!(
        out[0].text == "yes" || out[0].text == "no",
        "{:?}",
        out[0].text
    );
    let fin = out[0].finished.as_ref().unwrap();
    assert_eq!(
        fin.reason,
        FinishReason::Stop,
        "EOS once the choice is complete"
    );
}

#[tokio::test]
async fn a_model_that_agrees_with_the_grammar_is_left_alone() {
    let engine = start(config(scheduler_config()), 64, say("no"));
    let req = request("Q?", params(16)).with_constraint(choice(&["yes", "no"]));
    let out = collect(engine.generate(req).unwrap()).await;
    assert_eq!(out[0].text, "no");
}

#[tokio::test]
async fn a_json_schema_gives_json_that_validates() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["answer", "n"],
        "additionalProperties": false
    });
    let engine = start(config(scheduler_config()), 64, say("I think so!"));
    let req = request("Q?", params(64)).with_constraint(Constraint::Json {
        schema,
        format: JsonFormat::pattern(String::new()),
    });
    let out = collect(engine.generate(req).unwrap()).await;
    let v: serde_json::Value = serde_json::from_str(&out[0].text)
        .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", out[0].text));
    assert!(v["answer"] == "yes" || v["answer"] == "no", "{v}");
    let n = v["n"].as_i64().unwrap();
    assert!((1..=9).contains(&n), "{v}");
    assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);
}

#[tokio::test]
async fn every_child_of_n_has_its_own_matcher() {
    let engine = start(config(scheduler_config()), 64, say("n"));
    let mut p = SamplingParams::greedy(16);
    p.n = 3;
    let req = request("Q?", p).with_constraint(Constraint::Regex("n[0-9]{2}".into()));
    let out = collect(engine.generate(req).unwrap()).await;
    assert_eq!(out.len(), 3);
    for c in &out {
        assert_eq!(c.text.len(), 3, "{:?}", c.text);
        assert!(c.text.starts_with('n') && c.text[1..].bytes().all(|b| b.is_ascii_digit()));
    }
}

#[tokio::test]
async fn a_stop_string_still_cuts_constrained_text() {
    let engine = start(config(scheduler_config()), 64, say("abcabc"));
    let mut p = params(16);
    p.stop = vec!["c".into()];
    let req = request("Q?", p).with_constraint(Constraint::Regex("(abc)+".into()));
    let out = collect(engine.generate(req).unwrap()).await;
    assert_eq!(out[0].text, "ab");
    assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);
}

#[tokio::test]
async fn a_grammar_that_does_not_compile_fails_its_request_only() {
    let engine = start(config(scheduler_config()), 64, say("hi"));
    assert!(engine
        .compile_constraint(&Constraint::Regex("(unclosed".into()))
        .is_err());
    let bad = request("Q?", params(8)).with_constraint(Constraint::Grammar("start: foo".into()));
    let good = request("Q?", params(8));
    let (bad, good) = (
        engine.generate(bad).unwrap(),
        engine.generate(good).unwrap(),
    );
    let bad = collect(bad).await;
    let fin = bad[0].finished.as_ref().unwrap();
    assert_eq!(fin.reason, FinishReason::Error);
    let error = fin.error.as_deref().unwrap();
    assert!(error.starts_with("Invalid structured outputs: "), "{error}");
    assert_eq!(collect(good).await[0].text, "hi");
}

#[test]
fn preempted_constrained_requests_resume_where_their_grammar_was() {
    // 6 blocks of 16 tokens for two requests that each need 3+: the
    // scheduler preempts one, which later recomputes and goes on.
    let mut sc = scheduler_config();
    sc.max_model_len = 64;
    let (mut core, engine) = core(config(sc), 7, say(&"z".repeat(80)));
    let re = Constraint::Regex("(ab){20}".into());
    let mut streams: Vec<_> = (0..2)
        .map(|_| {
            engine
                .generate(request(&"p".repeat(10), params(40)).with_constraint(re.clone()))
                .unwrap()
        })
        .collect();
    let mut preempted = false;
    for _ in 0..100_000 {
        core.step();
        preempted |= core.stats().num_preemptions > 0;
        if !core.has_work() {
            break;
        }
    }
    assert!(preempted, "the pool was meant to force a preemption");
    for s in &mut streams {
        let o = run_to_end(&mut core, s);
        assert_eq!(o[0].text, "ab".repeat(20));
    }
}

#[tokio::test]
async fn a_requests_stop_token_ends_it_where_the_grammar_can_end() {
    // The model writes "ab" then wants token b'!' (a stop id of this
    // request), which the regex "ab(c)?" does not contain: allowed once
    // "ab" is complete, and it ends the request like EOS.
    let engine = start(config(scheduler_config()), 64, say("ab!c"));
    let mut p = params(16);
    p.stop_token_ids = vec![u32::from(b'!')];
    let req = request("Q?", p).with_constraint(Constraint::Regex("ab(c)?".into()));
    let out = collect(engine.generate(req).unwrap()).await;
    assert_eq!(out[0].text, "ab");
    let fin = out[0].finished.as_ref().unwrap();
    assert_eq!(fin.reason, FinishReason::Stop);
    assert_eq!(
        fin.stop_reason,
        Some(sluice_engine::StopReason::Token(u32::from(b'!')))
    );
}

/// The bytes of `s` as the scripted model's token ids.
fn ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[tokio::test]
async fn a_gated_grammar_holds_only_after_its_sequence() {
    // The thinking before `</think>` is free; the answer after it is held
    // to the choice, with the model's own preference where allowed.
    let engine = start(config(scheduler_config()), 64, say("maybe?</think>no"));
    let mut req = request("Q?", params(32)).with_constraint(choice(&["yes", "no"]));
    req.structured_after = Some(ids("</think>"));
    let out = collect(engine.generate(req).unwrap()).await;
    assert_eq!(out[0].text, "maybe?</think>no");
    assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);

    // After the sequence the grammar decides, whatever the model prefers.
    let engine = start(config(scheduler_config()), 64, say("hm</think>maybe"));
    let mut req = request("Q?", params(32)).with_constraint(choice(&["yes", "no"]));
    req.structured_after = Some(ids("</think>"));
    let out = collect(engine.generate(req).unwrap()).await;
    let answer = out[0].text.strip_prefix("hm</think>").unwrap();
    assert!(answer == "yes" || answer == "no", "{:?}", out[0].text);

    // Never reached: nothing is constrained (the model thinks to its limit).
    let engine = start(config(scheduler_config()), 64, say("thinking on and on"));
    let mut req = request("Q?", params(8)).with_constraint(choice(&["yes", "no"]));
    req.structured_after = Some(ids("</think>"));
    let out = collect(engine.generate(req).unwrap()).await;
    assert_eq!(out[0].text, "thinking");
    assert_eq!(
        out[0].finished.as_ref().unwrap().reason,
        FinishReason::Length
    );
}
