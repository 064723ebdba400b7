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
        bail!("--model: empty (give a model directory or a Hugging Face id ORG/NAME)");
    }
    // An existing path wins even when it also reads as a hub id, so
    // `--model org/name` with such a directory here keeps loading it.
    if exists(Path::new(model)) {
        return Ok(ModelRef::Local(PathBuf::from(model)));
    }
    match parse_hub_id(model) {
        Some(id) => Ok(ModelRef::Hub(id)),
        None => bail!(
            "--model {model}: no such file or directory, and not a Hugging Face model id \
             (ORG/NAME, or ORG/NAME:QUANT for a GGUF repository)"
        ),
    }
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
