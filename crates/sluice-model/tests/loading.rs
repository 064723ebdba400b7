//! Loading: sharded checkpoints, bf16, dummy weights, built-in configs, and
//! every user mistake reported as an error naming the file or tensor.

mod common;

use common::*;
use safetensors::{tensor::TensorView, SafeTensors};
use sluice_model::model::Model;
use sluice_model::{load_model, DType, LoadFormat, LoadedModel, ModelSpec};
use std::path::{Path, PathBuf};

/// A scratch copy of a fixture's config and generation config.
fn scratch_dir(test: &str, fixture: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("loading-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(data_dir(fixture).join(f), dir.join(f)).unwrap();
    }
    dir
}

/// Writes the fixture's tensors, transformed by `edit` (which may drop or
/// reshape them), into `dir/file`.
fn write_tensors(
    fixture: &str,
    dir: &Path,
    file: &str,
    keep: impl Fn(&str) -> bool,
    reshape: impl Fn(&str, &[usize]) -> Vec<usize>,
) {
    let bytes = std::fs::read(data_dir(fixture).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| keep(n))
        .map(|(n, v)| {
            let shape = reshape(&n, v.shape());
            let view = TensorView::new(v.dtype(), shape, v.data()).unwrap();
            (n, view)
        })
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join(file), out).unwrap();
}

fn spec(dir: &Path, dtype: DType) -> ModelSpec {
    ModelSpec {
        dir: Some(dir.to_path_buf()),
        dtype,
        ..ModelSpec::default()
    }
}

fn error_of(spec: &ModelSpec) -> String {
    match load_model(spec).and_then(|l| Model::build(&l)) {
        Ok(_) => panic!("loading should fail"),
        Err(e) => format!("{e:#}"),
    }
}

fn last_logits(loaded: &LoadedModel, prompt: &[u32]) -> Vec<f32> {
    prompt_last_logits(&Model::build(loaded).unwrap(), prompt)
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let dir = scratch_dir("sharded", "tiny-llama");
    let in_first = |n: &str| n.contains("layers.0.") || n.contains("embed");
    write_tensors(
        "tiny-llama",
        &dir,
        "model-00001-of-00002.safetensors",
        in_first,
        |_, s| s.to_vec(),
    );
    write_tensors(
        "tiny-llama",
        &dir,
        "model-00002-of-00002.safetensors",
        |n| !in_first(n),
        |_, s| s.to_vec(),
    );
    let bytes = std::fs::read(data_dir("tiny-llama").join("model.safetensors")).unwrap();
    let names: Vec<String> = SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .into_iter()
        .map(String::from)
        .collect();
    let weight_map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| {
            let file = if in_first(n) {
                "model-00001-of-00002.safetensors"
            } else {
                "model-00002-of-00002.safetensors"
            };
            (n.clone(), serde_json::Value::from(file))
        })
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let f = fixture("tiny-llama");
    let sharded = load_model(&spec(&dir, DType::F32)).unwrap();
    let p = &f.prompts[0];
    assert_eq!(
        last_logits(&sharded, &p.input_ids),
        last_logits(&f.loaded, &p.input_ids)
    );
}

#[test]
fn bf16_weights_stay_close_to_f32() {
    // The README: transformers in bf16 moves these logits by up to 0.12; we
    // round only the weights (activations stay f32), so expect less.
    for name in REFERENCE_FIXTURES {
        let f = fixture(name);
        let bf16 = load_model(&spec(&f.dir, DType::Bf16)).unwrap();
        assert_eq!(
            Model::build(&bf16).unwrap().dtype,
            sluice_model::kernels::QuantFormat::Bf16
        );
        for p in &f.prompts {
            let diff = max_abs_diff(&last_logits(&bf16, &p.input_ids), &p.prompt_last_logits);
            assert!(diff < 0.12, "{name}/{}: {diff}", p.name);
            assert!(diff > 0.0, "bf16 rounding must show");
        }
    }
}

#[test]
fn dummy_weights_are_deterministic_and_sane() {
    let builtin = |seed| {
        load_model(&ModelSpec {
            builtin: Some("tiny".into()),
            load_format: LoadFormat::Dummy,
            seed,
            ..ModelSpec::default()
        })
        .unwrap()
    };
    let prompt: Vec<u32> = b"Hello, sluice!".iter().map(|&b| b as u32).collect();
    let a = last_logits(&builtin(1), &prompt);
    assert_eq!(a, last_logits(&builtin(1), &prompt));
    assert_ne!(a, last_logits(&builtin(2), &prompt));
    assert_eq!(a.len(), 384);
    assert!(
        a.iter().all(|x| x.is_finite() && x.abs() < 10.0),
        "activations stay sane"
    );

    // A directory's config with dummy weights.
    let f = fixture("tiny-qwen2");
    let dummy = load_model(&ModelSpec {
        load_format: LoadFormat::Dummy,
        ..spec(&f.dir, DType::Auto)
    })
    .unwrap();
    assert_eq!(dummy.config, f.loaded.config);
    assert_eq!(dummy.generation_config.eos_token_ids, vec![999, 997]);
    assert!(last_logits(&dummy, &f.prompts[0].input_ids)
        .iter()
        .all(|x| x.is_finite()));
}

#[test]
fn errors_name_what_is_wrong() {
    // Nothing / both given, a built-in without dummy weights.
    assert!(error_of(&ModelSpec::default()).contains("no model"));
    let both = ModelSpec {
        builtin: Some("tiny".into()),
        ..spec(&data_dir("tiny-qwen2"), DType::F32)
    };
    assert!(error_of(&both).contains("not both"));
    let builtin_real = ModelSpec {
        builtin: Some("tiny".into()),
        ..ModelSpec::default()
    };
    assert!(error_of(&builtin_real).contains("dummy"));
    let unknown = ModelSpec {
        builtin: Some("gpt-9".into()),
        load_format: LoadFormat::Dummy,
        ..ModelSpec::default()
    };
    assert!(error_of(&unknown).contains("gpt-9"));

    // Missing directory / config / weights.
    let e = error_of(&spec(Path::new("/nonexistent/model"), DType::F32));
    assert!(e.contains("/nonexistent/model"), "{e}");
    let dir = scratch_dir("missing", "tiny-qwen2");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = error_of(&spec(&dir, DType::F32));
    assert!(e.contains("config.json"), "{e}");
    let dir = scratch_dir("noweights", "tiny-qwen2");
    let e = error_of(&spec(&dir, DType::F32));
    assert!(e.contains("model.safetensors"), "{e}");

    // Unsupported architecture.
    let dir = scratch_dir("arch", "tiny-qwen2");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("Qwen2ForCausalLM", "FalconForCausalLM"),
    )
    .unwrap();
    let e = error_of(&spec(&dir, DType::F32));
    assert!(
        e.contains("FalconForCausalLM") && e.contains("unsupported"),
        "{e}"
    );

    // A missing tensor.
    let dir = scratch_dir("tensor", "tiny-qwen2");
    let gone = "model.layers.1.mlp.up_proj.weight";
    write_tensors(
        "tiny-qwen2",
        &dir,
        "model.safetensors",
        |n| n != gone,
        |_, s| s.to_vec(),
    );
    let e = error_of(&spec(&dir, DType::F32));
    assert!(e.contains(gone), "{e}");

    // A tensor of the wrong shape (same bytes, transposed shape).
    let dir = scratch_dir("shape", "tiny-qwen2");
    let bad = "model.layers.0.self_attn.k_proj.weight";
    write_tensors(
        "tiny-qwen2",
        &dir,
        "model.safetensors",
        |_| true,
        |n, s| {
            if n == bad {
                vec![s[1], s[0]]
            } else {
                s.to_vec()
            }
        },
    );
    let e = error_of(&spec(&dir, DType::F32));
    assert!(
        e.contains(bad) && e.contains("[64, 32]") && e.contains("[32, 64]"),
        "{e}"
    );

    // A truncated file.
    let dir = scratch_dir("truncated", "tiny-qwen2");
    let bytes = std::fs::read(data_dir("tiny-qwen2").join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let e = error_of(&spec(&dir, DType::F32));
    assert!(e.contains("model.safetensors"), "{e}");

    // An untied head without lm_head.weight.
    let dir = scratch_dir("untied", "tiny-qwen2");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace(
            "\"tie_word_embeddings\": true",
            "\"tie_word_embeddings\": false",
        ),
    )
    .unwrap();
    write_tensors(
        "tiny-qwen2",
        &dir,
        "model.safetensors",
        |_| true,
        |_, s| s.to_vec(),
    );
    let e = error_of(&spec(&dir, DType::F32));
    assert!(e.contains("lm_head.weight"), "{e}");
}

/// A Mistral-style checkpoint (`MistralForCausalLM`, GQA, untied head, no
/// sliding window) is the Llama architecture: the same weights give the
/// same logits.
#[test]
fn mistral_checkpoint_runs_as_llama() {
    let dir = scratch_dir("mistral", "tiny-llama");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let cfg = cfg
        .replace("LlamaForCausalLM", "MistralForCausalLM")
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"mistral\"");
    assert!(cfg.contains("MistralForCausalLM") && cfg.contains("\"mistral\""));
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    std::fs::copy(
        data_dir("tiny-llama").join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let f = fixture("tiny-llama");
    let mistral = load_model(&spec(&dir, DType::F32)).unwrap();
    let p = &f.prompts[1];
    assert_eq!(
        last_logits(&mistral, &p.input_ids),
        last_logits(&f.loaded, &p.input_ids)
    );
}
