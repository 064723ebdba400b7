//! Partial selection: the best `n` of a vocabulary-sized row without sorting
//! it, and the top-p nucleus without sorting more than its boundary.
//!
//! Order everywhere: larger value first, equal values by smaller token id.
//! The id tie-break makes every result a function of the input alone, not of
//! the (unstable) sort or selection algorithm std happens to use.

use super::kernels::{exponent_bucket, ExpHist};
use crate::kernels::multiversion;
use std::cmp::Ordering;

/// True when `a` ranks below `b`.
#[inline(always)]
fn worse(a: (f32, u32), b: (f32, u32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 > b.1)
}

/// Descending by value, then ascending by id. Total as long as no value is
/// NaN, which every producer guarantees (std's sorts may panic on a
/// comparator that is not a total order).
#[inline]
pub(crate) fn rank_order(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The best `cap` (value, id) pairs seen, as a binary min-heap whose root is
/// the worst one kept. Pushing a value that does not beat the root costs one
/// comparison, so a pass over 150k logits for n = 20 is a plain scan.
#[derive(Default)]
pub(crate) struct TopN {
    cap: usize,
    heap: Vec<(f32, u32)>,
}

impl TopN {
    pub(crate) fn reset(&mut self, cap: usize) {
        self.cap = cap;
        self.heap.clear();
        // Grows once to the largest n a request asks for, then is reused.
        self.heap.reserve(cap);
    }

    /// Offers a value; NaN counts as -inf so the order stays total.
    #[inline]
    pub(crate) fn push(&mut self, v: f32, id: u32) {
        let item = (if v.is_nan() { f32::NEG_INFINITY } else { v }, id);
        if self.heap.len() < self.cap {
            self.heap.push(item);
            self.sift_up(self.heap.len() - 1);
        } else if let Some(&root) = self.heap.first() {
            if worse(root, item) {
                self.heap[0] = item;
                self.sift_down(0);
            }
        }
    }

    /// Offers every element of `row`, ids being positions (call after
    /// [`TopN::reset`]).
    pub(crate) fn extend_row(&mut self, row: &[f32]) {
        extend_row(self, row);
    }

    /// The worst value kept (the cap-th best once full).
    #[cfg(test)]
    pub(crate) fn min_value(&self) -> Option<f32> {
        self.heap.first().map(|x| x.0)
    }

    /// The kept items, best first (consumes the heap order).
    pub(crate) fn sorted(&mut self) -> &[(f32, u32)] {
        self.heap.sort_unstable_by(rank_order);
        &self.heap
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if worse(self.heap[i], self.heap[parent]) {
                self.heap.swap(i, parent);
                i = parent;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && worse(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < n && worse(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                break;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }
}

/// True when some element of `x` is `> t` (NaN never is): a lane-wise max
/// and one vector compare, no per-element branch.
#[inline(always)]
fn any_gt(x: &[f32], t: f32) -> bool {
    let (chunks, rem) = x.as_chunks::<16>();
    let mut acc = [f32::NEG_INFINITY; 16];
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    let mut hit = false;
    for &a in &acc {
        hit |= a > t;
    }
    for &v in rem {
        hit |= v > t;
    }
    hit
}

/// Rows are scanned in blocks this long; a block with nothing above the
/// current threshold is skipped after one vectorised check.
const SKIP_BLOCK: usize = 64;

multiversion! { Sampling;
    /// [`TopN::extend_row`]. Once the heap is full only values strictly
    /// above its root can enter (ids only grow along the row, so an equal
    /// value loses the tie-break), and whole blocks below the root are
    /// skipped: for small n the row costs little more than a max pass.
    fn extend_row(t: &mut TopN, row: &[f32]) {
        for (b, block) in row.chunks(SKIP_BLOCK).enumerate() {
            let base = b * SKIP_BLOCK;
            if t.heap.len() < t.cap {
                for (j, &v) in block.iter().enumerate() {
                    t.push(v, (base + j) as u32);
                }
                continue;
            }
            let Some(&(root, _)) = t.heap.first() else {
                // cap 0: nothing is ever kept.
                return;
            };
            if !any_gt(block, root) {
                continue;
            }
            for (j, &v) in block.iter().enumerate() {
                if t.heap.first().is_some_and(|r| v > r.0) {
                    t.push(v, (base + j) as u32);
                }
            }
        }
    }
}

/// True when some element of `x` is `>= t` (NaN never is).
#[inline(always)]
fn any_ge(x: &[f32], t: f32) -> bool {
    let (chunks, rem) = x.as_chunks::<16>();
    let mut acc = [f32::NEG_INFINITY; 16];
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    let mut hit = false;
    for &a in &acc {
        hit |= a >= t;
    }
    for &v in rem {
        hit |= v >= t;
    }
    hit
}

multiversion! { Sampling;
    /// Every (value, id) of `row` with value `>= floor`, in id order.
    /// Branch-free compaction within each block (a write per element, the
    /// length advancing only on a hit): survivors are scattered, so a branch
    /// per element would mispredict often.
    pub(crate) fn collect_at_least(row: &[f32], floor: f32, out: &mut Vec<(f32, u32)>) {
        out.clear();
        for (b, block) in row.chunks(SKIP_BLOCK).enumerate() {
            if !any_ge(block, floor) {
                continue;
            }
            let base = b * SKIP_BLOCK;
            let start = out.len();
            out.resize(start + block.len(), (0.0, 0));
            let dst = &mut out[start..];
            let mut n = 0;
            for (j, &v) in block.iter().enumerate() {
                dst[n] = (v, (base + j) as u32);
                n += usize::from(v >= floor);
            }
            out.truncate(start + n);
        }
    }
}

multiversion! { Sampling;
    /// The `k`-th largest value of `row` (-inf if fewer than `k` values
    /// exceed -inf; NaN must already be mapped to -inf), without sorting or
    /// copying the row: values above a running threshold are buffered, and
    /// whenever the buffer reaches `2k` a quickselect keeps its top `k` and
    /// raises the threshold to the k-th. Values equal to the threshold may
    /// be dropped since they cannot change the k-th value.
    pub(crate) fn kth_largest(row: &[f32], k: usize, buf: &mut Vec<f32>) -> f32 {
        let desc = |a: &f32, b: &f32| b.total_cmp(a);
        buf.clear();
        if k == 0 {
            // Not a meaningful request; keeping everything is the safe answer.
            return f32::NEG_INFINITY;
        }
        let mut threshold = f32::NEG_INFINITY;
        for block in row.chunks(SKIP_BLOCK) {
            if !any_gt(block, threshold) {
                continue;
            }
            for &v in block {
                if v > threshold {
                    buf.push(v);
                }
            }
            if buf.len() >= 2 * k {
                buf.select_nth_unstable_by(k - 1, desc);
                threshold = buf[k - 1];
                buf.truncate(k);
            }
        }
        if buf.len() < k {
            return f32::NEG_INFINITY;
        }
        let (_, kth, _) = buf.select_nth_unstable_by(k - 1, desc);
        *kth
    }
}

/// Top-p over unnormalised probabilities `e` (values in [0, 1], total
/// `total`, `hist` their mass per f32 exponent): fills `cands` with the
/// nucleus, the smallest set of most likely tokens whose mass reaches
/// `p * total`. Tokens of zero weight are never included; at least one
/// token is, when any has weight. The kept tokens come in no particular
/// order.
///
/// vLLM (`apply_top_k_top_p_pytorch`) sorts ascending and masks tokens whose
/// cumulative probability is `<= 1 - p`; in descending order that keeps a
/// token exactly when the mass strictly before it is `< p`, which is the
/// rule here. Instead of sorting the vocabulary, histograms of the weights'
/// bits (exponent, then successive mantissa bytes) narrow down where the
/// running mass crosses `p`: groups above the crossing are kept whole,
/// groups below dropped, and only the final small group is sorted. Sums are
/// f64, so the cut agrees with an exact computation except when the mass
/// before a token is within ~1e-12 of `p`.
pub(crate) fn nucleus(e: &[f32], hist: &ExpHist, total: f64, p: f64, cands: &mut Vec<(f32, u32)>) {
    cands.clear();
    let target = p * total;
    let Some((cut, mass_above)) = crossing(&hist.mass, 1, 0.0, target) else {
        return;
    };
    // Everything in bucket >= cut: the smallest such value is 2^(cut-127).
    collect_at_least(e, f32::from_bits((cut as u32) << 23), cands);
    let (n_above, _) = partition3(cands, 0, |v| exponent_bucket(v).cmp(&cut));
    refine(cands, n_above, mass_above, target, 15);
}

/// Walking `mass` from the highest bucket down (ignoring buckets below
/// `lowest` and empty ones), the bucket where `before` plus the running mass
/// first reaches `target`, with the mass before it. When rounding leaves the
/// total short of the target, the lowest non-empty bucket (so everything is
/// kept). `None` when no bucket has mass.
fn crossing(mass: &[f64; 256], lowest: usize, before: f64, target: f64) -> Option<(usize, f64)> {
    let mut acc = before;
    let mut last = None;
    for (k, &m) in mass.iter().enumerate().skip(lowest).rev() {
        if m <= 0.0 {
            continue;
        }
        if acc + m >= target {
            return Some((k, acc));
        }
        last = Some((k, acc));
        acc += m;
    }
    last
}

/// Top-p over a candidate list (top-k survivors, weights in [0, 1]): keeps
/// the same set as [`nucleus`] would.
pub(crate) fn nucleus_of_list(cands: &mut Vec<(f32, u32)>, p: f64) {
    let total: f64 = cands.iter().map(|&(v, _)| f64::from(v)).sum();
    refine(cands, 0, 0.0, p * total, 23);
}

/// Groups this small are sorted outright.
const SORT_BELOW: usize = 32;

/// Bucket of `v` at a refinement level: 8 bits of its representation from
/// `shift` up (23 = exponent, 15 / 7 = mantissa bytes, 0 = last 7 bits).
#[inline(always)]
fn level_key(v: f32, shift: u32) -> usize {
    ((v.to_bits() >> shift) & 0xFF) as usize
}

/// Reorders `c[start..]` as (key > pivot, key == pivot, key < pivot) and
/// returns the absolute ends of the first two groups.
fn partition3(
    c: &mut [(f32, u32)],
    start: usize,
    cmp: impl Fn(f32) -> std::cmp::Ordering,
) -> (usize, usize) {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let (mut lo, mut mid, mut hi) = (start, start, c.len());
    while mid < hi {
        match cmp(c[mid].0) {
            Greater => {
                c.swap(lo, mid);
                lo += 1;
                mid += 1;
            }
            Equal => mid += 1,
            Less => {
                hi -= 1;
                c.swap(mid, hi);
            }
        }
    }
    (lo, hi)
}

/// `c[..start]` is already kept (mass `before`); `c[start..]` holds the
/// rest of the candidates, all agreeing on the bits above `shift + 8`.
/// Narrows down to the tokens kept by the top-p rule and truncates `c` to
/// exactly the kept set.
fn refine(c: &mut Vec<(f32, u32)>, mut start: usize, mut before: f64, target: f64, mut shift: u32) {
    loop {
        if c.len() - start <= SORT_BELOW || shift == 0 {
            break;
        }
        let mut mass = [0.0f64; 256];
        for &(v, _) in &c[start..] {
            mass[level_key(v, shift)] += f64::from(v);
        }
        let Some((cut, mass_above)) = crossing(&mass, 0, before, target) else {
            // Nothing left has weight.
            c.truncate(start);
            return;
        };
        before = mass_above;
        let (above_end, eq_end) = partition3(c, start, |v| level_key(v, shift).cmp(&cut));
        c.truncate(eq_end);
        start = above_end;
        shift = shift.saturating_sub(8);
    }
    c[start..].sort_unstable_by(rank_order);
    let mut acc = before;
    let mut keep = start;
    for &(v, _) in &c[start..] {
        if (keep > 0 && acc >= target) || v <= 0.0 {
            break;
        }
        acc += f64::from(v);
        keep += 1;
    }
    c.truncate(keep);
}

/// Inverse-CDF draw from a candidate list of (weight, id).
pub(crate) fn draw_from_list(cands: &[(f32, u32)], u: f64) -> Option<u32> {
    let total: f64 = cands.iter().map(|&(v, _)| f64::from(v)).sum();
    let target = u * total;
    let mut acc = 0.0f64;
    for &(v, id) in cands {
        acc += f64::from(v);
        if v > 0.0 && acc > target {
            return Some(id);
        }
    }
    cands.iter().rev().find(|c| c.0 > 0.0).map(|c| c.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::kernels;
    use proptest::prelude::*;

    /// Exact reference: full sort, keep while the mass before is < p.
    fn naive_nucleus(e: &[f32], p: f64) -> (Vec<u32>, f64) {
        let mut all: Vec<(f32, u32)> = e
            .iter()
            .enumerate()
            .filter(|(_, &v)| v > 0.0)
            .map(|(i, &v)| (v, i as u32))
            .collect();
        all.sort_unstable_by(rank_order);
        let total: f64 = all.iter().map(|x| f64::from(x.0)).sum();
        let mut acc = 0.0;
        let mut out = Vec::new();
        let mut margin = f64::INFINITY;
        for &(v, id) in &all {
            margin = margin.min(((acc - p * total) / total).abs());
            if !out.is_empty() && acc >= p * total {
                break;
            }
            acc += f64::from(v);
            out.push(id);
        }
        out.sort_unstable();
        (out, margin)
    }

    #[test]
    fn topn_keeps_best_with_id_tiebreak() {
        let mut t = TopN::default();
        t.reset(3);
        t.extend_row(&[1.0, 5.0, f32::NAN, 5.0, 3.0, 2.0, 3.0]);
        assert_eq!(t.sorted(), &[(5.0, 1), (5.0, 3), (3.0, 4)]);
        t.reset(0);
        t.extend_row(&[1.0]);
        assert!(t.sorted().is_empty());
    }

    #[test]
    fn nucleus_hand_example() {
        // Probabilities 0.25, 0.5, 0.25: exact in binary, so the cut is
        // exact. Ties between ids 0 and 2 go to the smaller id.
        let e = [0.5f32, 1.0, 0.5];
        let mut hist = ExpHist::new();
        for &v in &e {
            hist.mass[kernels::exponent_bucket(v)] += f64::from(v);
        }
        let total: f64 = e.iter().map(|&v| f64::from(v)).sum();
        let mut c = Vec::new();
        for (p, want) in [
            (0.5, vec![1]),
            (0.6, vec![0, 1]),
            (0.75, vec![0, 1]),
            (0.76, vec![0, 1, 2]),
        ] {
            nucleus(&e, &hist, total, p, &mut c);
            let mut got: Vec<u32> = c.iter().map(|x| x.1).collect();
            got.sort_unstable();
            assert_eq!(got, want, "p = {p}");
            let mut list: Vec<(f32, u32)> =
                e.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
            nucleus_of_list(&mut list, p);
            let mut got: Vec<u32> = list.iter().map(|x| x.1).collect();
            got.sort_unstable();
            assert_eq!(got, want, "list, p = {p}");
        }
        // p <= 0 still keeps the most likely token.
        nucleus(&e, &hist, total, 0.0, &mut c);
        assert_eq!(c.iter().map(|x| x.1).collect::<Vec<_>>(), vec![1]);
    }

    proptest! {
        #[test]
        fn nucleus_matches_full_sort(
            logits in prop::collection::vec(-12.0f32..4.0, 1..3000),
            p in 0.01f64..1.0,
        ) {
            let m = kernels::max(&logits);
            let mut e = logits.clone();
            let mut hist = ExpHist::new();
            let mut sums = Vec::new();
            let total = kernels::exp_in_place(&mut e, m, f32::NEG_INFINITY, 0.0, &mut sums, Some(&mut hist));
            let (want, margin) = naive_nucleus(&e, p);
            // Skip draws where p sits within rounding of a cumulative sum.
            prop_assume!(margin > 1e-9);
            let mut c = Vec::new();
            nucleus(&e, &hist, total, p, &mut c);
            let mut got: Vec<u32> = c.iter().map(|x| x.1).collect();
            got.sort_unstable();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn nucleus_of_list_matches_full_sort_with_ties(
            // Few distinct weights: many exact ties, so refinement runs down
            // to the last level and the id tie-break decides the cut.
            picks in prop::collection::vec(0usize..6, 1..400),
            p in 0.0f64..1.0,
        ) {
            const W: [f32; 6] = [1.0, 0.75, 0.5, 0.125, 0.1, 0.0];
            let e: Vec<f32> = picks.iter().map(|&i| W[i]).collect();
            let (want, margin) = naive_nucleus(&e, p);
            prop_assume!(margin > 1e-9);
            let mut list: Vec<(f32, u32)> = e.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
            nucleus_of_list(&mut list, p);
            let mut got: Vec<u32> = list.iter().map(|x| x.1).collect();
            got.sort_unstable();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn kth_largest_agrees_with_heap(
            row in prop::collection::vec(-5.0f32..5.0, 1..500),
            k in 1usize..500,
        ) {
            let k = k.min(row.len());
            let mut t = TopN::default();
            t.reset(k);
            t.extend_row(&row);
            let mut s = Vec::new();
            prop_assert_eq!(t.min_value(), Some(kth_largest(&row, k, &mut s)));
        }
    }
}
