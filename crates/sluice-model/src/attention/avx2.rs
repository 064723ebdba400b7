//! The AVX2 + FMA attention kernel, for CPUs without AVX-512 (AMD Zen 2 and
//! Zen 3, most Intel client cores): the AVX-512 kernel's algorithm on
//! 256-bit vectors. A chunk of 16 keys is two vectors, and lane masks are
//! vectors (AVX2 has no mask registers).
//!
//! Per chunk of 16 keys: the scores of up to 4 query rows at once (each row
//! two vectors of scores, K loaded once per `d` for all of them: 8
//! accumulators, 2 K vectors and a broadcast fit the 16 registers), then per
//! row a masked online-softmax update with a vector `exp`, and the `p · V`
//! accumulation, 16 dims (two vectors) per row at a time, where rows that
//! see the same keys (up to 4) share each V load. A bf16 / f16 / q8_0 cache
//! is decoded into the item's tiles with vector conversions.
//!
//! Needs `head_dim` to be a multiple of 8 (`supports`); other shapes take
//! the portable kernel. Every row takes the same operations whatever else
//! is in its tile, so results do not depend on the batch (the module
//! promise of `attention`).

use super::{Item, KeyChunk, Scratch, KEY_CHUNK};
use crate::kernels::math::{exp_f32, EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E, ROUND_MAGIC};
use crate::kv_cache::KvTensor;
use std::arch::x86_64::*;

/// Query rows scored together (accumulators held in registers).
const ROW_TILE: usize = 4;

/// Rows sharing each V load in `pv_rows`: 4 rows × 2 accumulators plus 2 V
/// vectors and a broadcast fit the 16 registers.
const PV_ROWS: usize = 4;

/// Sixteen lanes: a chunk of keys.
type V16 = [__m256; 2];

/// Whether this kernel handles heads of `head_dim`.
pub(super) fn supports(head_dim: usize) -> bool {
    head_dim.is_multiple_of(8)
}

/// All-ones in lanes `skip..end` of 16, zeros elsewhere.
#[inline(always)]
unsafe fn range_mask(skip: usize, end: usize) -> [__m256i; 2] {
    let lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    let s = _mm256_set1_epi32(skip as i32);
    let e = _mm256_set1_epi32(end as i32);
    // skip <= j < end  ⇔  !(skip > j) && end > j.
    let m = |j: __m256i| _mm256_andnot_si256(_mm256_cmpgt_epi32(s, j), _mm256_cmpgt_epi32(e, j));
    [m(lo), m(hi)]
}

/// `e^x` lane-wise: the vector form of `math::exp_f32`.
#[inline(always)]
unsafe fn exp256(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
        _mm256_set1_ps(EXP_HI),
    );
    let k = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), _mm256_set1_ps(ROUND_MAGIC));
    let n_bits = _mm256_sub_epi32(
        _mm256_castps_si256(k),
        _mm256_set1_epi32(ROUND_MAGIC.to_bits() as i32),
    );
    let n = _mm256_sub_ps(k, _mm256_set1_ps(ROUND_MAGIC));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let er = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_castps_si256(er),
        _mm256_slli_epi32::<23>(n_bits),
    ))
}

/// The largest of 16 lanes.
#[inline(always)]
unsafe fn reduce_max(v: V16) -> f32 {
    let m = _mm256_max_ps(v[0], v[1]);
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)))
}

/// The sum of 16 lanes (a fixed tree order).
#[inline(always)]
unsafe fn reduce_add(v: V16) -> f32 {
    let m = _mm256_add_ps(v[0], v[1]);
    let h = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
}

/// Sixteen floats from `p`: whole when `mask` is `None` (all 16 lie in
/// the block), else the lanes `mask` sets (the others read as zero and
/// are never touched in memory).
#[inline(always)]
unsafe fn load16(p: *const f32, mask: Option<[__m256i; 2]>) -> V16 {
    match mask {
        None => [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))],
        Some(m) => [
            _mm256_maskload_ps(p, m[0]),
            _mm256_maskload_ps(p.wrapping_add(8), m[1]),
        ],
    }
}

/// Scores of `N` rows against one chunk of keys: `s[t][j] = Σ_d q_t[d] ·
/// K[d][j]`, `d` in order. `k` points at the chunk's first key in the
/// block's `[head_dim, block_size]` K run (`stride` apart), or at a decoded
/// tile's (16 apart).
#[inline(always)]
unsafe fn scores<const N: usize>(
    q: *const f32,
    q_offs: &[usize; ROW_TILE],
    k: *const f32,
    stride: usize,
    head_dim: usize,
    mask: Option<[__m256i; 2]>,
) -> [V16; N] {
    let mut s = [[_mm256_setzero_ps(); 2]; N];
    for d in 0..head_dim {
        let kd = load16(k.wrapping_add(d * stride), mask);
        for t in 0..N {
            let qd = _mm256_broadcast_ss(&*q.add(q_offs[t] + d));
            s[t][0] = _mm256_fmadd_ps(qd, kd[0], s[t][0]);
            s[t][1] = _mm256_fmadd_ps(qd, kd[1], s[t][1]);
        }
    }
    s
}

/// `acc_t[0..S·8] += Σ_j p_t[j] · v[j]` over `j` in `keys` for `R` rows,
/// one segment of `S` vectors of dims, `v` rows `head_dim` apart; each V
/// vector is loaded once for all rows. Every row takes the same operations
/// whatever `R` (one FMA per key, keys in order).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes V rows and every `p`.
unsafe fn pv_segment_rows<const R: usize, const S: usize>(
    acc: [*mut f32; R],
    v: *const f32,
    head_dim: usize,
    p: [&[f32; KEY_CHUNK]; R],
    keys: (usize, usize),
) {
    let mut a = [[_mm256_setzero_ps(); S]; R];
    for t in 0..R {
        for r in 0..S {
            a[t][r] = _mm256_loadu_ps(acc[t].add(8 * r));
        }
    }
    for j in keys.0..keys.1 {
        let vj = v.add(j * head_dim);
        let vv: [__m256; S] = std::array::from_fn(|r| _mm256_loadu_ps(vj.add(8 * r)));
        for t in 0..R {
            let pj = _mm256_broadcast_ss(&p[t][j]);
            for r in 0..S {
                a[t][r] = _mm256_fmadd_ps(pj, vv[r], a[t][r]);
            }
        }
    }
    for t in 0..R {
        for r in 0..S {
            _mm256_storeu_ps(acc[t].add(8 * r), a[t][r]);
        }
    }
}

/// `acc_t += Σ_j p_t[j] · V[j]` over `j` in `keys`, the whole head, for
/// `R` rows that see the same keys.
#[inline(always)]
unsafe fn pv_rows<const R: usize>(
    acc: [*mut f32; R],
    v: *const f32,
    head_dim: usize,
    p: [&[f32; KEY_CHUNK]; R],
    keys: (usize, usize),
) {
    let mut d0 = 0;
    while d0 < head_dim {
        let a = acc.map(|r| r.add(d0));
        if head_dim - d0 >= 16 {
            pv_segment_rows::<R, 2>(a, v.add(d0), head_dim, p, keys);
            d0 += 16;
        } else {
            pv_segment_rows::<R, 1>(a, v.add(d0), head_dim, p, keys);
            d0 += 8;
        }
    }
}

/// Eight halves (bf16 or f16) at `h` as floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves8(h: *const u16, bf16: bool) -> __m256 {
    let x = _mm_loadu_si128(h.cast());
    if bf16 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x)))
    } else {
        _mm256_cvtph_ps(x)
    }
}

/// Eight q8_0 values at `q` as floats, times `scale`.
#[inline(always)]
unsafe fn q8x8(q: *const i8, scale: __m256) -> __m256 {
    let b = _mm_loadl_epi64(q.cast());
    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), scale)
}

/// Decodes keys `c0..c0 + 16` of the K run at `run` into `tile`
/// (`[head_dim, 16]`), as `KvTensor::k_tile` does; a chunk narrower than 16
/// keys, or f16 without F16C, takes that portable way.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_tile_f16c(t: &KvTensor, run: usize, bs: usize, hd: usize, c0: usize, tile: &mut [f32]) {
    debug_assert!(tile.len() >= hd * KEY_CHUNK);
    let out = tile.as_mut_ptr();
    match t {
        KvTensor::F32(_) => t.k_tile(run, bs, hd, c0, KEY_CHUNK, tile),
        KvTensor::Bf16(k) | KvTensor::F16(k) => {
            let bf16 = matches!(t, KvTensor::Bf16(_));
            debug_assert!(run + (hd - 1) * bs + c0 + KEY_CHUNK <= k.len());
            for d in 0..hd {
                let src = k.as_ptr().add(run + d * bs + c0);
                _mm256_storeu_ps(out.add(d * KEY_CHUNK), halves8(src, bf16));
                _mm256_storeu_ps(out.add(d * KEY_CHUNK + 8), halves8(src.add(8), bf16));
            }
        }
        KvTensor::Q8_0 { q, d: scales } => {
            debug_assert!(run + (hd - 1) * bs + c0 + KEY_CHUNK <= q.len());
            let mut scale = [_mm256_setzero_ps(); 2];
            for d in 0..hd {
                if d % 32 == 0 {
                    let s = scales.as_ptr().add(run / 32 + (d / 32) * bs + c0);
                    scale = [halves8(s, false), halves8(s.add(8), false)];
                }
                let src = q.as_ptr().add(run + d * bs + c0);
                _mm256_storeu_ps(out.add(d * KEY_CHUNK), q8x8(src, scale[0]));
                _mm256_storeu_ps(out.add(d * KEY_CHUNK + 8), q8x8(src.add(8), scale[1]));
            }
        }
    }
}

/// Decodes the V rows of keys `c0..c0 + width` of the run at `run` into
/// `tile` (`[width, head_dim]`), as `KvTensor::v_tile` does (`head_dim` a
/// multiple of 8).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn v_tile_f16c(
    t: &KvTensor,
    run: usize,
    hd: usize,
    c0: usize,
    width: usize,
    tile: &mut [f32],
) {
    let n = width * hd;
    let src = run + c0 * hd;
    debug_assert!(tile.len() >= n && hd.is_multiple_of(8));
    let out = tile.as_mut_ptr();
    match t {
        KvTensor::F32(_) => t.v_tile(run, hd, c0, width, tile),
        KvTensor::Bf16(v) | KvTensor::F16(v) => {
            let bf16 = matches!(t, KvTensor::Bf16(_));
            debug_assert!(src + n <= v.len());
            for i in (0..n).step_by(8) {
                _mm256_storeu_ps(out.add(i), halves8(v.as_ptr().add(src + i), bf16));
            }
        }
        KvTensor::Q8_0 { q, d: scales } => {
            // hd is a multiple of 32 (`KvDtype::resolve`), so 8 lanes never
            // straddle two scales.
            debug_assert!(src + n <= q.len() && hd.is_multiple_of(32));
            let s0 = run / 32 + c0 * (hd / 32);
            for i in (0..n).step_by(8) {
                let scale =
                    _mm256_set1_ps(crate::kernels::formats::f16_to_f32(scales[s0 + i / 32]));
                _mm256_storeu_ps(out.add(i), q8x8(q.as_ptr().add(src + i), scale));
            }
        }
    }
}

/// `acc_row *= alpha` (`head_dim` a multiple of 8).
#[inline(always)]
unsafe fn scale_row(acc_row: *mut f32, head_dim: usize, alpha: f32) {
    let alpha = _mm256_set1_ps(alpha);
    for d0 in (0..head_dim).step_by(8) {
        let a = _mm256_loadu_ps(acc_row.add(d0));
        _mm256_storeu_ps(acc_row.add(d0), _mm256_mul_ps(a, alpha));
    }
}

/// One row's online-softmax update for a chunk: masks its scores to the
/// visible keys `skip..visible`, rescales what it accumulated if the
/// maximum grew, adds the chunk's weights to its sum and writes them to
/// `p` (zero outside the visible keys).
#[inline(always)]
unsafe fn softmax_update(
    item: &Item<'_>,
    scratch: &mut Scratch,
    row: usize,
    st: V16,
    (skip, visible): (usize, usize),
    p: &mut [f32; KEY_CHUNK],
) {
    let hd = item.shape.head_dim;
    let m = range_mask(skip, visible);
    let scale = _mm256_set1_ps(item.shape.scale);
    let mut scaled = [_mm256_mul_ps(st[0], scale), _mm256_mul_ps(st[1], scale)];
    if let Some(cap) = item.shape.logit_softcap {
        // No vector tanh here; the soft-cap is rare enough to take the
        // scalar one, lane by lane.
        let mut lanes = [0f32; KEY_CHUNK];
        _mm256_storeu_ps(lanes.as_mut_ptr(), scaled[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), scaled[1]);
        for x in &mut lanes {
            *x = (*x / cap).tanh() * cap;
        }
        scaled = [
            _mm256_loadu_ps(lanes.as_ptr()),
            _mm256_loadu_ps(lanes.as_ptr().add(8)),
        ];
    }
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mf = [_mm256_castsi256_ps(m[0]), _mm256_castsi256_ps(m[1])];
    let st = [
        _mm256_blendv_ps(neg_inf, scaled[0], mf[0]),
        _mm256_blendv_ps(neg_inf, scaled[1], mf[1]),
    ];
    let chunk_max = reduce_max(st);
    let m_old = scratch.max[row];
    let m_new = m_old.max(chunk_max);
    if m_new > m_old {
        let alpha = exp_f32(m_old - m_new);
        scratch.sum[row] *= alpha;
        scale_row(scratch.acc.as_mut_ptr().add(row * hd), hd, alpha);
        scratch.max[row] = m_new;
    }
    let mn = _mm256_set1_ps(m_new);
    let w = [
        _mm256_and_ps(exp256(_mm256_sub_ps(st[0], mn)), mf[0]),
        _mm256_and_ps(exp256(_mm256_sub_ps(st[1], mn)), mf[1]),
    ];
    scratch.sum[row] += reduce_add(w);
    _mm256_storeu_ps(p.as_mut_ptr(), w[0]);
    _mm256_storeu_ps(p.as_mut_ptr().add(8), w[1]);
}

/// One work item (see `super::Item`); `head_dim` a multiple of 8.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend(item: &Item<'_>, out: &mut [f32], scratch: &mut Scratch) {
    let hd = item.shape.head_dim;
    let bs = item.shape.block_size;
    debug_assert!(supports(hd));
    let group = item.group();
    let num_rows = item.num_rows();
    let last_visible = item.last_visible();
    scratch.reset(num_rows, hd);
    let q = item.q.data.as_ptr();
    let in_place = match (item.kv.k.as_f32(), item.kv.v.as_f32()) {
        (Some(k), Some(v)) => Some((k.as_ptr(), v.as_ptr())),
        _ => None,
    };
    let f16c = crate::kernels::cpu_features().f16c;
    debug_assert!(item.table.len() >= last_visible.div_ceil(bs));
    let mut q_offs = [0usize; ROW_TILE];
    let mut p = [[0f32; KEY_CHUNK]; ROW_TILE];

    for chunk in item.key_chunks() {
        let KeyChunk {
            base,
            offset: c0,
            start: chunk_start,
            width,
        } = chunk;
        // The chunk's keys, `k[d · k_stride + j]` and `v[j · hd + d]`:
        // in place for an f32 cache, else decoded into the tiles (16
        // wide, so whole loads stay inside them).
        let (k, k_stride, v, mask) = match in_place {
            Some((k_all, v_all)) => (
                k_all.add(base + c0),
                bs,
                v_all.add(base + c0 * hd),
                (width < KEY_CHUNK).then(|| range_mask(0, width)),
            ),
            None => {
                if f16c && width == KEY_CHUNK {
                    k_tile_f16c(&item.kv.k, base, bs, hd, c0, &mut scratch.k_tile);
                } else {
                    item.kv
                        .k
                        .k_tile(base, bs, hd, c0, width, &mut scratch.k_tile);
                }
                if f16c {
                    v_tile_f16c(&item.kv.v, base, hd, c0, width, &mut scratch.v_tile);
                } else {
                    item.kv.v.v_tile(base, hd, c0, width, &mut scratch.v_tile);
                }
                let tiles = (scratch.k_tile.as_ptr(), scratch.v_tile.as_ptr());
                (tiles.0, KEY_CHUNK, tiles.1, None)
            }
        };
        let mut r0 = 0;
        while r0 < num_rows {
            let n = ROW_TILE.min(num_rows - r0);
            // Rows are token-major, so the tile's last row sees the
            // latest keys and its first row the earliest.
            let first_i = item.q_begin + r0 / group;
            let last_i = item.q_begin + (r0 + n - 1) / group;
            let (_, last_end) = item.visible(last_i, chunk_start, width);
            let (first_skip, _) = item.visible(first_i, chunk_start, width);
            if last_end == 0 || first_skip == width {
                r0 += n;
                continue;
            }
            for (t, off) in q_offs.iter_mut().enumerate().take(n) {
                *off = item.q_offset(r0 + t);
            }
            let mut s = [[_mm256_setzero_ps(); 2]; ROW_TILE];
            macro_rules! tile {
                ($n:literal) => {{
                    let t = scores::<$n>(q, &q_offs, k, k_stride, hd, mask);
                    s[..$n].copy_from_slice(&t);
                }};
            }
            match n {
                1 => tile!(1),
                2 => tile!(2),
                3 => tile!(3),
                _ => tile!(4),
            }
            // The rows with visible keys in this chunk, and their keys.
            let mut active = [(0usize, (0usize, 0usize)); ROW_TILE];
            let mut live = 0;
            for (t, &st) in s.iter().enumerate().take(n) {
                let row = r0 + t;
                let i = item.q_begin + row / group;
                let keys = item.visible(i, chunk_start, width);
                if keys.0 == keys.1 {
                    continue;
                }
                softmax_update(item, scratch, row, st, keys, &mut p[t]);
                active[live] = (t, keys);
                live += 1;
            }
            // `p · V`: rows that see the same keys (every chunk but the
            // causal diagonal's) share each V load; the others go one
            // by one. Either way each row takes the same operations.
            let acc = scratch.acc.as_mut_ptr();
            let row_ptr = |t: usize| acc.add((r0 + t) * hd);
            let active = &active[..live];
            let shared = active.windows(2).all(|w| w[0].1 == w[1].1);
            if shared && live > 1 {
                let keys = active[0].1;
                debug_assert!(live <= PV_ROWS);
                match *active {
                    [(a, _), (b, _), (c, _), (d, _)] => pv_rows::<4>(
                        [row_ptr(a), row_ptr(b), row_ptr(c), row_ptr(d)],
                        v,
                        hd,
                        [&p[a], &p[b], &p[c], &p[d]],
                        keys,
                    ),
                    [(a, _), (b, _), (c, _)] => pv_rows::<3>(
                        [row_ptr(a), row_ptr(b), row_ptr(c)],
                        v,
                        hd,
                        [&p[a], &p[b], &p[c]],
                        keys,
                    ),
                    [(a, _), (b, _)] => {
                        pv_rows::<2>([row_ptr(a), row_ptr(b)], v, hd, [&p[a], &p[b]], keys)
                    }
                    _ => unreachable!("at most {PV_ROWS} live rows"),
                }
            } else {
                for &(t, keys) in active {
                    pv_rows::<1>([row_ptr(t)], v, hd, [&p[t]], keys);
                }
            }
            r0 += n;
        }
    }

    item.write_rows(out, scratch);
}
