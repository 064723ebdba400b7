//! Gemma 3 on the small random-weight fixture (`tests/data/tiny-gemma3`,
//! made by transformers' `Gemma3ForCausalLM`: sliding window 24, layers 2
//! and 5 full, two RoPE bases, linear scaling on the full layers,
//! `query_pre_attn_scalar` 24): what sluice reads from its config and
//! tokenizer, and its outputs through the scheduler with the hybrid KV
//! cache — batched, chunked, preempted, prefix-cached — against
//! transformers' (`reference.json`; the one-prompt-at-a-time comparison is
//! in `reference.rs` with the other fixtures).

mod common;

use common::*;
use sluice_core::block_pool::NULL_BLOCK;
use sluice_core::kv_cache::{GroupingPolicy, KvCacheGroupSpec};
use sluice_core::SchedulerConfig;
use sluice_model::config::RopeScaling;
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::model::{DecoderPlan, RopeParams};
use sluice_model::runner::ModelRunner;
use sluice_model::tokenizer::Tokenizer;

const WINDOW: usize = 24;

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The reference's own description of the model, read back through the
/// config parser: which layers slide, the scale, both RoPEs.
#[test]
fn config_gives_the_layer_shapes_transformers_uses() {
    let f = fixture("tiny-gemma3");
    let s = &f.reference["settings"];
    let c = &f.loaded.config;
    let plan = DecoderPlan::of(c);
    let types: Vec<&str> = s["layer_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(plan.layers.len(), types.len());
    assert_eq!(s["sliding_window"].as_u64(), Some(WINDOW as u64));
    let full_rope = RopeParams {
        base: 1e6,
        scaling: RopeScaling::Linear { factor: 8.0 },
    };
    let local_rope = RopeParams {
        base: 1e4,
        scaling: RopeScaling::None,
    };
    for (layer, (shape, t)) in plan.layers.iter().zip(&types).enumerate() {
        let sliding = *t == "sliding_attention";
        assert_eq!(
            shape.window,
            sliding.then_some(WINDOW),
            "layer {layer} ({t})"
        );
        assert_eq!(
            shape.rope,
            Some(if sliding { local_rope } else { full_rope }),
            "layer {layer}"
        );
        // transformers: `query_pre_attn_scalar ** -0.5`, a Python float.
        assert_eq!(
            shape.scale,
            24f64.powf(-0.5) as f32,
            "query_pre_attn_scalar"
        );
        assert_eq!(shape.logit_softcap, None);
    }
    // vLLM's grouping: the four sliding layers in two groups of two (the
    // full layers' count), beside the full group.
    let groups = c.kv_layer_groups(GroupingPolicy::default());
    assert_eq!(
        groups.specs,
        vec![
            KvCacheGroupSpec::sliding_window(WINDOW),
            KvCacheGroupSpec::sliding_window(WINDOW),
            KvCacheGroupSpec::FULL
        ]
    );
    assert_eq!(c.eos_token_ids, vec![1]);
    assert_eq!(
        f.loaded.generation_config.eos_token_ids,
        u32s(&s["eos_token_ids"])
    );
}

/// The SentencePiece tokenizer (tokenizer.json) gives transformers' ids for
/// every prompt, and the Gemma chat template renders as transformers does.
#[test]
fn tokenizer_and_chat_template_match_transformers() {
    let f = fixture("tiny-gemma3");
    let tok = Tokenizer::from_dir(&f.dir).expect("tokenizer");
    for p in f.reference["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids, u32s(&p["input_ids"]), "{text:?}");
    }
    let chat = &f.reference["chat"];
    let messages = chat["messages"].as_array().unwrap();
    let rendered = tok
        .apply_chat_template(messages, chat["add_generation_prompt"].as_bool().unwrap())
        .unwrap();
    assert_eq!(rendered, chat["rendered_prompt"].as_str().unwrap());
    let ids = tok.encode(&rendered, false).unwrap();
    assert_eq!(ids, u32s(&chat["input_ids"]));
}

fn driver(f: &Fixture, config: SchedulerConfig) -> Driver {
    let kv = KvCacheConfig::new(config.block_size, config.num_gpu_blocks);
    let runner = ModelRunner::new(&f.loaded, kv).expect("runner");
    Driver::with_runner(runner, config)
}

fn check_against_reference(f: &Fixture, d: &Driver, what: &str) {
    for p in &f.prompts {
        let r = &d.results[&p.name];
        assert_eq!(r.tokens, p.greedy_token_ids, "{what}: {}", p.name);
        for (step, (got, want)) in r.logprobs.iter().zip(&p.top_logprobs).enumerate() {
            let got = got.as_ref().unwrap();
            for (g, &(id, lp)) in got.top.iter().zip(want) {
                assert_eq!(g.token_id, id, "{what}: {} step {step}", p.name);
                assert!((g.logprob - lp).abs() <= ATOL, "{what}: {} {step}", p.name);
            }
        }
    }
}

/// Every prompt at once, with chunked prefill at several budgets, and a
/// pool so small that requests are preempted and recomputed: transformers'
/// tokens and logprobs every time, and the sliding groups never hold more
/// than the window's blocks (plus the one being filled) of a request.
#[test]
fn batched_chunked_and_preempted_runs_match_transformers() {
    let f = fixture("tiny-gemma3");
    let bs = 4;
    // (budget, blocks): all prompts in one step with room for everything;
    // chunks of 7 and 33 tokens; 150 blocks of 4, where the prompts alone
    // need 772 tokens in each of 3 groups without freeing.
    for (budget, blocks, max_seqs) in [(2048, 800, 16), (7, 800, 5), (33, 400, 8), (64, 150, 8)] {
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            ..scheduler_config(bs, blocks)
        };
        let mut d = driver(&f, config);
        for p in &f.prompts {
            d.add(&p.name, &p.input_ids, greedy_params(32));
        }
        let groups = d.sched.config().kv_cache_groups.clone();
        let mut most_held = 0;
        while d.sched.has_unfinished_requests() {
            d.step();
            for id in d.sched.running_ids() {
                for (g, spec) in groups.iter().enumerate() {
                    if *spec == KvCacheGroupSpec::FULL {
                        continue;
                    }
                    let held = d
                        .sched
                        .group_block_ids(&id, sluice_core::kv_cache::GroupId(g as u32))
                        .unwrap()
                        .iter()
                        .filter(|&&b| b != NULL_BLOCK)
                        .count();
                    most_held = most_held.max(held);
                }
            }
            assert!(d.steps < 10_000);
        }
        d.step();
        let preempted = d.sched.make_stats().num_preemptions_total;
        if blocks == 150 {
            assert!(preempted > 0, "150 blocks must preempt");
        }
        assert!(most_held >= WINDOW / bs, "the sliding groups were used");
        // A window of 24 tokens over blocks of 4 spans at most 7 blocks, and
        // the step's new tokens (up to one chunk) need theirs.
        let bound = WINDOW.div_ceil(bs) + 1 + budget.min(256).div_ceil(bs);
        assert!(
            most_held <= bound,
            "budget {budget}: a sliding group held {most_held} blocks of one request"
        );
        check_against_reference(&f, &d, &format!("budget {budget}, {blocks} blocks"));
    }
}

/// A prompt computed before is served from the prefix cache of every group
/// (the sliding groups keep the blocks inside the window), with the same
/// outputs.
#[test]
fn prefix_cache_hits_in_every_group() {
    let f = fixture("tiny-gemma3");
    let p = f.prompts.iter().find(|p| p.name == "past_window").unwrap();
    assert!(p.input_ids.len() > 4 * WINDOW);
    let mut d = driver(&f, scheduler_config(16, 200));
    d.add("first", &p.input_ids, greedy_params(32));
    d.run();
    d.add("again", &p.input_ids, greedy_params(32));
    d.run();
    let again = &d.results["again"];
    assert_eq!(again.tokens, p.greedy_token_ids);
    assert_eq!(d.results["first"].tokens, p.greedy_token_ids);
    // Every full block but the last prompt token's comes from the cache.
    assert_eq!(again.num_cached_tokens, (p.input_ids.len() - 1) / 16 * 16);
}

/// The fixture as a `Gemma3ForConditionalGeneration` checkpoint would hold
/// its text model: the config under `text_config` (given only where it
/// differs from `Gemma3TextConfig`'s defaults, as Google's configs do), the
/// tensors under transformers 4's `language_model.model.` or transformers
/// 5's `model.language_model.` prefix, a vision tensor beside them.
#[test]
fn the_text_model_of_a_conditional_generation_checkpoint_loads() {
    use safetensors::tensor::{Dtype, SafeTensors, TensorView};
    use sluice_model::{load_model, ModelSpec};
    let f = fixture("tiny-gemma3");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.join("config.json")).unwrap()).unwrap();
    let mut text = config.as_object().unwrap().clone();
    text.remove("architectures");
    // Gemma3TextConfig's defaults.
    for k in [
        "rms_norm_eps",
        "hidden_activation",
        "bos_token_id",
        "eos_token_id",
    ] {
        text.remove(k);
    }
    let outer = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "eos_token_id": [1, 6],
        "text_config": text,
        "vision_config": {"hidden_size": 8},
    });
    let bytes = std::fs::read(f.dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let vision = [0u8; 16];
    for (layout, prefix) in [
        ("v4", "language_model.model."),
        ("v5", "model.language_model."),
    ] {
        let dir =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gemma3-{layout}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), outer.to_string()).unwrap();
        let mut views: Vec<(String, TensorView)> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let renamed = match n.strip_prefix("model.") {
                    Some(rest) => format!("{prefix}{rest}"),
                    None => n.clone(),
                };
                (renamed, v)
            })
            .collect();
        views.push((
            "vision_tower.patch_embedding.weight".into(),
            TensorView::new(Dtype::F32, vec![4], &vision).unwrap(),
        ));
        std::fs::write(
            dir.join("model.safetensors"),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        let loaded = load_model(&ModelSpec {
            dir: Some(dir.clone()),
            dtype: sluice_model::DType::F32,
            ..ModelSpec::default()
        })
        .expect("the text model loads");
        assert_eq!(loaded.config.rms_norm_eps, 1e-6);
        assert_eq!(
            loaded.config.eos_token_ids,
            vec![1, 6],
            "the outer config's"
        );
        let model = sluice_model::model::Model::build(&loaded).unwrap();
        for p in &f.prompts {
            let diff = max_abs_diff(
                &prompt_last_logits(&model, &p.input_ids),
                &p.prompt_last_logits,
            );
            assert!(diff <= ATOL, "{layout}/{}: {diff}", p.name);
        }
    }
}

/// The fixture converted by llama.cpp's `convert_hf_to_gguf.py`
/// (`tiny-gemma3-f32.gguf`, made by `make_tiny_gemma3_gguf.py`): norms
/// with the +1 folded in, the sliding layers' RoPE base in
/// `rope.freq_base_swa`, and no `query_pre_attn_scalar` or layer pattern,
/// which llama.cpp fills in with head_dim and every 6th layer full. Read
/// as llama.cpp reads it, it computes what transformers computes for the
/// fixture with those two settings (`reference-gguf.json`), and its
/// vocabulary tokenizes the prompts as the fixture's tokenizer.json does.
#[test]
fn its_gguf_conversion_runs_as_llama_cpp_reads_it() {
    use sluice_model::{load_model, DType, ModelSpec};
    let f = fixture("tiny-gemma3");
    let path = f.dir.join("tiny-gemma3-f32.gguf");
    let loaded = load_model(&ModelSpec {
        dir: Some(path.clone()),
        dtype: DType::Auto,
        ..ModelSpec::default()
    })
    .unwrap();
    let plan = DecoderPlan::of(&loaded.config);
    let windows: Vec<_> = plan.layers.iter().map(|l| l.window).collect();
    assert_eq!(
        windows,
        [vec![Some(WINDOW); 5], vec![None]].concat(),
        "llama.cpp's default pattern"
    );
    assert!(plan
        .layers
        .iter()
        .all(|l| l.scale == 32f64.powf(-0.5) as f32));
    let text = std::fs::read_to_string(f.dir.join("reference-gguf.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let model = sluice_model::model::Model::build(&loaded).unwrap();
    let mut d = Driver::new(&loaded, scheduler_config(16, 400));
    let prompts = reference["prompts"].as_array().unwrap();
    for p in prompts {
        let name = p["name"].as_str().unwrap();
        let ids = u32s(&p["input_ids"]);
        let want: Vec<f32> = p["prompt_last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let diff = max_abs_diff(&prompt_last_logits(&model, &ids), &want);
        assert!(diff <= ATOL, "{name}: {diff}");
        d.add(name, &ids, greedy_params(32));
    }
    d.run();
    for p in prompts {
        let name = p["name"].as_str().unwrap();
        let r = &d.results[name];
        assert_eq!(r.tokens, u32s(&p["greedy_token_ids"]), "{name}");
        for (step, (got, want)) in r
            .logprobs
            .iter()
            .zip(p["top_logprobs"].as_array().unwrap())
            .enumerate()
        {
            let got = got.as_ref().unwrap();
            for (g, w) in got.top.iter().zip(want.as_array().unwrap()) {
                assert_eq!(
                    g.token_id as u64,
                    w["id"].as_u64().unwrap(),
                    "{name} {step}"
                );
                let lp = w["logprob"].as_f64().unwrap() as f32;
                assert!((g.logprob - lp).abs() <= ATOL, "{name} {step}");
            }
        }
    }
    // The file's vocabulary (SentencePiece scores, no dummy prefix) against
    // the fixture's tokenizer.json, through transformers' ids.
    let gguf = loaded.gguf.as_ref().unwrap();
    let tok = Tokenizer::from_gguf_vocab(&gguf.vocab).unwrap();
    for p in f.reference["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            u32s(&p["input_ids"]),
            "{text:?}"
        );
    }
    // The file's chat template and control tokens: the chat renders and
    // tokenizes as transformers does it from the checkpoint.
    let chat = &f.reference["chat"];
    let rendered = tok
        .apply_chat_template(chat["messages"].as_array().unwrap(), true)
        .unwrap();
    assert_eq!(rendered, chat["rendered_prompt"].as_str().unwrap());
    assert_eq!(
        tok.encode(&rendered, false).unwrap(),
        u32s(&chat["input_ids"])
    );
}
