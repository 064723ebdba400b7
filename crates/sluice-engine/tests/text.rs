//! What a completion's stream carries: text across token boundaries, stop
//! conditions, logprobs.

mod common;

use common::*;
use sluice_engine::{FinishReason, SamplingParams, StopReason};

fn stop_params(stop: &[&str], include: bool) -> SamplingParams {
    SamplingParams {
        stop: stop.iter().map(|s| s.to_string()).collect(),
        include_stop_str_in_output: include,
        ..params(100)
    }
}

#[tokio::test]
async fn stop_string_split_across_tokens_cuts_the_text() {
    let engine = start(config(scheduler_config()), 64, say("Hello, STOP world"));
    let out = collect(
        engine
            .generate(request("hi", stop_params(&["STOP"], false)))
            .unwrap(),
    )
    .await;
    let c = &out[0];
    assert_eq!(c.text, "Hello, ");
    // Nothing of the stop string was ever sent, not even its first letters.
    assert!(c.chunks.iter().all(|t| !t.contains('S')), "{:?}", c.chunks);
    let f = c.finished.as_ref().unwrap();
    assert_eq!(f.reason, FinishReason::Stop);
    assert_eq!(f.stop_reason, Some(StopReason::String("STOP".into())));
    // Tokens up to the one completing the stop string ("Hello, STOP").
    assert_eq!(c.token_ids, bytes("Hello, STOP"));
    assert_eq!(f.num_output_tokens, 11);
}

#[tokio::test]
async fn include_stop_str_in_output_keeps_it() {
    let engine = start(config(scheduler_config()), 64, say("Hello, STOP world"));
    let out = collect(
        engine
            .generate(request("hi", stop_params(&["world", "STOP"], true)))
            .unwrap(),
    )
    .await;
    assert_eq!(out[0].text, "Hello, STOP");
    assert_eq!(
        out[0].finished.as_ref().unwrap().stop_reason,
        Some(StopReason::String("STOP".into()))
    );
}

#[tokio::test]
async fn held_back_prefix_is_released_when_it_is_not_a_stop_string() {
    // "ST" could start "STOP"; it is held, then released with "AR".
    let engine = start(config(scheduler_config()), 64, say("a START b"));
    let out = collect(
        engine
            .generate(request("hi", stop_params(&["STOP"], false)))
            .unwrap(),
    )
    .await;
    assert_eq!(out[0].text, "a START b");
    assert_eq!(out[0].finished.as_ref().unwrap().stop_reason, None);
}

#[tokio::test]
async fn multi_byte_characters_split_across_tokens_arrive_whole() {
    let text = "é東🚀x";
    let engine = start(config(scheduler_config()), 64, say(text));
    let out = collect(engine.generate(request("hi", params(100))).unwrap()).await;
    assert_eq!(out[0].text, text);
    assert!(out[0].chunks.iter().all(|c| !c.contains('\u{FFFD}')));
    // Chunks are whole characters: "é" arrives with its second byte.
    let non_empty: Vec<&str> = out[0]
        .chunks
        .iter()
        .map(String::as_str)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(non_empty, ["é", "東", "🚀", "x"]);
}

#[tokio::test]
async fn invalid_byte_sequences_become_replacement_characters() {
    // A lone 0xFF, then "a", then a truncated 3-byte character, then EOS.
    let engine = start(
        config(scheduler_config()),
        64,
        emit(vec![0xFF, u32::from(b'a'), 0xE6, 0x9D]),
    );
    let out = collect(engine.generate(request("hi", params(100))).unwrap()).await;
    assert_eq!(out[0].text, "\u{FFFD}a\u{FFFD}");
    assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);
}

#[tokio::test]
async fn eos_stops_unless_ignored() {
    let engine = start(config(scheduler_config()), 64, say("ab"));
    let out = collect(engine.generate(request("hi", params(10))).unwrap()).await;
    let f = out[0].finished.as_ref().unwrap();
    assert_eq!(
        (f.reason, f.stop_reason.clone()),
        (FinishReason::Stop, None)
    );
    // The EOS token is reported, its text is not.
    assert_eq!(out[0].token_ids, vec![97, 98, EOS]);
    assert_eq!(out[0].text, "ab");

    let ignore = SamplingParams {
        ignore_eos: true,
        ..params(5)
    };
    let out = collect(engine.generate(request("hi", ignore)).unwrap()).await;
    let f = out[0].finished.as_ref().unwrap();
    assert_eq!(f.reason, FinishReason::Length);
    assert_eq!(out[0].token_ids, vec![97, 98, EOS, EOS, EOS]);
    assert_eq!(f.num_output_tokens, 5);
}

#[tokio::test]
async fn second_model_eos_and_stop_token_ids_report_the_token() {
    let engine = start(config(scheduler_config()), 64, emit(vec![97, EOS2]));
    let out = collect(engine.generate(request("hi", params(10))).unwrap()).await;
    let f = out[0].finished.as_ref().unwrap();
    assert_eq!(f.reason, FinishReason::Stop);
    assert_eq!(f.stop_reason, Some(sluice_engine::StopReason::Token(EOS2)));

    let engine = start(config(scheduler_config()), 64, say("abc"));
    let p = SamplingParams {
        stop_token_ids: vec![98],
        ..params(10)
    };
    let out = collect(engine.generate(request("hi", p)).unwrap()).await;
    assert_eq!(out[0].text, "a");
    assert_eq!(
        out[0].finished.as_ref().unwrap().stop_reason,
        Some(StopReason::Token(98))
    );
}

#[tokio::test]
async fn max_tokens_ends_with_length() {
    let engine = start(config(scheduler_config()), 64, say("abcdefgh"));
    let out = collect(engine.generate(request("hi", params(3))).unwrap()).await;
    assert_eq!(out[0].text, "abc");
    assert_eq!(
        out[0].finished.as_ref().unwrap().reason,
        FinishReason::Length
    );
}

#[tokio::test]
async fn max_model_len_caps_the_output() {
    let sc = sluice_engine::SchedulerConfig {
        max_model_len: 6,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        ..scheduler_config()
    };
    let engine = start(config(sc), 64, say("abcdefgh"));
    let out = collect(engine.generate(request("hi", params(100))).unwrap()).await;
    // 2 prompt tokens + 4 outputs = max_model_len.
    assert_eq!(out[0].text, "abcd");
    assert_eq!(
        out[0].finished.as_ref().unwrap().reason,
        FinishReason::Length
    );
}

#[tokio::test]
async fn min_tokens_masks_eos_until_reached() {
    // The script always prefers EOS; "z" is the runner-up.
    let engine = start(
        config(scheduler_config()),
        64,
        |_: &sluice_engine::SeqView<'_>| vec![EOS, u32::from(b'z')],
    );
    let p = SamplingParams {
        min_tokens: 3,
        ..params(10)
    };
    let out = collect(engine.generate(request("hi", p)).unwrap()).await;
    assert_eq!(out[0].text, "zzz");
    assert_eq!(out[0].token_ids, vec![122, 122, 122, EOS]);
    assert_eq!(out[0].finished.as_ref().unwrap().reason, FinishReason::Stop);
}

#[tokio::test]
async fn stop_strings_count_only_after_min_tokens() {
    let engine = start(config(scheduler_config()), 64, say("xaxbxc"));
    let p = SamplingParams {
        min_tokens: 2,
        stop: vec!["x".into()],
        ..params(10)
    };
    let out = collect(engine.generate(request("hi", p)).unwrap()).await;
    // The first "x" (token 1) is inside min_tokens; the second (token 3)
    // stops.
    assert_eq!(out[0].text, "xa");
    assert_eq!(out[0].token_ids, bytes("xax"));
}

#[tokio::test]
async fn logprobs_pass_through_per_token() {
    let engine = start(config(scheduler_config()), 64, say("abc"));
    let p = SamplingParams {
        logprobs: Some(2),
        prompt_logprobs: Some(1),
        ..params(10)
    };
    let mut stream = engine.generate(request("hello", p)).unwrap();
    let mut outputs = Vec::new();
    while let Some(o) = stream.next().await {
        outputs.push(o);
    }
    let tokens: usize = outputs.iter().map(|o| o.token_ids.len()).sum();
    let lps: Vec<_> = outputs.iter().flat_map(|o| o.logprobs.clone()).collect();
    assert_eq!(lps.len(), tokens);
    for (lp, tok) in lps
        .iter()
        .zip(outputs.iter().flat_map(|o| o.token_ids.clone()))
    {
        assert_eq!(lp.sampled.token_id, tok);
        assert_eq!(lp.top.len(), 2);
        assert!(lp.sampled.logprob < 0.0);
    }
    // Prompt logprobs: once, one per prompt position after the first.
    let prompt: Vec<_> = outputs
        .iter()
        .filter_map(|o| o.prompt_logprobs.clone())
        .collect();
    assert_eq!(prompt.len(), 1);
    assert_eq!(prompt[0].len(), 4);
    assert_eq!(prompt[0][0].sampled.token_id, u32::from(b'e'));
}

#[tokio::test]
async fn usage_counts_prompt_and_completion_tokens() {
    let engine = start(config(scheduler_config()), 64, say("abc"));
    let mut stream = engine.generate(request("hello", params(10))).unwrap();
    while stream.next().await.is_some() {}
    let u = stream.usage();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (5, 4));
    assert_eq!(u.total_tokens(), 9);
}
