//! The trait a step-time model implements, and a constant model for
//! tests. The step's shape itself (`StepShape`, `RowShape`,
//! `ShapeTracker`) is sluice-core's: the engine's step log and the
//! simulator share it.

pub use sluice_core::step_shape::{RowShape, ShapeTracker, StepShape};

/// How long one engine step takes on the simulated hardware.
pub trait StepTimeModel {
    /// Seconds for the step `step` (forward pass plus fixed overheads).
    fn step_time(&self, step: &StepShape) -> f64;

    /// Whether `step` lies outside the shapes the model was measured on, so
    /// that its time is extrapolated (a measured table's grid); false for
    /// models that claim no range.
    fn outside_range(&self, _step: &StepShape) -> bool {
        false
    }

    /// Whether the model prices `RowShape::shared_context` (a table with a
    /// shared-prefix grid); the simulator computes it only then, since it
    /// costs a pass over every row's block table each step.
    fn prices_shared_context(&self) -> bool {
        false
    }
}

impl<T: StepTimeModel + ?Sized> StepTimeModel for &T {
    fn step_time(&self, step: &StepShape) -> f64 {
        (**self).step_time(step)
    }
    fn outside_range(&self, step: &StepShape) -> bool {
        (**self).outside_range(step)
    }
    fn prices_shared_context(&self) -> bool {
        (**self).prices_shared_context()
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
