//! The element types the CPU runner's KV cache stores ([`KvDtype`]) and
//! their storage ([`KvTensor`]): how a new token's K and V rows are encoded
//! into a block run, and how the attention kernels get f32 back.
//!
//! - `F32`: the activations as they are; exact (tests compare against it).
//! - `Bf16`, `F16`: each element rounded to nearest, ties to even (what
//!   `torch.Tensor.to` and llama.cpp's `ggml_cpy` do); decoding is exact.
//! - `Q8_0`: llama.cpp's `q8_0` KV type — per 32 elements along `head_dim`
//!   of one token and head, 32 signed bytes and an f16 scale, quantized as
//!   llama.cpp's x86 `quantize_row_q8_0` quantizes (`quant::activations`'
//!   one owner); 34 bytes per 32 elements. Needs `head_dim % 32 == 0`.
//!
//! Layout: the bytes or halves sit exactly where the f32 elements would
//! (K transposed within a block, see the parent module), so one element
//! index serves every type. A q8_0 tensor keeps its scales beside, one per
//! 32 elements of a run: for K (`[head_dim, block_size]`) at
//! `run/32 + (d/32)·block_size + j`, so the 16 keys a kernel scores
//! together have their scales side by side; for V at `run/32 +
//! j·(head_dim/32) + d/32`.
//!
//! Decoding is exact (bf16 and f16 widen exactly; a q8_0 value is `q · d`
//! with `|q| ≤ 127` and an 11-bit `d`, exact in f32), so every kernel path
//! that decodes a chunk gets the same floats, and results stay bitwise
//! identical across paths, batch sizes and threads.

use crate::kernels::formats::{f16_to_f32, f32_to_f16};
use crate::kernels::quant::quantize_q8_0_block;
use crate::kernels::{bf16_to_f32, f32_to_bf16};
use anyhow::{bail, Result};
use sluice_arch::kv_dtype::{Q8_0_BLOCK, Q8_0_BLOCK_BYTES};
use sluice_arch::KvCacheDtype;
use std::alloc::Layout;

/// How one KV element is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// Exact; what library callers get unless they ask otherwise.
    #[default]
    F32,
    Bf16,
    F16,
    Q8_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::Bf16, KvDtype::F16, KvDtype::Q8_0];

    /// The type `--kv-cache-dtype dtype` stores for heads of `head_dim`.
    /// `auto` is f16, llama.cpp's default KV type, on every CPU: the
    /// kernels widen either half type to f32 at the same cost (no bf16
    /// arithmetic is involved, so AVX-512 BF16 buys nothing), and f16's 10
    /// mantissa bits keep attention 50× closer to f32 than bf16's 7
    /// (SmolLM2-135M, F32 weights, 3,570 scored tokens: mean KL divergence
    /// from the f32 cache 1e-6 for f16, 5.6e-5 for bf16; same top token
    /// 99.94 % and 99.55 %). f16's range (±65504) is what llama.cpp
    /// users' models already run in. fp8 has no CPU kernel here; q8_0
    /// needs heads of whole 32-element blocks. Errors name the value, not
    /// the flag (the caller does).
    pub fn resolve(dtype: KvCacheDtype, head_dim: usize) -> Result<KvDtype> {
        let d = match dtype {
            KvCacheDtype::Auto => KvDtype::F16,
            KvCacheDtype::Float32 => KvDtype::F32,
            KvCacheDtype::Bfloat16 => KvDtype::Bf16,
            KvCacheDtype::Float16 => KvDtype::F16,
            KvCacheDtype::Q8_0 => KvDtype::Q8_0,
            KvCacheDtype::Fp8 | KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E5m2 => bail!(
                "{dtype}: the CPU runner's KV cache stores float32, bfloat16, float16 or q8_0"
            ),
        };
        if d == KvDtype::Q8_0 && !head_dim.is_multiple_of(Q8_0_BLOCK) {
            bail!(
                "q8_0 stores blocks of {Q8_0_BLOCK} elements along head_dim, and this model's \
                 head_dim is {head_dim}"
            );
        }
        Ok(d)
    }

    /// The flag value naming this type.
    pub fn flag(self) -> KvCacheDtype {
        match self {
            KvDtype::F32 => KvCacheDtype::Float32,
            KvDtype::Bf16 => KvCacheDtype::Bfloat16,
            KvDtype::F16 => KvCacheDtype::Float16,
            KvDtype::Q8_0 => KvCacheDtype::Q8_0,
        }
    }

    /// vLLM's name (`float32`, `bfloat16`, `float16`, `q8_0`).
    pub fn name(self) -> &'static str {
        self.flag().name()
    }

    /// Bytes of one head's row of `head_dim` elements.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        self.flag().row_bytes(head_dim, 4)
    }

    /// Bytes of `elements` elements (a multiple of 32 for q8_0); `None` on
    /// overflow.
    pub(crate) fn bytes_of(self, elements: usize) -> Option<usize> {
        match self {
            KvDtype::F32 => elements.checked_mul(4),
            KvDtype::Bf16 | KvDtype::F16 => elements.checked_mul(2),
            KvDtype::Q8_0 => (elements / Q8_0_BLOCK).checked_mul(Q8_0_BLOCK_BYTES),
        }
    }
}

/// One K or V tensor of the pool.
pub enum KvTensor {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    F16(Vec<u16>),
    /// `q` where the f32 elements would be; `d` the f16 scales (module
    /// docs).
    Q8_0 {
        q: Vec<i8>,
        d: Vec<u16>,
    },
}

/// Types whose all-zero bit pattern is a valid zero.
trait Zero: Copy {}
impl Zero for f32 {}
impl Zero for u16 {}
impl Zero for i8 {}

/// `n` zeros, allocated fallibly. `alloc_zeroed` (what `vec![0; n]` uses)
/// gets fresh zero pages from the system for large sizes, so the memory is
/// only committed when written; `None` instead of an abort when the
/// allocation fails.
fn try_zeroed<T: Zero>(n: usize) -> Option<Vec<T>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = Layout::array::<T>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0 and every `Zero` type
    // has a non-zero size).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `n`
    // `T`s (so length and capacity `n` match its size and alignment), and
    // all `n` are initialised: all-zero bits are a valid `T` (`Zero`).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

impl KvTensor {
    /// `elements` zeros of `dtype` (`None` when the allocation fails).
    pub(crate) fn zeroed(dtype: KvDtype, elements: usize) -> Option<KvTensor> {
        Some(match dtype {
            KvDtype::F32 => KvTensor::F32(try_zeroed(elements)?),
            KvDtype::Bf16 => KvTensor::Bf16(try_zeroed(elements)?),
            KvDtype::F16 => KvTensor::F16(try_zeroed(elements)?),
            KvDtype::Q8_0 => KvTensor::Q8_0 {
                q: try_zeroed(elements)?,
                d: try_zeroed(elements / Q8_0_BLOCK)?,
            },
        })
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            KvTensor::F32(_) => KvDtype::F32,
            KvTensor::Bf16(_) => KvDtype::Bf16,
            KvTensor::F16(_) => KvDtype::F16,
            KvTensor::Q8_0 { .. } => KvDtype::Q8_0,
        }
    }

    /// The f32 storage, for kernels that read it in place.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            KvTensor::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Elements that are not zero (tests: which slots were written).
    pub fn count_nonzero(&self) -> usize {
        match self {
            KvTensor::F32(v) => v.iter().filter(|&&x| x != 0.0).count(),
            KvTensor::Bf16(v) | KvTensor::F16(v) => v.iter().filter(|&&x| x & 0x7fff != 0).count(),
            KvTensor::Q8_0 { q, .. } => q.iter().filter(|&&x| x != 0).count(),
        }
    }

    /// Element `at` as f32. Q8_0 scales are found through `scale_at`, the
    /// layout's index of the element's scale.
    #[inline]
    fn get(&self, at: usize, scale_at: usize) -> f32 {
        match self {
            KvTensor::F32(v) => v[at],
            KvTensor::Bf16(v) => bf16_to_f32(v[at]),
            KvTensor::F16(v) => f16_to_f32(v[at]),
            KvTensor::Q8_0 { q, d } => q[at] as f32 * f16_to_f32(d[scale_at]),
        }
    }

    /// Stores one token's K row `src` (one head, `head_dim` long) in the
    /// block run at `run`, transposed: element `d` at `run + d·bs + offset`.
    pub(crate) fn write_k_row(&mut self, run: usize, bs: usize, offset: usize, src: &[f32]) {
        match self {
            KvTensor::F32(k) => {
                for (d, &x) in src.iter().enumerate() {
                    k[run + d * bs + offset] = x;
                }
            }
            KvTensor::Bf16(k) => {
                for (d, &x) in src.iter().enumerate() {
                    k[run + d * bs + offset] = f32_to_bf16(x);
                }
            }
            KvTensor::F16(k) => {
                for (d, &x) in src.iter().enumerate() {
                    k[run + d * bs + offset] = f32_to_f16(x);
                }
            }
            KvTensor::Q8_0 { q, d: scales } => {
                let mut qs = [0i8; Q8_0_BLOCK];
                for (b, x) in src.chunks_exact(Q8_0_BLOCK).enumerate() {
                    let (dh, _, _) = quantize_q8_0_block(x, &mut qs);
                    for (i, &v) in qs.iter().enumerate() {
                        q[run + (b * Q8_0_BLOCK + i) * bs + offset] = v;
                    }
                    scales[run / Q8_0_BLOCK + b * bs + offset] = f32_to_f16(dh);
                }
            }
        }
    }

    /// Stores one token's V row `src` at `run + offset·head_dim`.
    pub(crate) fn write_v_row(&mut self, run: usize, offset: usize, src: &[f32]) {
        let hd = src.len();
        let at = run + offset * hd;
        match self {
            KvTensor::F32(v) => v[at..at + hd].copy_from_slice(src),
            KvTensor::Bf16(v) => {
                for (o, &x) in v[at..at + hd].iter_mut().zip(src) {
                    *o = f32_to_bf16(x);
                }
            }
            KvTensor::F16(v) => {
                for (o, &x) in v[at..at + hd].iter_mut().zip(src) {
                    *o = f32_to_f16(x);
                }
            }
            KvTensor::Q8_0 { q, d: scales } => {
                let blocks = hd / Q8_0_BLOCK;
                for (b, x) in src.chunks_exact(Q8_0_BLOCK).enumerate() {
                    let dst = &mut q[at + b * Q8_0_BLOCK..at + (b + 1) * Q8_0_BLOCK];
                    let (dh, _, _) = quantize_q8_0_block(x, dst);
                    scales[run / Q8_0_BLOCK + offset * blocks + b] = f32_to_f16(dh);
                }
            }
        }
    }

    /// The K row of key `offset` in the run at `run`, decoded.
    pub(crate) fn k_row(&self, run: usize, bs: usize, hd: usize, offset: usize) -> Vec<f32> {
        (0..hd)
            .map(|d| {
                let scale = run / Q8_0_BLOCK + (d / Q8_0_BLOCK) * bs + offset;
                self.get(run + d * bs + offset, scale)
            })
            .collect()
    }

    /// The V row of key `offset` in the run at `run`, decoded.
    pub(crate) fn v_row(&self, run: usize, hd: usize, offset: usize) -> Vec<f32> {
        let blocks = hd / Q8_0_BLOCK;
        (0..hd)
            .map(|d| {
                let scale = run / Q8_0_BLOCK + offset * blocks + d / Q8_0_BLOCK;
                self.get(run + offset * hd + d, scale)
            })
            .collect()
    }

    /// Decodes keys `c0..c0 + width` of the K run at `run` into `tile`
    /// (`[head_dim, KEY_TILE]`: key `j`'s element `d` at `d·KEY_TILE + j`),
    /// the portable way. Lanes `width..` are left as they were.
    pub(crate) fn k_tile(
        &self,
        run: usize,
        bs: usize,
        hd: usize,
        c0: usize,
        width: usize,
        tile: &mut [f32],
    ) {
        for d in 0..hd {
            let src = run + d * bs + c0;
            let dst = &mut tile[d * KEY_TILE..d * KEY_TILE + width];
            match self {
                KvTensor::F32(k) => dst.copy_from_slice(&k[src..src + width]),
                KvTensor::Bf16(k) => {
                    for (o, &b) in dst.iter_mut().zip(&k[src..src + width]) {
                        *o = bf16_to_f32(b);
                    }
                }
                KvTensor::F16(k) => {
                    for (o, &b) in dst.iter_mut().zip(&k[src..src + width]) {
                        *o = f16_to_f32(b);
                    }
                }
                KvTensor::Q8_0 { q, d: scales } => {
                    let s = run / Q8_0_BLOCK + (d / Q8_0_BLOCK) * bs + c0;
                    for ((o, &v), &sc) in dst
                        .iter_mut()
                        .zip(&q[src..src + width])
                        .zip(&scales[s..s + width])
                    {
                        *o = v as f32 * f16_to_f32(sc);
                    }
                }
            }
        }
    }

    /// Decodes the V rows of keys `c0..c0 + width` of the run at `run` into
    /// `tile` (`[width, head_dim]`), the portable way.
    pub(crate) fn v_tile(&self, run: usize, hd: usize, c0: usize, width: usize, tile: &mut [f32]) {
        let src = run + c0 * hd;
        let dst = &mut tile[..width * hd];
        match self {
            KvTensor::F32(v) => dst.copy_from_slice(&v[src..src + width * hd]),
            KvTensor::Bf16(v) => {
                for (o, &b) in dst.iter_mut().zip(&v[src..src + width * hd]) {
                    *o = bf16_to_f32(b);
                }
            }
            KvTensor::F16(v) => {
                for (o, &b) in dst.iter_mut().zip(&v[src..src + width * hd]) {
                    *o = f16_to_f32(b);
                }
            }
            KvTensor::Q8_0 { q, d: scales } => {
                let s = run / Q8_0_BLOCK + c0 * (hd / Q8_0_BLOCK);
                for (i, o) in dst.iter_mut().enumerate() {
                    *o = q[src + i] as f32 * f16_to_f32(scales[s + i / Q8_0_BLOCK]);
                }
            }
        }
    }
}

/// Keys per decoded K tile: the attention kernels' chunk of keys.
pub const KEY_TILE: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_follows_the_flag_and_refuses_what_cannot_be_stored() {
        assert_eq!(
            KvDtype::resolve(KvCacheDtype::Float32, 64).unwrap(),
            KvDtype::F32
        );
        assert_eq!(
            KvDtype::resolve(KvCacheDtype::Q8_0, 64).unwrap(),
            KvDtype::Q8_0
        );
        assert_eq!(
            KvDtype::resolve(KvCacheDtype::Auto, 64).unwrap(),
            KvDtype::F16
        );
        let e = KvDtype::resolve(KvCacheDtype::Fp8, 64).unwrap_err();
        assert!(e.to_string().starts_with("fp8: the CPU runner"), "{e}");
        let e = KvDtype::resolve(KvCacheDtype::Q8_0, 40).unwrap_err();
        assert!(e.to_string().contains("head_dim is 40"), "{e}");
    }

    /// bf16 and f16 rounding against the definition (nearest, ties to
    /// even) computed from the bit patterns: for a value between two
    /// representable neighbours, the stored one is the closer, and the
    /// even one on a tie.
    #[test]
    fn half_types_round_to_the_nearest_representable_value() {
        let values = [
            0.1f32,
            -3.3,
            1.0e-3,
            65504.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            2.5e-7,
        ];
        for dtype in [KvDtype::Bf16, KvDtype::F16] {
            let mut t = KvTensor::zeroed(dtype, 64).unwrap();
            for &x in &values {
                let row = vec![x; 32];
                t.write_v_row(0, 0, &row);
                let got = t.v_row(0, 32, 0)[0] as f64;
                let (decode, bits): (fn(u16) -> f32, u16) = match &t {
                    KvTensor::Bf16(v) => (bf16_to_f32, v[0]),
                    KvTensor::F16(v) => (f16_to_f32, v[0]),
                    _ => unreachable!(),
                };
                // The neighbours one unit below and above in magnitude.
                let lo = decode(bits.wrapping_sub(1)) as f64;
                let hi = decode(bits.wrapping_add(1)) as f64;
                let x = x as f64;
                assert!(
                    (got - x).abs() <= (lo - x).abs() && (got - x).abs() <= (hi - x).abs(),
                    "{dtype:?} {x}: stored {got}, neighbours {lo} {hi}"
                );
            }
        }
    }

    /// q8_0 against its definition in f64: per 32 elements, `d = amax/127`
    /// stored as f16 and `q = round(x·127/amax)`, so every decoded element
    /// is within half a step (plus the f16 rounding of `d`) of its input.
    #[test]
    fn q8_0_rows_decode_within_half_a_step() {
        let hd = 64;
        let mut k = KvTensor::zeroed(KvDtype::Q8_0, 2 * 4 * hd).unwrap();
        let mut v = KvTensor::zeroed(KvDtype::Q8_0, 2 * 4 * hd).unwrap();
        let row: Vec<f32> = (0..hd)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173)
            .collect();
        let run = 4 * hd;
        k.write_k_row(run, 4, 2, &row);
        v.write_v_row(run, 3, &row);
        for decoded in [k.k_row(run, 4, hd, 2), v.v_row(run, hd, 3)] {
            for (b, (x, y)) in row.chunks(32).zip(decoded.chunks(32)).enumerate() {
                let amax = x.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
                let step = amax / 127.0;
                for (&a, &g) in x.iter().zip(y) {
                    let err = (a as f64 - g as f64).abs();
                    assert!(err <= 0.5 * step + amax * 1e-3, "block {b}: {a} → {g}");
                }
            }
        }
        // Nothing else was touched: K key 2 and V key 3 only.
        assert_eq!(k.k_row(run, 4, hd, 1), vec![0.0; hd]);
        assert_eq!(v.v_row(run, hd, 2), vec![0.0; hd]);
        assert_eq!(
            k.count_nonzero() + v.count_nonzero(),
            row.iter().filter(|&&x| x != 0.0).count() * 2
        );
    }

    #[test]
    fn tiles_hold_the_rows_of_every_key() {
        let (bs, hd) = (16, 64);
        for dtype in KvDtype::ALL {
            let mut kt = KvTensor::zeroed(dtype, 2 * bs * hd).unwrap();
            let mut vt = KvTensor::zeroed(dtype, 2 * bs * hd).unwrap();
            let run = bs * hd;
            for j in 0..bs {
                let row: Vec<f32> = (0..hd).map(|d| (d as f32 - j as f32) * 0.37).collect();
                kt.write_k_row(run, bs, j, &row);
                vt.write_v_row(run, j, &row);
            }
            let (t_k, t_v) = (kt, vt);
            let mut kt = vec![f32::NAN; hd * KEY_TILE];
            let mut vt = vec![f32::NAN; KEY_TILE * hd];
            t_k.k_tile(run, bs, hd, 4, 12, &mut kt);
            t_v.v_tile(run, hd, 4, 12, &mut vt);
            for j in 0..12 {
                let k = t_k.k_row(run, bs, hd, 4 + j);
                let v = t_v.v_row(run, hd, 4 + j);
                for d in 0..hd {
                    assert_eq!(kt[d * KEY_TILE + j].to_bits(), k[d].to_bits(), "{dtype:?}");
                    assert_eq!(vt[j * hd + d].to_bits(), v[d].to_bits(), "{dtype:?}");
                }
            }
        }
    }

    #[test]
    fn sizes_are_the_formats() {
        assert_eq!(KvDtype::F32.row_bytes(64), 256);
        assert_eq!(KvDtype::Bf16.row_bytes(64), 128);
        assert_eq!(KvDtype::F16.row_bytes(64), 128);
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 68);
        assert_eq!(KvDtype::Q8_0.bytes_of(64), Some(68));
        assert_eq!(KvDtype::F32.bytes_of(usize::MAX), None);
    }
}
