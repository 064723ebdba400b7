//! `SyncPtr`: a raw pointer that may cross into `parallel_for` tasks, for
//! writing disjoint parts of one buffer from several threads.
//!
//! Owns: nothing but the wrapper. Promises nothing by itself: every user
//! promises, at its use, that the tasks write disjoint elements of a buffer
//! that outlives the parallel region (`parallel_for` returns only after
//! every task finished).

/// A raw pointer that tasks on other threads may write through.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);

// SAFETY: the pointer is only dereferenced inside `parallel_for` tasks that
// write disjoint elements of a buffer borrowed for the whole parallel region
// (each use says why its ranges are disjoint), so handing it to another
// thread creates no data race.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as for `Send`: shared use only ever writes disjoint elements.
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper rather
    /// than the raw field).
    #[inline]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
