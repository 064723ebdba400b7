//! The runner's device-independent half over a backend that is not the CPU
//! model: a simulated one whose "KV cache" stores token ids at the slots it
//! is given and whose next token is a function of the whole context read
//! back through the block table. Through the real scheduler (batching,
//! chunked prefill, prefix-cache hits), every request gets exactly the
//! tokens that function gives, which holds only if the runner's block
//! tables, slot mapping and logits rows are right.

mod common;

use common::*;
use sluice_core::{SamplingParams, SchedulerConfig};
use sluice_model::model::ForwardBatch;
use sluice_model::runner::{ForwardBackend, ModelRunner};
use std::ops::Range;

const VOCAB: usize = 97;

/// The simulated model: next token = (31 · Σ context + last position) mod
/// VOCAB.
fn next_token(context: &[u32]) -> u32 {
    let sum: u64 = context.iter().map(|&t| t as u64).sum();
    ((sum * 31 + context.len() as u64 - 1) % VOCAB as u64) as u32
}

struct Simulated {
    block_size: usize,
    num_blocks: usize,
    /// Token id stored at each slot.
    slots: Vec<Option<u32>>,
    /// The next token of each logits row of the last forward.
    rows: Vec<u32>,
    forwards: usize,
}

impl Simulated {
    fn new(block_size: usize, num_blocks: usize) -> Self {
        Simulated {
            block_size,
            num_blocks,
            slots: vec![None; block_size * num_blocks],
            rows: Vec::new(),
            forwards: 0,
        }
    }
}

impl ForwardBackend for Simulated {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn num_kv_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn forward(&mut self, batch: &ForwardBatch) -> anyhow::Result<()> {
        self.forwards += 1;
        for (&slot, &id) in batch.slot_mapping[0].iter().zip(&batch.input_ids) {
            self.slots[slot] = Some(id);
        }
        self.rows.clear();
        for &r in &batch.logits_rows {
            let seq = batch
                .seqs
                .iter()
                .find(|s| (s.query_start..s.query_start + s.query_len).contains(&r))
                .expect("a logits row belongs to a sequence");
            let table = &batch.block_tables[0][seq.block_table.clone()];
            let bs = self.block_size;
            let context: Vec<u32> = (0..=batch.positions[r])
                .map(|p| {
                    let slot = table[p / bs] as usize * bs + p % bs;
                    self.slots[slot].expect("every context slot was written")
                })
                .collect();
            self.rows.push(next_token(&context));
        }
        Ok(())
    }

    fn logits(&mut self, rows: Range<usize>, out: &mut Vec<f32>) -> anyhow::Result<()> {
        if out.len() < rows.len() * VOCAB {
            out.resize(rows.len() * VOCAB, 0.0);
        }
        for (row, &next) in out.chunks_exact_mut(VOCAB).zip(&self.rows[rows]) {
            for (j, v) in row.iter_mut().enumerate() {
                // Best at `next`, then falling off: a distinct top-k.
                *v = -(((j + VOCAB - next as usize) % VOCAB) as f32);
            }
        }
        Ok(())
    }
}

fn expected(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        seq.push(next_token(&seq));
    }
    seq.split_off(prompt.len())
}

#[test]
fn the_runner_drives_any_backend() {
    // Three prompts sharing their first 16 tokens (prefix-cache hits).
    let shared: Vec<u32> = (0..16).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
    let prompts: Vec<Vec<u32>> = [5usize, 21, 40]
        .iter()
        .map(|&extra| {
            let mut p = shared.clone();
            p.extend((0..extra as u32).map(|i| (i * 13 + 1) % VOCAB as u32));
            p
        })
        .collect();
    for budget in [4, 2048] {
        let (bs, blocks) = (8, 64);
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: 4,
            ..scheduler_config(bs, blocks)
        };
        let runner = ModelRunner::with_backend(Simulated::new(bs, blocks));
        let mut d = Driver::with_runner(runner, config);
        for (i, p) in prompts.iter().enumerate() {
            let params = SamplingParams {
                prompt_logprobs: (i == 2).then_some(2),
                ..greedy_params(12)
            };
            d.add(&format!("r{i}"), p, params);
        }
        d.run();
        assert!(d.runner.backend().forwards >= 12);
        for (i, p) in prompts.iter().enumerate() {
            let got = &d.results[&format!("r{i}")];
            assert_eq!(got.tokens, expected(p, 12), "budget {budget}, r{i}");
            for (lp, &t) in got.logprobs.iter().zip(&got.tokens) {
                let lp = lp.as_ref().expect("logprobs were asked for");
                assert_eq!(lp.sampled.token_id, t);
                assert_eq!(lp.top.len(), 5);
                assert_eq!(lp.top[1].token_id, (t + 1) % VOCAB as u32);
            }
        }
        // Again, now that the prompts' blocks are in the prefix cache.
        d.add("again", &prompts[2], greedy_params(12));
        d.run();
        let again = &d.results["again"];
        assert!(again.num_cached_tokens >= 16, "{}", again.num_cached_tokens);
        assert_eq!(again.tokens, expected(&prompts[2], 12));
        assert_eq!(d.runner.num_requests(), 0);
    }
}
