//! The step log's record: one JSON line per engine step, written by
//! `sluice serve --step-log PATH` (the engine) and read by `sluice simulate
//! fit` (the simulator), so it lives below both.
//!
//! A line carries the step's shape (one `[new_tokens, context_before,
//! samples]` row per scheduled request, so any feature a step-time model
//! wants can be recomputed from it), the aggregate features most models
//! use, and two wall times: the executor's forward pass and the whole
//! engine step (schedule + forward + update + output processing).
//!
//! ```json
//! {"step":17,"t_s":12.3,"num_reqs":5,"num_prefill_reqs":1,"num_decode_reqs":4,
//!  "prefill_tokens":512,"decode_tokens":4,"sum_context_len":3000,
//!  "kv_blocks_touched":190,"forward_s":0.0123,"step_s":0.0131,
//!  "rows":[[512,0,1],[1,700,1]]}
//! ```
//!
//! A step where rows share cached blocks adds `"shared_context":[0,640]`,
//! one count per row (`StepShape`'s `shared_context`).

use crate::step_shape::{RowShape, StepShape};
use serde::{Deserialize, Serialize};

/// One line of a step log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The engine step's index since the server started.
    pub step: u64,
    /// Wall seconds since the server started, at the step's start.
    pub t_s: f64,
    pub num_reqs: usize,
    pub num_prefill_reqs: usize,
    pub num_decode_reqs: usize,
    /// Tokens computed for prefill rows (prompt chunks, recomputation).
    pub prefill_tokens: usize,
    /// Tokens computed for decode rows (one per decode row).
    pub decode_tokens: usize,
    /// Σ over rows of the context after the step (`context_before +
    /// new_tokens`): the KV the attention reads.
    pub sum_context_len: usize,
    /// Σ over rows of ⌈context after the step ÷ block size⌉.
    pub kv_blocks_touched: usize,
    /// Wall seconds of the executor's forward pass (sampling included).
    pub forward_s: f64,
    /// Wall seconds of the whole engine step.
    pub step_s: f64,
    /// `[new_tokens, context_before, samples (0/1)]` per scheduled row.
    pub rows: Vec<[usize; 3]>,
    /// Each row's `shared_context` (`StepShape`'s: cached tokens in blocks
    /// an earlier row of the step also reads), in row order; absent when
    /// no row shares (and in logs written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_context: Vec<usize>,
}

impl StepRecord {
    /// The record of `shape` (times and indices left for the caller).
    pub fn from_shape(shape: &StepShape, block_size: usize) -> StepRecord {
        let mut r = StepRecord {
            num_reqs: shape.rows.len(),
            rows: Vec::with_capacity(shape.rows.len()),
            ..StepRecord::default()
        };
        for row in &shape.rows {
            let ctx = row.context_before + row.new_tokens;
            if row.is_decode() {
                r.num_decode_reqs += 1;
                r.decode_tokens += row.new_tokens;
            } else {
                r.num_prefill_reqs += 1;
                r.prefill_tokens += row.new_tokens;
            }
            r.sum_context_len += ctx;
            r.kv_blocks_touched += ctx.div_ceil(block_size.max(1));
            r.rows
                .push([row.new_tokens, row.context_before, row.samples as usize]);
        }
        if shape.rows.iter().any(|row| row.shared_context > 0) {
            r.shared_context = shape.rows.iter().map(|row| row.shared_context).collect();
        }
        r
    }

    /// The step shape this record describes.
    pub fn shape(&self) -> StepShape {
        StepShape {
            rows: self
                .rows
                .iter()
                .enumerate()
                .map(|(i, &[new_tokens, context_before, samples])| RowShape {
                    new_tokens,
                    context_before,
                    samples: samples != 0,
                    shared_context: self.shared_context.get(i).copied().unwrap_or(0),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_keeps_its_shape_and_sums() {
        let shape = StepShape {
            rows: vec![
                RowShape {
                    new_tokens: 512,
                    context_before: 0,
                    samples: true,
                    shared_context: 0,
                },
                RowShape {
                    new_tokens: 1,
                    context_before: 700,
                    samples: true,
                    shared_context: 0,
                },
            ],
        };
        let r = StepRecord::from_shape(&shape, 16);
        assert_eq!((r.num_prefill_reqs, r.num_decode_reqs), (1, 1));
        assert_eq!((r.prefill_tokens, r.decode_tokens), (512, 1));
        assert_eq!(r.sum_context_len, 512 + 701);
        assert_eq!(r.kv_blocks_touched, 32 + 44);
        let line = serde_json::to_string(&r).unwrap();
        let back: StepRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back.shape(), shape);
    }

    #[test]
    fn shared_context_is_kept_and_defaults_to_none() {
        let row = |context_before, shared_context| RowShape {
            new_tokens: 1,
            context_before,
            samples: true,
            shared_context,
        };
        let shape = StepShape {
            rows: vec![row(700, 0), row(700, 688)],
        };
        let line = serde_json::to_string(&StepRecord::from_shape(&shape, 16)).unwrap();
        assert!(line.contains(r#""shared_context":[0,688]"#), "{line}");
        let back: StepRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back.shape(), shape);
        // No sharing: no key; a line without it reads as no sharing.
        let plain = StepShape {
            rows: vec![row(700, 0)],
        };
        let line = serde_json::to_string(&StepRecord::from_shape(&plain, 16)).unwrap();
        assert!(!line.contains("shared_context"), "{line}");
        let old = r#"{"step":1,"t_s":0.5,"num_reqs":1,"num_prefill_reqs":0,"num_decode_reqs":1,
            "prefill_tokens":0,"decode_tokens":1,"sum_context_len":701,"kv_blocks_touched":44,
            "forward_s":0.01,"step_s":0.011,"rows":[[1,700,1]]}"#;
        let back: StepRecord = serde_json::from_str(old).unwrap();
        assert_eq!(back.shape(), plain);
    }
}
