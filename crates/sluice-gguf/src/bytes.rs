//! [`MappedBytes`]: a range of a memory-mapped file that owns a share of
//! the mapping.
//!
//! A quantized model's weights are used straight from the file's pages;
//! copying them into the heap would double the resident memory during load
//! and gain nothing. A weight that holds a `MappedBytes` keeps the mapping
//! alive through an `Arc`, so it needs no lifetime tied to the
//! [`crate::GgufFile`] it came from.

use memmap2::Mmap;
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// A byte range of a mapped GGUF file (typically one tensor's data),
/// dereferencing to `[u8]`. Cheap to clone: clones share the mapping.
///
/// The start of a tensor's bytes is aligned as the file says
/// (`general.alignment`, 32 by default) relative to the mapping, which
/// itself starts on a page boundary.
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
    /// A mapping of a file (pages can be dropped and read back), not an
    /// anonymous copy (whose dropped pages would read back as zeros).
    file_backed: bool,
}

impl MappedBytes {
    /// The range `range` of `map`; `None` when it does not lie inside it.
    pub fn new(map: Arc<Mmap>, range: Range<usize>) -> Option<MappedBytes> {
        if range.start > range.end || range.end > map.len() {
            return None;
        }
        Some(MappedBytes {
            map,
            start: range.start,
            end: range.end,
            file_backed: false,
        })
    }

    /// Marks the mapping as a read-only map of a file, so that
    /// [`MappedBytes::release_pages`] may drop its pages.
    pub(crate) fn of_file(mut self) -> MappedBytes {
        self.file_backed = true;
        self
    }

    /// Tells the kernel that these bytes will not be read again soon: the
    /// whole pages inside the range leave the resident set (a later read
    /// faults the same file contents back in). A loader calls it once it
    /// has copied a tensor (repacked, converted), so the resident set does
    /// not hold the file and the model at once. Does nothing for a mapping
    /// that is not a file's.
    pub fn release_pages(&self) {
        if !self.file_backed {
            return;
        }
        let page = page_size();
        let start = self.start.div_ceil(page) * page;
        let end = self.end / page * page;
        if start >= end {
            return;
        }
        // SAFETY: `file_backed` mappings are read-only maps of a file
        // (`Mmap::map` in file.rs), never written through, so MADV_DONTNEED
        // only drops page-table entries: the next read of these pages
        // faults the file's unchanged contents back in, and no reference
        // into the mapping observes a change. The range lies inside the
        // mapping (checked at construction) and is page-aligned.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // The range was checked against the mapping when this was made, and
        // a mapping never shrinks; `get` only keeps this free of a panic
        // path.
        self.map.get(self.start..self.end).unwrap_or(&[])
    }

    /// The range inside the mapped file.
    pub fn range(&self) -> Range<usize> {
        self.start..self.end
    }

    /// The whole mapping these bytes are part of.
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// A sub-range, relative to these bytes (`0..len()` is all of them);
    /// `None` when it does not lie inside them.
    pub fn slice(&self, range: Range<usize>) -> Option<MappedBytes> {
        if range.start > range.end || range.end > self.end - self.start {
            return None;
        }
        Some(MappedBytes {
            map: Arc::clone(&self.map),
            start: self.start + range.start,
            end: self.start + range.end,
            file_backed: self.file_backed,
        })
    }
}

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Shows the range, not the bytes: a tensor may be gigabytes.
impl fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MappedBytes({}..{})", self.start, self.end)
    }
}

/// The system's page size (4 KiB where it cannot be asked).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it reads a constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}
