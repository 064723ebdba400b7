//! The matmul driver: cuts `out[m×n]` into tasks for the thread pool and
//! each task into register tiles for a microkernel.
//!
//! Owns: blocking, task planning, and the `Tile` interface every microkernel
//! implements. Promises: each output element is computed by exactly one
//! microkernel call over the whole of `k`, so how the work is cut (`m`, the
//! thread count, the tile shape) never changes a result — batch invariance
//! reduces to each microkernel's per-element order, which depends on `k` and
//! the path only.
//!
//! Two loop nests, same per-element arithmetic:
//! - Streaming (decode: `m <= 4`, or `m <= 8` when those rows of `x` fit in
//!   half of L1): a tile reads its weight rows one after the other, a single
//!   sequential stream per thread that the hardware prefetcher follows at
//!   full speed, while the few `x` rows are served from L1. Weights are read
//!   once per call whatever `m` is. Threads claim runs of column tiles
//!   guided (large runs first, single tiles last), so each run is one long
//!   stream and the threads finish together (`run_streaming`).
//! - Blocked (batches and prefill): `mr × nr` register tiles interleave the
//!   weight rows per k-step so each loaded vector feeds several
//!   accumulators. Inside a task: for each `nt`-column tile, for each row
//!   tile of the task's row block; the weight tile stays in L1/L2 across row
//!   tiles (and the first row tile prefetches the next weight tile), the
//!   row block of `x` is sized to stay in L2.

use super::pool;
use super::SyncPtr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One register tile: `out[i][j] = dot(x row i, w row j) (+ bias[j])` for
/// `i < mr`, `j < nr`.
pub(crate) struct Tile<X, W> {
    /// First of `mr` rows of activations, `ldx` elements apart.
    pub x: *const X,
    pub ldx: usize,
    pub mr: usize,
    /// First of `nr` weight rows, `k` elements apart.
    pub w: *const W,
    pub nr: usize,
    pub k: usize,
    /// `out[0][0]`; rows `ldo` apart.
    pub out: *mut f32,
    pub ldo: usize,
    /// `nr` biases, or null.
    pub bias: *const f32,
    /// Software-prefetch the next tile's weight rows (the `nr` rows after
    /// this tile's) while computing: set on the first row tile of each
    /// column tile, whose weights come from DRAM in parallel short streams
    /// the hardware prefetcher follows poorly. A hint only.
    pub prefetch: bool,
}

/// A microkernel family and the tile shapes it supports.
pub(crate) struct Micro<X, W> {
    /// Most rows per tile.
    pub mr: usize,
    /// Columns per tile of `tile`.
    pub nr: usize,
    /// Most rows per tile of `tile_stream`; calls with `m <= mr_stream`
    /// stream.
    pub mr_stream: usize,
    /// Columns per tile of `tile_stream` (at most `32 / mr` rounded to a
    /// power of two, the accumulator budget of `store_tile16`).
    pub nr_stream: usize,
    /// Computes one tile, interleaving its weight rows step by step so each
    /// loaded `x` vector serves `nr` rows (compute-bound prefill). Callers
    /// guarantee `1 <= mr <= self.mr`, `1 <= nr <= self.nr`, pointers valid
    /// for the extents given, and the CPU features the kernel needs.
    pub tile: unsafe fn(&Tile<X, W>),
    /// The same result bit for bit, but reading the tile's weight rows one
    /// after the other: a single sequential stream the hardware prefetcher
    /// follows, which is what a decode step (`m <= mr`, memory-bound) needs.
    /// Same contract with `nr <= self.nr_stream`.
    pub tile_stream: unsafe fn(&Tile<X, W>),
}

/// A matmul call with its operands checked.
pub(crate) struct Problem<'a, X, W> {
    /// `m` rows of `k` values, `ldx` apart (`ldx >= k`).
    pub x: &'a [X],
    pub ldx: usize,
    pub m: usize,
    pub k: usize,
    /// `n` rows of `k` values.
    pub w: &'a [W],
    pub n: usize,
    pub bias: Option<&'a [f32]>,
    /// Row stride of `out` (`>= n`): row `i` is `out[i·ldc..i·ldc + n]`.
    pub ldc: usize,
}

/// Bytes of `x` a prefill task keeps hot (its row block), about half of L2.
const X_BLOCK_BYTES: usize = 384 * 1024;
/// Most bytes of `x` a streaming call with more than 4 rows may have (half
/// of L1D).
const STREAM_X_BYTES: usize = 16 * 1024;
/// At or below this many rows, a task takes every row (decode batches).
const SMALL_M: usize = 64;
/// Tasks per thread, so a thread slowed by another process hands its share
/// over to the others.
const TASKS_PER_THREAD: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Columns per register tile.
    pub nt: usize,
    /// Rows per task.
    pub mc: usize,
    /// Columns per task (a multiple of `nt`).
    pub nc: usize,
    pub m_blocks: usize,
    pub n_chunks: usize,
}

pub(crate) fn plan(
    m: usize,
    n: usize,
    ldx_bytes: usize,
    mr: usize,
    nt: usize,
    threads: usize,
) -> Plan {
    let mc = if m <= SMALL_M {
        m.max(1)
    } else {
        let rows = (X_BLOCK_BYTES / ldx_bytes.max(1)).clamp(mr, 512);
        (rows / mr * mr).min(m)
    };
    let m_blocks = m.div_ceil(mc).max(1);
    let n_tiles = n.div_ceil(nt).max(1);
    let want_tasks = if threads > 1 {
        threads * TASKS_PER_THREAD
    } else {
        1
    };
    let want_chunks = want_tasks.div_ceil(m_blocks).max(1);
    let tiles_per_chunk = n_tiles.div_ceil(want_chunks).max(1);
    let nc = tiles_per_chunk * nt;
    Plan {
        nt,
        mc,
        nc,
        m_blocks,
        n_chunks: n.div_ceil(nc).max(1),
    }
}

/// Runs `p` with microkernel `micro` on up to `threads` threads.
///
/// # Safety
/// The CPU must have the features `micro.tile` was compiled for.
pub(crate) unsafe fn run<X: Sync, W: Sync>(
    micro: &Micro<X, W>,
    p: &Problem<'_, X, W>,
    out: &mut [f32],
    threads: usize,
) {
    let (m, n, k) = (p.m, p.n, p.k);
    debug_assert!(p.ldx >= k);
    debug_assert!(m == 0 || p.x.len() >= (m - 1) * p.ldx + k);
    debug_assert_eq!(p.w.len(), n * k);
    debug_assert!(p.ldc >= n);
    debug_assert!(m == 0 || n == 0 || out.len() >= (m - 1) * p.ldc + n);
    debug_assert!(p.bias.is_none_or(|b| b.len() == n));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            let row = &mut out[i * p.ldc..i * p.ldc + n];
            match p.bias {
                Some(b) => row.copy_from_slice(b),
                None => row.fill(0.0),
            }
        }
        return;
    }
    // One row tile covers all of x: the call is bound by streaming the
    // weights, so read them sequentially.
    // Beyond 4 rows, streaming reloads every x row per weight vector, so x
    // must stay in L1 to pay off.
    let x_bytes = m * p.ldx * std::mem::size_of::<X>();
    let streaming =
        m <= micro.mr_stream.min(4) || (m <= micro.mr_stream && x_bytes <= STREAM_X_BYTES);
    let (mr, nt, tile_fn) = if streaming {
        let nt = (32 / m.next_power_of_two()).min(micro.nr_stream);
        (micro.mr_stream, nt, micro.tile_stream)
    } else {
        (micro.mr, micro.nr, micro.tile)
    };
    if streaming {
        // SAFETY: forwarded from the caller.
        unsafe { run_streaming(p, out, threads, mr, nt, tile_fn) };
        return;
    }
    let pl = plan(
        m,
        n,
        p.ldx * std::mem::size_of::<X>(),
        micro.mr,
        nt,
        threads,
    );
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (b, c) = (t / pl.n_chunks, t % pl.n_chunks);
        let (i0, i1) = (b * pl.mc, ((b + 1) * pl.mc).min(m));
        let (j0, j1) = (c * pl.nc, ((c + 1) * pl.nc).min(n));
        let mut j = j0;
        while j < j1 {
            let nr = pl.nt.min(j1 - j);
            let mut i = i0;
            while i < i1 {
                let mr = mr.min(i1 - i);
                let tile = Tile {
                    // SAFETY: (pointer arithmetic) i < m, j < n, so these
                    // stay inside `x`, `w`, `out`, `bias`.
                    x: unsafe { p.x.as_ptr().add(i * p.ldx) },
                    ldx: p.ldx,
                    mr,
                    // SAFETY: j < n, so row j starts inside `w`.
                    w: unsafe { p.w.as_ptr().add(j * k) },
                    nr,
                    k,
                    // SAFETY: i < m and j < n, so this lies inside `out` (checked by the caller).
                    out: unsafe { out_ptr.get().add(i * p.ldc + j) },
                    ldo: p.ldc,
                    bias: p
                        .bias
                        // SAFETY: j < n, and the bias holds n values.
                        .map_or(std::ptr::null(), |b| unsafe { b.as_ptr().add(j) }),
                    prefetch: i == i0,
                };
                // SAFETY: rows i..i+mr of x (ldx apart, k valid each) and
                // rows j..j+nr of w exist; out rows i..i+mr, columns j..j+nr
                // belong to this task alone; the caller vouched for the CPU.
                unsafe { tile_fn(&tile) };
                i += mr;
            }
            j += nr;
        }
    };
    pool::run(threads, pl.m_blocks * pl.n_chunks, &task);
}

/// Column tiles a streaming claim takes at least.
const STREAM_MIN_TILES: usize = 1;

/// Claims the next run of column tiles out of `total`, guided: a share of
/// what is left (`1 / (2 · threads)` of it), never fewer than
/// `STREAM_MIN_TILES`. Returns `None` once everything is claimed.
fn claim(next: &AtomicUsize, total: usize, threads: usize) -> Option<(usize, usize)> {
    let mut cur = next.load(Ordering::Relaxed);
    loop {
        if cur >= total {
            return None;
        }
        let size = ((total - cur) / (2 * threads))
            .max(STREAM_MIN_TILES)
            .min(total - cur);
        match next.compare_exchange_weak(cur, cur + size, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((cur, cur + size)),
            Err(now) => cur = now,
        }
    }
}

/// The streaming loop nest (`m <= mr`: one row tile covers all of `x`).
/// Every participating thread claims runs of whole column tiles from a
/// shared counter, large runs first and single tiles at the end (guided
/// self-scheduling): each run is one sequential stream of weight rows,
/// few streams restart per call, and the threads still finish together.
/// A thread that wakes late (or is descheduled) simply claims less.
///
/// # Safety
/// As for `run`; `m <= mr` and `tile_fn` accepts `m × nt` tiles.
unsafe fn run_streaming<X: Sync, W: Sync>(
    p: &Problem<'_, X, W>,
    out: &mut [f32],
    threads: usize,
    mr: usize,
    nt: usize,
    tile_fn: unsafe fn(&Tile<X, W>),
) {
    let (m, n, k) = (p.m, p.n, p.k);
    debug_assert!(m <= mr);
    let tiles = n.div_ceil(nt);
    let threads = threads.clamp(1, tiles);
    let next = AtomicUsize::new(0);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let task = |_: usize| {
        while let Some((t0, t1)) = claim(&next, tiles, threads) {
            for t in t0..t1 {
                let j = t * nt;
                let nr = nt.min(n - j);
                let tile = Tile {
                    x: p.x.as_ptr(),
                    ldx: p.ldx,
                    mr: m,
                    // SAFETY: (pointer arithmetic) j < n, so these stay
                    // inside `w`, `out`, `bias`.
                    w: unsafe { p.w.as_ptr().add(j * k) },
                    nr,
                    k,
                    // SAFETY: j < n, inside the first row of `out`.
                    out: unsafe { out_ptr.get().add(j) },
                    ldo: p.ldc,
                    bias: p
                        .bias
                        // SAFETY: j < n, and the bias holds n values.
                        .map_or(std::ptr::null(), |b| unsafe { b.as_ptr().add(j) }),
                    prefetch: false,
                };
                // SAFETY: all m rows of x and rows j..j+nr of w exist; out
                // columns j..j+nr belong to this claim alone; the caller
                // vouched for the CPU.
                unsafe { tile_fn(&tile) };
            }
        }
    };
    pool::run(threads, threads, &task);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_covers_everything_with_aligned_chunks() {
        for &(m, n, k) in &[
            (1, 896, 896),
            (32, 9728, 896),
            (512, 896, 4864),
            (2048, 32000, 896),
            (3, 5, 7),
        ] {
            for threads in [1, 2, 4] {
                let p = plan(m, n, k * 2, 4, 6, threads);
                assert!(p.mc * p.m_blocks >= m && p.mc * (p.m_blocks - 1) < m);
                assert!(p.nc * p.n_chunks >= n && p.nc * (p.n_chunks - 1) < n);
                assert_eq!(p.nc % p.nt, 0);
                if m > SMALL_M {
                    assert_eq!(p.mc % 4, 0);
                }
            }
        }
    }
}
