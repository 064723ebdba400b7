//! The step log: one JSON line per engine step, written by
//! `sluice serve --step-log PATH` and read by `sluice simulate fit`. The
//! record type is sluice-core's (`sluice_core::step_record`), shared with
//! the engine that writes it.

pub use sluice_core::step_record::StepRecord;
