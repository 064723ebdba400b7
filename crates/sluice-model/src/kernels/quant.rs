//! Matmul on block-quantized weights: the activation partners, the 16-row
//! panel layout, and the driver that runs a format's microkernel over it.
//!
//! Owns: quantizing the activation rows once per call (into a reused
//! thread-local buffer), repacking weights into panels (`PackedWeight`, or
//! on the fly per panel for weights in ggml's layout), and cutting the work
//! into (row tile × panel) microkernel calls over the thread pool.
//!
//! The arithmetic. Activations are quantized per block to the weight
//! format's partner exactly as llama.cpp's x86 build does (`ActKind`):
//! - `Q8_0` (partner of Q4_0 / Q5_0 / Q8_0): per 32 values, `d = amax/127`
//!   rounded to f16, `q = round_half_even(x · (127/amax))`;
//! - `Q8_1` (Q4_1 / Q5_1): as Q8_0, plus `s = f16(d · Σq)` (the unrounded
//!   `d`);
//! - `Q8_K` (the K types): per 256 values, `iscale = -127/max` (max: the
//!   signed value of largest magnitude), `q = min(127,
//!   round_half_even(iscale·x))`, `d = 1/iscale` (f32), and the sums of
//!   each 16 `q`.
//!
//! Then output element `(i, j)` starts at `+0.0` and takes, for each block
//! `b` of `k` in order, the format's step (`FormatKernels::step`, spelled
//! out in each format's file): an exact integer dot product of the block's
//! weight and activation integers (offsets and mins folded in as integers,
//! so any summation order inside a block gives the same value), converted
//! to f32 (round to nearest), times the f32 product of the block scales,
//! added with one fused multiply-add — plus, for formats with a min, a
//! second FMA of the min term. A bias is added after the last block.
//!
//! Every path (AVX-512 VNNI, AVX2, portable) computes that same sequence,
//! and SIMD lanes hold different output columns (never parts of one sum),
//! so for quantized weights the results are bit-identical across paths as
//! well as across batch sizes, thread counts, packed or ggml layout, and
//! strided or contiguous output. `dot_row_reference` is the scalar
//! definition the tests hold every path to.
//!
//! The panel layout: weight rows are grouped by 16 (the last group padded
//! with zero rows), and a panel stores, for each block of `k`, the 16 rows'
//! blocks interleaved so one 64-byte vector holds 4 consecutive
//! elements of each row: a VNNI `vpdpbusd` against 4 broadcast activation
//! bytes then advances 16 output columns at once with no horizontal sums.
//! Each format defines its panel block (scales first, then its quants in
//! that interleave) and keeps it the size of 16 ggml blocks, or a few
//! percent more where scales are stored decoded (the K types). A panel is
//! contiguous and consecutive panels are adjacent, so a decode thread reads
//! one sequential stream per claim; the kernels issue no software
//! prefetches (measured: they only got in the hardware prefetcher's way).

// Tile loops index several arrays by the same (i, j); ranges read closer
// to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

use super::dispatch::KernelPath;
use super::formats::{f16_to_f32, f32_to_f16, QuantFormat};
use super::pool;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Weight rows per panel (output columns per microkernel call).
pub(crate) const PANEL: usize = 16;

/// The activation format a weight format's integer kernels pair with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActKind {
    /// Elements per activation block.
    pub(crate) fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 32,
            ActKind::Q8K => 256,
        }
    }

    /// Integer sums kept per block: the block's Σq, or Q8_K's 16 sums of 16.
    pub(crate) fn sums_per_block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 1,
            ActKind::Q8K => 16,
        }
    }
}

/// One activation block, as the scalar steps read it.
pub(crate) struct ActBlock<'a> {
    pub qs: &'a [i8],
    /// The block scale: Q8_0/Q8_1's f16-rounded `d` widened, Q8_K's f32 `d`.
    pub d: f32,
    /// Q8_1: `f16(d · Σq)` widened; 0 otherwise.
    pub s: f32,
    /// Σq (Q8_0/Q8_1), or the 16 sums of 16 (Q8_K).
    pub sums: &'a [i32],
}

/// A microkernel call: `mr` activation rows against one packed panel.
pub(crate) struct QTile {
    /// The panel: `nb` panel blocks of `FormatKernels::panel_block_bytes`.
    pub w: *const u8,
    pub nb: usize,
    /// Row 0 of the tile in each activation array, and the row strides.
    pub x: *const i8,
    pub ldq: usize,
    pub d: *const f32,
    pub s: *const f32,
    /// `nb` per row.
    pub ldd: usize,
    pub sums: *const i32,
    /// `nb · sums_per_block` per row.
    pub lds: usize,
    pub mr: usize,
    /// `out[0][0]` of the tile, rows `ldo` apart.
    pub out: *mut f32,
    pub ldo: usize,
    /// Valid columns of the panel (the rest are padding, never stored).
    pub cols: usize,
    /// `cols` biases, or null.
    pub bias: *const f32,
}

/// A microkernel: computes and stores `t.mr × t.cols` outputs.
///
/// # Safety
/// Pointers valid for the extents in `t`; `1 <= t.mr <= MR_MAX`; the CPU
/// has the features the kernel was compiled for.
pub(crate) type QKernel = unsafe fn(&QTile);

/// Most rows a microkernel call takes (each path's kernels accept any
/// `1..=MR_MAX`).
pub(crate) const MR_MAX: usize = 8;

/// The integer-kernel half of a format's table row.
pub(crate) struct QuantKernels {
    pub act: ActKind,
    /// Elements per weight block (the activation block size too).
    pub block: usize,
    /// Bytes per ggml block.
    pub block_bytes: usize,
    /// Bytes per panel block (16 rows × one block, repacked).
    pub panel_block_bytes: usize,
    /// Writes row `r`'s part of one panel block from its ggml block `blk`.
    /// `dst` is `panel_block_bytes` long and was zeroed by the caller before
    /// the first row (rows past the matrix stay zero; bit masks are OR-ed
    /// in row by row).
    pub pack: fn(blk: &[u8], r: usize, dst: &mut [u8]),
    /// Restores row `r`'s ggml block from a panel block (exact inverse).
    pub unpack: fn(src: &[u8], r: usize, dst: &mut [u8]),
    /// The canonical per-block step: `acc` after weight block `w` (ggml
    /// bytes) against activation block `a`.
    pub step: fn(acc: f32, w: &[u8], a: &ActBlock<'_>) -> f32,
    pub avx2: Option<QKernel>,
    pub avx512: Option<QKernel>,
}

impl QuantKernels {
    /// The kernel for `path` (already clamped to this CPU), and the path it
    /// belongs to.
    fn kernel(&self, path: KernelPath) -> (QKernel, KernelPath) {
        if path == KernelPath::Avx512 {
            if let Some(k) = self.avx512 {
                return (k, KernelPath::Avx512);
            }
        }
        if path >= KernelPath::Avx2 {
            if let Some(k) = self.avx2 {
                return (k, KernelPath::Avx2);
            }
        }
        (portable_dummy, KernelPath::Portable)
    }
}

/// Stands in for the portable kernel in `QuantKernels::kernel`; the driver
/// recognises `KernelPath::Portable` and runs `portable_tile` instead.
unsafe fn portable_dummy(_: &QTile) {
    unreachable!("the portable path runs portable_tile");
}

// ------------------------------------------------------ activation buffers

/// Activation rows quantized for one call.
#[derive(Default)]
pub(crate) struct Acts {
    pub kind: Option<ActKind>,
    pub m: usize,
    pub k: usize,
    /// Blocks per row.
    pub nb: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub sums: Vec<i32>,
}

impl Acts {
    /// Quantizes `x[m×k]` (rows `ldx` apart) for `kind`, reusing buffers.
    pub(crate) fn quantize(&mut self, kind: ActKind, x: &[f32], ldx: usize, m: usize, k: usize) {
        let block = kind.block();
        debug_assert!(k.is_multiple_of(block));
        let nb = k / block;
        let spb = kind.sums_per_block();
        self.kind = Some(kind);
        self.m = m;
        self.k = k;
        self.nb = nb;
        // `resize` only grows the buffers: a warm step allocates nothing.
        fit(&mut self.qs, m * k, 0);
        fit(&mut self.d, m * nb, 0.0);
        fit(&mut self.s, m * nb, 0.0);
        fit(&mut self.sums, m * nb * spb, 0);
        for i in 0..m {
            let row = &x[i * ldx..i * ldx + k];
            for b in 0..nb {
                let src = &row[b * block..(b + 1) * block];
                let qs = &mut self.qs[i * k + b * block..i * k + (b + 1) * block];
                let at = i * nb + b;
                match kind {
                    ActKind::Q8_0 | ActKind::Q8_1 => {
                        let (d, s, sum) = quantize_q8_0_block(src, qs);
                        self.d[at] = d;
                        self.s[at] = if kind == ActKind::Q8_1 { s } else { 0.0 };
                        self.sums[at] = sum;
                    }
                    ActKind::Q8K => {
                        let sums = &mut self.sums[at * 16..at * 16 + 16];
                        self.d[at] = quantize_q8_k_block(src, qs, sums);
                        self.s[at] = 0.0;
                    }
                }
            }
        }
    }

    /// Block `b` of row `i`.
    pub(crate) fn block(&self, i: usize, b: usize) -> ActBlock<'_> {
        let kind = self.kind.unwrap_or(ActKind::Q8_0);
        let block = kind.block();
        let spb = kind.sums_per_block();
        let at = i * self.nb + b;
        ActBlock {
            qs: &self.qs[i * self.k + b * block..i * self.k + (b + 1) * block],
            d: self.d[at],
            s: self.s[at],
            sums: &self.sums[at * spb..(at + 1) * spb],
        }
    }
}

fn fit<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}

/// One Q8_0 / Q8_1 block as llama.cpp's AVX2 `quantize_row_q8_0/1` makes
/// it: returns `(f16(d) widened, f16(d·Σq) widened, Σq)`.
pub(crate) fn quantize_q8_0_block(x: &[f32], q: &mut [i8]) -> (f32, f32, i32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        // `_mm256_round_ps(_MM_ROUND_NEAREST)` then `cvtps_epi32`; the sum
        // is taken before the saturating packs (which never bind: |v·id|
        // <= 127 up to rounding).
        let r = (v * id).round_ties_even();
        let r = if r.is_nan() { 0 } else { r as i32 };
        sum += r;
        *o = r.clamp(-128, 127) as i8;
    }
    let dh = f16_to_f32(f32_to_f16(d));
    let s = f16_to_f32(f32_to_f16(d * sum as f32));
    (dh, s, sum)
}

/// One Q8_K block (ggml's `quantize_row_q8_K_ref`, what x86 runs): returns
/// `d`; writes the quants and the 16 sums of 16.
pub(crate) fn quantize_q8_k_block(x: &[f32], q: &mut [i8], sums: &mut [i32]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        sums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q.iter_mut().zip(x) {
        // ggml's `nearest_int` (the 1.5·2²³ trick) rounds half to even.
        let r = (iscale * v).round_ties_even();
        let r = if r.is_nan() { 0 } else { r as i32 };
        *o = r.clamp(-128, 127) as i8;
    }
    for (j, s) in sums.iter_mut().enumerate() {
        *s = q[j * 16..(j + 1) * 16].iter().map(|&v| v as i32).sum();
    }
    1.0 / iscale
}

thread_local! {
    /// Quantized activations of the current call (caller's thread).
    static ACTS: RefCell<Acts> = RefCell::default();
    /// A panel repacked on the fly from ggml-layout weights (per thread).
    static PANEL_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

// ------------------------------------------------------- packed weights

/// A quantized `[n×k]` matrix repacked into 16-row panels for the integer
/// kernels (see the module docs); made once at load by `PackedWeight::new`.
/// Gives bit for bit the results of the same bytes in ggml's layout, and
/// `dequantize_row` still recovers every row.
#[derive(Clone)]
pub struct PackedWeight {
    format: QuantFormat,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedWeight")
            .field("format", &self.format)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl PackedWeight {
    /// Repacks `data` (`n` rows of `k` elements in ggml's layout). `None`
    /// for the float formats (nothing to repack) or when the sizes do not
    /// match.
    pub fn new(format: QuantFormat, data: &[u8], n: usize, k: usize) -> Option<PackedWeight> {
        let kern = format.info().kernels?;
        let row_bytes = format.row_bytes(k).ok()?;
        if data.len() != row_bytes.checked_mul(n)? {
            return None;
        }
        let nb = k / kern.block;
        let panel_bytes = nb * kern.panel_block_bytes;
        let panels = n.div_ceil(PANEL);
        let mut out = vec![0u8; panels.checked_mul(panel_bytes)?];
        for (p, dst) in out.chunks_exact_mut(panel_bytes.max(1)).enumerate() {
            pack_panel(kern, data, row_bytes, n, p, nb, dst);
        }
        Some(PackedWeight {
            format,
            n,
            k,
            data: out,
        })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes held (what a decode step streams).
    pub fn size_in_bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `row` as f32, bit for bit `format.dequantize_row` of the
    /// original bytes.
    ///
    /// # Panics
    /// If `row >= rows()` or `out.len() != cols()`.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.n && out.len() == self.k,
            "PackedWeight::dequantize_row: bad row or length"
        );
        let Some(kern) = self.format.info().kernels else {
            return;
        };
        let nb = self.k / kern.block;
        let panel = &self.data[row / PANEL * nb * kern.panel_block_bytes..];
        let mut blk = [0u8; 256];
        let blk = &mut blk[..kern.block_bytes];
        for b in 0..nb {
            let src = &panel[b * kern.panel_block_bytes..(b + 1) * kern.panel_block_bytes];
            (kern.unpack)(src, row % PANEL, blk);
            (self.format.info().dequantize)(blk, &mut out[b * kern.block..(b + 1) * kern.block]);
        }
    }
}

/// Packs panel `p` (rows `16p..16p+16` of `data`) into `dst` (zeroed
/// first). Row by row, so the reads are one sequential stream at a time
/// and the writes stay in the (L1-sized) panel.
fn pack_panel(
    kern: &QuantKernels,
    data: &[u8],
    row_bytes: usize,
    n: usize,
    p: usize,
    nb: usize,
    dst: &mut [u8],
) {
    dst.fill(0);
    let r0 = p * PANEL;
    let rows = PANEL.min(n - r0);
    for r in 0..rows {
        let row = &data[(r0 + r) * row_bytes..(r0 + r + 1) * row_bytes];
        for (blk, pb) in row
            .chunks_exact(kern.block_bytes)
            .zip(dst.chunks_exact_mut(kern.panel_block_bytes))
            .take(nb)
        {
            (kern.pack)(blk, r, pb);
        }
    }
}

// ------------------------------------------------------------ the driver

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
            acts.quantize(kern.act, x, ldx, m, k);
            run(kern, kernel, path, threads, &acts, w, n, bias, out, ldc);
        }
        // Re-entered on this thread (cannot happen from matmul itself).
        Err(_) => {
            let mut acts = Acts::default();
            acts.quantize(kern.act, x, ldx, m, k);
            run(kern, kernel, path, threads, &acts, w, n, bias, out, ldc);
        }
    });
    path
}

/// A raw pointer that tasks on other threads may write through; each task
/// writes only its own rows × panels of `out`.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: tasks write disjoint elements (see `run`), and `pool::run` returns
// only after every task finished, while `out` is still borrowed.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

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
    let out_ptr = OutPtr(out.as_mut_ptr());
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
                // SAFETY (pointer arithmetic): i < m and j < n, inside `out`
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

/// The portable path: unpacks each panel block back to ggml blocks and
/// runs the format's scalar step per element.
fn portable_tile(kern: &QuantKernels, acts: &Acts, row0: usize, t: &QTile) {
    let mut acc = [[0.0f32; PANEL]; MR_MAX];
    let mut blk = [0u8; 256];
    let blk = &mut blk[..kern.block_bytes];
    for b in 0..t.nb {
        // SAFETY: the panel holds `nb` panel blocks (see `QTile::w`).
        let src = unsafe {
            std::slice::from_raw_parts(t.w.add(b * kern.panel_block_bytes), kern.panel_block_bytes)
        };
        for r in 0..t.cols {
            (kern.unpack)(src, r, blk);
            for i in 0..t.mr {
                acc[i][r] = (kern.step)(acc[i][r], blk, &acts.block(row0 + i, b));
            }
        }
    }
    for i in 0..t.mr {
        for r in 0..t.cols {
            let v = if t.bias.is_null() {
                acc[i][r]
            } else {
                // SAFETY: `bias` holds `cols` values when not null.
                acc[i][r] + unsafe { *t.bias.add(r) }
            };
            // SAFETY: the tile's out rectangle is writable (see `QTile`).
            unsafe { *t.out.add(i * t.ldo + r) = v };
        }
    }
}

/// The scalar definition of one output element: `w_row` (ggml layout, `k`
/// elements) against activation row `x` quantized to the format's partner.
/// Every path's result equals this bit for bit.
///
/// # Panics
/// If `format` is a float format or the lengths do not fit.
pub fn dot_row_reference(format: QuantFormat, w_row: &[u8], x: &[f32]) -> f32 {
    let kern = format
        .info()
        .kernels
        .expect("dot_row_reference: an integer format");
    let k = x.len();
    assert_eq!(
        format.row_bytes(k).ok(),
        Some(w_row.len()),
        "dot_row_reference: lengths"
    );
    let mut acts = Acts::default();
    acts.quantize(kern.act, x, k, 1, k);
    let mut acc = 0.0f32;
    for b in 0..acts.nb {
        let w = &w_row[b * kern.block_bytes..(b + 1) * kern.block_bytes];
        acc = (kern.step)(acc, w, &acts.block(0, b));
    }
    acc
}

/// The values the kernels actually multiply for activation row `x`: each
/// element dequantized from its partner block (`d · q`), for tolerance
/// arguments in tests.
pub fn quantized_activations(format: QuantFormat, x: &[f32]) -> Vec<f32> {
    let Some(kern) = format.info().kernels else {
        return x.to_vec();
    };
    let k = x.len();
    let mut acts = Acts::default();
    acts.quantize(kern.act, x, k, 1, k);
    let mut out = Vec::with_capacity(k);
    for b in 0..acts.nb {
        let a = acts.block(0, b);
        out.extend(a.qs.iter().map(|&q| a.d * q as f32));
    }
    out
}

// --------------------------------------------------- shared SIMD helpers

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::QTile;
    use std::arch::x86_64::*;

    /// The 4 activation bytes at `p`, broadcast to every 32-bit lane (the
    /// signed operand of `vpdpbusd` / `pmaddubsw`).
    ///
    /// # Safety
    /// `p` valid for 4 bytes.
    #[inline(always)]
    pub(crate) unsafe fn bcast512(p: *const i8) -> __m512i {
        // SAFETY: forwarded; unaligned reads are fine.
        _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
    }

    /// As `bcast512`, 256 bits.
    ///
    /// # Safety
    /// `p` valid for 4 bytes.
    #[inline(always)]
    pub(crate) unsafe fn bcast256(p: *const i8) -> __m256i {
        // SAFETY: forwarded.
        _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
    }

    /// Stores 16 accumulated columns of row `i` (+ bias), masked to
    /// `t.cols`.
    ///
    /// # Safety
    /// AVX-512F; the tile's out and bias extents (see `QTile`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn store512(t: &QTile, i: usize, acc: __m512) {
        let mask: __mmask16 = ((1u32 << t.cols) - 1) as __mmask16;
        // SAFETY: masked lanes stay within `cols` outputs and biases.
        unsafe {
            let v = if t.bias.is_null() {
                acc
            } else {
                _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, t.bias))
            };
            _mm512_mask_storeu_ps(t.out.add(i * t.ldo), mask, v);
        }
    }

    /// Stores two 8-column halves of row `i` (+ bias), `t.cols` of them.
    ///
    /// # Safety
    /// AVX; the tile's out and bias extents.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn store256(t: &QTile, i: usize, acc: [__m256; 2]) {
        let mut v = [0.0f32; 16];
        // SAFETY: `v` has room for 16 floats.
        unsafe {
            _mm256_storeu_ps(v.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(v.as_mut_ptr().add(8), acc[1]);
        }
        for r in 0..t.cols {
            // SAFETY: r < cols: inside the out row and the biases.
            unsafe {
                let x = if t.bias.is_null() {
                    v[r]
                } else {
                    v[r] + *t.bias.add(r)
                };
                *t.out.add(i * t.ldo + r) = x;
            }
        }
    }

    /// Expands to a `match t.mr` calling `$f::<MR>(t)` (after any leading
    /// const arguments given as `$f::<A, B>`) for MR in 1..=8.
    macro_rules! rows_1_to_8 {
        ($f:ident $(::<$($g:tt),*>)?, $t:expr) => {
            match $t.mr {
                1 => $f::<$($({ $g },)*)? 1>($t),
                2 => $f::<$($({ $g },)*)? 2>($t),
                3 => $f::<$($({ $g },)*)? 3>($t),
                4 => $f::<$($({ $g },)*)? 4>($t),
                5 => $f::<$($({ $g },)*)? 5>($t),
                6 => $f::<$($({ $g },)*)? 6>($t),
                7 => $f::<$($({ $g },)*)? 7>($t),
                8 => $f::<$($({ $g },)*)? 8>($t),
                mr => unreachable!("no {mr}-row quant tile"),
            }
        };
    }
    pub(crate) use rows_1_to_8;

    /// Runs `$f::<MR>` over the tile's rows in chunks of at most 4 (for
    /// kernels with several accumulators per row: AVX2 has 16 vector
    /// registers, and the K kernels hold 4-6 per row), advancing the
    /// tile's row pointers between chunks.
    macro_rules! rows_in_fours {
        ($f:ident $(::<$($g:tt),*>)?, $t:expr) => {{
            let t: &QTile = $t;
            let mut done = 0;
            while done < t.mr {
                let mr = (t.mr - done).min(4);
                let sub = QTile {
                    x: t.x.wrapping_add(done * t.ldq),
                    d: t.d.wrapping_add(done * t.ldd),
                    s: t.s.wrapping_add(done * t.ldd),
                    sums: t.sums.wrapping_add(done * t.lds),
                    out: t.out.wrapping_add(done * t.ldo),
                    mr,
                    ..*t
                };
                match mr {
                    1 => $f::<$($({ $g },)*)? 1>(&sub),
                    2 => $f::<$($({ $g },)*)? 2>(&sub),
                    3 => $f::<$($({ $g },)*)? 3>(&sub),
                    _ => $f::<$($({ $g },)*)? 4>(&sub),
                }
                done += mr;
            }
        }};
    }
    pub(crate) use rows_in_fours;

    /// Bytes `0xFF` where bit `j` of `bits` is set (byte `j`), for 32 bits
    /// (llama.cpp's `bytes_from_bits_32`).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn bytes_from_bits32(bits: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
    }

    /// `Σ` of 4 u8×i8 products per 32-bit lane, added to `acc` (the AVX2
    /// stand-in for `vpdpbusd`; exact while each pair sum fits i16, which
    /// every format's value range guarantees).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn dpbusd256(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(u, s);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
}

impl Clone for QTile {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for QTile {}
