//! Token sampling: turns one request's logits into its next token, the way
//! vLLM 0.33's v1 `Sampler` does, plus sampled-token and prompt logprobs.
//!
//! # What this module owns
//! [`RequestSampler`] is the per-request state (parameters, random stream,
//! penalty counts, scratch buffers); the runner keeps one per live request and
//! calls [`RequestSampler::sample`] with the request's row of logits.
//! [`prompt_logprobs`] scores prompt positions. Nothing here knows about
//! batches: every result depends only on the request's own parameters,
//! tokens and logits.
//!
//! # Processing order (vLLM `vllm/v1/sample/sampler.py`)
//! 0. Structured outputs: the runner first sets the tokens the request's
//!    grammar forbids to -inf (`apply_token_bitmask`), so everything below,
//!    logprobs included, sees the masked logits (as in vLLM).
//! 1. Logprobs, when asked for, are taken from the **raw** logits before any
//!    processing: vLLM's default `logprobs_mode = "raw_logprobs"` computes
//!    `log_softmax(logits)` first thing in `Sampler.forward` ("Use the
//!    original logits (before any penalties or temperature scaling)").
//! 2. `min_tokens`: while fewer than `min_tokens` outputs exist, EOS and every
//!    stop token id get -inf (`MinTokensLogitsProcessor`, which vLLM runs
//!    before the logit bias; with finite biases the two commute).
//! 3. Logit bias is added (`LogitBiasLogitsProcessor`; a token listed twice
//!    keeps its last bias, as vLLM's dict does).
//! 4. Penalties (`apply_penalties`): repetition on prompt ∪ output tokens,
//!    then frequency and presence on output tokens (see `penalties.rs`).
//! 5. Greedy requests (`temperature < 1e-5`, vLLM's `_SAMPLING_EPS`) take the
//!    argmax (first maximum, as `torch.argmax`) here. `top_k == 1` takes the
//!    same shortcut (as [`SamplingParams::is_greedy`] does); vLLM would
//!    instead sample among tokens tied for the maximum.
//! 6. Temperature: logits are divided by it.
//! 7. min-p (`MinPLogitsProcessor`, an argmax-invariant processor vLLM runs
//!    after temperature and **before** top-k / top-p): drop tokens with
//!    `p < min_p * p_max`.
//! 8. top-k, then top-p on the renormalised survivors
//!    (`apply_top_k_top_p_pytorch`, `vllm/v1/sample/ops/topk_topp_sampler.py`):
//!    top-k keeps every token whose logit is `>=` the k-th largest (ties at
//!    the boundary survive; vLLM's Triton GPU kernel trims them to exactly
//!    k); `top_k <= 0` or `>= vocab` disables it. top-p keeps the most likely
//!    tokens while the mass strictly before them is `< p` (vLLM masks
//!    ascending-sorted tokens whose cumulative sum is `<= 1 - p`, which is
//!    the same set), so at least one token survives; `top_p >= 1` disables
//!    it. Ties in the sort order go to the smaller token id.
//! 9. A draw from the softmax of what is left.
//!
//! # Randomness
//! A request's `n`-th sampled token (`n = output_token_ids.len()`) uses draw
//! `n` of a counter-based SplitMix64 stream keyed by `params.seed`, or by the
//! runner's `default_seed` for unseeded requests (see `rng.rs`). The same
//! seed and the same logits therefore give the same token whatever else is
//! in the batch, and a sampler rebuilt after a preemption continues the same
//! stream. One uniform number per token drives an inverse-CDF draw over the
//! kept tokens. vLLM draws Gumbel / exponential noise from torch generators
//! instead, so sluice and vLLM agree in distribution, not token for token.
//!
//! # Degenerate input never panics
//! NaN logits count as -inf. If every token ends up masked, the token is 0;
//! if some logits are +inf, the first +inf one is taken. Token ids outside
//! the vocabulary (stop ids, bias ids, prompt tokens) are ignored. An empty
//! row gives token 0.
//!
//! # Cost
//! Greedy: one vectorised pass. Random: a scale+max pass, an exponential
//! pass, and an inverse-CDF scan of per-block sums; top-k finds the k-th
//! value by a filtered quickselect over a 2k-element buffer, collects the
//! survivors and (unless k is a large part of the vocabulary) finishes on
//! that list without the vocabulary-wide exponential pass; top-p locates
//! the nucleus with a histogram of the probabilities' float exponents,
//! refines the boundary bucket by mantissa bytes and sorts only the final
//! small group. Logprob top-n uses an n-element heap whose full blocks are
//! skipped after one vectorised compare. The vocabulary-wide loops are compiled for AVX-512,
//! AVX2 and the baseline and picked at run time, with bit-identical results
//! (`kernels.rs`). Scratch buffers live in the sampler, so steady-state calls
//! allocate only the returned logprob list.

mod kernels;
mod logprobs;
mod penalties;
mod rng;
mod select;
#[cfg(test)]
mod tests;

pub use logprobs::prompt_logprobs;

/// Structured outputs: every token whose bit is clear in `mask` (bit
/// `t % 32` of word `t / 32`; tokens past the mask count as clear) gets a
/// logit of -inf. Runs on the raw logits, before step 1 above, as vLLM
/// applies its grammar bitmask ahead of the sampler.
pub fn apply_token_bitmask(logits: &mut [f32], mask: &[u32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = mask.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (b, x) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

use kernels::ExpHist;
use penalties::Penalties;
use rng::DrawStream;
use select::TopN;
use sluice_core::{SampleLogprobs, SamplingParams};
use std::sync::Arc;

/// vLLM's `_SAMPLING_EPS`: temperatures below it mean greedy.
const SAMPLING_EPS: f32 = 1e-5;

/// The result of one [`RequestSampler::sample`] call.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Present when the request asked for logprobs (`params.logprobs`):
    /// the sampled token's raw logprob and rank, and the raw top-n.
    pub logprobs: Option<SampleLogprobs>,
}

/// Reusable buffers, so a steady-state step allocates nothing.
#[derive(Default)]
struct Scratch {
    /// Copy of the raw logits, for logprobs (processing is in place).
    raw: Vec<f32>,
    block_sums: Vec<f64>,
    cands: Vec<(f32, u32)>,
    topn: TopN,
    values: Vec<f32>,
    hist: Option<Box<ExpHist>>,
}

/// Per-request sampling state. See the module documentation for the
/// processing order and the guarantees.
pub struct RequestSampler {
    params: Arc<SamplingParams>,
    stream: DrawStream,
    greedy: bool,
    temperature: f32,
    /// k >= 2 (k = 1 is greedy); disabled again at sample time if k >= vocab.
    top_k: Option<usize>,
    /// p < 1.
    top_p: Option<f64>,
    /// Threshold on `exp(l - l_max) = p / p_max`; 0 when min-p is off.
    min_ratio: f32,
    /// Deduplicated (last bias per id wins), sorted by id.
    logit_bias: Vec<(u32, f32)>,
    penalties: Option<Penalties>,
    scratch: Scratch,
}

impl std::fmt::Debug for RequestSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSampler")
            .field("params", &self.params)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl RequestSampler {
    /// `default_seed` is used when `params.seed` is `None` (the runner draws
    /// it per request from its own RNG).
    pub fn new(params: Arc<SamplingParams>, prompt_token_ids: &[u32], default_seed: u64) -> Self {
        let p = &*params;
        // A NaN temperature goes to greedy rather than dividing every logit
        // into NaN.
        let greedy = p.temperature.is_nan() || p.temperature < SAMPLING_EPS || p.top_k == 1;
        let top_k = usize::try_from(p.top_k).ok().filter(|&k| k > 1);
        let top_p = (p.top_p < 1.0).then_some(f64::from(p.top_p));
        let min_ratio = if p.min_p > 0.0 { p.min_p.min(1.0) } else { 0.0 };
        // Sorted by id, the last bias of a repeated id winning: a stable
        // sort keeps repeats in input order, then each run keeps its last.
        // O(k log k), where a search per entry was O(k^2) on the engine
        // thread.
        let mut logit_bias: Vec<(u32, f32)> = p.logit_bias.clone();
        logit_bias.sort_by_key(|e| e.0);
        let mut kept = 0;
        for i in 0..logit_bias.len() {
            if kept > 0 && logit_bias[kept - 1].0 == logit_bias[i].0 {
                logit_bias[kept - 1] = logit_bias[i];
            } else {
                logit_bias[kept] = logit_bias[i];
                kept += 1;
            }
        }
        logit_bias.truncate(kept);
        let penalties = Penalties::new(
            p.repetition_penalty,
            p.frequency_penalty,
            p.presence_penalty,
            prompt_token_ids,
        );
        Self {
            stream: DrawStream::new(p.seed.unwrap_or(default_seed)),
            greedy,
            temperature: p.temperature,
            top_k,
            top_p,
            min_ratio,
            logit_bias,
            penalties,
            scratch: Scratch::default(),
            params,
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Applies, in vLLM's order, min_tokens masking of all stop tokens
    /// (while fewer than `min_tokens` outputs exist), logit bias,
    /// repetition / frequency / presence penalties, temperature, min-p,
    /// top-k and top-p, then samples (argmax when greedy). `logits` is
    /// modified in place. `output_token_ids` are the request's outputs so
    /// far (append-only; its length numbers the random draw). When
    /// `params.logprobs = Some(n)`, also returns the sampled token's raw
    /// logprob and rank and the raw top-n.
    pub fn sample(&mut self, logits: &mut [f32], output_token_ids: &[u32]) -> Sampled {
        let want_logprobs = self.params.logprobs;
        if want_logprobs.is_some() {
            self.scratch.raw.clear();
            self.scratch.raw.extend_from_slice(logits);
        }
        self.process(logits, output_token_ids);
        let token = if self.greedy {
            kernels::argmax(logits)
        } else {
            self.draw(logits, output_token_ids.len() as u64)
        };
        let token = u32::try_from(token).unwrap_or(0);
        let logprobs = want_logprobs
            .map(|n| logprobs::row_logprobs(&self.scratch.raw, token, n, &mut self.scratch.topn));
        Sampled { token, logprobs }
    }

    /// The argmax-changing processors: min_tokens, logit bias, penalties.
    fn process(&mut self, logits: &mut [f32], outputs: &[u32]) {
        let p = &*self.params;
        if outputs.len() < p.min_tokens {
            for id in p.all_stop_token_ids() {
                if let Some(x) = logits.get_mut(id as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        for &(id, b) in &self.logit_bias {
            if let Some(x) = logits.get_mut(id as usize) {
                *x += b;
            }
        }
        if let Some(pen) = &mut self.penalties {
            pen.apply(logits, outputs);
        }
    }

    /// Temperature, min-p, top-k, top-p, then draw `n` of the stream.
    fn draw(&mut self, logits: &mut [f32], n: u64) -> usize {
        let m = kernels::scale_sanitize_max(logits, self.temperature);
        if !m.is_finite() {
            // +inf: the first +inf token (all the mass is there); -inf:
            // everything is masked and argmax falls back to token 0.
            return kernels::argmax(logits);
        }
        let u = self.stream.uniform(n);
        let s = &mut self.scratch;
        let mut floor = f32::NEG_INFINITY;
        if let Some(k) = self.top_k.filter(|&k| k < logits.len()) {
            floor = select::kth_largest(logits, k, &mut s.values);
            select::collect_at_least(logits, floor, &mut s.cands);
            // Few survivors (k plus any ties at the k-th value): finish on
            // the list and skip the vocabulary-wide exponential pass.
            if s.cands.len() <= logits.len() / 8 {
                s.cands.retain_mut(|c| {
                    c.0 = kernels::exp_nonpos(c.0 - m);
                    c.0 > 0.0 && c.0 >= self.min_ratio
                });
                if let Some(p) = self.top_p {
                    select::nucleus_of_list(&mut s.cands, p);
                }
                // The maximum (weight 1) always survives, so the list is
                // never empty; argmax is only a backstop.
                return select::draw_from_list(&s.cands, u)
                    .map_or_else(|| kernels::argmax(logits), |t| t as usize);
            }
        }
        if let Some(p) = self.top_p {
            let hist = s.hist.get_or_insert_with(|| Box::new(ExpHist::new()));
            hist.clear();
            let total = kernels::exp_in_place(
                logits,
                m,
                floor,
                self.min_ratio,
                &mut s.block_sums,
                Some(hist),
            );
            select::nucleus(logits, hist, total, p, &mut s.cands);
            select::draw_from_list(&s.cands, u).map_or(0, |t| t as usize)
        } else {
            let total =
                kernels::exp_in_place(logits, m, floor, self.min_ratio, &mut s.block_sums, None);
            kernels::scan_blocks(logits, &s.block_sums, total, u)
        }
    }
}
