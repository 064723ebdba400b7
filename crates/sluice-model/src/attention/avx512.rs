//! The AVX-512F attention kernel.
//!
//! Per chunk of 16 keys: the scores of up to 8 query rows at once (each row
//! one vector of 16 scores, K loaded once per `d` and shared by the rows),
//! then per row a masked online-softmax update with a vector `exp`, and the
//! `p · V` accumulation, up to four vector accumulators per 64 dims, where
//! rows that see the same keys (up to 4) share each V load.

use super::{Item, KeyChunk, Scratch, KEY_CHUNK};
use crate::kernels::math::{exp_f32, EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG2E, ROUND_MAGIC};
use crate::kv_cache::KvTensor;
use std::arch::x86_64::*;

/// Query rows scored together (accumulators held in registers).
const ROW_TILE: usize = 8;

#[inline(always)]
fn lane_mask(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}

/// Lanes `skip..end`.
#[inline(always)]
fn range_mask(skip: usize, end: usize) -> __mmask16 {
    lane_mask(end) & !lane_mask(skip)
}

/// `e^x` lane-wise: the vector form of `math::exp_f32`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp512(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
        _mm512_set1_ps(EXP_HI),
    );
    let k = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), _mm512_set1_ps(ROUND_MAGIC));
    let n_bits = _mm512_sub_epi32(
        _mm512_castps_si512(k),
        _mm512_set1_epi32(ROUND_MAGIC.to_bits() as i32),
    );
    let n = _mm512_sub_ps(k, _mm512_set1_ps(ROUND_MAGIC));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let er = _mm512_add_ps(
        _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    _mm512_castsi512_ps(_mm512_add_epi32(
        _mm512_castps_si512(er),
        _mm512_slli_epi32::<23>(n_bits),
    ))
}

/// Scores of `N` rows against one chunk of keys: `s[t][j] = Σ_d q_t[d] ·
/// K[d][j]`, `d` in order. `k` points at the chunk's first key in the
/// block's `[head_dim, block_size]` K run (`block_size` apart), or at a
/// decoded tile's (16 apart).
#[inline(always)]
unsafe fn scores<const N: usize>(
    q: *const f32,
    q_offs: &[usize; ROW_TILE],
    k: *const f32,
    block_size: usize,
    head_dim: usize,
    load_mask: __mmask16,
) -> [__m512; N] {
    let mut s = [_mm512_setzero_ps(); N];
    for d in 0..head_dim {
        let kd = _mm512_maskz_loadu_ps(load_mask, k.add(d * block_size));
        for t in 0..N {
            s[t] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(q_offs[t] + d)), kd, s[t]);
        }
    }
    s
}

/// `acc_t[0..S·16] += Σ_j p_t[j] · v[j]` over `j` in `keys` for `R` rows,
/// one segment of up to 64 dims (`masks` trims the last vector), `v` rows
/// `head_dim` apart; each V vector is loaded once for all rows. Every row
/// takes the same operations whatever `R` (one FMA per key, keys in
/// order), so sharing the loads changes no bit.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` indexes V rows and every `p`.
unsafe fn pv_segment_rows<const R: usize, const S: usize>(
    acc: [*mut f32; R],
    v: *const f32,
    head_dim: usize,
    p: [&[f32; KEY_CHUNK]; R],
    keys: (usize, usize),
    masks: [__mmask16; 4],
) {
    let mut a = [[_mm512_setzero_ps(); S]; R];
    for t in 0..R {
        for r in 0..S {
            a[t][r] = _mm512_maskz_loadu_ps(masks[r], acc[t].add(16 * r));
        }
    }
    for j in keys.0..keys.1 {
        let vj = v.add(j * head_dim);
        let vv: [__m512; S] =
            std::array::from_fn(|r| _mm512_maskz_loadu_ps(masks[r], vj.add(16 * r)));
        for t in 0..R {
            let pj = _mm512_set1_ps(p[t][j]);
            for r in 0..S {
                a[t][r] = _mm512_fmadd_ps(pj, vv[r], a[t][r]);
            }
        }
    }
    for t in 0..R {
        for r in 0..S {
            _mm512_mask_storeu_ps(acc[t].add(16 * r), masks[r], a[t][r]);
        }
    }
}

/// `acc_t += Σ_j p_t[j] · V[j]` over `j` in `keys` (`(skip, end)`), the
/// whole head, for `R` rows that see the same keys.
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
        let rem = (head_dim - d0).min(64);
        let regs = rem.div_ceil(16);
        let mut masks = [0xffff as __mmask16; 4];
        masks[regs - 1] = lane_mask(rem - 16 * (regs - 1));
        let a = acc.map(|r| r.add(d0));
        let vs = v.add(d0);
        match regs {
            1 => pv_segment_rows::<R, 1>(a, vs, head_dim, p, keys, masks),
            2 => pv_segment_rows::<R, 2>(a, vs, head_dim, p, keys, masks),
            3 => pv_segment_rows::<R, 3>(a, vs, head_dim, p, keys, masks),
            _ => pv_segment_rows::<R, 4>(a, vs, head_dim, p, keys, masks),
        }
        d0 += rem;
    }
}

/// Rows sharing each V load in `pv_rows`: 4 rows × 4 vectors of
/// accumulators plus the 4 V vectors fit the 32 registers.
const PV_ROWS: usize = 4;

/// Decodes keys `c0..c0 + 16` of the K run at `run` into `tile`
/// (`[head_dim, 16]`), as `KvTensor::k_tile` does; a chunk narrower than
/// 16 keys (a block size below 16) takes that portable way.
#[inline(always)]
unsafe fn k_tile(
    t: &KvTensor,
    run: usize,
    bs: usize,
    hd: usize,
    c0: usize,
    width: usize,
    tile: &mut [f32],
) {
    if width < KEY_CHUNK {
        return t.k_tile(run, bs, hd, c0, width, tile);
    }
    debug_assert!(tile.len() >= hd * KEY_CHUNK);
    let out = tile.as_mut_ptr();
    match t {
        KvTensor::F32(_) => t.k_tile(run, bs, hd, c0, width, tile),
        KvTensor::Bf16(k) | KvTensor::F16(k) => {
            let bf16 = matches!(t, KvTensor::Bf16(_));
            debug_assert!(run + (hd - 1) * bs + c0 + KEY_CHUNK <= k.len());
            for d in 0..hd {
                let h = _mm256_loadu_si256(k.as_ptr().add(run + d * bs + c0).cast());
                let x = if bf16 {
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
                } else {
                    _mm512_cvtph_ps(h)
                };
                _mm512_storeu_ps(out.add(d * KEY_CHUNK), x);
            }
        }
        KvTensor::Q8_0 { q, d: scales } => {
            debug_assert!(run + (hd - 1) * bs + c0 + KEY_CHUNK <= q.len());
            let mut scale = _mm512_setzero_ps();
            for d in 0..hd {
                if d % 32 == 0 {
                    let s = scales.as_ptr().add(run / 32 + (d / 32) * bs + c0);
                    scale = _mm512_cvtph_ps(_mm256_loadu_si256(s.cast()));
                }
                let b = _mm_loadu_si128(q.as_ptr().add(run + d * bs + c0).cast());
                let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                _mm512_storeu_ps(out.add(d * KEY_CHUNK), _mm512_mul_ps(x, scale));
            }
        }
    }
}

/// Decodes the V rows of keys `c0..c0 + width` of the run at `run` into
/// `tile` (`[width, head_dim]`), as `KvTensor::v_tile` does; heads that
/// are not a multiple of 16 take that portable way.
#[inline(always)]
unsafe fn v_tile(t: &KvTensor, run: usize, hd: usize, c0: usize, width: usize, tile: &mut [f32]) {
    if !hd.is_multiple_of(16) {
        return t.v_tile(run, hd, c0, width, tile);
    }
    let n = width * hd;
    let src = run + c0 * hd;
    debug_assert!(tile.len() >= n);
    let out = tile.as_mut_ptr();
    match t {
        KvTensor::F32(_) => t.v_tile(run, hd, c0, width, tile),
        KvTensor::Bf16(v) => {
            debug_assert!(src + n <= v.len());
            for i in (0..n).step_by(16) {
                let h = _mm256_loadu_si256(v.as_ptr().add(src + i).cast());
                let x = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                _mm512_storeu_ps(out.add(i), x);
            }
        }
        KvTensor::F16(v) => {
            debug_assert!(src + n <= v.len());
            for i in (0..n).step_by(16) {
                let h = _mm256_loadu_si256(v.as_ptr().add(src + i).cast());
                _mm512_storeu_ps(out.add(i), _mm512_cvtph_ps(h));
            }
        }
        KvTensor::Q8_0 { q, d: scales } => {
            // hd is a multiple of 32 (`KvDtype::resolve`), so a 16-lane
            // vector never straddles two scales.
            debug_assert!(src + n <= q.len() && hd.is_multiple_of(32));
            let s0 = run / 32 + c0 * (hd / 32);
            for i in (0..n).step_by(16) {
                let scale =
                    _mm512_set1_ps(crate::kernels::formats::f16_to_f32(scales[s0 + i / 32]));
                let b = _mm_loadu_si128(q.as_ptr().add(src + i).cast());
                let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                _mm512_storeu_ps(out.add(i), _mm512_mul_ps(x, scale));
            }
        }
    }
}

/// `acc_row *= alpha`.
#[inline(always)]
unsafe fn scale_row(acc_row: *mut f32, head_dim: usize, alpha: f32) {
    let alpha = _mm512_set1_ps(alpha);
    let mut d0 = 0;
    while d0 < head_dim {
        let m = lane_mask((head_dim - d0).min(16));
        let a = _mm512_maskz_loadu_ps(m, acc_row.add(d0));
        _mm512_mask_storeu_ps(acc_row.add(d0), m, _mm512_mul_ps(a, alpha));
        d0 += 16;
    }
}

/// One work item (see `super::Item`).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn attend(item: &Item<'_>, out: &mut [f32], scratch: &mut Scratch) {
    let hd = item.shape.head_dim;
    let bs = item.shape.block_size;
    let group = item.group();
    let num_rows = item.num_rows();
    let last_visible = item.last_visible();
    scratch.reset(num_rows, hd);
    let acc = scratch.acc.as_mut_ptr();
    let q = item.q.data.as_ptr();
    let in_place = match (item.kv.k.as_f32(), item.kv.v.as_f32()) {
        (Some(k), Some(v)) => Some((k.as_ptr(), v.as_ptr())),
        _ => None,
    };
    debug_assert!(item.table.len() >= last_visible.div_ceil(bs));
    let scale = _mm512_set1_ps(item.shape.scale);
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut q_offs = [0usize; ROW_TILE];
    let mut p = [[0f32; KEY_CHUNK]; ROW_TILE];

    for chunk in item.key_chunks() {
        let KeyChunk {
            base,
            offset: c0,
            start: chunk_start,
            width,
        } = chunk;
        let load_mask = lane_mask(width.min(last_visible - chunk_start));
        // The chunk's keys, `k[d · k_stride + j]` and `v[j · hd + d]`:
        // in place for an f32 cache, else decoded into the tiles.
        let (k, k_stride, v) = match in_place {
            Some((k_all, v_all)) => (k_all.add(base + c0), bs, v_all.add(base + c0 * hd)),
            None => {
                k_tile(&item.kv.k, base, bs, hd, c0, width, &mut scratch.k_tile);
                v_tile(&item.kv.v, base, hd, c0, width, &mut scratch.v_tile);
                (scratch.k_tile.as_ptr(), KEY_CHUNK, scratch.v_tile.as_ptr())
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
            let mut s = [_mm512_setzero_ps(); ROW_TILE];
            // The rows with visible keys in this chunk, and their keys.
            let mut active = [(0usize, (0usize, 0usize)); ROW_TILE];
            let mut live = 0;
            macro_rules! tile {
                ($n:literal) => {{
                    let t = scores::<$n>(q, &q_offs, k, k_stride, hd, load_mask);
                    s[..$n].copy_from_slice(&t);
                }};
            }
            match n {
                1 => tile!(1),
                2 => tile!(2),
                3 => tile!(3),
                4 => tile!(4),
                5 => tile!(5),
                6 => tile!(6),
                7 => tile!(7),
                _ => tile!(8),
            }
            for (t, &st) in s.iter().enumerate().take(n) {
                let row = r0 + t;
                let i = item.q_begin + row / group;
                let (skip, visible) = item.visible(i, chunk_start, width);
                if skip == visible {
                    continue;
                }
                let m = range_mask(skip, visible);
                let mut scaled = _mm512_mul_ps(st, scale);
                if let Some(cap) = item.shape.logit_softcap {
                    // No vector tanh here; the soft-cap is rare enough
                    // to take the scalar one, lane by lane.
                    let mut lanes = [0f32; KEY_CHUNK];
                    _mm512_storeu_ps(lanes.as_mut_ptr(), scaled);
                    for x in &mut lanes {
                        *x = (*x / cap).tanh() * cap;
                    }
                    scaled = _mm512_loadu_ps(lanes.as_ptr());
                }
                let st = _mm512_mask_blend_ps(m, neg_inf, scaled);
                let chunk_max = _mm512_reduce_max_ps(st);
                let acc_row = acc.add(row * hd);
                let m_old = scratch.max[row];
                let m_new = m_old.max(chunk_max);
                if m_new > m_old {
                    let alpha = exp_f32(m_old - m_new);
                    scratch.sum[row] *= alpha;
                    scale_row(acc_row, hd, alpha);
                    scratch.max[row] = m_new;
                }
                let pv_vec =
                    _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(st, _mm512_set1_ps(m_new))));
                scratch.sum[row] += _mm512_reduce_add_ps(pv_vec);
                _mm512_storeu_ps(p[t].as_mut_ptr(), pv_vec);
                active[live] = (t, (skip, visible));
                live += 1;
            }
            // `p · V`: rows that see the same keys (every chunk but
            // the causal diagonal's) share each V load, 4 at a time;
            // the others go one by one. Either way each row takes the
            // same operations.
            let active = &active[..live];
            let shared = active.windows(2).all(|w| w[0].1 == w[1].1);
            if shared && live > 1 {
                let keys = active[0].1;
                let row_ptr = |t: usize| acc.add((r0 + t) * hd);
                for g in active.chunks(PV_ROWS) {
                    match *g {
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
                        _ => pv_rows::<1>([row_ptr(g[0].0)], v, hd, [&p[g[0].0]], keys),
                    }
                }
            } else {
                for &(t, keys) in active {
                    pv_rows::<1>([acc.add((r0 + t) * hd)], v, hd, [&p[t]], keys);
                }
            }
            r0 += n;
        }
    }

    item.write_rows(out, scratch);
}
