//! A malformed step is an error from `execute`, never a panic.

mod common;

use common::*;
use sluice_core::{NewRequest, NewRequestData, SamplingParams, SchedulerOutput};
use std::sync::Arc;

#[test]
fn token_outside_the_vocabulary_is_an_error() {
    let f = fixture("tiny-qwen2");
    let mut d = Driver::new(&f.loaded, scheduler_config(16, 32));
    d.sched
        .add_request(NewRequest::new(
            "bad",
            vec![1, 2, 5000],
            SamplingParams::greedy(4),
        ))
        .unwrap();
    let so = d.sched.schedule();
    let e = d.runner.execute(&so).unwrap_err().to_string();
    assert!(e.contains("5000") && e.contains("vocabulary"), "{e}");
}

#[test]
fn block_outside_the_pool_is_an_error() {
    let f = fixture("tiny-qwen2");
    let mut d = Driver::new(&f.loaded, scheduler_config(16, 32));
    let so = SchedulerOutput {
        scheduled_new_reqs: vec![NewRequestData {
            req_id: "r".into(),
            prompt_token_ids: vec![1, 2, 3],
            sampling_params: Arc::new(SamplingParams::greedy(4)),
            block_ids: vec![vec![1, 99]],
            num_computed_tokens: 0,
        }],
        ..SchedulerOutput::default()
    };
    let e = d.runner.execute(&so).unwrap_err().to_string();
    assert!(e.contains("99") && e.contains("request r"), "{e}");
    // The runner is still usable afterwards.
    d.add("ok", &f.prompts[0].input_ids, greedy_params(4));
    d.run();
    assert_eq!(d.results["ok"].tokens, f.prompts[0].greedy_token_ids[..4]);
}

#[test]
fn block_tables_for_more_groups_than_the_cache_has_are_refused() {
    let f = fixture("tiny-qwen2");
    let mut d = Driver::new(&f.loaded, scheduler_config(16, 32));
    let so = SchedulerOutput {
        scheduled_new_reqs: vec![NewRequestData {
            req_id: "r".into(),
            prompt_token_ids: vec![1, 2, 3],
            sampling_params: Arc::new(SamplingParams::greedy(4)),
            block_ids: vec![vec![1], vec![2]],
            num_computed_tokens: 0,
        }],
        ..SchedulerOutput::default()
    };
    let e = d.runner.execute(&so).unwrap_err().to_string();
    assert!(
        e.contains("2 KV cache groups") && e.contains("request r"),
        "{e}"
    );
}
