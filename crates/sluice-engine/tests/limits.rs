//! The limits that keep one client from stalling or starving the others:
//! stop strings, logit bias, the vocabulary, queued tokens, and a stream
//! nobody reads.

mod common;

use common::*;
use sluice_engine::{EngineError, FinishReason, RequestLimits, SamplingParams};

fn limited(limits: RequestLimits) -> sluice_engine::EngineConfig {
    let mut cfg = config(scheduler_config());
    cfg.limits = limits;
    cfg
}

fn field_of(r: Result<sluice_engine::RequestStream, EngineError>) -> &'static str {
    match r {
        Err(EngineError::Invalid(f)) => f.field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn stop_strings_and_logit_bias_are_bounded() {
    let (_core, engine) = core(
        limited(RequestLimits {
            max_stop_strings: 3,
            max_stop_string_bytes: 4,
            max_logit_bias: 2,
            ..RequestLimits::default()
        }),
        64,
        say("ok"),
    );
    let with = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = params(4);
        f(&mut p);
        engine.generate(request("hi", p))
    };
    let stops = |n: usize| (0..n).map(|i| format!("s{i}")).collect::<Vec<_>>();
    assert!(with(&|p| p.stop = stops(3)).is_ok());
    assert_eq!(field_of(with(&|p| p.stop = stops(4))), "stop");
    assert_eq!(field_of(with(&|p| p.stop = vec!["12345".into()])), "stop");
    assert!(with(&|p| p.logit_bias = vec![(1, 1.0), (2, 1.0)]).is_ok());
    assert_eq!(
        field_of(with(&|p| p.logit_bias = vec![(1, 1.0), (2, 1.0), (3, 1.0)])),
        "logit_bias"
    );
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused_everywhere() {
    let (_core, engine) = core(config(scheduler_config()), 64, say("ok"));
    // The builtin tokenizer is smaller than the scripted model's 384: the
    // smaller one bounds every check.
    let vocab = engine.vocab_size();
    assert_eq!(vocab, engine.tokenizer().vocab_size().min(384));
    let top = vocab as u32 - 1;
    let prompt_ok = engine.generate(sluice_engine::GenerateRequest::new(vec![1, top], params(2)));
    assert!(prompt_ok.is_ok());
    let r = engine.generate(sluice_engine::GenerateRequest::new(
        vec![1, top + 1],
        params(2),
    ));
    assert_eq!(field_of(r), "prompt");
    let mut p = params(2);
    p.stop_token_ids = vec![top + 1];
    assert_eq!(
        field_of(engine.generate(request("hi", p))),
        "stop_token_ids"
    );
    let mut p = params(2);
    p.logit_bias = vec![(top + 1, 1.0)];
    assert_eq!(field_of(engine.generate(request("hi", p))), "logit_bias");
    assert!(engine.check_token_ids("tokens", &[0, top]).is_ok());
    assert_eq!(
        engine
            .check_token_ids("tokens", &[top + 1])
            .unwrap_err()
            .field,
        "tokens"
    );
}

#[test]
fn queued_tokens_are_bounded_until_requests_start() {
    let (mut core, engine) = core(
        limited(RequestLimits {
            max_waiting_tokens: Some(100),
            ..RequestLimits::default()
        }),
        64,
        say("ok"),
    );
    // "0123456789" is 10 prompt tokens; + 40 = 50 each.
    let mut a = engine.generate(request("0123456789", params(40))).unwrap();
    let mut b = engine.generate(request("0123456789", params(40))).unwrap();
    match engine.generate(request("0123456789", params(40))) {
        Err(EngineError::OverloadedTokens {
            waiting_tokens,
            limit,
        }) => assert_eq!((waiting_tokens, limit), (100, 100)),
        other => panic!("expected OverloadedTokens, got {other:?}"),
    }
    // A request that could never fit is invalid rather than overloaded.
    let mut huge = params(40);
    huge.n = 3;
    assert_eq!(
        field_of(engine.generate(request("0123456789", huge))),
        "max_tokens"
    );
    // Once they start, their tokens leave the bound.
    core.step();
    assert!(engine.generate(request("0123456789", params(40))).is_ok());
    run_to_end(&mut core, &mut a);
    run_to_end(&mut core, &mut b);
}

#[test]
fn a_stream_nobody_reads_is_aborted_and_its_blocks_freed() {
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let (mut core, engine) = core(
        limited(RequestLimits {
            max_stream_buffer_bytes: 1000,
            ..RequestLimits::default()
        }),
        64,
        say(&long),
    );
    let mut unread = engine.generate(request("hi", params(300))).unwrap();
    let mut read = engine.generate(request("hi", params(300))).unwrap();
    let mut read_out = Vec::new();
    for _ in 0..1000 {
        while let Some(o) = read.try_next() {
            read_out.push(o);
        }
        if read.is_finished() {
            break;
        }
        core.step();
    }
    // Each output costs ~65 bytes: the unread one passed 1000 long before
    // its 300 tokens and was aborted; the one being read finished.
    assert_eq!(
        read_out
            .last()
            .and_then(|o| o.finished.as_ref())
            .map(|f| f.reason),
        Some(FinishReason::Length)
    );
    let mut outs = Vec::new();
    while let Some(o) = unread.try_next() {
        outs.push(o);
    }
    let last = outs
        .last()
        .and_then(|o| o.finished.clone())
        .expect("finished");
    assert_eq!(last.reason, FinishReason::Abort);
    assert!(last.num_output_tokens < 40, "{last:?}");
    core.step();
    assert_eq!(core.stats().kv_cache_usage, 0.0);
    assert_eq!(core.stats().num_running_reqs, 0);
}

#[test]
fn many_stop_strings_still_find_the_earliest() {
    let (mut core, engine) = core(config(scheduler_config()), 64, say("abcdefghij"));
    let mut p = params(20);
    p.stop = (0..200).map(|i| format!("zz{i}")).collect();
    p.stop.push("fgh".into());
    p.stop.push("ef".into());
    let mut s = engine.generate(request("hi", p)).unwrap();
    let out = run_to_end(&mut core, &mut s);
    assert_eq!(out[0].text, "abcd");
    let f = out[0].finished.clone().unwrap();
    assert_eq!(
        f.stop_reason,
        Some(sluice_engine::StopReason::String("ef".into()))
    );
}
