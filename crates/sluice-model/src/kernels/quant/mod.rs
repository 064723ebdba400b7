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
//! (AVX2 has no `vpdpbusd`: its kernels keep `pmaddubsw` pair sums in i16
//! lanes only over as many chunks as the format's value range proves
//! exact, which the tests check at the extremes.)
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
//!
//! Files: `activations` (the partners, quantized once per call),
//! `panels` (`PackedWeight` and the panel repacking), `driver` (the work
//! split over the pool), `portable` (the scalar path and the reference
//! definition), `x86` (helpers shared by the formats' SIMD microkernels;
//! the microkernels themselves live with their format in `formats/`).

mod activations;
mod driver;
mod panels;
mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub(crate) use activations::quantize_q8_0_block;
#[cfg(test)]
pub(crate) use activations::quantize_q8_k_block;
pub use activations::quantized_activations;
pub(crate) use activations::{ActBlock, ActKind};
pub(crate) use driver::{matmul_quant, QuantSource};
pub use panels::PackedWeight;
pub use portable::dot_row_reference;

use super::dispatch::KernelPath;

/// Weight rows per panel (output columns per microkernel call).
pub(crate) const PANEL: usize = 16;

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

impl Clone for QTile {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for QTile {}
