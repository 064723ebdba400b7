//! `sluice simulate` and `sluice serve --executor simulated` size one model
//! alike: for the Hugging Face checkpoints and GGUF files in the repository
//! (and a Qwen3 config without `head_dim`), both commands report the same
//! KV block count, and it is the count vLLM's sizing gives for the model's
//! own config, written out here from the config's numbers:
//!
//! - head_dim: the config's, else transformers' config-class default
//!   (`Qwen3Config`: 128; Llama / Qwen2: hidden ÷ heads); a GGUF's
//!   `attention.key_length`, else embedding ÷ heads (llama.cpp's rule);
//! - bytes per weight and KV element: 2 for a checkpoint (vLLM's
//!   `--dtype auto` serves float32 in bf16), the file's tensor bytes for a
//!   GGUF's weights;
//! - blocks: ⌊(⌈memory × 0.92⌉ − weights − reserve) ÷ (16 × KV bytes per
//!   token)⌋ (vLLM 0.33's `determine_available_memory`).
//!
//! A hybrid config (tiny-gemma3's sliding and full layers) is sized by its
//! KV cache groups, a block costing one group's layer pages, or all of them
//! with `--disable-hybrid-kv-cache-manager`; and the runner's and the
//! simulator's readers give every layer of a config the same attention
//! kind.

mod common;

use common::spawn_serve;
use serde_json::Value;
use sluice_sim::Hardware;
use std::path::{Path, PathBuf};
use std::process::Command;

/// 1 GB, no reserve: tiny models get a block count far below the
/// simulated cap, so every weight byte shows.
const HW: Hardware = Hardware {
    memory_bytes: 1e9,
    activation_reserve_bytes: 0.0,
    ..Hardware::H100_SXM
};
const UTILIZATION: f64 = 0.92;
const BLOCK_SIZE: u64 = 16;

fn repo_data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-model/tests/data")
        .join(rel)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-sizing-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The widths a KV sizing needs, and the weight bytes.
#[derive(Debug)]
struct Expected {
    layers: u64,
    kv_heads: u64,
    head_dim: u64,
    weight_bytes: u64,
}

impl Expected {
    fn blocks(&self) -> u64 {
        self.blocks_of(2)
    }

    /// Blocks with KV elements of `bytes` each.
    fn blocks_of(&self, bytes: u64) -> u64 {
        let kv_per_token = self.layers * 2 * self.kv_heads * self.head_dim * bytes;
        let available = (HW.memory_bytes * UTILIZATION).ceil() - self.weight_bytes as f64;
        (available / (BLOCK_SIZE * kv_per_token) as f64).floor() as u64
    }
}

/// From a `config.json`, with transformers' defaults.
fn expected_hf(config: &Path) -> Expected {
    let c: Value = serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    let (h, layers, heads, i, vocab) = (
        n("hidden_size"),
        n("num_hidden_layers"),
        n("num_attention_heads"),
        n("intermediate_size"),
        n("vocab_size"),
    );
    let kv_heads = c["num_key_value_heads"].as_u64().unwrap_or(heads);
    let qwen3 = c["architectures"][0] == "Qwen3ForCausalLM";
    let head_dim = match c["head_dim"].as_u64() {
        Some(d) => d,
        None if qwen3 => 128,
        None => h / heads,
    };
    let tied = c["tie_word_embeddings"].as_bool().unwrap_or(false);
    // q, k, v, o; gate, up, down; two norms (biases left out: the roofline's
    // count, under a block of these models' KV).
    let per_layer =
        h * (heads + 2 * kv_heads) * head_dim + heads * head_dim * h + 3 * h * i + 2 * h;
    let params = layers * per_layer + if tied { 1 } else { 2 } * vocab * h + h;
    Expected {
        layers,
        kv_heads,
        head_dim,
        weight_bytes: 2 * params,
    }
}

/// From a GGUF file's metadata and tensor sizes.
fn expected_gguf(path: &Path) -> Expected {
    let file = sluice_gguf::GgufFile::open(path).unwrap();
    let md = file.metadata();
    let arch = md.architecture().unwrap().to_string();
    let get = |k: &str| md.u64(&format!("{arch}.{k}")).unwrap();
    let heads = get("attention.head_count");
    let head_dim = md
        .opt(
            &format!("{arch}.attention.key_length"),
            sluice_gguf::Metadata::u64,
        )
        .unwrap()
        .unwrap_or(get("embedding_length") / heads);
    Expected {
        layers: get("block_count"),
        kv_heads: md
            .opt(
                &format!("{arch}.attention.head_count_kv"),
                sluice_gguf::Metadata::u64,
            )
            .unwrap()
            .unwrap_or(heads),
        head_dim,
        weight_bytes: file.tensors().iter().map(|t| t.n_bytes() as u64).sum(),
    }
}

/// `N` of `... N KV blocks` / `(N KV blocks: ...)` in `line`.
fn blocks_in(line: &str) -> Option<u64> {
    let before = &line[..line.find(" KV blocks")?];
    before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn simulate_blocks(model: &Path, profile: &Path) -> u64 {
    simulate_blocks_with(model, profile, &[])
}

fn simulate_blocks_with(model: &Path, profile: &Path, extra: &[&str]) -> u64 {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .arg("--model")
        .arg(model)
        .arg("--hardware")
        .arg(profile)
        .args(extra)
        .args(["--num-prompts", "1", "--random-input-len", "4"])
        .args(["--random-output-len", "2", "--no-progress"])
        .output()
        .expect("sluice simulate runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{model:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(blocks_in)
        .unwrap_or_else(|| panic!("{model:?}: no KV blocks line in {stdout}"))
}

fn serve_blocks(model: &Path, profile: &Path) -> u64 {
    serve_blocks_with(model, profile, &[])
}

fn serve_blocks_with(model: &Path, profile: &Path, extra: &[&str]) -> u64 {
    let mut args = vec![
        "--executor",
        "simulated",
        "--profile",
        profile.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let mut serve = spawn_serve(&args, &[]);
    let blocks = serve
        .log
        .iter()
        .filter(|l| l.contains("simulated executor"))
        .find_map(|l| blocks_in(l))
        .unwrap_or_else(|| panic!("{model:?}: no KV blocks line in {:?}", serve.log));
    serve.terminate_and_wait();
    blocks
}

/// tiny-qwen3 without its `head_dim`: transformers' Qwen3Config fills in
/// 128, not hidden ÷ heads (16). No weights: neither command reads them.
fn qwen3_without_head_dim() -> PathBuf {
    let dir = temp_dir("qwen3-no-head-dim");
    let src = repo_data("tiny-qwen3");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut c: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    c.as_object_mut().unwrap().remove("head_dim");
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    dir
}

#[test]
fn the_simulator_and_the_server_size_every_fixture_alike() {
    let dir = temp_dir("profile");
    let profile = dir.join("profile.json");
    let json = serde_json::json!({"kind": "roofline", "hardware": HW});
    std::fs::write(&profile, json.to_string()).unwrap();

    let mut cases: Vec<(PathBuf, Expected)> = Vec::new();
    for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama"] {
        let d = repo_data(name);
        let e = expected_hf(&d.join("config.json"));
        cases.push((d, e));
    }
    let no_head_dim = qwen3_without_head_dim();
    let e = expected_hf(&no_head_dim.join("config.json"));
    assert_eq!(e.head_dim, 128);
    cases.push((no_head_dim, e));
    for name in [
        "tiny-qwen2.F32.gguf",
        "tiny-qwen2.Q4_K_M.gguf",
        "tiny-qwen3.Q8_0.gguf",
        "tiny-llama.Q4_0.gguf",
        "tiny-llama-k256.Q6_K.gguf",
    ] {
        let p = repo_data("gguf").join(name);
        let e = expected_gguf(&p);
        cases.push((p, e));
    }
    for (model, expected) in &cases {
        let want = expected.blocks();
        let simulated = simulate_blocks(model, &profile);
        let served = serve_blocks(model, &profile);
        assert_eq!(
            (simulated, served),
            (want, want),
            "{model:?} (simulate, serve) vs vLLM's sizing of {expected:?}"
        );
    }
}

/// `--kv-cache-dtype` sets the bytes of a KV element in both commands:
/// vLLM's `fp8` 1 byte, `float32` 4 (`auto` is the checkpoint's 2).
#[test]
fn the_kv_cache_dtype_sets_the_element_bytes_of_a_simulated_pool() {
    let dir = temp_dir("dtype-profile");
    let profile = dir.join("profile.json");
    let json = serde_json::json!({"kind": "roofline", "hardware": HW});
    std::fs::write(&profile, json.to_string()).unwrap();
    let model = repo_data("tiny-qwen2");
    let e = expected_hf(&model.join("config.json"));
    for (flag, bytes) in [("fp8", 1), ("float32", 4), ("auto", 2)] {
        let extra = ["--kv-cache-dtype", flag];
        let want = e.blocks_of(bytes);
        assert_eq!(
            simulate_blocks_with(&model, &profile, &extra),
            want,
            "{flag}"
        );
        assert_eq!(serve_blocks_with(&model, &profile, &extra), want, "{flag}");
    }
}

#[test]
fn a_hybrid_config_is_sized_by_its_kv_cache_groups() {
    let dir = temp_dir("hybrid-profile");
    let profile = dir.join("profile.json");
    let json = serde_json::json!({"kind": "roofline", "hardware": HW});
    std::fs::write(&profile, json.to_string()).unwrap();
    // tiny-gemma3's `layer_types`: 4 sliding layers, 2 full (2 and 5).
    // vLLM's group size is the smaller bucket, 2: two sliding groups and a
    // full one of 2 layers, so a block of the shared pool costs 2 layer
    // pages, not 6 (`_get_kv_cache_bytes_per_block`); without the hybrid
    // manager, one group of all 6.
    let model = repo_data("tiny-gemma3");
    let e = expected_hf(&model.join("config.json"));
    assert_eq!((e.layers, e.kv_heads, e.head_dim), (6, 2, 32));
    let sized_as = |layer_slots| {
        Expected {
            layers: layer_slots,
            kv_heads: e.kv_heads,
            head_dim: e.head_dim,
            weight_bytes: e.weight_bytes,
        }
        .blocks()
    };
    let off = ["--disable-hybrid-kv-cache-manager"];
    assert_eq!(simulate_blocks(&model, &profile), sized_as(2));
    assert_eq!(serve_blocks(&model, &profile), sized_as(2));
    assert_eq!(simulate_blocks_with(&model, &profile, &off), sized_as(6));
    assert_eq!(serve_blocks_with(&model, &profile, &off), sized_as(6));
    // Its llama.cpp conversion stores the window but no pattern, so
    // llama.cpp's default makes every 6th layer full: [sliding × 5, full],
    // buckets of 5 and 1, six groups of 1 layer, a block 1 page.
    let gguf = model.join("tiny-gemma3-f32.gguf");
    let e = expected_gguf(&gguf);
    let sized_as = |layer_slots| {
        Expected {
            layers: layer_slots,
            kv_heads: e.kv_heads,
            head_dim: e.head_dim,
            weight_bytes: e.weight_bytes,
        }
        .blocks()
    };
    assert_eq!(simulate_blocks(&gguf, &profile), sized_as(1));
    assert_eq!(serve_blocks(&gguf, &profile), sized_as(1));
}

#[test]
fn the_runner_and_the_shape_reader_give_every_layer_the_same_attention_kind() {
    // Two readers of one config.json: the CPU runner's (its architecture's
    // layer shapes) and sluice-arch's (the simulator's), on the sliding
    // window rules of the families the runner runs.
    use sluice_sim::LayeredShape;
    let base = r#""hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
        "max_position_embeddings": 4096"#;
    for (arch, extra) in [
        ("MistralForCausalLM", r#", "sliding_window": 1024"#),
        ("MistralForCausalLM", r#", "sliding_window": 4096"#),
        ("MistralForCausalLM", r#", "sliding_window": null"#),
        ("LlamaForCausalLM", ""),
        ("Qwen2ForCausalLM", r#", "sliding_window": 1024"#),
        (
            "Qwen2ForCausalLM",
            r#", "sliding_window": 1024, "use_sliding_window": true, "max_window_layers": 2"#,
        ),
        (
            "Qwen3ForCausalLM",
            r#", "sliding_window": 512, "use_sliding_window": true, "max_window_layers": 1"#,
        ),
        (
            "Qwen3ForCausalLM",
            r#", "sliding_window": 512, "use_sliding_window": true"#,
        ),
    ] {
        let text = format!(r#"{{"architectures": ["{arch}"], {base}{extra}}}"#);
        let runner = sluice_model::config::ModelConfig::from_json(&text).unwrap();
        let runner_kinds = sluice_model::model::DecoderPlan::of(&runner).attention_kinds();
        let shape = LayeredShape::from_config_str(&text, Path::new("config.json")).unwrap();
        assert_eq!(shape.layer_kinds, runner_kinds, "{arch}{extra}");
    }
    // Gemma 3: its `layer_types`, or without them the pattern keys or
    // Gemma3TextConfig's 6; and its GGUF conversion.
    let dir = repo_data("tiny-gemma3");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    let listed = cfg.clone();
    cfg.as_object_mut().unwrap().remove("layer_types");
    let patterned = cfg.clone();
    cfg.as_object_mut()
        .unwrap()
        .remove("sliding_window_pattern");
    let underscored = cfg.clone();
    cfg.as_object_mut()
        .unwrap()
        .remove("_sliding_window_pattern");
    cfg["num_hidden_layers"] = 12.into();
    // A window past the context still makes sliding layers.
    let mut wide = listed.clone();
    wide["sliding_window"] = 1024.into();
    for c in [listed, patterned, underscored, cfg, wide] {
        let text = c.to_string();
        let runner = sluice_model::config::ModelConfig::from_json(&text).unwrap();
        let runner_kinds = sluice_model::model::DecoderPlan::of(&runner).attention_kinds();
        let shape = LayeredShape::from_config_str(&text, Path::new("config.json")).unwrap();
        assert_eq!(shape.layer_kinds, runner_kinds, "{text}");
        assert!(shape.has_windowed_layers(), "{text}");
    }
    let gguf = dir.join("tiny-gemma3-f32.gguf");
    let runner = sluice_model::gguf::GgufModel::open(&gguf).unwrap().config;
    let runner_kinds = sluice_model::model::DecoderPlan::of(&runner).attention_kinds();
    let shape = LayeredShape::from_gguf(&gguf).unwrap();
    assert_eq!(shape.layer_kinds, runner_kinds);
    assert!(shape.has_windowed_layers());
}
