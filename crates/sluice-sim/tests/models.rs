//! The step-time models: fitted, table, roofline with tensor parallelism
//! and experts, KV sizing, model shapes from files, profiles.

use proptest::prelude::*;
use sluice_arch::LayeredShape;
use sluice_core::kv_cache::{AttentionKind, GroupingPolicy};
use sluice_core::SchedulerConfig;
use sluice_gguf::{GgmlType, GgufWriter};
use sluice_sim::fit::{
    fit, parse_step_log, read_step_log, FitError, FitOptions, Segmentation, StepFeatures,
    FEATURE_NAMES,
};
use sluice_sim::model_config::ModelConfigError;
use sluice_sim::profile::{FittedProfile, Profile, ProfileError, RooflineProfile, TableProfile};
use sluice_sim::roofline::{
    kv_cache_budget, kv_cache_budget_grouped, num_gpu_blocks, RooflineError,
};
use sluice_sim::steplog::StepRecord;
use sluice_sim::table::TableModel;
use sluice_sim::{
    Hardware, ModelShape, RandomWorkload, Rng, Roofline, RowShape, Simulator, StepShape,
    StepTimeModel,
};
use std::path::Path;

// ---------------------------------------------------------------- fitting

/// The coefficients a synthetic log is generated from, in
/// `FEATURE_NAMES` order: about a 7B model on one H100 (2.5e-5 s per
/// token of GEMMs, 6e-10 s per query-key pair of prefill attention).
const TRUE: [f64; 7] = [4e-3, 2.5e-5, 1.5e-5, 2e-5, 6e-10, 3e-8, 3e-5];

fn decode(context: usize) -> RowShape {
    RowShape {
        new_tokens: 1,
        context_before: context,
        samples: true,
        shared_context: 0,
    }
}

/// A varied step: decode rows, prefill chunks of 1 to 2048 tokens
/// (finishing or not), or both, so that rows, decode tokens and sampling
/// rows vary apart from one another.
fn random_step(rng: &mut Rng) -> StepShape {
    let mut rows = Vec::new();
    let kind = rng.range_inclusive(0, 2);
    if kind != 1 {
        for _ in 0..rng.range_inclusive(1, 64) {
            rows.push(decode(rng.range_inclusive(16, 4000)));
        }
    }
    if kind != 0 {
        for _ in 0..rng.range_inclusive(1, 16) {
            let scale = 1 << rng.range_inclusive(0, 11);
            rows.push(RowShape {
                new_tokens: rng.range_inclusive(scale.max(2) / 2, scale),
                context_before: rng.range_inclusive(0, 8000),
                samples: rng.range_inclusive(0, 1) == 1,
                shared_context: 0,
            });
        }
    }
    StepShape { rows }
}

/// A step log whose times follow `time(features)` times a deterministic
/// noise of at most ±`noise` (relative).
fn synthetic_log(
    n: usize,
    seed: u64,
    noise: f64,
    time: impl Fn(&StepFeatures) -> f64,
) -> Vec<StepRecord> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let shape = random_step(&mut rng);
            let t = time(&StepFeatures::of(&shape)) * (1.0 + noise * (2.0 * rng.f64() - 1.0));
            StepRecord {
                step: i as u64,
                t_s: i as f64 * 0.02,
                forward_s: 0.9 * t,
                step_s: t,
                ..StepRecord::from_shape(&shape, 16)
            }
        })
        .collect()
}

fn linear(c: [f64; 7]) -> impl Fn(&StepFeatures) -> f64 {
    move |f| c.iter().zip(f.as_array()).map(|(c, x)| c * x).sum()
}

#[test]
fn the_fit_recovers_known_coefficients() {
    let log = synthetic_log(3000, 7, 0.005, linear(TRUE));
    let options = FitOptions {
        segmentations: vec![Segmentation::Single],
        ..FitOptions::default()
    };
    let report = fit(&log, &options).unwrap();
    assert_eq!((report.train_steps, report.held_out_steps), (2400, 600));
    let got = report.model.pieces[0].coefficients.as_array();
    let rel = |i: usize| (got[i] - TRUE[i]).abs() / TRUE[i];
    // What the data pin down tightly: the fixed cost, the per-token and
    // per-pair costs, and the cost of one decode row as a whole.
    for i in [0, 1, 4, 5] {
        assert!(
            rel(i) < 0.02,
            "{}: {} vs {}",
            FEATURE_NAMES[i],
            got[i],
            TRUE[i]
        );
    }
    let decode_row = |c: &[f64]| c[2] + c[3] + c[6];
    let r = (decode_row(&got) - decode_row(&TRUE)).abs() / decode_row(&TRUE);
    assert!(r < 0.02, "one decode row: {got:?}");
    // How it splits between decode token, row and sampling row is seen
    // only through the prefill rows' counts (a decode row is all three),
    // against ±0.5 % noise on steps of tens of milliseconds: looser.
    for i in [2, 3, 6] {
        assert!(
            rel(i) < 0.15,
            "{}: {} vs {}",
            FEATURE_NAMES[i],
            got[i],
            TRUE[i]
        );
    }
    // ±0.5 % uniform noise: a mean absolute error of about 0.25 %.
    assert!(report.held_out_mape_pct < 0.5, "{report:?}");
    assert!(report.held_out_p90_ape_pct < 0.75, "{report:?}");
    assert!(report.held_out_median_ape_pct <= report.held_out_p90_ape_pct);
    assert!(report.held_out_r2.unwrap() > 0.99);
}

#[test]
fn the_fit_reads_the_target_asked_for() {
    let log = synthetic_log(300, 8, 0.0, linear(TRUE));
    let options = FitOptions {
        target: sluice_sim::fit::FitTarget::ForwardS,
        segmentations: vec![Segmentation::Single],
        ..FitOptions::default()
    };
    let report = fit(&log, &options).unwrap();
    // forward_s is 0.9 × step_s in the synthetic log.
    let got = report.model.pieces[0].coefficients.intercept_s;
    assert!((got - 0.9 * TRUE[0]).abs() < 1e-3 * TRUE[0], "{got}");
}

#[test]
fn piecewise_by_phase_is_chosen_when_decode_and_prefill_steps_differ() {
    // Decode-only steps run as a CUDA graph (a larger fixed cost, cheaper
    // per row); steps with prefill run eagerly. No single linear model
    // fits both.
    let decode_only = [8e-3, 0.0, 5e-6, 0.0, 0.0, 1e-8, 1e-6];
    let mixed = [2e-3, 6e-5, 4e-5, 2e-5, 2e-10, 8e-8, 3e-5];
    let time = move |f: &StepFeatures| {
        if f.decode_only {
            linear(decode_only)(f)
        } else {
            linear(mixed)(f)
        }
    };
    let log = synthetic_log(1500, 9, 0.01, time);
    let report = fit(&log, &FitOptions::default()).unwrap();
    assert_eq!(
        report.model.segmentation,
        Segmentation::ByPhase,
        "{report:?}"
    );
    let scores: Vec<_> = report.candidates.iter().map(|c| c.segmentation).collect();
    assert_eq!(scores, Segmentation::ALL.to_vec());
    let single = fit(
        &log,
        &FitOptions {
            segmentations: vec![Segmentation::Single],
            ..FitOptions::default()
        },
    )
    .unwrap();
    assert!(
        report.held_out_mape_pct < 0.5 * single.held_out_mape_pct,
        "by_phase {} vs single {}",
        report.held_out_mape_pct,
        single.held_out_mape_pct
    );
    assert!(report.held_out_mape_pct < 1.5);
    // The pieces carry their phases.
    let phases: Vec<_> = report.model.pieces.iter().map(|p| p.decode_only).collect();
    assert_eq!(phases, vec![Some(true), Some(false)]);
}

#[test]
fn a_single_model_is_kept_when_pieces_do_not_help() {
    let log = synthetic_log(1000, 10, 0.0, linear(TRUE));
    let report = fit(&log, &FitOptions::default()).unwrap();
    // Exact data: every segmentation fits it, and the simplest wins ties
    // or near-ties; whichever is chosen predicts held-out steps exactly.
    assert!(report.held_out_mape_pct < 0.01, "{report:?}");
}

#[test]
fn too_few_steps_is_an_error_not_a_fit() {
    let log = synthetic_log(6, 11, 0.0, linear(TRUE));
    match fit(&log, &FitOptions::default()) {
        Err(FitError::TooFewSteps { usable: 6, .. }) => {}
        other => panic!("{other:?}"),
    }
    let bad = FitOptions {
        held_out_every: 1,
        ..FitOptions::default()
    };
    assert!(matches!(fit(&log, &bad), Err(FitError::BadOption(_))));
}

#[test]
fn warm_up_and_zero_times_are_skipped() {
    let mut log = synthetic_log(200, 12, 0.0, linear(TRUE));
    log[0].step_s = 5.0; // compilation
    log[50].step_s = 0.0;
    let options = FitOptions {
        skip_first_steps: 1,
        ..FitOptions::default()
    };
    let report = fit(&log, &options).unwrap();
    assert_eq!(report.skipped_steps, 2);
    assert_eq!(report.train_steps + report.held_out_steps, 198);
    assert!(report.held_out_mape_pct < 0.01);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the times (here random, unrelated to the features, so
    /// unconstrained least squares would make some costs negative), every
    /// coefficient is non-negative and every prediction positive.
    #[test]
    fn nnls_never_goes_negative(seed in 0u64..1_000_000, n in 20usize..120) {
        let mut rng = Rng::new(seed);
        let mut log = synthetic_log(n, seed, 0.0, linear(TRUE));
        for r in &mut log {
            r.step_s = 1e-4 + rng.f64() * 0.1;
        }
        let report = fit(&log, &FitOptions::default()).unwrap();
        for p in &report.model.pieces {
            for c in p.coefficients.as_array() {
                prop_assert!(c >= 0.0 && c.is_finite(), "{:?}", p.coefficients);
            }
        }
        prop_assert!(report.model.validate().is_ok());
        let mut rng = Rng::new(seed ^ 1);
        for _ in 0..20 {
            let t = report.model.step_time(&random_step(&mut rng));
            prop_assert!(t > 0.0 && t.is_finite());
        }
        prop_assert!(report.model.step_time(&StepShape::default()) > 0.0);
    }
}

#[test]
fn a_step_log_error_names_the_line_and_field() {
    let good = serde_json::to_string(&StepRecord::from_shape(
        &StepShape {
            rows: vec![decode(10)],
        },
        16,
    ))
    .unwrap();
    let text = format!(
        "{good}\n\n{}\n",
        good.replace("\"step_s\":0.0", "\"step_s\":\"slow\"")
    );
    let err = parse_step_log(&text, "steps.jsonl")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("steps.jsonl line 3: field `step_s`:"),
        "{err}"
    );
    let text = format!(
        "{good}\n{}",
        good.replace("\"num_reqs\":1", "\"num_reqs\":4")
    );
    let err = parse_step_log(&text, "steps.jsonl")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2: field `rows`: 1 rows but `num_reqs` is 4"),
        "{err}"
    );
    let err = parse_step_log("{not json", "s.jsonl")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("s.jsonl line 1:"), "{err}");
    assert_eq!(parse_step_log(&good, "s").unwrap().len(), 1);
}

// ------------------------------------------------------------------ table

fn table() -> TableModel {
    TableModel::from_json_str(
        r#"{"prefill": {"chunk_tokens": [256, 1024], "context": [0, 4096],
                        "time_s": [[0.020, 0.030], [0.060, 0.080]]},
            "decode": {"batch_size": [1, 16, 64], "mean_context": [512, 4096],
                       "time_s": [[0.010, 0.012], [0.013, 0.018], [0.020, 0.040]]},
            "step_overhead_s": 0.004}"#,
        "t.json",
    )
    .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn the_table_returns_its_grid_points() {
    let t = table();
    assert!(close(t.prefill_time(256.0, 0.0), 0.020));
    assert!(close(t.prefill_time(1024.0, 4096.0), 0.080));
    assert!(close(t.decode_time(16.0, 4096.0), 0.018));
    assert!(close(t.decode_time(64.0, 512.0), 0.020));
}

#[test]
fn the_table_interpolates_between_and_holds_or_extrapolates_outside() {
    let t = table();
    // The centre of a cell is the mean of its corners.
    assert!(close(
        t.prefill_time(640.0, 2048.0),
        (0.020 + 0.030 + 0.060 + 0.080) / 4.0
    ));
    // Along one axis, linear.
    assert!(close(
        t.decode_time(40.0, 512.0),
        0.013 + 0.5 * (0.020 - 0.013)
    ));
    // Below the first point: held.
    assert!(close(t.prefill_time(10.0, 0.0), 0.020));
    assert!(close(t.decode_time(1.0, 100.0), 0.010));
    // Past the last point: the last segment's slope, 0.040 s per 768
    // tokens at context 0.
    assert!(close(t.prefill_time(1792.0, 0.0), 0.100));
}

#[test]
fn a_mixed_step_pays_the_overhead_once() {
    let t = table();
    let prefill = RowShape {
        new_tokens: 256,
        context_before: 0,
        samples: true,
        shared_context: 0,
    };
    // 16 decode rows at context 4095 + 1.
    let decodes = vec![decode(4095); 16];
    let only_prefill = StepShape {
        rows: vec![prefill],
    };
    let only_decode = StepShape {
        rows: decodes.clone(),
    };
    let mut mixed = decodes;
    mixed.push(prefill);
    let mixed = StepShape { rows: mixed };
    assert!(close(t.step_time(&only_prefill), 0.020));
    assert!(close(t.step_time(&only_decode), 0.018));
    assert!(close(t.step_time(&mixed), 0.020 + 0.018 - 0.004));
    assert!(close(t.step_time(&StepShape::default()), 0.004));
    // Two prefill rows merge into one chunk at their weighted context:
    // 512 tokens at (256·0 + 256·4096) / 512 = 2048.
    let two = StepShape {
        rows: vec![
            prefill,
            RowShape {
                context_before: 4096,
                ..prefill
            },
        ],
    };
    assert!(close(t.step_time(&two), t.prefill_time(512.0, 2048.0)));
}

#[test]
fn malformed_tables_name_the_field() {
    let cases = [
        (
            r#"{"prefill": {"chunk_tokens": [256, 256], "context": [0], "time_s": [[1], [2]]},
                "decode": {"batch_size": [1], "mean_context": [1], "time_s": [[1]]}}"#,
            "`prefill.chunk_tokens`: not strictly increasing at index 1",
        ),
        (
            r#"{"prefill": {"chunk_tokens": [256, 512], "context": [0, 10], "time_s": [[1, 2], [2]]},
                "decode": {"batch_size": [1], "mean_context": [1], "time_s": [[1]]}}"#,
            "`prefill.time_s[1]`: 1 values, expected 2 (one per `context` value)",
        ),
        (
            r#"{"prefill": {"chunk_tokens": [256], "context": [0], "time_s": [[1]]},
                "decode": {"batch_size": [1, 2], "mean_context": [1], "time_s": [[1]]}}"#,
            "`decode.time_s`: 1 rows, expected 2 (one per `batch_size` value)",
        ),
        (
            r#"{"prefill": {"chunk_tokens": [256], "context": [0], "time_s": [[-1]]},
                "decode": {"batch_size": [1], "mean_context": [1], "time_s": [[1]]}}"#,
            "`prefill.time_s[0][0]`: -1",
        ),
        (
            r#"{"prefill": {"chunk_tokens": [256], "context": [0], "time_s": [[1]]},
                "decode": {"batch_size": [1], "mean_context": ["x"], "time_s": [[1]]}}"#,
            "field `decode.mean_context[0]`: invalid type",
        ),
        (
            r#"{"prefill": {"chunk_tokens": [256], "context": [0], "time_s": [[1]]}}"#,
            "missing field `decode`",
        ),
        (
            r#"{"prefill": {"chunk_tokens": [256], "context": [0], "time_s": [[1]], "ctx": 1},
                "decode": {"batch_size": [1], "mean_context": [1], "time_s": [[1]]}}"#,
            "field `prefill.ctx`: unknown field `ctx`",
        ),
    ];
    for (text, want) in cases {
        let err = TableModel::from_json_str(text, "t.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("t.json: ") && err.contains(want),
            "{err}\nwant {want}"
        );
    }
}

// --------------------------------------------------------------- roofline

fn decode_batch(n: usize, context: usize) -> StepShape {
    StepShape {
        rows: vec![decode(context); n],
    }
}

#[test]
fn tensor_parallel_two_is_faster_for_large_batches_and_pays_all_reduces() {
    let m = ModelShape::LLAMA_3_1_70B;
    let h = Hardware::H100_SXM;
    let tp1 = Roofline::new(m, h);
    let tp2 = Roofline::with_tensor_parallel(m, h, 2).unwrap();
    let big = decode_batch(256, 2048);
    let prefill = StepShape {
        rows: vec![RowShape {
            new_tokens: 4096,
            context_before: 0,
            samples: true,
            shared_context: 0,
        }],
    };
    for step in [&big, &prefill] {
        assert!(tp2.step_time(step) < tp1.step_time(step));
        // Faster, but not twice as fast: the all-reduces cost.
        assert!(tp2.step_time(step) > 0.5 * tp1.step_time(step));
        assert_eq!(tp1.collective_s(step), 0.0);
        assert!(tp2.collective_s(step) > 0.0);
        // With a free interconnect the difference is exactly that cost.
        let free = Roofline::with_tensor_parallel(
            m,
            Hardware {
                interconnect_bandwidth: f64::INFINITY,
                collective_latency_s: 0.0,
                ..h
            },
            2,
        )
        .unwrap();
        let diff = tp2.step_time(step) - free.step_time(step);
        assert!((diff - tp2.collective_s(step)).abs() < 1e-12);
    }
    // 161 all-reduces of 256 × 8192 × 2 bytes at 900/2 × 0.8 GB/s plus
    // 8 µs each.
    let one = 8e-6 + 2.0 * 0.5 * (256.0 * 8192.0 * 2.0) / (450e9 * 0.8);
    assert!((tp2.collective_s(&big) - 161.0 * one).abs() < 1e-12);
    // PCIe (L40S) all-reduces cost more than NVLink ones.
    let l40s = Roofline::with_tensor_parallel(m, Hardware::L40S, 2).unwrap();
    assert!(l40s.collective_s(&big) > tp2.collective_s(&big));
}

#[test]
fn moe_weight_reads_grow_with_tokens_and_stop_at_all_experts() {
    let m = ModelShape::MIXTRAL_8X7B;
    assert!(m.is_moe());
    assert_eq!(m.expected_experts_touched(0), 0.0);
    assert!((m.expected_experts_touched(1) - 2.0).abs() < 1e-12);
    // Two tokens: 8 · (1 − (3/4)²) = 3.5.
    assert!((m.expected_experts_touched(2) - 3.5).abs() < 1e-12);
    let expert = 3.0 * 4096.0 * 14336.0 * 2.0;
    let mut last = 0.0;
    for t in [1, 2, 3, 5, 8, 16, 64, 512, 100_000] {
        let b = m.moe_weight_bytes_read(t, 1);
        assert!(b >= last, "{t}");
        assert!(b <= 8.0 * expert + 1e-3);
        last = b;
    }
    assert!((last - 8.0 * expert).abs() < 1e-3 * expert);
    // Sharded: each GPU reads its half of each expert.
    assert!((m.moe_weight_bytes_read(1, 2) - expert).abs() < 1e-6);
    // A dense model touches no experts.
    assert_eq!(ModelShape::LLAMA_3_1_8B.expected_experts_touched(64), 0.0);
    // A one-row Mixtral decode reads ~2 experts a layer, so it is faster
    // than a dense model of all 8 experts' size would be.
    let r = Roofline::new(m, Hardware::H100_SXM);
    let all_experts = Roofline::new(
        ModelShape {
            intermediate: 8 * 14336,
            num_experts: 0,
            experts_per_token: 0,
            ..m
        },
        Hardware::H100_SXM,
    );
    let one = decode_batch(1, 1000);
    assert!(r.step_time(&one) < 0.5 * all_experts.step_time(&one));
    // Step time grows with the batch.
    assert!(r.step_time(&decode_batch(8, 1000)) > r.step_time(&one));
}

#[test]
fn kv_blocks_by_hand() {
    // A made-up GPU: 100 GB, 0.5 of it, a 1 GB reserve; Llama 3.1 8B's
    // 16.06 GB of weights at tp 1: 50 − 16.060522496 − 1 = 32.939477504
    // GB; a block of 16 tokens × 128 KiB = 2 MiB → 15706 blocks.
    let h = Hardware {
        memory_bytes: 100e9,
        activation_reserve_bytes: 1e9,
        ..Hardware::H100_SXM
    };
    let m = ModelShape::LLAMA_3_1_8B;
    let b = kv_cache_budget(&m, &h, 1, 0.5, 16).unwrap();
    assert_eq!(b.requested_bytes, 50e9);
    assert_eq!(b.weight_bytes_per_gpu, 16_060_522_496.0);
    assert_eq!(b.bytes_per_block, 2_097_152);
    assert_eq!(b.num_blocks, 32_939_477_504 / 2_097_152);
    assert_eq!(b.num_blocks, 15_706);
    // tp 2: half the weights and half of each block per GPU.
    let b2 = kv_cache_budget(&m, &h, 2, 0.5, 16).unwrap();
    assert_eq!(b2.bytes_per_block, 1_048_576);
    assert_eq!(
        b2.num_blocks,
        (50e9 - 8_030_261_248.0 - 1e9) as usize / 1_048_576
    );
    // The built-in H100: ⌈85,520,809,984 × 0.9⌉ − 16,060,522,496 − 2 GiB
    // = 58,760,722,842 bytes → 28019 blocks.
    assert_eq!(
        num_gpu_blocks(&m, &Hardware::H100_SXM, 1, 0.9, 16).unwrap(),
        28_019
    );
}

#[test]
fn hybrid_kv_blocks_by_hand() {
    // vLLM 0.33 on Gemma 3 270M (`get_kv_cache_config_from_groups`): one
    // page is 16 tokens × K and V × 1 KV head × 256 × 2 bytes = 16 KiB;
    // its 15 sliding and 3 full layers form six groups of 3
    // (`_get_kv_cache_groups_uniform_page_size`), so a block of the shared
    // pool is 3 pages (the largest group's), 49,152 bytes. Weights: per
    // layer 640·(1024 + 2·256) + 1024·640 attention + 3·640·2048 MLP +
    // 2·640 norms = 5,571,840; × 18 + 262,144·640 tied embedding + 640 =
    // 268,065,920 parameters, 536,131,840 bytes. On 100 GB × 0.5 with a
    // 1 GB reserve: 48,463,868,160 bytes → 985,999 blocks. Without the
    // hybrid manager one full group of 18 layers: 294,912 bytes a block,
    // 164,333 blocks, a sixth.
    let h = Hardware {
        memory_bytes: 100e9,
        activation_reserve_bytes: 1e9,
        ..Hardware::H100_SXM
    };
    let gemma = LayeredShape::builtin("gemma-3-270m").unwrap();
    let hybrid =
        kv_cache_budget_grouped(&gemma, GroupingPolicy::default(), &h, 1, 0.5, 16).unwrap();
    assert_eq!(hybrid.weight_bytes_per_gpu, 536_131_840.0);
    assert_eq!(hybrid.available_bytes, 48_463_868_160.0);
    assert_eq!((hybrid.layer_slots, hybrid.bytes_per_block), (3, 49_152));
    assert_eq!(hybrid.num_blocks, 985_999);
    let off = GroupingPolicy {
        hybrid: false,
        chunked_local: false,
    };
    let full = kv_cache_budget_grouped(&gemma, off, &h, 1, 0.5, 16).unwrap();
    assert_eq!((full.layer_slots, full.bytes_per_block), (18, 294_912));
    assert_eq!(full.num_blocks, 164_333);
    // A plain decoder is one group of every layer either way: the budget
    // of `kv_cache_budget`.
    let llama = LayeredShape::all_full(ModelShape::LLAMA_3_1_8B);
    assert_eq!(
        kv_cache_budget_grouped(&llama, GroupingPolicy::default(), &h, 1, 0.5, 16)
            .unwrap()
            .num_blocks,
        15_706
    );
    // gpt-oss-20b: 12 sliding + 12 full layers, two groups of 12. A page
    // is 16 × 2 × 8 × 64 × 2 = 32 KiB, so a block is 12 pages (384 KiB)
    // with the hybrid manager, 24 (768 KiB) without; at tp 2 each GPU
    // holds 4 KV heads, half of each.
    let oss = LayeredShape::builtin("gpt-oss-20b").unwrap();
    let on = kv_cache_budget_grouped(&oss, GroupingPolicy::default(), &h, 1, 0.5, 16).unwrap();
    assert_eq!(on.bytes_per_block, 393_216);
    let off_oss = kv_cache_budget_grouped(&oss, off, &h, 1, 0.5, 16).unwrap();
    assert_eq!(off_oss.bytes_per_block, 786_432);
    let on2 = kv_cache_budget_grouped(&oss, GroupingPolicy::default(), &h, 2, 0.5, 16).unwrap();
    assert_eq!(on2.bytes_per_block, 196_608);
}

#[test]
fn weights_that_do_not_fit_are_an_error_that_says_so() {
    let m = ModelShape::LLAMA_3_1_70B;
    let err = num_gpu_blocks(&m, &Hardware::H100_SXM, 1, 0.9, 16).unwrap_err();
    assert!(matches!(err, RooflineError::WeightsDoNotFit { .. }));
    let msg = err.to_string();
    assert!(
        msg.starts_with("the weights (141.1 GB per GPU)") && msg.contains("85.5 GB × 0.9"),
        "{msg}"
    );
    // Across four GPUs it fits.
    assert!(num_gpu_blocks(&m, &Hardware::H100_SXM, 4, 0.9, 16).unwrap() > 10_000);
    assert!(matches!(
        num_gpu_blocks(&m, &Hardware::H100_SXM, 4, 1.5, 16),
        Err(RooflineError::BadUtilization(_))
    ));
    assert!(matches!(
        num_gpu_blocks(&m, &Hardware::H100_SXM, 4, 0.9, 0),
        Err(RooflineError::ZeroBlockSize)
    ));
    // Room for the weights but not for one block.
    let tight = Hardware {
        memory_bytes: 16_060_522_496.0 + 2.0 * 1024.0 * 1024.0 * 1024.0 + 1000.0,
        ..Hardware::H100_SXM
    };
    let err = num_gpu_blocks(&ModelShape::LLAMA_3_1_8B, &tight, 1, 1.0, 16).unwrap_err();
    assert!(
        matches!(err, RooflineError::NoRoomForABlock { .. }),
        "{err}"
    );
}

// ------------------------------------------------------------ model files

const QWEN7B_CONFIG: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "vocab_size": 152064, "torch_dtype": "bfloat16", "tie_word_embeddings": false,
  "rope_theta": 1000000.0, "model_type": "qwen2"}"#;

const MIXTRAL_CONFIG: &str = r#"{
  "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
  "torch_dtype": "bfloat16", "head_dim": null, "model_type": "mixtral"}"#;

#[test]
fn config_json_gives_the_builtin_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let qwen = dir.path().join("qwen");
    std::fs::create_dir(&qwen).unwrap();
    std::fs::write(qwen.join("config.json"), QWEN7B_CONFIG).unwrap();
    // A directory and the file itself.
    assert_eq!(
        ModelShape::load(qwen.to_str().unwrap()).unwrap(),
        ModelShape::QWEN2_5_7B
    );
    let mixtral = dir.path().join("mixtral.json");
    std::fs::write(&mixtral, MIXTRAL_CONFIG).unwrap();
    assert_eq!(
        ModelShape::load(mixtral.to_str().unwrap()).unwrap(),
        ModelShape::MIXTRAL_8X7B
    );
    // Without num_key_value_heads: no GQA.
    let mha = QWEN7B_CONFIG.replace("\"num_key_value_heads\": 4,", "");
    let m = ModelShape::from_config_str(&mha, Path::new("c.json")).unwrap();
    assert_eq!(m.kv_heads, 28);
    // float32 weights: vLLM's `--dtype auto` serves them in bf16
    // (`_resolve_auto_dtype` downcasts float32 checkpoints).
    let f32 = QWEN7B_CONFIG.replace("bfloat16", "float32");
    let m = ModelShape::from_config_str(&f32, Path::new("c.json")).unwrap();
    assert_eq!(m.bytes_per_param, 2);
}

#[test]
fn bad_config_json_names_the_file_and_key() {
    let p = Path::new("/models/x/config.json");
    let missing = QWEN7B_CONFIG.replace("\"hidden_size\": 3584,", "");
    let err = ModelShape::from_config_str(&missing, p)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "/models/x/config.json: key `hidden_size`: missing");
    let wrong = QWEN7B_CONFIG.replace("\"num_hidden_layers\": 28", "\"num_hidden_layers\": \"28\"");
    let err = ModelShape::from_config_str(&wrong, p)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("key `num_hidden_layers`: expected a positive integer"),
        "{err}"
    );
    let dtype = QWEN7B_CONFIG.replace("bfloat16", "int3");
    let err = ModelShape::from_config_str(&dtype, p)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("key `torch_dtype`: unknown dtype \"int3\""),
        "{err}"
    );
    let moe = MIXTRAL_CONFIG.replace("\"num_experts_per_tok\": 2,", "");
    let err = ModelShape::from_config_str(&moe, p)
        .unwrap_err()
        .to_string();
    assert!(err.contains("key `num_experts_per_tok`: missing"), "{err}");
    let err = ModelShape::from_config_str("{", p).unwrap_err();
    assert!(matches!(err, ModelConfigError::Json { .. }), "{err}");
    assert!(err
        .to_string()
        .starts_with("/models/x/config.json: not valid JSON"));
}

#[test]
fn a_name_that_is_neither_builtin_nor_a_path_lists_the_builtins() {
    assert_eq!(
        ModelShape::load("Qwen/Qwen2.5-7B-Instruct").unwrap(),
        ModelShape::QWEN2_5_7B
    );
    let err = ModelShape::load("no/such-model").unwrap_err().to_string();
    assert!(
        err.starts_with("no/such-model: not a built-in model (") && err.contains("mixtral-8x7b"),
        "{err}"
    );
}

/// A tiny llama-architecture GGUF: hidden 8, 2 layers, 2 heads, 1 KV
/// head of 4, feed-forward 16, vocabulary 16.
fn tiny_gguf(with_tokens: bool) -> (GgufWriter, u64) {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")
        .add("llama.embedding_length", 8u32)
        .add("llama.block_count", 2u32)
        .add("llama.attention.head_count", 2u32)
        .add("llama.attention.head_count_kv", 1u32)
        .add("llama.attention.key_length", 4u32)
        .add("llama.feed_forward_length", 16u32);
    if with_tokens {
        let tokens: Vec<String> = (0..16).map(|i| format!("t{i}")).collect();
        w.add("tokenizer.ggml.tokens", tokens);
    }
    let mut bytes = 0;
    let mut tensor = |w: &mut GgufWriter, name: &str, dims: &[u64]| {
        let n: u64 = dims.iter().product();
        w.add_tensor_f32(name, dims, &vec![0.0; n as usize]);
        bytes += 4 * n;
    };
    tensor(&mut w, "token_embd.weight", &[8, 16]);
    tensor(&mut w, "blk.0.attn_q.weight", &[8, 8]);
    tensor(&mut w, "blk.0.ffn_down.weight", &[16, 8]);
    tensor(&mut w, "output_norm.weight", &[8]);
    (w, bytes)
}

#[test]
fn a_gguf_gives_its_shape_and_tensor_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (w, bytes) = tiny_gguf(true);
    let path = dir.path().join("tiny.gguf");
    w.write(&path).unwrap();
    let m = ModelShape::load(path.to_str().unwrap()).unwrap();
    let want = ModelShape {
        hidden: 8,
        layers: 2,
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
        intermediate: 16,
        vocab: 16,
        bytes_per_param: 2,
        num_experts: 0,
        experts_per_token: 0,
        tie_word_embeddings: true, // no output.weight
        stored_weight_bytes: Some(bytes),
        kv_cache_dtype: sluice_arch::KvCacheDtype::Auto,
    };
    assert_eq!(m, want);
    assert_eq!(m.weight_bytes(), (8 * 16 + 64 + 128 + 8) * 4);
    // A directory holding one GGUF.
    assert_eq!(
        ModelShape::load(dir.path().to_str().unwrap()).unwrap(),
        want
    );
    // The vocabulary from the embedding when there is no token list.
    let (w, _) = tiny_gguf(false);
    let path = dir.path().join("no-tokens.gguf");
    w.write(&path).unwrap();
    assert_eq!(ModelShape::from_gguf(&path).unwrap().vocab, 16);
}

#[test]
fn a_gguf_with_experts_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, _) = tiny_gguf(true);
    w.add("llama.expert_count", 4u32)
        .add("llama.expert_used_count", 2u32);
    let path = dir.path().join("moe.gguf");
    w.write(&path).unwrap();
    let m = ModelShape::from_gguf(&path).unwrap();
    assert_eq!((m.num_experts, m.experts_per_token), (4, 2));
}

#[test]
fn a_gemma3_gguf_slides_on_llama_cpps_pattern() {
    // llama.cpp stores `gemma3.attention.sliding_window` but not the
    // pattern: layer il is full when (il + 1) % 6 == 0.
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add("general.architecture", "gemma3")
        .add("gemma3.embedding_length", 8u32)
        .add("gemma3.block_count", 12u32)
        .add("gemma3.attention.head_count", 2u32)
        .add("gemma3.attention.head_count_kv", 1u32)
        .add("gemma3.attention.key_length", 4u32)
        .add("gemma3.feed_forward_length", 16u32)
        .add("gemma3.attention.sliding_window", 512u32);
    w.add_tensor_f32("token_embd.weight", &[8, 16], &[0.0; 128]);
    let path = dir.path().join("gemma3.gguf");
    w.write(&path).unwrap();
    let m = LayeredShape::from_gguf(&path).unwrap();
    let full: Vec<usize> = (0..12)
        .filter(|&i| m.layer_kinds[i] == AttentionKind::Full)
        .collect();
    assert_eq!(full, vec![5, 11]);
    assert_eq!(
        m.layer_kinds[0],
        AttentionKind::SlidingWindow { window: 512 }
    );
    // `attention.sliding_window_pattern`: N (every N-th layer full, 0
    // none) or a bool per layer (true: sliding).
    let full_layers = |pattern: sluice_gguf::Value| {
        let mut w = w.clone();
        w.add("gemma3.attention.sliding_window_pattern", pattern);
        let path = dir.path().join("patterned.gguf");
        w.write(&path).unwrap();
        let m = LayeredShape::from_gguf(&path).unwrap();
        (0..12)
            .filter(|&i| m.layer_kinds[i] == AttentionKind::Full)
            .collect::<Vec<_>>()
    };
    assert_eq!(full_layers(3u32.into()), vec![2, 5, 8, 11]);
    assert_eq!(full_layers(0u32.into()), Vec::<usize>::new());
    let mut bools = vec![true; 12];
    bools[0] = false;
    assert_eq!(full_layers(bools.into()), vec![0]);
    // A window of 0 is none.
    let mut w0 = w.clone();
    w0.add("gemma3.attention.sliding_window", 0u32);
    let path = dir.path().join("no-window.gguf");
    w0.write(&path).unwrap();
    let m = LayeredShape::from_gguf(&path).unwrap();
    assert_eq!(m.layer_kinds, vec![AttentionKind::Full; 12]);
    // A llama file with a window key is still full attention.
    let (mut w, _) = tiny_gguf(true);
    w.add("llama.attention.sliding_window", 64u32);
    let path = dir.path().join("llama.gguf");
    w.write(&path).unwrap();
    let m = LayeredShape::from_gguf(&path).unwrap();
    assert_eq!(m.layer_kinds, vec![AttentionKind::Full; 2]);
}

#[test]
fn bad_gguf_files_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")
        .add("llama.embedding_length", 8u32)
        .add("llama.attention.head_count", 2u32)
        .add("llama.feed_forward_length", 16u32);
    let path = dir.path().join("partial.gguf");
    w.write(&path).unwrap();
    let err = ModelShape::from_gguf(&path).unwrap_err().to_string();
    assert!(
        err.contains("partial.gguf") && err.contains("llama.block_count"),
        "{err}"
    );
    // A file that claims to be GGUF but is cut short.
    let (w, _) = tiny_gguf(true);
    let bytes = w.to_bytes().unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let err = ModelShape::load(cut.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, ModelConfigError::Gguf(_)), "{err}");
    assert!(err.to_string().contains("cut.gguf"), "{err}");
    // A tensor type with no vocabulary at all.
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")
        .add("llama.embedding_length", 8u32)
        .add("llama.block_count", 2u32)
        .add("llama.attention.head_count", 2u32)
        .add("llama.feed_forward_length", 16u32)
        .add_tensor("blk.0.attn_q.weight", GgmlType::F32, &[2], vec![0u8; 8]);
    let path = dir.path().join("novocab.gguf");
    w.write(&path).unwrap();
    let err = ModelShape::from_gguf(&path).unwrap_err().to_string();
    assert!(err.contains("novocab.gguf: no vocabulary size"), "{err}");
}

// --------------------------------------------------------------- profiles

fn fitted_profile() -> Profile {
    let log = synthetic_log(300, 13, 0.01, linear(TRUE));
    let report = fit(&log, &FitOptions::default()).unwrap();
    let mut p = FittedProfile::from_report(&report, "synthetic.jsonl");
    p.memory_bytes = Some(80e9);
    p.tensor_parallel = Some(1);
    Profile::Fitted(p)
}

/// Equal JSON, numbers within a few ULP: serde_json (without its
/// `float_roundtrip` feature) may parse a printed float one ULP off.
fn assert_json_close(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-15 * x.abs().max(y.abs()),
                "{at}: {x} vs {y}"
            );
        }
        (Object(x), Object(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (k, v) in x {
                assert_json_close(v, &y[k], &format!("{at}.{k}"));
            }
        }
        (Array(x), Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                assert_json_close(v, w, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

#[test]
fn profiles_round_trip_through_json_files() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = [
        Profile::Roofline(RooflineProfile {
            name: Some("mine".into()),
            description: None,
            hardware: Hardware::H200,
        }),
        fitted_profile(),
        Profile::Table(TableProfile {
            name: None,
            description: Some("measured".into()),
            tensor_parallel: None,
            memory_bytes: None,
            kv_cache: Some(sluice_sim::MeasuredKvCache {
                num_blocks: 2912,
                block_size: 16,
            }),
            measured_on: Some(sluice_sim::MeasuredOn {
                model: "smollm2.gguf".into(),
                cpu: "a CPU".into(),
                threads: 2,
                repeats: 3,
                cost_s: 61.5,
                speed_probe_s: vec![0.0043, 0.0044],
            }),
            mixed_measured: Some(vec![sluice_sim::MixedPoint {
                batch_size: 4.0,
                mean_context: 66.0,
                chunk_tokens: 128.0,
                context: 0.0,
                time_s: 0.09,
            }]),
            table: table(),
        }),
    ];
    for (i, p) in profiles.iter().enumerate() {
        let path = dir.path().join(format!("p{i}.json"));
        p.save(&path).unwrap();
        let back = Profile::load(path.to_str().unwrap()).unwrap();
        assert_json_close(
            &serde_json::to_value(&back).unwrap(),
            &serde_json::to_value(p).unwrap(),
            "",
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("\"kind\": \"{}\"", p.kind())),
            "{text}"
        );
    }
    assert_eq!(
        profiles[0].memory_bytes(),
        Some(Hardware::H200.memory_bytes)
    );
    assert_eq!(profiles[1].memory_bytes(), Some(80e9));
    assert_eq!(profiles[2].memory_bytes(), None);
}

#[test]
fn a_builtin_name_is_a_roofline_profile() {
    let p = Profile::load("h100").unwrap();
    assert_eq!(p.hardware(), Some(&Hardware::H100_SXM));
    let m = p.step_model(Some(&ModelShape::QWEN2_5_7B), 1).unwrap();
    let step = decode_batch(8, 512);
    assert_eq!(
        m.step_time(&step),
        Roofline::new(ModelShape::QWEN2_5_7B, Hardware::H100_SXM).step_time(&step)
    );
    assert!(matches!(
        p.step_model(None, 1),
        Err(ProfileError::NeedsModel)
    ));
    // vLLM would refuse 28 heads on 8 GPUs, so does the profile.
    assert!(matches!(
        p.step_model(Some(&ModelShape::QWEN2_5_7B), 8),
        Err(ProfileError::Roofline(
            RooflineError::HeadsNotDivisible { .. }
        ))
    ));
    let err = Profile::load("tpu-v9").unwrap_err().to_string();
    assert!(err.contains("H100-SXM"), "{err}");
}

#[test]
fn fitted_and_table_profiles_ignore_the_model_but_not_tensor_parallelism() {
    let p = fitted_profile();
    let m = p.step_model(None, 1).unwrap();
    let step = decode_batch(8, 512);
    let Profile::Fitted(f) = &p else {
        unreachable!()
    };
    assert_eq!(m.step_time(&step), f.model.step_time(&step));
    assert!(matches!(
        p.step_model(Some(&ModelShape::QWEN2_5_7B), 2),
        Err(ProfileError::TensorParallelMismatch {
            profile: 1,
            asked: 2,
            ..
        })
    ));
}

#[test]
fn bad_profiles_name_the_file_and_field() {
    let hw = serde_json::to_value(Hardware::H100_SXM).unwrap();
    let mut missing = hw.clone();
    missing.as_object_mut().unwrap().remove("peak_flops");
    let mut wrong = hw.clone();
    wrong["memory_bytes"] = serde_json::json!("80GB");
    let mut zero = hw.clone();
    zero["hbm_bandwidth"] = serde_json::json!(0.0);
    let cases = [
        (
            serde_json::json!({"kind": "roofline", "hardware": missing}).to_string(),
            "missing field `peak_flops`",
        ),
        (
            serde_json::json!({"kind": "roofline", "hardware": wrong}).to_string(),
            "field `hardware.memory_bytes`: invalid type: string \"80GB\"",
        ),
        (
            serde_json::json!({"kind": "roofline", "hardware": zero}).to_string(),
            "`hardware.hbm_bandwidth`: expected a positive number, found 0",
        ),
        (
            serde_json::json!({"kind": "gpu", "hardware": hw}).to_string(),
            "field `kind`: unknown kind `gpu`",
        ),
        (
            serde_json::json!({"kind": "fitted", "model": {"segmentation": "single",
                "pieces": [{"coefficients": {"intercept_s": 0.01, "per_prefill_token_s": -1.0,
                "per_decode_token_s": 0, "per_row_s": 0, "per_prefill_attention_pair_s": 0,
                "per_decode_context_token_s": 0, "per_sampling_row_s": 0}}]}})
            .to_string(),
            "`model.pieces[0].coefficients.per_prefill_token_s`: -1",
        ),
        (
            serde_json::json!({"kind": "table", "table": {
                "prefill": {"chunk_tokens": [2, 1], "context": [0], "time_s": [[1], [1]]},
                "decode": {"batch_size": [1], "mean_context": [1], "time_s": [[1]]}}})
            .to_string(),
            "`table.prefill.chunk_tokens`: not strictly increasing",
        ),
        (
            serde_json::json!({"kind": "table", "tensor_parallel": 0, "table": {
                "prefill": {"chunk_tokens": [1], "context": [0], "time_s": [[1]]},
                "decode": {"batch_size": [1], "mean_context": [1], "time_s": [[1]]}}})
            .to_string(),
            "`tensor_parallel`: 0",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.json"));
        std::fs::write(&path, text).unwrap();
        let err = Profile::load(path.to_str().unwrap())
            .unwrap_err()
            .to_string();
        let file = path.display().to_string();
        assert!(
            err.starts_with(&format!("{file}: ")) && err.contains(want),
            "{err}\nwant {want}"
        );
    }
}

#[test]
fn a_boxed_profile_model_drives_the_simulator() {
    let model = Profile::load("H200")
        .unwrap()
        .step_model(Some(&ModelShape::QWEN2_5_7B), 1)
        .unwrap();
    let config = SchedulerConfig {
        num_gpu_blocks: num_gpu_blocks(&ModelShape::QWEN2_5_7B, &Hardware::H200, 1, 0.9, 16)
            .unwrap(),
        ..SchedulerConfig::default()
    };
    let w = RandomWorkload {
        num_prompts: 20,
        input_len: 256,
        output_len: 16,
        request_rate: 10.0,
        seed: 1,
        ..RandomWorkload::default()
    };
    let res = Simulator::new(config, model)
        .run(&w.generate().unwrap())
        .unwrap();
    assert_eq!(
        res.requests.iter().filter(|r| r.finish_s.is_some()).count(),
        20
    );
}

/// The fitted CPU profile shipped as an example (the one README's
/// validation table was predicted with) against a step log it was not
/// fitted on: `tests/data/cpu-qwen2.5-0.5b-steps.jsonl`, measured by
/// `sluice serve --step-log` in the same validation run, on the same
/// machine and model shape, under another workload and server process (its
/// README has the command). That log adds run-to-run noise to the fit's
/// own held-out error, so the bound on its mean absolute percentage error
/// is twice the held-out MAPE the profile records, and on its median twice
/// the held-out median.
#[test]
fn the_shipped_cpu_profile_predicts_an_independent_step_log() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = dir.join("profiles/cpu-qwen2.5-0.5b-bf16-2threads.json");
    let profile = Profile::load(path.to_str().unwrap()).unwrap();
    let Profile::Fitted(fitted) = &profile else {
        panic!(
            "{}: a {} profile, expected fitted",
            path.display(),
            profile.kind()
        );
    };
    let held_out = fitted
        .held_out
        .clone()
        .expect("the profile records its held-out error");
    let model = profile.step_model(None, 1).unwrap();
    let log = dir.join("tests/data/cpu-qwen2.5-0.5b-steps.jsonl");
    let records = read_step_log(&log).unwrap();
    assert!(
        records.len() >= 200,
        "{}: {} steps",
        log.display(),
        records.len()
    );
    let mut ape: Vec<f64> = records
        .iter()
        .map(|r| (model.step_time(&r.shape()) - r.step_s).abs() / r.step_s * 100.0)
        .collect();
    let mape = ape.iter().sum::<f64>() / ape.len() as f64;
    ape.sort_by(f64::total_cmp);
    let median = ape[ape.len() / 2];
    eprintln!(
        "{} steps: MAPE {mape:.1} % (held out {:.1} %), median {median:.1} % (held out {:.1} %)",
        ape.len(),
        held_out.mape_pct,
        held_out.median_ape_pct
    );
    assert!(
        mape <= 2.0 * held_out.mape_pct,
        "MAPE {mape:.1} % over twice the held-out {:.1} %",
        held_out.mape_pct
    );
    assert!(
        median <= 2.0 * held_out.median_ape_pct,
        "median APE {median:.1} % over twice the held-out {:.1} %",
        held_out.median_ape_pct
    );
}
