//! The per-layer seam of the shared forward pass: a decoder wired with pre-
//! and post-norms around each block (or post-norms only, or pre-norms),
//! GELU-tanh, a scaled embedding, and per layer a configured attention
//! scale, a logit soft-cap and a RoPE of its own base or none,
//! run by the real forward pass and compared with a dense f64 forward
//! written here from the math. A layer with a sliding window attends only
//! inside it, and a config whose `sliding_window` transformers ignores
//! still loads.

use anyhow::bail;
use sluice_model::config::ModelConfig;
use sluice_model::kernels::QuantFormat;
use sluice_model::kv_cache::{KvCache, KvCacheConfig};
use sluice_model::model::{
    Activation, DecoderPlan, ForwardBatch, LayerAttention, LayerWiring, Model, NormPlacement,
    RopeParams,
};
use sluice_model::weights::{TensorSource, Weight};

const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
    "intermediate_size":96,"vocab_size":50,"max_position_embeddings":128,
    "rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":false}"#;
const EPS: f64 = 1e-6;

/// Random tensors that depend only on their name: the model reads them
/// through `TensorSource`, the reference by calling [`tensor`].
struct Random;

fn tensor(name: &str, shape: &[usize]) -> Vec<f32> {
    let mut state = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut next = || {
        // SplitMix64, uniform in [0, 1).
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    let n: usize = shape.iter().product();
    if name.ends_with("norm.weight") {
        return (0..n).map(|_| 0.5 + next()).collect();
    }
    // Unit-variance outputs for unit-variance inputs, so that scores reach
    // the soft-cap's curved part.
    let fan_in = *shape.last().unwrap() as f32;
    let a = 3f32.sqrt() / fan_in.sqrt();
    (0..n).map(|_| (2.0 * next() - 1.0) * a).collect()
}

impl TensorSource for Random {
    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> anyhow::Result<()> {
        match out {
            Weight::F32(v) => v.extend(tensor(name, shape)),
            _ => bail!("{name}: only f32 here"),
        }
        Ok(())
    }

    fn contains(&self, _name: &str) -> bool {
        true
    }
}

fn plan(c: &ModelConfig) -> DecoderPlan {
    DecoderPlan {
        wiring: LayerWiring {
            norms: NormPlacement::PrePost,
            activation: Activation::GeluTanh,
            embedding_scale: Some(8.0),
        },
        layers: vec![
            LayerAttention {
                window: None,
                // Gemma's query_pre_attn_scalar: 8^-0.5, not 16^-0.5.
                scale: 8f32.powf(-0.5),
                // A RoPE base of its own (Gemma 3's global layers), not the
                // config's 10,000.
                rope: Some(RopeParams {
                    base: 1e6,
                    ..RopeParams::of(c)
                }),
                logit_softcap: Some(2.0),
            },
            LayerAttention {
                window: None,
                scale: 0.3,
                rope: None,
                logit_softcap: Some(3.0),
            },
        ],
    }
}

fn matvec(w: &[f32], rows: usize, x: &[f64]) -> Vec<f64> {
    let cols = x.len();
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] as f64 * x[c]).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f32]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + EPS).sqrt();
    x.iter().zip(w).map(|(v, &g)| v * inv * g as f64).collect()
}

/// Rotate-half RoPE of one head at `pos`.
fn rope(x: &mut [f64], pos: usize, base: f64) {
    let d = x.len();
    for i in 0..d / 2 {
        let inv_freq = 1.0 / base.powf((2 * i) as f64 / d as f64);
        let (sin, cos) = (pos as f64 * inv_freq).sin_cos();
        let (a, b) = (x[i], x[i + d / 2]);
        x[i] = a * cos - b * sin;
        x[i + d / 2] = b * cos + a * sin;
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// `x`, RMS-normed with the norm `name` when `on`.
fn norm_if(on: bool, x: &[f64], name: &str) -> Vec<f64> {
    if on {
        rms_norm(x, &tensor(name, &[x.len()]))
    } else {
        x.to_vec()
    }
}

/// Logits of every position of `ids`, dense, in f64.
fn reference(c: &ModelConfig, plan: &DecoderPlan, ids: &[u32]) -> Vec<Vec<f64>> {
    // Which norms the wiring has: before attention, after it, before the
    // MLP, after it (and the name of the one before the MLP).
    let (pre_attn, post_attn, pre_mlp, post_mlp, pre_mlp_name) = match plan.wiring.norms {
        NormPlacement::Pre => (true, false, true, false, "post_attention_layernorm"),
        NormPlacement::PrePost => (true, true, true, true, "pre_feedforward_layernorm"),
        NormPlacement::Post => (false, true, false, true, ""),
    };
    let (h, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (nh, nkv) = (c.num_attention_heads, c.num_key_value_heads);
    let group = nh / nkv;
    let w = |name: &str, shape: &[usize]| tensor(name, shape);
    let scale = plan.wiring.embedding_scale.unwrap_or(1.0) as f64;
    let embed = w("model.embed_tokens.weight", &[c.vocab_size, h]);
    let mut x: Vec<Vec<f64>> = ids
        .iter()
        .map(|&t| {
            let row = &embed[t as usize * h..(t as usize + 1) * h];
            row.iter().map(|&v| v as f64 * scale).collect()
        })
        .collect();
    for (l, shape) in plan.layers.iter().enumerate() {
        let p = |n: &str| format!("model.layers.{l}.{n}.weight");
        let (wq, wk, wv) = (
            w(&p("self_attn.q_proj"), &[nh * hd, h]),
            w(&p("self_attn.k_proj"), &[nkv * hd, h]),
            w(&p("self_attn.v_proj"), &[nkv * hd, h]),
        );
        let wo = w(&p("self_attn.o_proj"), &[h, nh * hd]);
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, row) in x.iter().enumerate() {
            let n = norm_if(pre_attn, row, &p("input_layernorm"));
            let (mut qt, mut kt) = (matvec(&wq, nh * hd, &n), matvec(&wk, nkv * hd, &n));
            if let Some(r) = shape.rope {
                qt.chunks_mut(hd).for_each(|head| rope(head, pos, r.base));
                kt.chunks_mut(hd).for_each(|head| rope(head, pos, r.base));
            }
            q.push(qt);
            k.push(kt);
            v.push(matvec(&wv, nkv * hd, &n));
        }
        for (i, row) in x.iter_mut().enumerate() {
            let mut o = vec![0.0; nh * hd];
            for head in 0..nh {
                let kvh = head / group;
                let qh = &q[i][head * hd..(head + 1) * hd];
                // A sliding window of W: the W latest keys, its own included.
                let lo = shape.window.map_or(0, |w| (i + 1).saturating_sub(w));
                let scores: Vec<f64> = (lo..=i)
                    .map(|j| {
                        let kj = &k[j][kvh * hd..(kvh + 1) * hd];
                        let s =
                            qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * shape.scale as f64;
                        match shape.logit_softcap {
                            Some(cap) => (s / cap as f64).tanh() * cap as f64,
                            None => s,
                        }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, ej) in (lo..).zip(&e) {
                    let vj = &v[j][kvh * hd..(kvh + 1) * hd];
                    for d in 0..hd {
                        o[head * hd + d] += ej / sum * vj[d];
                    }
                }
            }
            let a = norm_if(
                post_attn,
                &matvec(&wo, h, &o),
                &p("post_attention_layernorm"),
            );
            row.iter_mut().zip(a).for_each(|(r, a)| *r += a);
        }
        let (wg, wu, wd) = (
            w(&p("mlp.gate_proj"), &[inter, h]),
            w(&p("mlp.up_proj"), &[inter, h]),
            w(&p("mlp.down_proj"), &[h, inter]),
        );
        for row in x.iter_mut() {
            let n = norm_if(pre_mlp, row, &p(pre_mlp_name));
            let (g, u) = (matvec(&wg, inter, &n), matvec(&wu, inter, &n));
            let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| gelu_tanh(*g) * u).collect();
            let m = norm_if(
                post_mlp,
                &matvec(&wd, h, &act),
                &p("post_feedforward_layernorm"),
            );
            row.iter_mut().zip(m).for_each(|(r, m)| *r += m);
        }
    }
    let (norm, head) = (
        w("model.norm.weight", &[h]),
        w("lm_head.weight", &[c.vocab_size, h]),
    );
    x.iter()
        .map(|row| matvec(&head, c.vocab_size, &rms_norm(row, &norm)))
        .collect()
}

fn run(model: &Model, c: &ModelConfig, ids: &[u32]) -> Vec<f32> {
    let bs = 16;
    let blocks = ids.len().div_ceil(bs);
    let mut kv = KvCache::new(c, KvCacheConfig::new(bs, blocks + 1)).unwrap();
    let table: Vec<u32> = (1..=blocks as u32).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(ids, 0, &table, bs).unwrap();
    batch.logits_rows.extend(0..ids.len());
    model.forward(&batch, &mut kv).unwrap()
}

/// The model's logits for `plan` against the dense reference's; returns
/// the reference and the tolerance used.
fn check_against_reference(
    c: &ModelConfig,
    plan: &DecoderPlan,
    ids: &[u32],
) -> (Vec<Vec<f64>>, f64) {
    let model = Model::load_planned(c, &Random, QuantFormat::F32, plan.clone()).unwrap();
    let got = run(&model, c, ids);
    let want = reference(c, plan, ids);
    let peak = want.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    // f32 kernels against f64 math over two small layers: a few ulps of the
    // largest logit per operation, far below the effect of any one switch.
    let tol = 2e-5 * peak.max(1.0);
    let err = got
        .iter()
        .zip(want.iter().flatten())
        .fold(0f64, |m, (&g, &w)| m.max((g as f64 - w).abs()));
    eprintln!("max logit error {err:e}, tolerance {tol:e}, peak {peak}");
    assert!(err <= tol, "max |logit error| {err} > {tol} (peak {peak})");
    (want, tol)
}

#[test]
fn post_norms_gelu_scaled_embedding_and_softcap_match_a_dense_reference() {
    let c = ModelConfig::from_json(CONFIG).unwrap();
    let plan = plan(&c);
    let ids: Vec<u32> = (0..21).map(|i| (i * 17 + 3) % 50).collect();
    let (want, tol) = check_against_reference(&c, &plan, &ids);

    // Each switch moves the logits by far more than the tolerance, so the
    // comparison above sees every one of them.
    let mut variants = Vec::new();
    let mut p = plan.clone();
    p.layers.iter_mut().for_each(|l| l.logit_softcap = None);
    variants.push(("soft-cap", p));
    let mut p = plan.clone();
    p.wiring.embedding_scale = None;
    variants.push(("embedding scale", p));
    let mut p = plan.clone();
    p.layers[0].scale = 0.25;
    variants.push(("attention scale", p));
    let mut p = plan.clone();
    p.layers[0].rope = Some(RopeParams::of(&c));
    variants.push(("the layer's own RoPE base", p));
    let mut p = plan.clone();
    p.wiring.norms = NormPlacement::Pre;
    variants.push(("post-norms", p));
    for (what, p) in variants {
        let other = reference(&c, &p, &ids);
        let moved = other
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            moved > 100.0 * tol,
            "{what} moves the logits by only {moved}"
        );
    }
}

/// Norms after each block only (OLMo 2's wiring), and the pre-norm wiring
/// under the same per-layer attention shapes.
#[test]
fn post_only_and_pre_norm_wirings_match_the_dense_reference() {
    let c = ModelConfig::from_json(CONFIG).unwrap();
    let ids: Vec<u32> = (0..19).map(|i| (i * 11 + 5) % 50).collect();
    let mut outputs = Vec::new();
    for norms in [NormPlacement::Post, NormPlacement::Pre] {
        let mut p = plan(&c);
        p.wiring.norms = norms;
        outputs.push(check_against_reference(&c, &p, &ids));
    }
    let (post, tol) = &outputs[0];
    let moved = post
        .iter()
        .flatten()
        .zip(outputs[1].0.iter().flatten())
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(moved > 100.0 * tol, "the wirings differ by only {moved}");
}

#[test]
fn a_layer_with_a_sliding_window_attends_inside_it() {
    let c = ModelConfig::from_json(CONFIG).unwrap();
    let full_plan = plan(&c);
    let mut plan = full_plan.clone();
    // A window shorter than the prompt and not a multiple of the block
    // size: positions 5.. see only their 5 latest keys in layer 1.
    plan.layers[1].window = Some(5);
    let ids: Vec<u32> = (0..37).map(|i| (i * 13 + 7) % 50).collect();
    let (windowed, tol) = check_against_reference(&c, &plan, &ids);
    // The window matters: without it the logits past it move.
    let full = reference(&c, &full_plan, &ids);
    let moved = windowed[5..]
        .iter()
        .flatten()
        .zip(full[5..].iter().flatten())
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        moved > 100.0 * tol,
        "the window moves the logits by only {moved}"
    );
    // Inside the window nothing changes.
    assert_eq!(windowed[..5], full[..5]);
}

#[test]
fn a_sliding_window_transformers_ignores_keeps_loading() {
    // Qwen2 applies `sliding_window` only with `use_sliding_window`.
    let text = CONFIG
        .replace("LlamaForCausalLM", "Qwen2ForCausalLM")
        .replace(
            "\"tie_word_embeddings\":false",
            "\"tie_word_embeddings\":false,\"sliding_window\":4,\"use_sliding_window\":false",
        );
    let c = ModelConfig::from_json(&text).unwrap();
    let plan = DecoderPlan::of(&c);
    assert!(plan.layers.iter().all(|l| l.window.is_none()));
    assert_eq!(plan.wiring, LayerWiring::default());
    Model::load(&c, &Random, QuantFormat::F32).unwrap();
}
