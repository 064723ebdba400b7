//! The horizontal reductions that end every dot product, and their
//! definition.
//!
//! Owns: the fixed addition tree that turns a vector of per-lane partial
//! sums into one number. Promises: every SIMD implementation here computes,
//! for each input vector, exactly `tree16` (16 lanes) or `tree8` (8 lanes)
//! — whether it reduces one vector or transposes sixteen at once — so a
//! result never depends on how many accumulators a tile happened to hold.
//! That is half of the batch-invariance argument (the other half is that
//! each lane accumulates the same k elements in the same order in every
//! tile shape; see `mod.rs`).

// Tile and lane loops index several arrays by the same (i, j, l); ranges
// read closer to the math than zipped iterators.
#![allow(clippy::needless_range_loop)]

/// The 16-lane tree: halves are added pairwise, `v[l] + v[l+8]`, then
/// `+4`, `+2`, `+1`.
#[inline]
pub(crate) fn tree16(v: &[f32; 16]) -> f32 {
    let mut s8 = [0.0f32; 8];
    for l in 0..8 {
        s8[l] = v[l] + v[l + 8];
    }
    let s8: &[f32; 8] = &s8;
    tree8(s8)
}

/// The 8-lane tree: `v[l] + v[l+4]`, then `+2`, `+1` (the tail of `tree16`).
#[inline]
pub(crate) fn tree8(v: &[f32; 8]) -> f32 {
    let s4 = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Reduces 16 vectors at once: lane `j` of the result is
    /// `tree16(v[j])`. About 3 shuffles and adds per result instead of ~8
    /// for one-by-one reductions; this matters because a 4×6 tile reduces 24
    /// accumulators every k-pass.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn hsum16x16(v: &[__m512; 16]) -> __m512 {
        // The transposing tree below leaves the sum of input 4p+q in lane
        // 4q+p; feeding the inputs in that transposed order makes the
        // output order natural.
        const ORDER: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];
        // Step 1, `l + l+8`: pair (a, b) → [s8(a) | s8(b)].
        let mut t = [_mm512_setzero_ps(); 8];
        for (p, t) in t.iter_mut().enumerate() {
            let a = v[ORDER[2 * p]];
            let b = v[ORDER[2 * p + 1]];
            let lo = _mm512_shuffle_f32x4::<0x44>(a, b);
            let hi = _mm512_shuffle_f32x4::<0xEE>(a, b);
            *t = _mm512_add_ps(lo, hi);
        }
        // Step 2, `l + l+4`: quarters become s4 of four inputs.
        let mut u = [_mm512_setzero_ps(); 4];
        for (c, u) in u.iter_mut().enumerate() {
            let a = t[2 * c];
            let b = t[2 * c + 1];
            let lo = _mm512_shuffle_f32x4::<0x88>(a, b);
            let hi = _mm512_shuffle_f32x4::<0xDD>(a, b);
            *u = _mm512_add_ps(lo, hi);
        }
        // Step 3, `l + l+2`, within each 128-bit quarter.
        let mut w = [_mm512_setzero_ps(); 2];
        for (d, w) in w.iter_mut().enumerate() {
            let a = _mm512_castps_pd(u[2 * d]);
            let b = _mm512_castps_pd(u[2 * d + 1]);
            let lo = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            let hi = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
            *w = _mm512_add_ps(lo, hi);
        }
        // Step 4, `l + l+1`.
        let x = _mm512_shuffle_ps::<0x88>(w[0], w[1]);
        let y = _mm512_shuffle_ps::<0xDD>(w[0], w[1]);
        _mm512_add_ps(x, y)
    }

    /// Reduces 8 vectors at once: lane `j` of the result is `tree8(v[j])`.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn hsum8x8(v: &[__m256; 8]) -> __m256 {
        // The tree below leaves the sum of input π(p) in lane p with
        // π = [0,2,4,6,1,3,5,7]; feed inputs so that input π(p) is v[p].
        const ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
        // Step 1, `l + l+4`: pair (a, b) → [s4(a) | s4(b)].
        let mut t = [_mm256_setzero_ps(); 4];
        for (p, t) in t.iter_mut().enumerate() {
            let a = v[ORDER[2 * p]];
            let b = v[ORDER[2 * p + 1]];
            let lo = _mm256_permute2f128_ps::<0x20>(a, b);
            let hi = _mm256_permute2f128_ps::<0x31>(a, b);
            *t = _mm256_add_ps(lo, hi);
        }
        // Step 2, `l + l+2`, within each 128-bit half.
        let mut u = [_mm256_setzero_ps(); 2];
        for (c, u) in u.iter_mut().enumerate() {
            let a = _mm256_castps_pd(t[2 * c]);
            let b = _mm256_castps_pd(t[2 * c + 1]);
            let lo = _mm256_castpd_ps(_mm256_unpacklo_pd(a, b));
            let hi = _mm256_castpd_ps(_mm256_unpackhi_pd(a, b));
            *u = _mm256_add_ps(lo, hi);
        }
        // Step 3, `l + l+1`.
        let x = _mm256_shuffle_ps::<0x88>(u[0], u[1]);
        let y = _mm256_shuffle_ps::<0xDD>(u[0], u[1]);
        _mm256_add_ps(x, y)
    }

    /// Reduces the `MR × NR` accumulators of a tile with `hsum16x16` and
    /// writes `sum (+ bias[j])` to `out[i * ldo + j]`.
    ///
    /// # Safety
    /// AVX-512F must be available; `out` must be valid for writes at
    /// `i * ldo + j` for `i < MR`, `j < NR`; `bias`, if not null, for reads
    /// of `NR` values.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn store_tile16<const MR: usize, const NR: usize>(
        acc: &[[__m512; NR]; MR],
        out: *mut f32,
        ldo: usize,
        bias: *const f32,
    ) {
        let count = MR * NR;
        let mut sums = [0.0f32; 32];
        debug_assert!(count <= sums.len());
        let mut group = [_mm512_setzero_ps(); 16];
        let mut g = 0;
        while g * 16 < count {
            for (slot, v) in group.iter_mut().enumerate() {
                let idx = g * 16 + slot;
                *v = if idx < count {
                    acc[idx / NR][idx % NR]
                } else {
                    _mm512_setzero_ps()
                };
            }
            let r = hsum16x16(&group);
            // SAFETY: `g * 16 + 16 <= 32 = sums.len()` since count <= 32.
            unsafe { _mm512_storeu_ps(sums.as_mut_ptr().add(g * 16), r) };
            g += 1;
        }
        write_sums::<MR, NR>(&sums, out, ldo, bias);
    }

    /// Like `store_tile16` for 8-lane accumulators, with `hsum8x8`.
    ///
    /// # Safety
    /// AVX2 must be available; same pointer rules as `store_tile16`.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn store_tile8<const MR: usize, const NR: usize>(
        acc: &[[__m256; NR]; MR],
        out: *mut f32,
        ldo: usize,
        bias: *const f32,
    ) {
        let count = MR * NR;
        let mut sums = [0.0f32; 32];
        debug_assert!(count <= sums.len());
        let mut group = [_mm256_setzero_ps(); 8];
        let mut g = 0;
        while g * 8 < count {
            for (slot, v) in group.iter_mut().enumerate() {
                let idx = g * 8 + slot;
                *v = if idx < count {
                    acc[idx / NR][idx % NR]
                } else {
                    _mm256_setzero_ps()
                };
            }
            let r = hsum8x8(&group);
            // SAFETY: `g * 8 + 8 <= 32 = sums.len()` since count <= 32.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr().add(g * 8), r) };
            g += 1;
        }
        write_sums::<MR, NR>(&sums, out, ldo, bias);
    }

    /// # Safety
    /// As for `store_tile16`.
    #[inline(always)]
    unsafe fn write_sums<const MR: usize, const NR: usize>(
        sums: &[f32; 32],
        out: *mut f32,
        ldo: usize,
        bias: *const f32,
    ) {
        for i in 0..MR {
            for j in 0..NR {
                let s = sums[i * NR + j];
                // SAFETY: caller guarantees `bias` (if non-null) holds NR
                // values and `out` is writable at `i * ldo + j`.
                unsafe {
                    let v = if bias.is_null() { s } else { s + *bias.add(j) };
                    *out.add(i * ldo + j) = v;
                }
            }
        }
    }
}
