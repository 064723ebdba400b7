//! Draft verification (speculative decoding): how a request's sampling rows
//! turn into the tokens it reports.
//!
//! A request with k drafts scheduled has k + 1 sampling rows: the logits
//! after its last known token, then after each draft. Row 0 is sampled with
//! the request's own sampler exactly as without drafts; while the sampled
//! token equals the draft at that position the draft is accepted and the
//! next row is sampled; the first mismatch ends the walk with the sampled
//! token (the correction), and k accepted drafts end it with the token
//! sampled from row k (the bonus token).
//!
//! Promises: every row is sampled through `RequestState::sample`, which
//! appends the token, so penalties, `min_tokens`, logprobs and the seeded
//! draw (numbered by the count of outputs) see the accepted tokens as if
//! they had been generated one per step. The reported tokens are therefore
//! the ones the same runner reports without drafts, for greedy and seeded
//! random sampling alike; drafts only change how many steps they take. The
//! KV written at rejected positions is left for the scheduler, which rolls
//! `num_computed_tokens` back so those slots are written again.

use super::state::RequestState;
use crate::sampling::apply_token_bitmask;
use anyhow::{bail, Result};
use sluice_core::{SampleLogprobs, TokenId};

/// Checks that the step's span `start..end` of a request with `known`
/// tokens is one the runner can build: within the known tokens, or, with
/// drafts, exactly the known tokens from `start` followed by every draft.
pub(super) fn check_span(
    req_id: &str,
    start: usize,
    end: usize,
    known: usize,
    num_drafts: usize,
) -> Result<()> {
    if num_drafts == 0 {
        if end > known {
            bail!(
                "request {req_id}: {} tokens scheduled from position {start}, but only {known} \
                 are known and no drafts were scheduled",
                end - start
            );
        }
    } else if start >= known || end != known + num_drafts {
        bail!(
            "request {req_id}: {num_drafts} drafts scheduled, but the step covers positions \
             {start}..{end} where the request's {known} known tokens and its drafts need \
             ..{known}..{}",
            known + num_drafts
        );
    }
    Ok(())
}

/// Samples a request's rows (`rows` holds `1 + drafts.len()` rows of
/// `vocab` logits) in order, accepting drafts while they match, and writes
/// the tokens it reports into `tokens` (their logprobs into `logprobs`
/// when the step has any). `mask` is the request's structured-output
/// bitmask, one row (of the given words) per sampled position: the
/// grammar's state after the known tokens, then after each draft (vLLM's
/// per-position masks for speculative decoding).
#[allow(clippy::too_many_arguments)]
pub(super) fn sample_rows(
    state: &mut RequestState,
    req_id: &str,
    rows: &mut [f32],
    vocab: usize,
    drafts: &[TokenId],
    mask: Option<(&[u32], usize)>,
    tokens: &mut Vec<TokenId>,
    mut logprobs: Option<&mut Vec<Option<SampleLogprobs>>>,
) -> Result<()> {
    if let Some((words, per_row)) = mask {
        if per_row == 0 || words.len() != per_row * (1 + drafts.len()) {
            bail!(
                "request {req_id}: {} grammar bitmask rows for {} drafts (one row per sampled \
                 position is needed)",
                words.len().checked_div(per_row).unwrap_or(0),
                drafts.len()
            );
        }
    }
    for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
        if let Some((words, per_row)) = mask {
            // Before everything the sampler does, logprobs included.
            apply_token_bitmask(row, &words[i * per_row..(i + 1) * per_row]);
        }
        let sampled = state.sample(row);
        tokens.push(sampled.token);
        if let Some(lp) = logprobs.as_deref_mut() {
            lp.push(sampled.logprobs);
        }
        if drafts.get(i) != Some(&sampled.token) {
            // A correction (mismatch) or the bonus token (past the drafts).
            break;
        }
    }
    Ok(())
}
