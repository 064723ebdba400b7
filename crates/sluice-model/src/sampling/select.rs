//! Partial selection: the best `n` of a vocabulary-sized row without sorting
//! it, and the top-p nucleus without sorting more than its boundary.
//!
//! Order everywhere: larger value first, equal values by smaller token id.
//! The id tie-break makes every result a function of the input alone, not of
//! the (unstable) sort or selection algorithm std happens to use.

use super::kernels::{exponent_bucket, ExpHist};
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

    /// Offers every element of `row`, ids being positions.
    pub(crate) fn extend_row(&mut self, row: &[f32]) {
        for (i, &v) in row.iter().enumerate() {
            self.push(v, i as u32);
        }
    }

    /// The worst value kept (the cap-th best once full).
    pub(crate) fn min_value(&self) -> Option<f32> {
        self.heap.first().map(|x| x.0)
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// The kept items, best first (consumes the heap order).
    pub(crate) fn sorted(&mut self) -> &[(f32, u32)] {
        self.heap.sort_unstable_by(rank_order);
        &self.heap
    }

    /// The kept items in heap order.
    pub(crate) fn items(&self) -> &[(f32, u32)] {
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

/// Largest `k` for which the top-k threshold comes from a heap; beyond it a
/// linear-time selection on a copy of the row is cheaper than `V log k`.
pub(crate) const HEAP_TOP_K_LIMIT: usize = 1024;

/// The `k`-th largest value of `row` (1 <= k <= row.len(); NaN must already
/// be mapped to -inf) by quickselect on `scratch`.
pub(crate) fn kth_largest_select(row: &[f32], k: usize, scratch: &mut Vec<f32>) -> f32 {
    scratch.clear();
    scratch.extend_from_slice(row);
    let Some(idx) = k.checked_sub(1).filter(|&i| i < scratch.len()) else {
        return f32::NEG_INFINITY;
    };
    let (_, kth, _) = scratch.select_nth_unstable_by(idx, |a, b| b.total_cmp(a));
    *kth
}

/// Top-p over unnormalised probabilities `e` (values in [0, 1], total
/// `total`, `hist` their mass per f32 exponent): fills `cands` with the
/// nucleus, the smallest set of most likely tokens whose mass reaches
/// `p * total`, and returns it. Tokens of zero weight are never included; at
/// least one token is, when any has weight.
///
/// vLLM (`apply_top_k_top_p_pytorch`) sorts ascending and masks tokens whose
/// cumulative probability is `<= 1 - p`; in descending order that keeps a
/// token exactly when the mass strictly before it is `< p`, which is the
/// rule below. Instead of sorting the vocabulary, the exponent histogram
/// locates the bucket where the running mass crosses `p`: buckets above it
/// are kept whole, buckets below dropped, and only the boundary bucket's
/// tokens are sorted. Sums are f64, so the cut agrees with an exact
/// computation except when the mass before a token is within ~1e-12 of `p`.
pub(crate) fn nucleus(e: &[f32], hist: &ExpHist, total: f64, p: f64, cands: &mut Vec<(f32, u32)>) {
    cands.clear();
    let target = p * total;
    // Bucket where the running mass (from the top) reaches the target, and
    // the mass of the buckets above it.
    let mut cut = None;
    let mut above = 0.0f64;
    for b in (1..256).rev() {
        let m = hist.mass[b];
        if m <= 0.0 {
            continue;
        }
        cut = Some((b, above));
        if above + m >= target {
            break;
        }
        above += m;
    }
    let Some((cut, mass_above)) = cut else {
        return;
    };
    for (i, &v) in e.iter().enumerate() {
        if v > 0.0 && exponent_bucket(v) >= cut {
            cands.push((v, i as u32));
        }
    }
    // Tokens above the boundary bucket first (kept whatever their order),
    // then the boundary bucket, sorted.
    let mut n_above = 0;
    for j in 0..cands.len() {
        if exponent_bucket(cands[j].0) > cut {
            cands.swap(j, n_above);
            n_above += 1;
        }
    }
    cands[n_above..].sort_unstable_by(rank_order);
    let mut acc = mass_above;
    let mut keep = n_above;
    for &(v, _) in &cands[n_above..] {
        if keep > 0 && acc >= target {
            break;
        }
        acc += f64::from(v);
        keep += 1;
    }
    cands.truncate(keep);
}

/// Top-p over a short candidate list (top-k survivors): sorts it and keeps
/// the same prefix as [`nucleus`].
pub(crate) fn nucleus_of_list(cands: &mut Vec<(f32, u32)>, p: f64) {
    cands.sort_unstable_by(rank_order);
    let total: f64 = cands.iter().map(|&(v, _)| f64::from(v)).sum();
    let target = p * total;
    let mut acc = 0.0f64;
    let mut keep = 0;
    for &(v, _) in cands.iter() {
        if keep > 0 && acc >= target {
            break;
        }
        acc += f64::from(v);
        keep += 1;
    }
    cands.truncate(keep);
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
        fn kth_largest_agrees_with_heap(
            row in prop::collection::vec(-5.0f32..5.0, 1..500),
            k in 1usize..500,
        ) {
            let k = k.min(row.len());
            let mut t = TopN::default();
            t.reset(k);
            t.extend_row(&row);
            let mut s = Vec::new();
            prop_assert_eq!(t.min_value(), Some(kth_largest_select(&row, k, &mut s)));
        }
    }
}
