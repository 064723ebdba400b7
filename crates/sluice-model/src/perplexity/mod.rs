//! Perplexity and KL divergence of a model over a text's tokens, computed
//! the way llama.cpp's `llama-perplexity` computes them, so that figures
//! compare with those the llama.cpp community publishes.
//!
//! The tokens are cut into `⌊tokens / n_ctx⌋` windows of `n_ctx` (the
//! chunks; the tail is dropped). Each window is evaluated from an empty
//! cache, its first token replaced by BOS when the tokenizer adds one, and
//! only its second half is scored: the logits at positions `n_ctx/2 ..
//! n_ctx − 2` predict the tokens after them, so every scored token has at
//! least half a window of context. With `--kl-divergence-base` the scored
//! rows' log probabilities are saved (`logits_file`); with
//! `--kl-divergence` a model's rows are compared with a saved base
//! (`scoring::KldSums`).
//!
//! Owns the windows and the forward passes; the per-position arithmetic is
//! `scoring`'s, the file format `logits_file`'s.

pub mod logits_file;
pub mod scoring;

use crate::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use crate::model::{ForwardBatch, Model, Workspace};
use anyhow::{bail, Result};
use logits_file::BaseHeader;
use scoring::{base_row_len, encode_base_row, KldSums, PplSums};
use std::io::{Read, Write};

/// The first scored position of a window.
pub fn first_scored(n_ctx: usize) -> usize {
    n_ctx / 2
}

/// Positions scored per window: `n_ctx − 1 − n_ctx/2`.
pub fn scored_per_window(n_ctx: usize) -> usize {
    n_ctx - 1 - first_scored(n_ctx)
}

/// Windows of `n_ctx` in `n_tokens`, at most `max` (llama.cpp's
/// `--chunks`). Refused below two windows' worth of tokens, as
/// `llama-perplexity` refuses it.
pub fn num_chunks(n_tokens: usize, n_ctx: usize, max: Option<usize>) -> Result<usize> {
    if n_ctx < 4 {
        bail!("a context of {n_ctx} tokens scores nothing; use at least 4");
    }
    if n_tokens < 2 * n_ctx {
        bail!(
            "the text tokenizes to {n_tokens} tokens; at least {} are needed with a context of \
             {n_ctx}",
            2 * n_ctx
        );
    }
    let all = n_tokens / n_ctx;
    Ok(max.map_or(all, |m| m.min(all)))
}

/// Runs windows through a model: its own KV cache (one window's blocks per
/// KV cache group), workspace and batch, reused window after window.
pub struct Evaluator<'m> {
    model: &'m Model,
    kv: KvCache,
    ws: Workspace,
    batch: ForwardBatch,
    tables: Vec<Vec<u32>>,
    block_size: usize,
    n_ctx: usize,
    n_batch: usize,
    bos: Option<u32>,
    /// The scored rows of the last window, and the buffers of one pass
    /// (its tokens, its logits), kept across windows.
    logits: Vec<f32>,
    piece: Vec<u32>,
    rows: Vec<f32>,
}

impl<'m> Evaluator<'m> {
    /// An evaluator of `n_ctx`-token windows, computed `n_batch` tokens per
    /// forward pass, the first token of each window replaced by `bos` when
    /// given, the KV cache stored as `kv_dtype`.
    pub fn new(
        model: &'m Model,
        n_ctx: usize,
        n_batch: usize,
        bos: Option<u32>,
        kv_dtype: KvDtype,
    ) -> Result<Self> {
        if n_batch == 0 {
            bail!("the batch size must be at least 1");
        }
        if n_ctx > model.config.max_position_embeddings {
            bail!(
                "a context of {n_ctx} is longer than the model's max_position_embeddings ({})",
                model.config.max_position_embeddings
            );
        }
        let block_size = 16;
        let groups = model.config.kv_layer_groups(Default::default()).specs.len();
        let per_group = n_ctx.div_ceil(block_size);
        let num_blocks = groups * per_group + 1;
        let kv = KvCache::new(
            &model.config,
            KvCacheConfig::new(block_size, num_blocks).with_dtype(kv_dtype),
        )?;
        let tables = (0..groups)
            .map(|g| {
                (0..per_group)
                    .map(|b| (1 + g * per_group + b) as u32)
                    .collect()
            })
            .collect();
        Ok(Evaluator {
            model,
            kv,
            ws: Workspace::default(),
            batch: ForwardBatch::default(),
            tables,
            block_size,
            n_ctx,
            n_batch,
            bos,
            logits: Vec::new(),
            piece: Vec::new(),
            rows: Vec::new(),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    /// Evaluates one window (`n_ctx` tokens) and returns the logits of its
    /// scored positions, `scored_per_window(n_ctx)` rows of the vocabulary.
    pub fn window_logits(&mut self, window: &[u32]) -> Result<&[f32]> {
        let n_ctx = self.n_ctx;
        if window.len() != n_ctx {
            bail!("a window of {} tokens, expected {n_ctx}", window.len());
        }
        let (first, last) = (first_scored(n_ctx), n_ctx - 1);
        let vocab = self.vocab_size();
        let hidden = self.model.config.hidden_size;
        self.logits.clear();
        let mut pos = 0;
        while pos < n_ctx {
            let end = (pos + self.n_batch).min(n_ctx);
            self.piece.clear();
            self.piece.extend_from_slice(&window[pos..end]);
            if pos == 0 {
                if let Some(bos) = self.bos {
                    self.piece[0] = bos;
                }
            }
            self.batch.clear();
            self.batch
                .push_seq_groups(&self.piece, pos, &self.tables, self.block_size)?;
            self.batch.logits_rows.extend(
                (pos..end)
                    .filter(|p| (first..last).contains(p))
                    .map(|p| p - pos),
            );
            let n = self.batch.logits_rows.len();
            let h = self
                .model
                .forward_hidden(&self.batch, &mut self.kv, &mut self.ws)?;
            if n > 0 {
                self.model
                    .compute_logits(&h[..n * hidden], n, &mut self.rows);
                self.logits.extend_from_slice(&self.rows[..n * vocab]);
            }
            pos = end;
        }
        Ok(&self.logits)
    }
}

/// Plain perplexity over `n_chunk` windows of `tokens`; with `base_out`,
/// the scored rows are saved as a `--kl-divergence-base` file.
/// `on_chunk(i, sums)` sees the running sums after window `i`.
pub fn perplexity(
    eval: &mut Evaluator<'_>,
    tokens: &[u32],
    n_chunk: usize,
    mut base_out: Option<&mut dyn Write>,
    mut on_chunk: impl FnMut(usize, &PplSums),
) -> Result<PplSums> {
    let n_ctx = eval.n_ctx;
    let vocab = eval.vocab_size();
    let nv = base_row_len(vocab);
    if let Some(w) = base_out.as_deref_mut() {
        BaseHeader {
            n_ctx,
            n_vocab: vocab,
            n_chunk,
            tokens: tokens[..n_chunk * n_ctx].to_vec(),
        }
        .write(w)?;
    }
    let first = first_scored(n_ctx);
    let mut sums = PplSums::default();
    let mut packed = vec![0u16; scored_per_window(n_ctx) * nv];
    for i in 0..n_chunk {
        let window = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let logits = eval.window_logits(window)?;
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let next = window[first + r + 1] as usize;
            let nll = match base_out {
                Some(_) => encode_base_row(row, next, &mut packed[r * nv..(r + 1) * nv]),
                None => scoring::nll(row, next),
            };
            sums.add(nll);
        }
        if let Some(w) = base_out.as_deref_mut() {
            logits_file::write_rows(w, &packed)?;
        }
        on_chunk(i, &sums);
    }
    Ok(sums)
}

/// What `--kl-divergence` measured: the sums, and every scored position's
/// KL divergence and probability difference, sorted (for percentiles).
#[derive(Clone, Debug, Default)]
pub struct KldRun {
    pub sums: KldSums,
    pub kld: Vec<f32>,
    pub p_diff: Vec<f32>,
}

/// KL divergence of the model against a base file, over its windows
/// (`base` read, `rows` positioned after the header), at most `max_chunks`.
pub fn kl_divergence(
    eval: &mut Evaluator<'_>,
    base: &BaseHeader,
    rows: &mut impl Read,
    max_chunks: Option<usize>,
    mut on_chunk: impl FnMut(usize, &KldSums),
) -> Result<KldRun> {
    if base.n_ctx != eval.n_ctx {
        bail!(
            "the base was computed with a context of {}, the evaluator has {}",
            base.n_ctx,
            eval.n_ctx
        );
    }
    let vocab = eval.vocab_size();
    if base.n_vocab != vocab {
        bail!(
            "the base has a vocabulary of {} tokens, the model {vocab}",
            base.n_vocab
        );
    }
    let n_ctx = base.n_ctx;
    let first = first_scored(n_ctx);
    let nv = base_row_len(vocab);
    let n_chunk = max_chunks.map_or(base.n_chunk, |m| m.min(base.n_chunk));
    let mut run = KldRun::default();
    let mut packed = Vec::new();
    for i in 0..n_chunk {
        logits_file::read_rows(rows, base, i, &mut packed)?;
        let window = &base.tokens[i * n_ctx..(i + 1) * n_ctx];
        let logits = eval.window_logits(window)?;
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let next = window[first + r + 1] as usize;
            let (k, p) = run.sums.add(row, &packed[r * nv..(r + 1) * nv], next);
            run.kld.push(k);
            run.p_diff.push(p);
        }
        on_chunk(i, &run.sums);
    }
    run.kld.sort_by(f32::total_cmp);
    run.p_diff.sort_by(f32::total_cmp);
    Ok(run)
}

#[cfg(test)]
mod tests;
