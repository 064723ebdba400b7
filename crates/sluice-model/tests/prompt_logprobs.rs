//! Prompt logprobs through the runner: one entry per prompt position after
//! the first, equal to the log-softmax of a full forward pass's logits, the
//! same whether the prompt is prefilled at once or in chunks.

mod common;

use common::*;
use sluice_core::{output::PromptLogprobs, NewRequest, SamplingParams, SchedulerConfig};
use sluice_model::kv_cache::{KvCache, KvCacheConfig};
use sluice_model::model::ForwardBatch;

fn collect_prompt_logprobs(f: &Fixture, prompt: &[u32], chunk: usize) -> Vec<(u32, f32, usize)> {
    let config = SchedulerConfig {
        max_num_batched_tokens: chunk,
        max_num_seqs: chunk.min(4),
        ..scheduler_config(16, 64)
    };
    let mut d = Driver::new(&f.loaded, config);
    let params = SamplingParams {
        prompt_logprobs: Some(3),
        ignore_eos: true,
        ..SamplingParams::greedy(2)
    };
    d.sched
        .add_request(NewRequest::new("p", prompt.to_vec(), params))
        .unwrap();
    let mut got: Vec<PromptLogprobs> = Vec::new();
    while d.sched.has_unfinished_requests() {
        let so = d.sched.schedule();
        let out = d.runner.execute(&so).unwrap();
        got.extend(out.prompt_logprobs.iter().cloned());
        d.sched.update_from_output(&so, &out);
    }
    got.iter()
        .flat_map(|p| p.positions.iter())
        .map(|s| (s.sampled.token_id, s.sampled.logprob, s.top.len()))
        .collect()
}

#[test]
fn prompt_logprobs_match_full_forward_and_ignore_chunking() {
    let f = fixture("tiny-llama");
    let prompt = &f.prompts[4].input_ids;
    let n = prompt.len();

    // Expected: log_softmax of every prompt row of one forward pass.
    let vocab = f.loaded.config.vocab_size;
    let mut kv = KvCache::new(&f.loaded.config, KvCacheConfig::new(16, 8)).unwrap();
    let mut batch = ForwardBatch::default();
    batch
        .push_seq(prompt, 0, &[1, 2, 3, 4, 5, 6, 7], 16)
        .unwrap();
    batch.logits_rows.extend(0..n - 1);
    let logits = f.model.forward(&batch, &mut kv).unwrap();
    let want: Vec<f32> = logits
        .chunks_exact(vocab)
        .zip(&prompt[1..])
        .map(|(row, &next)| {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            (row[next as usize] as f64 - lse) as f32
        })
        .collect();

    for chunk in [1, 5, 2048] {
        let got = collect_prompt_logprobs(&f, prompt, chunk);
        assert_eq!(got.len(), n - 1, "chunk {chunk}");
        for (i, ((tok, lp, top), w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(*tok, prompt[i + 1]);
            assert_eq!(*top, 3);
            assert!(
                (lp - w).abs() <= ATOL,
                "chunk {chunk} position {i}: {lp} vs {w}"
            );
        }
    }
}
