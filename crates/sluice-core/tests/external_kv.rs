//! Prompt KV that arrives from outside (`num_external_computed_tokens`, the
//! decode side of prefill/decode disaggregation): counted as computed at the
//! first admission, given blocks, and charged no token budget.

use sluice_core::{ModelRunnerOutput, NewRequest, SamplingParams, Scheduler, SchedulerConfig};

fn request(id: &str, prompt_len: usize, external: usize) -> NewRequest {
    let params = SamplingParams {
        max_tokens: 4,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let mut r = NewRequest::new(id, (0..prompt_len as u32).collect(), params);
    r.num_external_computed_tokens = external;
    r
}

#[test]
fn external_tokens_count_as_computed_and_leave_the_last_token() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 64,
        num_gpu_blocks: 64,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config).unwrap();
    // The whole 100-token prompt is external: the last token is computed
    // here, in one step, although the budget is 64.
    s.add_request(request("a", 100, 100)).unwrap();
    let out = s.schedule();
    assert_eq!(out.total_num_scheduled_tokens, 1);
    assert_eq!(out.scheduled_new_reqs[0].num_computed_tokens, 99);
    // Blocks for all 100 tokens (16 per block).
    assert_eq!(out.scheduled_new_reqs[0].block_ids[0].len(), 7);
    let mut mro = ModelRunnerOutput::with_capacity(1);
    mro.push(&[7]);
    s.update_from_output(&out, &mro);
    let out = s.schedule();
    assert_eq!(out.total_num_scheduled_tokens, 1, "then it decodes");
}

#[test]
fn external_tokens_extend_a_local_prefix_hit_and_zero_is_ordinary() {
    let config = SchedulerConfig {
        num_gpu_blocks: 64,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config).unwrap();
    s.add_request(request("plain", 40, 0)).unwrap();
    let out = s.schedule();
    assert_eq!(out.total_num_scheduled_tokens, 40);
    // 32 tokens hit locally; 8 more are external; 10 are left to compute.
    let mut r = request("b", 50, 40);
    r.prompt_token_ids = (0..50u32).collect();
    s.add_request(r).unwrap();
    let mut mro = ModelRunnerOutput::with_capacity(1);
    mro.push(&[1]);
    s.update_from_output(&out, &mro);
    let out = s.schedule();
    let b = out
        .scheduled_new_reqs
        .iter()
        .find(|n| n.req_id.as_ref() == "b")
        .unwrap();
    assert_eq!(b.num_computed_tokens, 40);
    let scheduled: usize = out
        .num_scheduled_tokens
        .iter()
        .filter(|x| x.req_id.as_ref() == "b")
        .map(|x| x.num_tokens)
        .sum();
    assert_eq!(scheduled, 10);
}
