//! The architecture seam and the pieces it selects: Qwen3's per-head q/k
//! norm and config head_dim really take part in the fixture's logits
//! (`reference.rs` and `scheduling.rs` check tiny-qwen3 against
//! transformers like the other fixtures), and linear layers whose parts come
//! in different weight formats (as GGUF files store q/k and v) run one
//! matmul per part and keep every promise of the fused path.

mod common;

use common::*;
use sluice_model::config::Architecture;
use sluice_model::kernels::QuantFormat;
use sluice_model::kv_cache::{KvCache, KvCacheConfig};
use sluice_model::model::{ForwardBatch, LinearWeight, Model};
use sluice_model::{load_model, DType, LoadFormat, ModelSpec};

fn last_logits(model: &Model, prompt: &[u32]) -> Vec<f32> {
    let blocks = prompt.len().div_ceil(16) + 1;
    let mut kv = KvCache::new(&model.config, KvCacheConfig::new(16, blocks)).unwrap();
    let table: Vec<u32> = (1..blocks as u32).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(prompt, 0, &table, 16).unwrap();
    batch.logits_rows.push(prompt.len() - 1);
    model.forward(&batch, &mut kv).unwrap()
}

#[test]
fn qwen3_fixture_has_its_pieces() {
    let f = fixture("tiny-qwen3");
    let c = &f.loaded.config;
    assert_eq!(c.architecture, Architecture::Qwen3);
    assert_eq!(c.head_dim, 32);
    assert_ne!(c.head_dim, c.hidden_size / c.num_attention_heads);
    assert!(c.qk_norm && !c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
    assert_eq!(
        c.num_parameters(),
        175_040,
        "the checkpoint's parameter count"
    );
    let m = &f.model;
    assert!(m.lm_head.is_none());
    for layer in &m.layers {
        let a = &layer.attention;
        assert!(a.qk_norm.is_some() && a.qkv_proj.bias.is_none());
        assert_eq!(a.qkv_proj.out_features, (4 + 2 * 2) * 32);
        assert_eq!(a.o_proj.in_features, 4 * 32);
    }
}

/// Dropping the q/k norms moves the logits far past the tolerance, so
/// matching transformers proves they are applied, and in the right place.
#[test]
fn qwen3_qk_norm_is_exercised() {
    let f = fixture("tiny-qwen3");
    let loaded = load_model(&ModelSpec {
        dir: Some(f.dir.clone()),
        dtype: DType::F32,
        ..ModelSpec::default()
    })
    .unwrap();
    let mut without = Model::build(&loaded).unwrap();
    for layer in &mut without.layers {
        layer.attention.qk_norm = None;
    }
    let p = &f.prompts[1];
    let diff = max_abs_diff(&last_logits(&without, &p.input_ids), &p.prompt_last_logits);
    assert!(
        diff > 100.0 * ATOL,
        "q/k norm changes the logits by only {diff}"
    );
    let with = max_abs_diff(&last_logits(&f.model, &p.input_ids), &p.prompt_last_logits);
    assert!(with <= ATOL, "{with}");
}

#[test]
fn parts_in_different_formats_run_as_one_layer() {
    for name in ["tiny-qwen2", "tiny-qwen3"] {
        let f = fixture(name);
        let m = mixed_formats(&f);
        let model = Model::build(&m).unwrap();
        for layer in &model.layers {
            let LinearWeight::Parts(parts) = &layer.attention.qkv_proj.weight else {
                panic!("{name}: q/k/v in two formats must be parts");
            };
            let formats: Vec<_> = parts.iter().map(|p| p.weight.dtype()).collect();
            assert_eq!(
                formats,
                [QuantFormat::F32, QuantFormat::F32, QuantFormat::Bf16]
            );
            assert!(matches!(
                layer.mlp.gate_up_proj.weight,
                LinearWeight::Parts(_)
            ));
            // One format: still one fused matrix.
            assert!(layer.attention.o_proj.fused_weight().is_some());
            assert!(layer.mlp.down_proj.fused_weight().is_some());
        }
        // Rounding v and up to bf16 moves the logits, within bf16's reach
        // (q/k biases, when present, are still added per part).
        for p in &f.prompts {
            let diff = max_abs_diff(&last_logits(&model, &p.input_ids), &p.prompt_last_logits);
            assert!(diff < 0.12, "{name}/{}: {diff}", p.name);
            assert!(diff > 0.0, "{name}/{}: the bf16 parts must show", p.name);
        }
        // Batch invariance: all prompts in one batch give each prompt
        // exactly its tokens and logprobs alone.
        let singles: Vec<Finished> = f
            .prompts
            .iter()
            .map(|p| {
                let mut d = Driver::new(&m, scheduler_config(16, 64));
                d.add(&p.name, &p.input_ids, greedy_params(8));
                d.run();
                d.results.remove(&p.name).unwrap()
            })
            .collect();
        let mut d = Driver::new(&m, scheduler_config(16, 128));
        for p in &f.prompts {
            d.add(&p.name, &p.input_ids, greedy_params(8));
        }
        d.run();
        for (p, single) in f.prompts.iter().zip(&singles) {
            let got = &d.results[&p.name];
            assert_eq!(got.tokens, single.tokens, "{name}/{}", p.name);
            for (a, b) in got.logprobs.iter().zip(&single.logprobs) {
                let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
                assert_eq!(a.sampled.logprob.to_bits(), b.sampled.logprob.to_bits());
            }
        }
    }
}

/// Dummy weights of the Qwen3 shape load and run (the built-in configs are
/// Qwen2; a directory's Qwen3 config with `--load-format dummy` takes this
/// path).
#[test]
fn qwen3_dummy_weights_run() {
    let f = fixture("tiny-qwen3");
    let dummy = load_model(&ModelSpec {
        dir: Some(f.dir.clone()),
        load_format: LoadFormat::Dummy,
        ..ModelSpec::default()
    })
    .unwrap();
    let dummy = Model::build(&dummy).unwrap();
    assert!(dummy.layers[0].attention.qk_norm.is_some());
    let logits = last_logits(&dummy, &f.prompts[0].input_ids);
    assert!(logits.iter().all(|x| x.is_finite()));
}
