//! `sluice replay` traces as simulator input: each request's output
//! count exactly as replay emits it.

use super::*;

/// The number of outputs `sluice_core::replay` emits for `r` before the
/// scheduler finishes it, under `max_model_len`: its stop check runs after
/// each appended token, EOS first (unless `ignore_eos`), then
/// `stop_token_ids`, then the length caps (`max_tokens`, or prompt plus
/// outputs reaching `max_model_len`). Replay never shows the scheduler
/// `min_tokens` (the scripted outputs stand in for the sampler), so it
/// does not count here either. Exact for any trace the parser accepts.
pub fn replay_output_len(r: &TraceRequest, max_model_len: usize) -> usize {
    let cap = r
        .max_tokens
        .min(max_model_len.saturating_sub(r.prompt.len()));
    let eos = if r.ignore_eos { None } else { r.eos_token_id };
    r.output
        .iter()
        .take(cap)
        .position(|&t| Some(t) == eos || r.stop_token_ids.contains(&t))
        .map_or(cap, |k| k + 1)
}

/// A parsed replay trace as simulator requests. `file` names it in
/// errors (only a priority outside `i32` can fail here).
///
/// The simulator samples its own output tokens (`sim::output_token`), not
/// the trace's scripted ones: the counts match replay exactly, the token
/// values do not, which matters only where prefix caching could match a
/// prompt against another request's outputs.
pub fn replay_workload(file: &str, trace: &Trace) -> Result<ReplayWorkload, TraceFileError> {
    let at = At { file };
    let max_len = trace.config.max_model_len;
    let requests = trace
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let priority = i32::try_from(r.priority).map_err(|_| {
                at.err(
                    None,
                    Some(&format!("requests[{i}].priority")),
                    format!("{} does not fit in an i32", r.priority),
                )
            })?;
            let mut req = SimRequest::new(
                r.id.clone(),
                0.0,
                r.prompt.clone(),
                replay_output_len(r, max_len),
            );
            req.priority = priority;
            req.arrival_step = Some(r.arrival_step);
            Ok(req)
        })
        .collect::<Result<Vec<_>, TraceFileError>>()?;
    Ok(ReplayWorkload {
        name: trace.name.clone(),
        config: trace.config.clone(),
        requests,
        aborts: trace.aborts.clone(),
        max_steps: trace.max_steps,
    })
}

/// Parses a replay trace's JSON text with the core parser.
pub fn parse_replay_json(file: &str, text: &str) -> Result<ReplayWorkload, TraceFileError> {
    let trace = Trace::from_json(text).map_err(|e| TraceFileError {
        file: file.to_string(),
        line: None,
        field: (!e.path.is_empty()).then(|| e.path.clone()),
        message: e.message,
    })?;
    replay_workload(file, &trace)
}
