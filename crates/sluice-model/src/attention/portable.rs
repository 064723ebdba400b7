//! The portable attention kernel: the reference algorithm in plain Rust,
//! written as elementwise loops over chunks of up to 16 keys so that the
//! compiler vectorises them. Compiled twice: with AVX2+FMA enabled and plain.

use super::{Item, KeyChunk, Scratch, KEY_CHUNK};
use crate::kernels::math::{exp_f32, madd};

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend_avx2(item: &Item<'_>, out: &mut [f32], scratch: &mut Scratch) {
    attend::<true>(item, out, scratch)
}

pub(super) unsafe fn attend_plain(item: &Item<'_>, out: &mut [f32], scratch: &mut Scratch) {
    attend::<false>(item, out, scratch)
}

/// One work item. No closures inside: a closure would be compiled without
/// the caller's target features (and `mul_add` would become a libm call).
#[inline(always)]
fn attend<const FMA: bool>(item: &Item<'_>, out: &mut [f32], scratch: &mut Scratch) {
    let hd = item.shape.head_dim;
    let bs = item.shape.block_size;
    let group = item.group();
    let num_rows = item.num_rows();
    scratch.reset(num_rows, hd);
    let Scratch {
        acc,
        max,
        sum,
        k_tile,
        v_tile,
    } = scratch;
    let mut s = [0f32; KEY_CHUNK];

    for chunk in item.key_chunks() {
        let KeyChunk {
            base,
            offset: c0,
            start: chunk_start,
            width,
        } = chunk;
        // The chunk's keys: `k[d · k_stride + j]`, `v[j · hd + d]`. K is
        // stored [head_dim, block_size] within the block, V
        // [block_size, head_dim]; a cache not in f32 is decoded into
        // the tiles (same layout, 16 keys wide).
        let (k, k_stride, v): (&[f32], usize, &[f32]) =
            match (item.kv.k.as_f32(), item.kv.v.as_f32()) {
                (Some(k), Some(v)) => (
                    &k[base + c0..base + bs * hd],
                    bs,
                    &v[base + c0 * hd..base + (c0 + width) * hd],
                ),
                _ => {
                    item.kv.k.k_tile(base, bs, hd, c0, width, k_tile);
                    item.kv.v.v_tile(base, hd, c0, width, v_tile);
                    (&k_tile[..], KEY_CHUNK, &v_tile[..width * hd])
                }
            };
        for row in 0..num_rows {
            let i = item.q_begin + row / group;
            let (skip, visible) = item.visible(i, chunk_start, width);
            if skip == visible {
                continue;
            }
            let q_off = item.q_offset(row);
            let q_row = &item.q.data[q_off..q_off + hd];
            let s = &mut s[skip..visible];
            s.fill(0.0);
            for (d, &qd) in q_row.iter().enumerate() {
                let k = &k[d * k_stride + skip..d * k_stride + visible];
                for (sj, &kj) in s.iter_mut().zip(k) {
                    *sj = madd::<FMA>(qd, kj, *sj);
                }
            }
            for sj in s.iter_mut() {
                *sj *= item.shape.scale;
            }
            if let Some(cap) = item.shape.logit_softcap {
                for sj in s.iter_mut() {
                    *sj = (*sj / cap).tanh() * cap;
                }
            }
            let mut chunk_max = f32::NEG_INFINITY;
            for &sj in s.iter() {
                chunk_max = chunk_max.max(sj);
            }
            let acc_row = &mut acc[row * hd..(row + 1) * hd];
            let m_new = max[row].max(chunk_max);
            if m_new > max[row] {
                // Rescale what was accumulated under the old max (zero
                // on the first chunk).
                let alpha = exp_f32(max[row] - m_new);
                sum[row] *= alpha;
                for a in acc_row.iter_mut() {
                    *a *= alpha;
                }
                max[row] = m_new;
            }
            for sj in s.iter_mut() {
                *sj = exp_f32(*sj - m_new);
            }
            sum[row] += s.iter().sum::<f32>();
            for (j, &p) in (skip..).zip(s.iter()) {
                let v = &v[j * hd..(j + 1) * hd];
                for (a, &vd) in acc_row.iter_mut().zip(v) {
                    *a = madd::<FMA>(p, vd, *a);
                }
            }
        }
    }

    item.write_rows(out, scratch);
}
