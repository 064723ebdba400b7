//! What a step-time model sees of one engine step, and the trait it
//! implements.
//!
//! `StepShape` is computed from a `SchedulerOutput` right after
//! `schedule()`: one `RowShape` per scheduled request, in scheduled order.
//! A model only needs token counts and context lengths, never token ids,
//! which is what lets one model serve any workload.

use sluice_core::{Scheduler, SchedulerOutput};

/// One scheduled request within a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    /// Tokens this step computes for the request.
    pub new_tokens: usize,
    /// Tokens whose KV already exists before this step (prefix hits and
    /// earlier chunks included).
    pub context_before: usize,
    /// The row reaches the end of its known tokens, so the model samples
    /// (and runs the LM head) for it.
    pub samples: bool,
}

impl RowShape {
    /// A decode row: one new token that is sampled from. Everything else
    /// (prompt chunks, recomputation after a preemption) is prefill.
    pub fn is_decode(&self) -> bool {
        self.new_tokens == 1 && self.samples && self.context_before > 0
    }
}

/// One `SchedulerOutput` summarised for a step-time model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    pub rows: Vec<RowShape>,
}

impl StepShape {
    /// The shape of `out`, which `scheduler` has just produced (the
    /// scheduler has already advanced each request's computed tokens by
    /// its scheduled tokens, as vLLM's `_update_after_schedule` does).
    pub fn from_output(out: &SchedulerOutput, scheduler: &Scheduler) -> StepShape {
        let rows = out
            .num_scheduled_tokens
            .iter()
            .filter_map(|s| {
                let req = scheduler.request(s.handle)?;
                let computed = req.num_computed_tokens();
                Some(RowShape {
                    new_tokens: s.num_tokens,
                    context_before: computed.saturating_sub(s.num_tokens),
                    samples: computed >= req.num_tokens(),
                })
            })
            .collect();
        StepShape { rows }
    }

    pub fn total_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.new_tokens).sum()
    }

    pub fn num_decode_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.is_decode()).count()
    }

    pub fn num_prefill_rows(&self) -> usize {
        self.rows.len() - self.num_decode_rows()
    }

    pub fn num_sampling_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.samples).count()
    }
}

/// How long one engine step takes on the simulated hardware.
pub trait StepTimeModel {
    /// Seconds for the step `step` (forward pass plus fixed overheads).
    fn step_time(&self, step: &StepShape) -> f64;
}

impl<T: StepTimeModel + ?Sized> StepTimeModel for &T {
    fn step_time(&self, step: &StepShape) -> f64 {
        (**self).step_time(step)
    }
}

/// Every step takes the same time: the model for hand-computed tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConstantStepTime(pub f64);

impl StepTimeModel for ConstantStepTime {
    fn step_time(&self, _step: &StepShape) -> f64 {
        self.0
    }
}
