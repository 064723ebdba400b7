//! Structured outputs in the step loop: a request's grammar compiles off
//! the engine thread while its completions wait in the scheduler (vLLM's
//! `WAITING_FOR_FSM`); once compiled, each completion gets its own matcher,
//! which fills its row of the step's bitmask before `execute()` and is
//! advanced by every token it is given after.

use super::EngineCore;
use sluice_core::{
    EngineCoreOutput, FinishReason, GrammarBitmask, SchedulerOutput, TokenId, PLACEHOLDER_TOKEN_ID,
};
use std::time::Instant;

impl EngineCore {
    /// The request's stop ids its grammar does not already allow at its
    /// end (usually none: the model's EOS ids are the grammar's), so the
    /// per-step `can_stop` check runs only where it can matter.
    pub(super) fn grammar_stop_ids(&self, stop_token_ids: &[TokenId]) -> Vec<TokenId> {
        // Built already: `generate` compiled the grammar with it.
        match self.shared.grammar_compiler() {
            Ok(compiler) => stop_token_ids
                .iter()
                .copied()
                .filter(|t| !compiler.stop_ids().contains(t))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Gives each completion whose grammar has compiled its own matcher and
    /// lets the scheduler admit it; a grammar that failed to compile fails
    /// its request (vLLM: "Invalid structured outputs: ...").
    pub(super) fn poll_grammars(&mut self) {
        let mut i = 0;
        while i < self.pending_grammars.len() {
            let (seq, pending) = &mut self.pending_grammars[i];
            let seq = *seq;
            let Some(result) = pending.try_take() else {
                i += 1;
                continue;
            };
            self.pending_grammars.swap_remove(i);
            let Some(parent) = self.parents.get(&seq) else {
                continue;
            };
            match result {
                Ok(grammar) => {
                    for id in parent.children.clone() {
                        if let Some(child) = self.children.get_mut(&id) {
                            child.grammar = Some(grammar.matcher());
                            self.scheduler.set_grammar_ready(&id);
                        }
                    }
                }
                Err(e) => self.abort_parent(
                    seq,
                    FinishReason::Error,
                    Some(format!("Invalid structured outputs: {e}")),
                ),
            }
        }
    }

    /// The allowed tokens of every scheduled completion that has a grammar,
    /// for the runner to mask its logits with.
    pub(super) fn fill_grammar_bitmask(&mut self, sched_out: &mut SchedulerOutput) {
        let t0 = Instant::now();
        let words = self.shared.logits_width.div_ceil(32);
        let mut mask = self
            .grammar_bitmask
            .take()
            .unwrap_or_else(|| GrammarBitmask::new(words));
        mask.req_ids.clear();
        mask.words.clear();
        let mut broken = Vec::new();
        for s in &sched_out.num_scheduled_tokens {
            let Some(child) = self.children.get_mut(&s.req_id) else {
                continue;
            };
            if child.grammar_gate.is_some() {
                continue;
            }
            let Some(m) = child.grammar.as_mut() else {
                continue;
            };
            // One row per sampled position: after the known tokens, then
            // after each draft (accepted for the mask, rolled back after).
            let drafts = sched_out.spec_tokens_of(&s.req_id);
            let stops = &child.grammar_stop_ids;
            let mut advanced = 0;
            for i in 0..=drafts.len() {
                let row = mask.push_row(s.req_id.clone());
                m.fill_bitmask(row);
                if !stops.is_empty() && m.can_stop() {
                    for &t in stops {
                        if let Some(w) = row.get_mut(t as usize / 32) {
                            *w |= 1 << (t % 32);
                        }
                    }
                }
                if let Some(&d) = drafts.get(i) {
                    // The drafts were validated when they were proposed; a
                    // refused one leaves the rows after it at this state
                    // (its own row cannot sample it, so none of them is used).
                    if advanced == i && d != PLACEHOLDER_TOKEN_ID && m.accept_token(d) {
                        advanced += 1;
                    }
                }
            }
            if advanced > 0 && !m.rollback(advanced) {
                // A matcher that cannot undo its steps would check the
                // next tokens from the wrong state: the request fails.
                broken.push(child.parent);
            }
        }
        for seq in broken {
            self.abort_parent(
                seq,
                FinishReason::Error,
                Some("the grammar could not roll back the drafts it checked".into()),
            );
        }
        if mask.is_empty() {
            self.grammar_bitmask = Some(mask);
        } else {
            let secs = t0.elapsed().as_secs_f64();
            self.stats.record_grammar_masks(mask.req_ids.len(), secs);
            sched_out.grammar_bitmask = Some(mask);
        }
    }

    /// Advances the completion's matcher by the tokens of `out`; returns
    /// false when the grammar rejected one and the request was failed.
    pub(super) fn advance_grammar(&mut self, out: &EngineCoreOutput) -> bool {
        let Some(child) = self.children.get_mut(&out.req_id) else {
            return true;
        };
        // Gated: the tokens up to and including the gate's sequence are
        // not the grammar's (the thinking before `</think>`); the ones
        // after it in the same output are.
        let mut tokens = &out.new_token_ids[..];
        if let Some(gate) = child.grammar_gate.as_mut() {
            match tokens.iter().position(|&t| gate.passes(t)) {
                Some(i) => {
                    child.grammar_gate = None;
                    tokens = &tokens[i + 1..];
                }
                None => return true,
            }
        }
        if let Some(m) = child.grammar.as_mut() {
            // In update_from_output's order, as vLLM's scheduler advances
            // its matchers. A token outside the mask cannot be sampled, so
            // a rejection means the request's state is broken: fail it. A
            // request stop id where the grammar could end is not the
            // grammar's to follow: it ends the request.
            let stops = &child.grammar_stop_ids;
            let accepted = tokens
                .iter()
                .all(|&t| (stops.contains(&t) && m.can_stop()) || m.accept_token(t));
            if !accepted {
                let error = m.error().unwrap_or_default();
                let seq = child.parent;
                self.abort_parent(
                    seq,
                    FinishReason::Error,
                    Some(format!("the grammar rejected a sampled token: {error}")),
                );
                return false;
            }
        }
        true
    }
}
