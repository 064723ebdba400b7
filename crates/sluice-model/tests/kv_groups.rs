//! A model with a sliding-window layer beside a full one, run through the
//! scheduler with the hybrid KV cache (a full group and a sliding-window
//! group that frees out-of-window blocks, vLLM's layout) and a pool too
//! small to keep every token, gives exactly the tokens and logprobs of the
//! same model with every token kept (the hybrid manager off, a pool large
//! enough for everything): freeing blocks outside the window never changes
//! what a layer reads. The windowed layer itself is checked against a dense
//! float64 forward pass in `wiring.rs` and the kernels in `attention`.

mod common;

use common::*;
use sluice_core::kv_cache::{GroupingPolicy, KvCacheGroupSpec};
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::runner::ModelRunner;
use sluice_model::LoadedModel;

const WINDOW: usize = 12;

/// tiny-qwen2 with layer 1 sliding over the last 12 tokens (Qwen2's
/// `use_sliding_window` with `max_window_layers` 1).
fn windowed() -> LoadedModel {
    let mut loaded = fixture("tiny-qwen2").loaded;
    loaded.config.attention.sliding_window = Some(WINDOW);
    loaded.config.attention.max_window_layers = Some(1);
    loaded
}

fn run(loaded: &LoadedModel, grouping: GroupingPolicy, num_blocks: usize) -> Vec<Finished> {
    let bs = 4;
    let kv = KvCacheConfig::new(bs, num_blocks).with_grouping(grouping);
    let runner = ModelRunner::new(loaded, kv).expect("runner");
    let mut config = scheduler_config(bs, num_blocks);
    config.kv_cache_groups = runner.kv_cache_groups();
    config.max_model_len = 128;
    // Chunked prefill of long prompts, several requests in flight.
    config.max_num_batched_tokens = 24;
    config.enable_prefix_caching = true;
    let mut d = Driver::with_runner(runner, config);
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|r| {
            (0..30 + 9 * r)
                .map(|i| (i * 7 + r * 3 + 11) % 990)
                .collect()
        })
        .collect();
    for (i, p) in prompts.iter().enumerate() {
        d.add(&format!("r{i}"), p, greedy_params(40));
    }
    // A shared prefix, to go through the groups' prefix cache.
    d.add("shared", &prompts[3][..33], greedy_params(20));
    d.run();
    let mut names: Vec<_> = d.results.keys().cloned().collect();
    names.sort();
    names.iter().map(|n| d.results[n].clone()).collect()
}

#[test]
fn freeing_out_of_window_blocks_changes_no_output() {
    let loaded = windowed();
    let groups = loaded.config.kv_layer_groups(GroupingPolicy::default());
    assert_eq!(
        groups.specs,
        vec![
            KvCacheGroupSpec::FULL,
            KvCacheGroupSpec::sliding_window(WINDOW)
        ]
    );
    let off = GroupingPolicy {
        hybrid: false,
        chunked_local: false,
    };
    // Everything kept: 5 requests × up to 107 tokens in blocks of 4.
    let kept = run(&loaded, off, 160);
    // Hybrid, with fewer blocks than the full-attention pool would need for
    // all requests at once in both groups.
    let hybrid = run(&loaded, GroupingPolicy::default(), 90);
    assert_eq!(kept.len(), hybrid.len());
    for (k, h) in kept.iter().zip(&hybrid) {
        assert_eq!(k.tokens, h.tokens);
        assert!(k.tokens.len() >= 20);
        for (a, b) in k.logprobs.iter().zip(&h.logprobs) {
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            assert_eq!(a.sampled.logprob.to_bits(), b.sampled.logprob.to_bits());
        }
    }
}
