//! `--backend`: the model runs on the CPU backend by default and by name;
//! an unknown name exits 2, naming the flag and the known backends, before
//! any weight is read.

use std::process::{Command, Output};

fn generate(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["generate", "--prompt", "Hi", "--max-tokens", "2"])
        .args(extra)
        .output()
        .expect("sluice runs")
}

#[test]
fn the_backend_is_chosen_by_name() {
    let out = generate(&["--backend", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("completion_tokens=2"), "{err}");

    let out = generate(&["--backend", "tpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--backend: unknown backend \"tpu\" (known: cpu)"),
        "{err}"
    );
}
