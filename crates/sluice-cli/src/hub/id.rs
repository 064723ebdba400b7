//! What the user typed as `--model`: a local path or a hub id
//! (`ORG/NAME`, `ORG/NAME:QUANT`), and the checks on the revision and on
//! repository file names that keep every path inside the cache.

use super::*;

// What the user typed

#[derive(Debug, PartialEq)]
pub(super) enum ModelRef {
    Local(PathBuf),
    Hub(HubId),
}

/// `ORG/NAME` with an optional `:QUANT` (a GGUF quantization tag).
#[derive(Debug, PartialEq)]
pub(super) struct HubId {
    pub(super) repo: String,
    pub(super) quant: Option<String>,
}

pub(super) fn parse_model(model: &str, exists: impl Fn(&Path) -> bool) -> Result<ModelRef> {
    if model.is_empty() {
        return Err(bad_config(
            "--model: empty (give a model directory, a .gguf file or a Hugging Face id ORG/NAME)",
        ));
    }
    let path = expand_home(model);
    // An existing path wins even when it also reads as a hub id, so
    // `--model org/name` with such a directory here keeps loading it.
    if exists(&path) {
        return Ok(ModelRef::Local(path));
    }
    if looks_like_path(model, &exists) {
        return Err(bad_config(format!("--model: {}", missing_path(&path))));
    }
    match parse_hub_id(model) {
        Some(id) => Ok(ModelRef::Hub(id)),
        None => Err(bad_config(format!(
            "--model: {}, and {model:?} is not a Hugging Face model id (ORG/NAME, or \
             ORG/NAME:QUANT for a GGUF repository)",
            missing_path(&path)
        ))),
    }
}

/// `~` and `~/...` with `$HOME` (a shell leaves a quoted `~` as it is).
pub(crate) fn expand_home(model: &str) -> PathBuf {
    let home = || std::env::var_os("HOME").filter(|h| !h.is_empty());
    match (model, model.strip_prefix("~/")) {
        ("~", _) => home().map_or_else(|| PathBuf::from(model), PathBuf::from),
        (_, Some(rest)) => {
            home().map_or_else(|| PathBuf::from(model), |h| Path::new(&h).join(rest))
        }
        _ => PathBuf::from(model),
    }
}

/// Whether `--model` names a local file or directory rather than a hub id:
/// it ends in `.gguf`, starts with `./`, `../`, `/` or `~`, or its first
/// component exists here (`models/x` with a `models` directory). Such an
/// argument is never sent to the hub.
pub(crate) fn looks_like_path(model: &str, exists: impl Fn(&Path) -> bool) -> bool {
    let lower = model.to_ascii_lowercase();
    if lower.ends_with(".gguf")
        || model == "."
        || model == ".."
        || ["./", "../", "/", "~"].iter().any(|p| model.starts_with(p))
        || model.contains('\\')
    {
        return true;
    }
    match model.split_once('/') {
        Some((first, _)) => !first.is_empty() && exists(Path::new(first)),
        None => false,
    }
}

/// "no such file or directory: PATH", with the `.gguf` files of its
/// directory when there are some (a typo'd name is the usual cause), or
/// the first part of the path that does not exist.
pub(crate) fn missing_path(path: &Path) -> String {
    let mut text = format!("no such file or directory: {}", path.display());
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return text,
    };
    if parent.is_dir() {
        let mut ggufs: Vec<String> = std::fs::read_dir(parent)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.to_ascii_lowercase().ends_with(".gguf"))
                    .collect()
            })
            .unwrap_or_default();
        if !ggufs.is_empty() {
            ggufs.sort();
            let shown = ggufs.len().min(5);
            let more = if ggufs.len() > shown {
                format!(", and {} more", ggufs.len() - shown)
            } else {
                String::new()
            };
            text.push_str(&format!(
                " ({} holds {}{more})",
                parent.display(),
                ggufs[..shown].join(", ")
            ));
        }
    } else {
        let mut missing = parent;
        while let Some(up) = missing.parent() {
            if up.as_os_str().is_empty() || up.is_dir() {
                break;
            }
            missing = up;
        }
        text.push_str(&format!(" ({} does not exist)", missing.display()));
    }
    text
}

/// The hub's own rule for repository ids (huggingface_hub's
/// `validate_repo_id`), narrowed to `ORG/NAME`: a bare `NAME` is far more
/// likely a mistyped local directory than one of the hub's few legacy ids.
pub(super) fn parse_hub_id(s: &str) -> Option<HubId> {
    let (repo, quant) = match s.split_once(':') {
        Some((repo, tag)) => {
            let ok = !tag.is_empty()
                && tag
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
            if !ok {
                return None;
            }
            (repo, Some(tag.to_string()))
        }
        None => (s, None),
    };
    let (org, name) = repo.split_once('/')?;
    let part_ok = |p: &str| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        !p.is_empty()
            && p.chars().all(|c| word(c) || c == '-' || c == '.')
            && p.starts_with(word)
            && p.ends_with(word)
    };
    if !part_ok(org)
        || !part_ok(name)
        || repo.len() > 96
        || repo.contains("--")
        || repo.contains("..")
        || repo.ends_with(".git")
    {
        return None;
    }
    Some(HubId {
        repo: repo.to_string(),
        quant,
    })
}

/// A revision becomes a URL segment and a file under `refs/`: refuse what
/// could break either (`..` would write outside the cache).
pub(super) fn check_revision(rev: &str) -> Result<()> {
    let bad = rev.is_empty()
        || rev.starts_with('/')
        || rev.ends_with('/')
        || rev
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        || rev
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "\\?#%:".contains(c));
    if bad {
        bail!("--revision {rev:?}: not a branch, tag or commit name");
    }
    Ok(())
}

/// A repository file name (from the hub or from a shard index) becomes a
/// path under the snapshot: only plain relative components.
pub(super) fn check_repo_file(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('\\')
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}
