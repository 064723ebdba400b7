//! The hub's environment, read as huggingface_hub reads it: `HF_ENDPOINT`,
//! `HF_TOKEN` (or the token file of `huggingface-cli login`), `HF_HOME`,
//! `HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_HUB_DISABLE_PROGRESS_BARS`.

use super::*;

// The environment, as huggingface_hub reads it

pub(super) struct HubEnv {
    pub(super) endpoint: String,
    /// The hub cache (`…/hub`, holding `models--ORG--NAME`).
    pub(super) cache_dir: PathBuf,
    pub(super) token: Option<String>,
    /// Where the token came from, for error hints.
    pub(super) token_source: String,
    pub(super) offline: bool,
    pub(super) progress: bool,
}

impl HubEnv {
    pub(super) fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok();
        let mut env = Self::from_vars(var)?;
        if env.token.is_none() {
            // `huggingface-cli login` writes this file.
            let path = token_file(var).ok();
            if let Some(path) = path {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    let t = text.trim();
                    if !t.is_empty() {
                        env.token = Some(t.to_string());
                        env.token_source = path.display().to_string();
                    }
                }
            }
        }
        Ok(env)
    }

    /// Everything but the token file, from variables `var` gives.
    pub(super) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let set = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let endpoint = set("HF_ENDPOINT")
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            bail!("HF_ENDPOINT={endpoint}: not an http:// or https:// URL");
        }
        let cache_dir = match set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
            Some(dir) => expand_home(&dir, &var)?,
            None => hf_home(&var)?.join("hub"),
        };
        // HUGGING_FACE_HUB_TOKEN is the older name huggingface_hub still reads.
        let (token, token_source) = match set("HF_TOKEN") {
            Some(t) => (Some(t), "HF_TOKEN"),
            None => (set("HUGGING_FACE_HUB_TOKEN"), "HUGGING_FACE_HUB_TOKEN"),
        };
        Ok(Self {
            endpoint,
            cache_dir,
            token: token.map(|t| t.trim().to_string()),
            token_source: token_source.to_string(),
            offline: set("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v)),
            progress: !set("HF_HUB_DISABLE_PROGRESS_BARS").is_some_and(|v| truthy(&v)),
        })
    }
}

/// huggingface_hub's reading of a boolean variable.
pub(super) fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

/// `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else
/// `~/.cache/huggingface`.
pub(super) fn hf_home(var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    if let Some(home) = set("HF_HOME") {
        return expand_home(&home, var);
    }
    if let Some(xdg) = set("XDG_CACHE_HOME") {
        return Ok(expand_home(&xdg, var)?.join("huggingface"));
    }
    Ok(user_home(var)?.join(".cache").join("huggingface"))
}

pub(super) fn token_file(var: impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    match var("HF_TOKEN_PATH").filter(|v| !v.trim().is_empty()) {
        Some(p) => expand_home(&p, &var),
        None => Ok(hf_home(&var)?.join("token")),
    }
}

pub(super) fn user_home(var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    var("HOME")
        .or_else(|| var("USERPROFILE"))
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            anyhow!("cannot find the home directory for the Hugging Face cache: set HF_HOME")
        })
}

/// `~/x` → `$HOME/x`, as huggingface_hub's `expanduser`.
pub(super) fn expand_home(p: &str, var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    match p.strip_prefix("~/") {
        Some(rest) => Ok(user_home(var)?.join(rest)),
        None if p == "~" => user_home(var),
        None => Ok(PathBuf::from(p)),
    }
}
