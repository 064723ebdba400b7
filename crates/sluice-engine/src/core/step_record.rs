//! The step log's record of one step: its shape is taken right after
//! `schedule()` (before the update moves the requests on), `execute()`'s
//! wall time is filled in by the step, and the whole step's time when it
//! is written, after the stats are published.

use super::EngineCore;
use sluice_core::{SchedulerOutput, StepRecord, StepShape};
use std::time::Instant;

impl EngineCore {
    /// The record of the step `sched_out` starts, if a log wants it: steps
    /// without tokens stay out of the log (see `step_log`).
    pub(super) fn begin_step_record(
        &self,
        sched_out: &SchedulerOutput,
        step_index: u64,
        start: Instant,
    ) -> Option<StepRecord> {
        match &self.step_log {
            Some(log) if log.is_active() && sched_out.total_num_scheduled_tokens > 0 => {
                let shape = StepShape::from_output(sched_out, &self.scheduler);
                let mut r = StepRecord::from_shape(&shape, self.shared.config.scheduler.block_size);
                r.step = step_index;
                r.t_s = start.saturating_duration_since(self.started).as_secs_f64();
                Some(r)
            }
            _ => None,
        }
    }

    /// Writes the step that began at `start`, if it was recorded, with its
    /// whole time (`step_s`) filled in.
    pub(super) fn write_step_record(&mut self, start: Instant) {
        if let Some(mut record) = self.step_record.take() {
            record.step_s = start.elapsed().as_secs_f64();
            if let Some(log) = self.step_log.as_mut() {
                log.write(&record);
            }
        }
    }
}
