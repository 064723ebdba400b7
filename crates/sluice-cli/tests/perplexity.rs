//! `sluice perplexity` against llama.cpp's `llama-perplexity` on the
//! tiny-llama GGUF fixtures: the perplexity of the F32 file, the base
//! log-probability file (sluice reads llama.cpp's, and writes the same
//! one), and each quantized file's KL divergence and same-top-token rate
//! against the F32 base. References: tests/data/perplexity/llamacpp.json
//! and tiny-llama.F32.c64.kld, made by make_llamacpp_refs.py there with
//! llama.cpp's defaults (an f16 KV cache), so sluice runs with
//! `--kv-cache-dtype float16` against them.

use serde_json::Value;
use sluice_model::perplexity::logits_file::{read_rows, BaseHeader};
use sluice_model::perplexity::scoring::base_log_prob;
use std::path::{Path, PathBuf};
use std::process::Command;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/perplexity")
}

fn gguf(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-model/tests/data/gguf")
        .join(name)
}

fn refs() -> Value {
    let text = std::fs::read_to_string(data().join("llamacpp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `sluice perplexity ARGS --json`, its one JSON object.
fn perplexity(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("perplexity")
        .args(args)
        .args(["--json", "--threads", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluice perplexity {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The F32 file's perplexity is llama.cpp's to 1e-5, and the base file
/// sluice writes is llama.cpp's: the same header and tokens (so the text
/// tokenized alike), every log probability within a few code steps (a
/// step is at most 16/65535 = 2.4e-4).
#[test]
fn perplexity_and_the_base_file_match_llama_cpp() {
    let refs = refs();
    let ours = std::env::temp_dir().join(format!("sluice-ppl-base-{}.kld", std::process::id()));
    let f32_file = gguf("tiny-llama.F32.gguf");
    let got = perplexity(&[
        "-m",
        path(&f32_file),
        "-f",
        path(&data().join("text.txt")),
        "-c",
        "64",
        "--chunks",
        "4",
        "--kv-cache-dtype",
        "float16",
        "--kl-divergence-base",
        path(&ours),
    ]);
    let want = refs["f32"]["ppl"].as_f64().unwrap();
    let ppl = got["ppl"].as_f64().unwrap();
    assert!(
        (ppl / want - 1.0).abs() < 1e-5,
        "PPL {ppl} vs llama.cpp {want}"
    );
    let want_err = refs["f32"]["ppl_err"].as_f64().unwrap();
    assert!((got["ppl_err"].as_f64().unwrap() / want_err - 1.0).abs() < 1e-4);
    assert_eq!(got["scored"], 4 * 31);

    let read = |p: &Path| {
        let bytes = std::fs::read(p).unwrap();
        let mut r = &bytes[..];
        let header = BaseHeader::read(&mut r).unwrap();
        let mut rows = Vec::new();
        let mut chunks = Vec::new();
        for c in 0..header.n_chunk {
            read_rows(&mut r, &header, c, &mut rows).unwrap();
            chunks.push(rows.clone());
        }
        assert!(r.is_empty(), "{}: bytes after the last chunk", p.display());
        (header, chunks)
    };
    let (theirs_h, theirs) = read(&data().join("tiny-llama.F32.c64.kld"));
    let (ours_h, ours_rows) = read(&ours);
    std::fs::remove_file(&ours).unwrap();
    let ours = ours_rows;
    assert_eq!(ours_h, theirs_h);
    let nv = 2 * ours_h.n_vocab.div_ceil(2) + 4;
    let mut worst = 0f32;
    for (a, b) in ours.iter().zip(&theirs) {
        for (ra, rb) in a.chunks(nv).zip(b.chunks(nv)) {
            for i in 0..ours_h.n_vocab {
                worst = worst.max((base_log_prob(ra, i) - base_log_prob(rb, i)).abs());
            }
        }
    }
    assert!(worst < 1e-3, "log probabilities differ by up to {worst}");
}

/// Each quantized file against llama.cpp's F32 base: with an f16 KV
/// cache (llama.cpp's), sluice's mean KL divergence and same-top-token
/// rate are llama.cpp's within 3 % and one token, and never worse than
/// 3 % above; the F32 file itself is at zero.
#[test]
fn kl_divergence_of_each_format_is_no_worse_than_llama_cpps() {
    let refs = refs();
    let base = data().join("tiny-llama.F32.c64.kld");
    let kld_of = |file: &Path, kv: &str| {
        let got = perplexity(&[
            "-m",
            path(file),
            "-c",
            "64",
            "--kv-cache-dtype",
            kv,
            "--kl-divergence-base",
            path(&base),
            "--kl-divergence",
        ]);
        assert_eq!(got["scored"], 4 * 31);
        let s = &got["stats"];
        (
            s["kld"]["value"].as_f64().unwrap(),
            100.0 * s["same_top_p"]["value"].as_f64().unwrap(),
        )
    };
    let (kld, top) = kld_of(&gguf("tiny-llama.F32.gguf"), "float16");
    assert!(
        kld < 1e-5 && top == 100.0,
        "F32 against its own base: {kld} {top}"
    );
    let one_token = 100.0 / (4.0 * 31.0);
    for (q, want) in refs["kl_divergence"].as_object().unwrap() {
        let (want_kld, want_top) = (
            want["kld"].as_f64().unwrap(),
            want["same_top_percent"].as_f64().unwrap(),
        );
        let (kld, top) = kld_of(&gguf(&format!("tiny-llama.{q}.gguf")), "float16");
        assert!(
            (kld / want_kld - 1.0).abs() < 0.03,
            "{q}: KLD {kld} vs llama.cpp {want_kld}"
        );
        assert!(
            (top - want_top).abs() <= one_token + 0.01,
            "{q}: same top {top} % vs llama.cpp {want_top} %"
        );
    }
}

/// A KV cache type the heads cannot be stored in, or a text too short for
/// two windows, is a configuration error naming what is wrong.
#[test]
fn bad_settings_are_errors_that_say_why() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("perplexity")
            .args(args)
            .output()
            .unwrap()
    };
    let f32_file = gguf("tiny-llama.F32.gguf");
    let text = data().join("text.txt");
    let out = run(&[
        "-m",
        path(&f32_file),
        "-f",
        path(&text),
        "--kv-cache-dtype",
        "q8_0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kv-cache-dtype") && err.contains("head_dim is 8"),
        "{err}"
    );
    let out = run(&["-m", path(&f32_file), "-f", path(&text), "-c", "4096"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ctx-size"), "{err}");
    let out = run(&["-m", path(&f32_file), "-f", path(&text), "-c", "512"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 1024 are needed"), "{err}");
    let out = run(&[
        "-m",
        path(&f32_file),
        "--kl-divergence-base",
        path(&text),
        "--kl-divergence",
        "-c",
        "64",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a base log-probability file"), "{err}");
}
