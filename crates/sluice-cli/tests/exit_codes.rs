//! The command line's error paths: a configuration that cannot work exits
//! 2 (clap's status for a flag it cannot parse, and README's promise for
//! every other refused setting) with one message naming the flag and, for
//! a path, the path. An argument that looks like a path is never sent to
//! the hub (and the hub is offline here anyway: HF_HUB_OFFLINE=1 with an
//! empty HF_HOME).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Scratch {
    let dir = std::env::temp_dir().join(format!("sluice-exit-codes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Runs `sluice ARGS` in `cwd`; its exit code and stderr. A command that
/// is still running after 60 s (it started serving) fails the test.
fn sluice(cwd: &Path, hf_home: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .current_dir(cwd)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", hf_home)
        .env_remove("HF_HUB_CACHE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice {args:?} was still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
// One table of cases, read top to bottom.
#[allow(clippy::too_many_lines)]
fn configuration_errors_exit_2_naming_the_flag_and_the_path() {
    let s = scratch();
    let root = &s.0;
    let hf_home = root.join("hf-home");
    std::fs::create_dir_all(&hf_home).unwrap();
    // A models directory with one GGUF file (its name is all that is read)
    // and a README, an empty directory, a directory of other files.
    std::fs::create_dir_all(root.join("models")).unwrap();
    std::fs::write(root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"), b"").unwrap();
    std::fs::write(root.join("models/README.md"), b"notes").unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::create_dir_all(root.join("notes")).unwrap();
    std::fs::write(root.join("notes/model.txt"), b"not a model").unwrap();
    let abs_missing = root.join("nowhere/model.gguf");
    let abs_missing = abs_missing.to_str().unwrap();

    // (args, what the message must contain)
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // A missing file: named, its directory's GGUF files suggested.
        (
            vec!["serve", "--model", "models/SmolLM2.gguf"],
            vec![
                "--model",
                "no such file or directory: models/SmolLM2.gguf",
                "SmolLM2-135M-Instruct.Q4_1.gguf",
            ],
        ),
        // A typo'd relative path with one slash, no .gguf: it would read
        // as a hub id ORG/NAME, but `models` exists here.
        (
            vec!["serve", "--model", "models/SmolLM2-135M"],
            vec!["--model", "no such file or directory: models/SmolLM2-135M"],
        ),
        // A typo in the first component, with .gguf.
        (
            vec![
                "generate",
                "--model",
                "modls/SmolLM2.gguf",
                "--prompt",
                "hi",
            ],
            vec![
                "--model",
                "no such file or directory: modls/SmolLM2.gguf",
                "modls does not exist",
            ],
        ),
        (
            vec!["serve", "--model", "./no/such/dir"],
            vec!["--model", "no such file or directory: ./no/such/dir"],
        ),
        (
            vec!["serve", "--model", abs_missing],
            vec!["--model", abs_missing],
        ),
        (
            vec!["bench-model", "--model", "models/typo.gguf"],
            vec!["--model", "no such file or directory: models/typo.gguf"],
        ),
        // Directories that hold no model.
        (
            vec!["serve", "--model", "empty"],
            vec!["--model empty", "the directory is empty"],
        ),
        (
            vec!["generate", "--model", "notes", "--prompt", "hi"],
            vec!["--model notes", "no config.json and no .gguf file"],
        ),
        (
            vec!["serve", "--model", "empty", "--gguf-file", "x.gguf"],
            vec!["--gguf-file x.gguf", "no such file or directory"],
        ),
        // Flag values.
        (vec!["serve", "--port", "eighty"], vec!["--port"]),
        (vec!["serve", "--max-num-seqs", "0"], vec!["--max-num-seqs"]),
        (vec!["serve", "--dtype", "f99"], vec!["--dtype", "f99"]),
        (vec!["serve", "--backend", "tpu"], vec!["--backend", "tpu"]),
        (
            vec!["serve", "--kv-cache-memory", "lots"],
            vec!["--kv-cache-memory"],
        ),
        (vec!["serve", "--block-size", "0"], vec!["--block-size"]),
        (
            vec![
                "serve",
                "--structured-outputs-config",
                r#"{"backend": "xgrammar"}"#,
            ],
            vec!["--structured-outputs-config", "backend", "llguidance"],
        ),
        (
            vec!["serve", "--reasoning-parser", "r1"],
            vec!["--reasoning-parser", "deepseek_r1"],
        ),
        (
            vec!["serve", "--responses-store-max-age", "0"],
            vec![
                "--responses-store-max-age",
                "--responses-store-max-entries 0",
            ],
        ),
        (
            vec!["serve", "--structured-outputs-config", "{"],
            vec!["--structured-outputs-config", "not JSON"],
        ),
        (
            vec!["serve", "--scheduling-policy", "random"],
            vec!["--scheduling-policy"],
        ),
        (
            vec!["generate", "--max-num-seqs", "0", "--prompt", "hi"],
            vec!["--max-num-seqs"],
        ),
        (
            vec!["serve", "--model", "Org/Name", "--revision", "../up"],
            vec!["--revision"],
        ),
        (
            vec!["bench", "--tokenizer", "models/missing.gguf"],
            vec![
                "--tokenizer",
                "no such file or directory: models/missing.gguf",
            ],
        ),
        (
            vec!["bench", "--tokenizer", "empty"],
            vec!["--tokenizer empty", "no tokenizer.json and no .gguf file"],
        ),
    ];
    for (args, wanted) in cases {
        let (code, stderr) = sluice(root, &hf_home, &args);
        assert_eq!(code, Some(2), "sluice {args:?}: {stderr}");
        for w in wanted {
            assert!(stderr.contains(w), "sluice {args:?}: no {w:?} in {stderr}");
        }
        assert!(
            !stderr.contains("huggingface") && !stderr.contains("dns"),
            "sluice {args:?} went to the hub: {stderr}"
        );
    }
}
