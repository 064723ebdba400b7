//! Hub ids, the environment, GGUF choice and offline lookups, without a
//! network.

use super::*;

fn hub(s: &str) -> Option<(String, Option<String>)> {
    parse_hub_id(s).map(|h| (h.repo, h.quant))
}

#[test]
fn hub_ids_parse() {
    assert_eq!(
        hub("Qwen/Qwen2.5-0.5B-Instruct"),
        Some(("Qwen/Qwen2.5-0.5B-Instruct".into(), None))
    );
    assert_eq!(
        hub("meta-llama/Llama-3.2-1B"),
        Some(("meta-llama/Llama-3.2-1B".into(), None))
    );
    assert_eq!(
        hub("bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"),
        Some((
            "bartowski/Qwen2.5-0.5B-Instruct-GGUF".into(),
            Some("Q4_K_M".into())
        ))
    );
    assert_eq!(
        hub("a_b/c.d:q8_0"),
        Some(("a_b/c.d".into(), Some("q8_0".into())))
    );
}

#[test]
fn non_ids_are_refused() {
    for bad in [
        "gpt2",            // no organisation: more likely a mistyped directory
        "./models/x",      // a relative path
        "/abs/path",       // an absolute path
        "a/b/c",           // two slashes
        "org/",            // empty name
        "/name",           // empty organisation
        "org/na--me",      // `--` is reserved by the cache layout
        "org/na..me",      // `..`
        "-org/name",       // must start with a word character
        "org/name.",       // and end with one
        "org/name.git",    // a git remote, not an id
        "org/na me",       // spaces
        "org/name:",       // empty quant tag
        "org/name:Q4 K",   // bad tag
        "org/name:Q4:K_M", // two tags
        "C:\\models\\x",   // a Windows path
    ] {
        assert_eq!(parse_hub_id(bad), None, "{bad:?}");
    }
    let long = format!("org/{}", "x".repeat(93));
    assert_eq!(parse_hub_id(&long), None);
}

#[test]
fn an_existing_path_wins_over_a_hub_id() {
    let m = parse_model("org/name", |_| true).unwrap();
    assert_eq!(m, ModelRef::Local(PathBuf::from("org/name")));
    let m = parse_model("org/name", |_| false).unwrap();
    assert!(matches!(m, ModelRef::Hub(HubId { ref repo, quant: None }) if repo == "org/name"));
    let e = parse_model("./no/such/dir", |_| false)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--model: no such file or directory: ./no/such/dir"),
        "{e}"
    );
    assert!(parse_model("", |_| true)
        .unwrap_err()
        .to_string()
        .contains("--model"));
}

#[test]
fn what_looks_like_a_path_never_goes_to_the_hub() {
    // Each would parse as ORG/NAME, or fails as one, but reads as a path.
    for model in [
        "models/SmolLM2.gguf",
        "org/Name.GGUF",
        "./org/name",
        "../org/name",
        "/org/name",
        "~/org/name",
    ] {
        assert!(looks_like_path(model, |_| false), "{model}");
        let e = parse_model(model, |_| false).unwrap_err();
        assert!(
            format!("{e:#}").contains("no such file or directory"),
            "{model}: {e:#}"
        );
        assert_eq!(crate::exit::exit_code(&e), std::process::ExitCode::from(2));
    }
    // The first component exists here: a path, not a hub id.
    assert!(looks_like_path("models/name", |p| p == Path::new("models")));
    assert!(!looks_like_path("models/name", |_| false));
    assert!(!looks_like_path("Qwen/Qwen2.5-0.5B-Instruct", |_| false));
    assert!(!looks_like_path("bartowski/x-GGUF:Q4_K_M", |_| false));
}

#[test]
fn revisions_are_checked() {
    for ok in [
        "main",
        "v1.0",
        "refs/pr/1",
        "0123456789abcdef0123456789abcdef01234567",
    ] {
        assert!(check_revision(ok).is_ok(), "{ok}");
    }
    for bad in ["", "../x", "a/../b", "/main", "main/", "a b", "a\\b", "a?b"] {
        let e = check_revision(bad).unwrap_err().to_string();
        assert!(e.starts_with("--revision"), "{e}");
    }
}

#[test]
fn repo_file_names_stay_inside() {
    assert!(check_repo_file("model-00001-of-00002.safetensors"));
    assert!(check_repo_file("Q4_K_M/model.gguf"));
    for bad in ["", "../x", "/etc/passwd", "a/../../b", "a\\b", "./a"] {
        assert!(!check_repo_file(bad), "{bad:?}");
    }
}

#[test]
fn environment_is_read_like_huggingface_hub() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let env = HubEnv::from_vars(vars(&[("HOME", "/home/u")])).unwrap();
    assert_eq!(env.endpoint, DEFAULT_ENDPOINT);
    assert_eq!(
        env.cache_dir,
        PathBuf::from("/home/u/.cache/huggingface/hub")
    );
    assert!(!env.offline && env.progress && env.token.is_none());

    let env = HubEnv::from_vars(vars(&[
        ("HOME", "/home/u"),
        ("HF_HOME", "~/hf"),
        ("HF_ENDPOINT", "http://127.0.0.1:9/"),
        ("HF_TOKEN", " hf_abc \n"),
        ("HF_HUB_OFFLINE", "yes"),
        ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ]))
    .unwrap();
    assert_eq!(env.endpoint, "http://127.0.0.1:9");
    assert_eq!(env.cache_dir, PathBuf::from("/home/u/hf/hub"));
    assert_eq!(env.token.as_deref(), Some("hf_abc"));
    assert!(env.offline && !env.progress);

    let env = HubEnv::from_vars(vars(&[
        ("HF_HOME", "/hf"),
        ("HF_HUB_CACHE", "/cache"),
        ("HF_HUB_OFFLINE", "0"),
    ]))
    .unwrap();
    assert_eq!(env.cache_dir, PathBuf::from("/cache"));
    assert!(!env.offline);

    let env = HubEnv::from_vars(vars(&[("XDG_CACHE_HOME", "/xdg")])).unwrap();
    assert_eq!(env.cache_dir, PathBuf::from("/xdg/huggingface/hub"));
    assert_eq!(
        token_file(vars(&[("HF_HOME", "/hf")])).unwrap(),
        PathBuf::from("/hf/token")
    );

    assert!(HubEnv::from_vars(vars(&[("HOME", "/h"), ("HF_ENDPOINT", "localhost:80")])).is_err());
    // No home and no HF_HOME: an error, not hf-hub's panic.
    assert!(HubEnv::from_vars(vars(&[])).is_err());
}

#[test]
fn split_gguf_names() {
    assert_eq!(
        split_part("m-Q8_0-00001-of-00003.gguf"),
        Some(("m-Q8_0", 1, 3))
    );
    assert_eq!(split_part("d/m-00003-of-00003.GGUF"), Some(("d/m", 3, 3)));
    assert_eq!(split_part("m-Q8_0.gguf"), None);
    assert_eq!(split_part("m-00004-of-00003.gguf"), None);
    assert_eq!(split_part("m-00001-of-00003.safetensors"), None);
}

const FILES: &[&str] = &[
    "README.md",
    "model-Q4_K_S.gguf",
    "model-Q4_K_M.gguf",
    "model-IQ4_XS.gguf",
    "model_bf16.gguf",
    "mmproj-model-Q4_K_M.gguf",
    "Q8_0/model-Q8_0-00002-of-00002.gguf",
    "Q8_0/model-Q8_0-00001-of-00002.gguf",
    "Q6_K/model-Q6_K-00001-of-00002.gguf",
];

fn pick(tag: &str) -> std::result::Result<Vec<String>, String> {
    pick_gguf(FILES, &GgufPick::Quant(tag.into())).map(|s| s.parts)
}

#[test]
fn quant_tags_pick_one_gguf_model() {
    assert_eq!(pick("Q4_K_M").unwrap(), ["model-Q4_K_M.gguf"]);
    assert_eq!(pick("q4_k_s").unwrap(), ["model-Q4_K_S.gguf"]);
    // `Q4_XS` is not a token of `IQ4_XS`, but the fallback still finds it.
    assert_eq!(pick("IQ4_XS").unwrap(), ["model-IQ4_XS.gguf"]);
    assert_eq!(pick("Q4_XS").unwrap(), ["model-IQ4_XS.gguf"]);
    // Glued to the name with `_`: the substring fallback.
    assert_eq!(pick("BF16").unwrap(), ["model_bf16.gguf"]);
    assert_eq!(
        pick("Q8_0").unwrap(),
        [
            "Q8_0/model-Q8_0-00001-of-00002.gguf",
            "Q8_0/model-Q8_0-00002-of-00002.gguf"
        ]
    );
    let e = pick("Q4_K").unwrap_err();
    assert!(
        e.contains("several") && e.contains("model-Q4_K_M.gguf"),
        "{e}"
    );
    let e = pick("Q2_K").unwrap_err();
    assert!(
        e.contains("no .gguf file matches") && e.contains("model-Q4_K_M.gguf"),
        "{e}"
    );
    assert!(!e.contains("mmproj"), "{e}");
    let e = pick("Q6_K").unwrap_err();
    assert!(e.contains("1 of its 2 parts"), "{e}");
}

#[test]
fn gguf_file_names_pick_their_set() {
    let by = |n: &str| pick_gguf(FILES, &GgufPick::File(n.into())).map(|s| s.parts);
    assert_eq!(by("model-Q4_K_S.gguf").unwrap(), ["model-Q4_K_S.gguf"]);
    assert_eq!(by("model-Q8_0-00001-of-00002.gguf").unwrap().len(), 2);
    assert_eq!(by("Q8_0/model-Q8_0-00002-of-00002.gguf").unwrap().len(), 2);
    assert!(by("nope.gguf").unwrap_err().contains("no file nope.gguf"));
}
