//! The driver of quantized matmul: quantizes the activations once per
//! call, then cuts the work into (row tile × panel) microkernel calls over
//! the kernel pool — runs of panels claimed per thread for decode batches,
//! L2-sized row blocks × panel chunks for prefill.
//!
//! Owns: the work split and the per-thread buffers. Promises: every output
//! element is one microkernel call over the whole of `k`, so the split
//! never changes a result.

use super::activations::{ActKind, Acts};
use super::panels::{pack_panel, PackedWeight};
use super::portable::portable_tile;
use super::{QKernel, QTile, QuantKernels, MR_MAX, PANEL};
use crate::kernels::dispatch::KernelPath;
use crate::kernels::formats::QuantFormat;
use crate::kernels::pool;
use crate::kernels::SyncPtr;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// Quantized activations of the current call (caller's thread).
    static ACTS: RefCell<Acts> = RefCell::default();
    /// A panel repacked on the fly from ggml-layout weights (per thread).
    static PANEL_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// What the driver reads weights from.
#[derive(Clone, Copy)]
pub(crate) enum QuantSource<'a> {
    /// ggml's row layout: panels are repacked per call.
    Rows(&'a [u8]),
    Packed(&'a PackedWeight),
}

/// Rows of quantized activations a prefill task keeps hot (about half of
/// L2 at `k` bytes per row).
const X_BLOCK_BYTES: usize = 384 * 1024;
/// At or below this many rows every task takes all rows, and threads claim
/// runs of panels (decode batches: each weight byte read once per call).
const SMALL_M: usize = 64;
const TASKS_PER_THREAD: usize = 8;

/// `out[i·ldc + j] = Σ_k x[i·ldx + k]·w[j][k] (+ bias[j])` for quantized `w`.
/// Returns the path that ran.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_quant(
    path: KernelPath,
    threads: usize,
    x: &[f32],
    ldx: usize,
    m: usize,
    k: usize,
    format: QuantFormat,
    w: QuantSource<'_>,
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    ldc: usize,
) -> KernelPath {
    let Some(kern) = format.info().kernels else {
        unreachable!("float formats run on the float kernels");
    };
    let (kernel, path) = kern.kernel(path);
    if m == 0 || n == 0 {
        return path;
    }
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => {
            acts.quantize_with(path, threads, kern.act, x, ldx, m, k);
            run(kern, kernel, path, threads, &acts, w, n, bias, out, ldc);
        }
        // Re-entered on this thread (cannot happen from matmul itself).
        Err(_) => {
            let mut acts = Acts::default();
            acts.quantize_with(path, threads, kern.act, x, ldx, m, k);
            run(kern, kernel, path, threads, &acts, w, n, bias, out, ldc);
        }
    });
    path
}

#[allow(clippy::too_many_arguments)]
fn run(
    kern: &'static QuantKernels,
    kernel: QKernel,
    path: KernelPath,
    threads: usize,
    acts: &Acts,
    w: QuantSource<'_>,
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    ldc: usize,
) {
    let m = acts.m;
    let nb = acts.nb;
    let panel_bytes = nb * kern.panel_block_bytes;
    let panels = n.div_ceil(PANEL);
    let row_bytes = nb * kern.block_bytes;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let out_len = out.len();

    // One panel against rows i0..i1.
    let do_panel = |p: usize, i0: usize, i1: usize, scratch: &mut Vec<u8>| {
        let panel: &[u8] = match w {
            QuantSource::Packed(pw) => &pw.data[p * panel_bytes..(p + 1) * panel_bytes],
            QuantSource::Rows(data) => {
                if scratch.len() < panel_bytes {
                    scratch.resize(panel_bytes, 0);
                }
                pack_panel(kern, data, row_bytes, n, p, nb, &mut scratch[..panel_bytes]);
                &scratch[..panel_bytes]
            }
        };
        let j = p * PANEL;
        let cols = PANEL.min(n - j);
        let spb = acts.kind.map_or(1, ActKind::sums_per_block);
        let mut i = i0;
        while i < i1 {
            let mr = MR_MAX.min(i1 - i);
            debug_assert!((i + mr - 1) * ldc + j + cols <= out_len);
            let tile = QTile {
                w: panel.as_ptr(),
                nb,
                x: acts.qs[i * acts.k..].as_ptr(),
                ldq: acts.k,
                d: acts.d[i * nb..].as_ptr(),
                s: acts.s[i * nb..].as_ptr(),
                ldd: nb,
                sums: acts.sums[i * nb * spb..].as_ptr(),
                lds: nb * spb,
                mr,
                // SAFETY: (pointer arithmetic) i < m and j < n, inside `out`
                // (checked by the caller: (m-1)·ldc + n <= out.len()).
                out: unsafe { out_ptr.get().add(i * ldc + j) },
                ldo: ldc,
                cols,
                bias: bias.map_or(std::ptr::null(), |b| b[j..].as_ptr()),
            };
            if path == KernelPath::Portable {
                portable_tile(kern, acts, i, &tile);
            } else {
                // SAFETY: `kernel` was chosen for `path`, which the caller
                // clamped to what this CPU runs; the tile's pointers cover
                // mr rows of acts, one whole panel and its out rectangle,
                // which belongs to this call alone.
                unsafe { kernel(&tile) };
            }
            i += mr;
        }
    };

    let with_scratch = |f: &mut dyn FnMut(&mut Vec<u8>)| {
        PANEL_BUF.with(|cell| match cell.try_borrow_mut() {
            Ok(mut v) => f(&mut v),
            Err(_) => f(&mut Vec::new()),
        })
    };

    let k_bytes = acts.k.max(1);
    if m <= SMALL_M {
        // Decode: every task takes all rows; threads claim runs of panels,
        // guided, so each run is one sequential stream of weights.
        let threads = threads.clamp(1, panels);
        let next = AtomicUsize::new(0);
        let cap = max_claim(panel_bytes);
        pool::run(threads, threads, &|_| {
            with_scratch(&mut |scratch| {
                while let Some((p0, p1)) = claim(&next, panels, threads, cap) {
                    for p in p0..p1 {
                        do_panel(p, 0, m, scratch);
                    }
                }
            })
        });
        return;
    }
    // Prefill: row blocks that keep their activations in L2, times chunks
    // of panels; within a task each panel serves every row tile of the
    // block from L1/L2.
    let mc = (X_BLOCK_BYTES / k_bytes).clamp(MR_MAX, 512) / MR_MAX * MR_MAX;
    let m_blocks = m.div_ceil(mc);
    let want = if threads > 1 {
        threads * TASKS_PER_THREAD
    } else {
        1
    };
    let chunks = want.div_ceil(m_blocks).clamp(1, panels);
    let per_chunk = panels.div_ceil(chunks);
    let chunks = panels.div_ceil(per_chunk);
    pool::run(threads, m_blocks * chunks, &|t| {
        let (rb, c) = (t / chunks, t % chunks);
        let (i0, i1) = (rb * mc, ((rb + 1) * mc).min(m));
        let (p0, p1) = (c * per_chunk, ((c + 1) * per_chunk).min(panels));
        with_scratch(&mut |scratch| {
            for p in p0..p1 {
                do_panel(p, i0, i1, scratch);
            }
        })
    });
}

/// Most panels one claim takes (`MAX_CLAIM_BYTES` of weights at most, at
/// least one panel).
fn max_claim(panel_bytes: usize) -> usize {
    (MAX_CLAIM_BYTES / panel_bytes.max(1)).max(1)
}

/// Weights one claim may cover: long enough to stream well (hundreds of
/// kilobytes per sequential run), short enough that a thread descheduled
/// by another process (a shared machine) holds little of the call: the
/// others finish everything else and wait for at most one run.
const MAX_CLAIM_BYTES: usize = 256 * 1024;

/// Claims the next run of panels out of `total`, guided (a share of what
/// is left, `1 / (2·threads)` of it, at least one, at most `cap`).
fn claim(next: &AtomicUsize, total: usize, threads: usize, cap: usize) -> Option<(usize, usize)> {
    let mut cur = next.load(Ordering::Relaxed);
    loop {
        if cur >= total {
            return None;
        }
        let size = ((total - cur) / (2 * threads))
            .clamp(1, cap)
            .min(total - cur);
        match next.compare_exchange_weak(cur, cur + size, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((cur, cur + size)),
            Err(now) => cur = now,
        }
    }
}
