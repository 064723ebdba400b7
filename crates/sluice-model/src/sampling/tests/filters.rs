//! Greedy, temperature, top-k, top-p and min-p: each keeps the tokens it
//! should, in proportion (chi-square against an f64 softmax).

use super::*;

#[test]
fn greedy_is_argmax() {
    let mut s = sampler(SamplingParams::greedy(16));
    let mut row = LOGITS8;
    assert_eq!(s.sample(&mut row, &[]).token, 3);
    // First of tied maxima, as torch.argmax.
    let mut row = [0.0, 4.0, 1.0, 4.0];
    assert_eq!(s.sample(&mut row, &[]).token, 1);
}

#[test]
fn temperature_shapes_the_distribution() {
    // 8 cells = 7 degrees of freedom: P(chi2 > 40) ≈ 1.6e-6, so a correct
    // sampler is nowhere near the bound while a wrong temperature (which
    // moves several cells by hundreds of counts) is far above it.
    for t in [0.7f32, 1.0, 1.6] {
        let mut s = sampler(random(t));
        let counts = histogram(&mut s, &LOGITS8, 40_000);
        let chi = chi_square(&counts, &softmax(&LOGITS8, f64::from(t)));
        assert!(
            chi < 40.0,
            "temperature {t}: chi-square {chi}, counts {counts:?}"
        );
        // And a neighbouring temperature is clearly rejected.
        let wrong = chi_square(&counts, &softmax(&LOGITS8, f64::from(t) * 1.3));
        assert!(
            wrong > 200.0,
            "temperature {t}: wrong-shape chi-square only {wrong}"
        );
    }
}

#[test]
fn top_k_one_equals_greedy() {
    let mut s = sampler(SamplingParams {
        top_k: 1,
        ..random(1.5)
    });
    let mut g = sampler(SamplingParams::greedy(16));
    let mut outputs = Vec::new();
    for i in 0..50 {
        let logits: Vec<f32> = (0..100)
            .map(|j| ((i * 31 + j * 17) % 97) as f32 * 0.1)
            .collect();
        let (mut a, mut b) = (logits.clone(), logits.clone());
        let t = s.sample(&mut a, &outputs).token;
        assert_eq!(t, g.sample(&mut b, &outputs).token);
        assert_eq!(t as usize, argmax_naive(&logits));
        outputs.push(t);
    }
}

#[test]
fn top_k_keeps_k_tokens_in_proportion() {
    let mut s = sampler(SamplingParams {
        top_k: 3,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &LOGITS8, 20_000);
    // Top 3: ids 3 (3.0), 6 (2.5), 1 (2.0), renormalised.
    let mut kept = LOGITS8;
    for (i, x) in kept.iter_mut().enumerate() {
        if ![1, 3, 6].contains(&i) {
            *x = f32::NEG_INFINITY;
        }
    }
    let chi = chi_square(&counts, &softmax(&kept, 1.0));
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn top_k_keeps_ties_at_the_kth_value() {
    // k = 2 but three tokens share the 2nd largest value: all survive
    // (vLLM's `logits < kth_value` mask), and the heap shortcut must not
    // drop the third.
    let logits = [5.0f32, 4.0, 4.0, 4.0, 0.0];
    let mut s = sampler(SamplingParams {
        top_k: 2,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &logits, 20_000);
    let mut kept = logits;
    kept[4] = f32::NEG_INFINITY;
    let chi = chi_square(&counts, &softmax(&kept, 1.0));
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn large_top_k_uses_selection_and_masks_the_rest() {
    // k above the heap limit: the k-th value comes from quickselect.
    let v = 5000;
    let logits: Vec<f32> = (0..v).map(|i| ((i * 7919) % v) as f32 / 1000.0).collect();
    let k = 2000;
    let mut sorted = logits.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[k - 1];
    let mut s = sampler(SamplingParams {
        top_k: k as i32,
        ..random(0.2)
    });
    let mut outputs = Vec::new();
    for _ in 0..300 {
        let mut row = logits.clone();
        let t = s.sample(&mut row, &outputs).token;
        assert!(logits[t as usize] >= kth);
        outputs.push(t);
    }
}

#[test]
fn tiny_top_p_keeps_only_the_max() {
    for top_k in [0, 5] {
        let mut s = sampler(SamplingParams {
            top_p: 1e-6,
            top_k,
            ..random(2.0)
        });
        let counts = histogram(&mut s, &LOGITS8, 500);
        assert_eq!(counts[3], 500, "top_k {top_k}: {counts:?}");
    }
}

#[test]
fn top_p_keeps_the_nucleus_in_proportion() {
    // Probabilities 0.5, 0.25, 0.125, 0.125 (exact in binary). With p = 0.7
    // the mass before token 2 is 0.75 >= 0.7, so tokens 0 and 1 remain.
    let logits = [
        0.0f32,
        -std::f32::consts::LN_2,
        -2.0 * std::f32::consts::LN_2,
        -2.0 * std::f32::consts::LN_2,
    ];
    let mut s = sampler(SamplingParams {
        top_p: 0.7,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &logits, 20_000);
    let chi = chi_square(&counts, &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]);
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn min_p_drops_tokens_below_the_fraction_of_the_max() {
    // Probabilities ∝ 1, 0.5, 0.25, 0.1: min_p = 0.3 keeps the first two.
    let logits = [0.0f32, 0.5f32.ln(), 0.25f32.ln(), 0.1f32.ln()];
    let mut s = sampler(SamplingParams {
        min_p: 0.3,
        ..random(1.0)
    });
    let counts = histogram(&mut s, &logits, 20_000);
    let chi = chi_square(&counts, &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]);
    assert!(chi < 40.0, "chi-square {chi}, counts {counts:?}");
}

#[test]
fn min_p_applies_before_top_p() {
    // p = 0.5, 0.3, 0.2. min_p 0.5 leaves {0, 1} renormalised to 0.625 /
    // 0.375; top_p 0.6 then keeps token 0 alone. (Top-p first would keep
    // {0, 1}: the order is vLLM's and it matters.)
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    for top_k in [0, 2] {
        let mut s = sampler(SamplingParams {
            min_p: 0.5,
            top_p: 0.6,
            top_k,
            ..random(1.0)
        });
        assert_eq!(
            histogram(&mut s, &logits, 300),
            vec![300, 0, 0],
            "top_k {top_k}"
        );
    }
}
