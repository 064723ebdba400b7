//! `ScriptedExecutor`: a deterministic fake model for engine tests.
//!
//! It follows the scheduler's protocol exactly as a model runner must (it
//! keeps per-request state from new / cached / resumed / finished data and
//! samples only when a request's computed tokens reach all its known
//! tokens), but the "model" is a caller-supplied function: given a
//! sequence, it returns candidate next tokens, best first. Like a sampler,
//! the executor masks the EOS and stop token ids while fewer than
//! `min_tokens` outputs exist, takes the best remaining candidate, and
//! reports logprobs as if candidate `r` (0-based) had logit `-r`. A
//! structured-output request's grammar bitmask removes the candidates it
//! forbids; when it forbids them all, the smallest allowed token id is
//! taken (a model that knows nothing of the grammar, constrained).
//!
//! With a drafter (`with_drafter`, a second function of the sequence), it
//! proposes draft tokens after each step (`take_draft_token_ids`) and
//! verifies scheduled drafts as a target model does: it samples position by
//! position, accepting each draft equal to its own choice and stopping at
//! the first that differs, so drafts change how many steps a completion
//! takes, never its tokens. Requests asking for logprobs get no drafts.

use super::Executor;
use anyhow::{anyhow, bail, Result};
use sluice_core::output::PromptLogprobs;
use sluice_core::{
    DraftTokenIds, ModelRunnerOutput, RequestId, SampleLogprobs, SamplingParams, SchedulerConfig,
    SchedulerOutput, TokenId, TokenLogprob,
};
use std::collections::HashMap;
use std::sync::Arc;

/// What the script sees of a request when asked for its next token.
#[derive(Debug)]
pub struct SeqView<'a> {
    pub req_id: &'a str,
    pub prompt: &'a [TokenId],
    /// Tokens this request has produced so far.
    pub output: &'a [TokenId],
    pub params: &'a SamplingParams,
}

type Script = Box<dyn FnMut(&SeqView<'_>) -> Vec<TokenId> + Send>;
/// Proposes draft tokens for a sequence (the tokens it guesses come next).
type Drafter = Box<dyn FnMut(&SeqView<'_>) -> Vec<TokenId> + Send>;

struct SeqState {
    tokens: Vec<TokenId>,
    num_prompt_tokens: usize,
    num_computed_tokens: usize,
    params: Arc<SamplingParams>,
}

/// A fake model driven by a script (see the module docs).
pub struct ScriptedExecutor {
    num_kv_blocks: usize,
    block_size: usize,
    vocab_size: Option<usize>,
    script: Script,
    reqs: HashMap<RequestId, SeqState>,
    steps: u64,
    fail_at_step: Option<u64>,
    drafter: Option<Drafter>,
    /// The drafts proposed after the last step, until taken.
    drafts: Option<DraftTokenIds>,
}

impl ScriptedExecutor {
    /// A pool of `num_kv_blocks` blocks (null block included) and a script
    /// returning candidate next tokens, best first.
    pub fn new(
        num_kv_blocks: usize,
        script: impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static,
    ) -> Self {
        ScriptedExecutor {
            num_kv_blocks,
            block_size: SchedulerConfig::default().block_size,
            vocab_size: None,
            script: Box::new(script),
            reqs: HashMap::new(),
            steps: 0,
            fail_at_step: None,
            drafter: None,
            drafts: None,
        }
    }

    /// Proposes drafts with `drafter` after every step in which a request
    /// sampled (speculative decoding); scheduled drafts are verified.
    pub fn with_drafter(
        mut self,
        drafter: impl FnMut(&SeqView<'_>) -> Vec<TokenId> + Send + 'static,
    ) -> Self {
        self.drafter = Some(Box::new(drafter));
        self
    }

    /// Declares the KV block size (default: the scheduler's default), which
    /// the engine checks against its scheduler's.
    pub fn with_block_size(mut self, block_size: usize) -> Self {
        self.block_size = block_size;
        self
    }

    /// Declares the vocabulary size (prompts with larger ids are refused by
    /// the engine).
    pub fn with_vocab_size(mut self, vocab_size: usize) -> Self {
        self.vocab_size = Some(vocab_size);
        self
    }

    /// Makes the `step`-th call to `execute` (0-based) fail, to test how the
    /// engine handles a model error.
    pub fn fail_at_step(mut self, step: u64) -> Self {
        self.fail_at_step = Some(step);
        self
    }

    /// Requests whose state the executor holds (running and preempted).
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    fn update_states(&mut self, so: &SchedulerOutput) -> Result<()> {
        for id in &so.finished_req_ids {
            self.reqs.remove(id);
        }
        for n in &so.scheduled_new_reqs {
            self.reqs.insert(
                n.req_id.clone(),
                SeqState {
                    tokens: n.prompt_token_ids.clone(),
                    num_prompt_tokens: n.prompt_token_ids.len(),
                    num_computed_tokens: n.num_computed_tokens,
                    params: n.sampling_params.clone(),
                },
            );
        }
        for c in &so.scheduled_cached_reqs.reqs {
            let state = self
                .reqs
                .get_mut(&c.req_id)
                .ok_or_else(|| anyhow!("scheduled request {} is unknown", c.req_id))?;
            if let Some(all) = &c.all_token_ids {
                state.tokens.clone_from(all);
            }
            state.num_computed_tokens = c.num_computed_tokens;
        }
        Ok(())
    }

    fn sample(
        &mut self,
        id: &RequestId,
        mask: Option<&[u32]>,
    ) -> Result<(TokenId, Option<SampleLogprobs>)> {
        let state = &self.reqs[id];
        let params = state.params.clone();
        let view = SeqView {
            req_id: id,
            prompt: &state.tokens[..state.num_prompt_tokens],
            output: &state.tokens[state.num_prompt_tokens..],
            params: &params,
        };
        let num_output = view.output.len();
        let mut candidates = (self.script)(&view);
        if num_output < params.min_tokens {
            let masked: Vec<TokenId> = params.all_stop_token_ids().collect();
            candidates.retain(|t| !masked.contains(t));
        }
        if let Some(mask) = mask {
            let allowed = |t: u32| {
                mask.get(t as usize / 32)
                    .is_some_and(|w| w & (1 << (t % 32)) != 0)
            };
            candidates.retain(|&t| allowed(t));
            if candidates.is_empty() {
                let first = (0..mask.len() as u32 * 32).find(|&t| allowed(t));
                candidates.extend(first);
            }
        }
        let Some(&token) = candidates.first() else {
            bail!("the script gave request {id} no allowed token");
        };
        let logprobs = params.logprobs.map(|k| {
            // log-softmax of logits 0, -1, -2, ... over the candidates.
            let log_z = (0..candidates.len())
                .map(|r| (-(r as f64)).exp())
                .sum::<f64>()
                .ln();
            let lp = |r: usize| (-(r as f64) - log_z) as f32;
            SampleLogprobs {
                sampled: TokenLogprob {
                    token_id: token,
                    logprob: lp(0),
                },
                rank: 1,
                top: candidates
                    .iter()
                    .take(k)
                    .enumerate()
                    .map(|(r, &t)| TokenLogprob {
                        token_id: t,
                        logprob: lp(r),
                    })
                    .collect(),
            }
        });
        if let Some(s) = self.reqs.get_mut(id) {
            s.tokens.push(token);
        }
        Ok((token, logprobs))
    }
}

impl Executor for ScriptedExecutor {
    fn num_kv_blocks(&self) -> usize {
        self.num_kv_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn vocab_size(&self) -> Option<usize> {
        self.vocab_size
    }

    fn execute(&mut self, so: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        let step = self.steps;
        self.steps += 1;
        if self.fail_at_step == Some(step) {
            bail!("scripted failure at step {step}");
        }
        self.update_states(so)?;
        let mut out = ModelRunnerOutput::with_capacity(so.num_scheduled_tokens.len());
        let mut logprobs = Vec::new();
        let mut any_logprobs = false;
        // A request's rows in order: one per sampled position (after the
        // known tokens, then after each draft).
        let mut masks: HashMap<&str, Vec<&[u32]>> = HashMap::new();
        for (id, row) in so.grammar_bitmask.iter().flat_map(|m| m.rows()) {
            masks.entry(id).or_default().push(row);
        }
        let spec: HashMap<&str, &[TokenId]> = so
            .scheduled_spec_decode_tokens
            .iter()
            .map(|(id, d)| (&**id, d.as_slice()))
            .collect();
        let mut sampled_ids = Vec::new();
        for s in &so.num_scheduled_tokens {
            let drafts = spec.get(&*s.req_id).copied().unwrap_or(&[]);
            let state = self
                .reqs
                .get_mut(&s.req_id)
                .ok_or_else(|| anyhow!("scheduled request {} is unknown", s.req_id))?;
            let start = state.num_computed_tokens;
            state.num_computed_tokens += s.num_tokens;
            // The drafts ride after the known tokens; verification replaces
            // them with what is accepted.
            let end = state.num_computed_tokens - drafts.len().min(s.num_tokens);
            if end > state.tokens.len() {
                bail!(
                    "request {} scheduled past its known tokens ({end} > {})",
                    s.req_id,
                    state.tokens.len()
                );
            }
            if let Some(k) = state.params.prompt_logprobs {
                // Positions 1.. of the prompt computed in this step: a flat
                // synthetic distribution where the actual token ranks first.
                let n_prompt = state.num_prompt_tokens;
                let positions: Vec<SampleLogprobs> = (start.max(1)..end.min(n_prompt))
                    .map(|p| {
                        let t = TokenLogprob {
                            token_id: state.tokens[p],
                            logprob: -1.0,
                        };
                        SampleLogprobs {
                            sampled: t,
                            rank: 1,
                            top: vec![t; k.min(1)],
                        }
                    })
                    .collect();
                if !positions.is_empty() {
                    out.prompt_logprobs.push(PromptLogprobs {
                        req_id: s.req_id.clone(),
                        positions,
                    });
                }
            }
            if end == state.tokens.len() {
                let rows = masks.get(&*s.req_id);
                let mask_at = |i: usize| rows.and_then(|r| r.get(i).copied());
                let (token, lp) = self.sample(&s.req_id, mask_at(0))?;
                any_logprobs |= lp.is_some();
                logprobs.push(lp);
                let mut row = vec![token];
                for &draft in drafts {
                    if row.last() != Some(&draft) {
                        break;
                    }
                    // Accepted: the model's choice after it comes next,
                    // under the grammar's state after it.
                    let (token, _) = self.sample(&s.req_id, mask_at(row.len()))?;
                    row.push(token);
                }
                out.push(&row);
                sampled_ids.push(s.req_id.clone());
            } else {
                out.push(&[]);
            }
        }
        if any_logprobs {
            out.logprobs = Some(logprobs);
        }
        self.propose(&sampled_ids);
        Ok(out)
    }

    fn take_draft_token_ids(&mut self) -> Option<DraftTokenIds> {
        self.drafts.take()
    }
}

impl ScriptedExecutor {
    /// The drafter's proposals for the requests that sampled this step.
    fn propose(&mut self, sampled: &[RequestId]) {
        let Some(drafter) = self.drafter.as_mut() else {
            return;
        };
        let mut drafts = DraftTokenIds::new();
        for id in sampled {
            let Some(state) = self.reqs.get(id) else {
                continue;
            };
            if state.params.logprobs.is_some() {
                continue;
            }
            let view = SeqView {
                req_id: id,
                prompt: &state.tokens[..state.num_prompt_tokens],
                output: &state.tokens[state.num_prompt_tokens..],
                params: &state.params,
            };
            let proposed = drafter(&view);
            if !proposed.is_empty() {
                drafts.push((id.clone(), proposed));
            }
        }
        self.drafts = Some(drafts);
    }
}
