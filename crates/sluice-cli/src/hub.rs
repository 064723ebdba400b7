//! `--model ORG/NAME`: turns what the user typed into a local model
//! directory (or GGUF file), downloading a Hugging Face Hub repository into
//! the standard Hugging Face cache when needed.
//!
//! Owns: telling a local path from a hub id, the hub's environment
//! (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`,
//! `HF_HUB_DISABLE_PROGRESS_BARS`), choosing which files of a repository a
//! model needs, choosing a GGUF file from a quantization tag, and the cache
//! lookups of offline mode. The HTTP and the cache layout itself
//! (`models--ORG--NAME/{blobs,refs,snapshots}`) are the `hf-hub` crate's.
//!
//! Promises:
//! - a path that exists is always used as it is, whatever it looks like;
//! - the directory returned is a snapshot holding everything the loader and
//!   the tokenizer read, so it loads exactly like a local directory;
//! - a file already in the cache snapshot of the repository's current commit
//!   is never downloaded again;
//! - with `HF_HUB_OFFLINE` set nothing touches the network;
//! - every failure (bad id, missing repository or file, refused access,
//!   network down, not cached offline) is one line naming `--model` and the
//!   repository or file, never a panic.

use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::{Progress, RepoInfo};
use hf_hub::{Cache, Repo, RepoType};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The default hub, used when `HF_ENDPOINT` is not set.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The branch used when no `--revision` is given.
pub const DEFAULT_REVISION: &str = "main";
/// Files the loader or tokenizer read when present; fetched when the
/// repository has them.
const OPTIONAL_FILES: &[&str] = &[
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];
/// Files a safetensors model cannot run without.
const REQUIRED_FILES: &[&str] = &["config.json", "tokenizer.json"];
const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

/// What `--model` resolved to.
#[derive(Clone, Debug)]
pub struct ResolvedModel {
    /// A model directory, or a `.gguf` file (the first part of a split set).
    pub path: PathBuf,
    /// The hub id (`ORG/NAME`, `:QUANT` kept) when it came from the hub.
    pub hub_id: Option<String>,
}

/// Resolves `--model`: an existing path as it is, otherwise a hub id
/// downloaded (or found, offline) in the Hugging Face cache. `weights: false`
/// (`--load-format dummy`) skips the safetensors files.
pub fn resolve_model(
    model: &str,
    revision: Option<&str>,
    gguf_file: Option<&str>,
    weights: bool,
) -> Result<ResolvedModel> {
    match parse_model(model, |p| p.exists())? {
        ModelRef::Local(path) => {
            if revision.is_some() {
                eprintln!(
                    "sluice: --revision applies to hub ids only; ignored for the local path {model}"
                );
            }
            let path = match gguf_file {
                // A local directory with several GGUF files: pick one by name.
                Some(name) if path.is_dir() => {
                    let file = path.join(name);
                    if !file.is_file() {
                        bail!("--gguf-file {name}: no such file in --model {model}");
                    }
                    file
                }
                Some(name) => bail!("--gguf-file {name}: --model {model} is not a directory"),
                None => path,
            };
            Ok(ResolvedModel { path, hub_id: None })
        }
        ModelRef::Hub(id) => {
            let revision = revision.unwrap_or(DEFAULT_REVISION);
            check_revision(revision)?;
            let want = match (&id.quant, gguf_file) {
                (Some(_), Some(_)) => bail!(
                    "--model {model}: give the GGUF file either as ORG/NAME:QUANT or with \
                     --gguf-file, not both"
                ),
                (Some(tag), None) => Want::Gguf(GgufPick::Quant(tag.clone())),
                (None, Some(name)) => {
                    if !name.to_ascii_lowercase().ends_with(".gguf") {
                        bail!("--gguf-file {name}: not a .gguf file name");
                    }
                    Want::Gguf(GgufPick::File(name.to_string()))
                }
                (None, None) => Want::Safetensors { weights },
            };
            let env = HubEnv::from_env().map_err(|e| anyhow!("--model {model}: {e}"))?;
            let hub = Hub {
                env: &env,
                id: &id,
                model,
                revision,
                want: &want,
            };
            let path = if env.offline {
                hub.cached()
                    .map_err(|e| anyhow!("--model {model}: offline (HF_HUB_OFFLINE is set): {e}"))?
            } else {
                hub.fetch()?
            };
            eprintln!("sluice: --model {model}: {}", path.display());
            Ok(ResolvedModel {
                path,
                hub_id: Some(model.to_string()),
            })
        }
    }
}

// ---------------------------------------------------------------------------
// What the user typed

#[derive(Debug, PartialEq)]
enum ModelRef {
    Local(PathBuf),
    Hub(HubId),
}

/// `ORG/NAME` with an optional `:QUANT` (a GGUF quantization tag).
#[derive(Debug, PartialEq)]
struct HubId {
    repo: String,
    quant: Option<String>,
}

fn parse_model(model: &str, exists: impl Fn(&Path) -> bool) -> Result<ModelRef> {
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
fn parse_hub_id(s: &str) -> Option<HubId> {
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
fn check_revision(rev: &str) -> Result<()> {
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
fn check_repo_file(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('\\')
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

// ---------------------------------------------------------------------------
// The environment, as huggingface_hub reads it

struct HubEnv {
    endpoint: String,
    /// The hub cache (`…/hub`, holding `models--ORG--NAME`).
    cache_dir: PathBuf,
    token: Option<String>,
    /// Where the token came from, for error hints.
    token_source: String,
    offline: bool,
    progress: bool,
}

impl HubEnv {
    fn from_env() -> Result<Self> {
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
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
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
fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

/// `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else
/// `~/.cache/huggingface`.
fn hf_home(var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    if let Some(home) = set("HF_HOME") {
        return expand_home(&home, var);
    }
    if let Some(xdg) = set("XDG_CACHE_HOME") {
        return Ok(expand_home(&xdg, var)?.join("huggingface"));
    }
    Ok(user_home(var)?.join(".cache").join("huggingface"))
}

fn token_file(var: impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    match var("HF_TOKEN_PATH").filter(|v| !v.trim().is_empty()) {
        Some(p) => expand_home(&p, &var),
        None => Ok(hf_home(&var)?.join("token")),
    }
}

fn user_home(var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    var("HOME")
        .or_else(|| var("USERPROFILE"))
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            anyhow!("cannot find the home directory for the Hugging Face cache: set HF_HOME")
        })
}

/// `~/x` → `$HOME/x`, as huggingface_hub's `expanduser`.
fn expand_home(p: &str, var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    match p.strip_prefix("~/") {
        Some(rest) => Ok(user_home(var)?.join(rest)),
        None if p == "~" => user_home(var),
        None => Ok(PathBuf::from(p)),
    }
}

// ---------------------------------------------------------------------------
// Which files

enum Want {
    Safetensors { weights: bool },
    Gguf(GgufPick),
}

enum GgufPick {
    Quant(String),
    File(String),
}

/// A GGUF model: one file, or the parts of a split set
/// (`NAME-00001-of-00003.gguf`, ...), first part first.
#[derive(Debug, PartialEq)]
struct GgufSet {
    /// The name without `.gguf` and without the `-0000i-of-0000n` suffix.
    key: String,
    parts: Vec<String>,
    /// Parts the set's names say it has (1 for a single file).
    total: u32,
}

impl GgufSet {
    fn complete(&self) -> bool {
        self.parts.len() == self.total as usize
    }

    fn describe(&self) -> String {
        match self.parts.first() {
            Some(first) if self.total > 1 => format!("{first} ({} parts)", self.total),
            Some(first) => first.clone(),
            None => self.key.clone(),
        }
    }
}

/// `dir/name-00001-of-00003.gguf` → (`dir/name`, 1, 3).
fn split_part(name: &str) -> Option<(&str, u32, u32)> {
    let stem = strip_gguf(name)?;
    let (head, total) = stem.rsplit_once("-of-")?;
    let (prefix, index) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if !digits(total) || !digits(index) {
        return None;
    }
    let (index, total) = (index.parse().ok()?, total.parse().ok()?);
    if index == 0 || index > total {
        return None;
    }
    Some((prefix, index, total))
}

fn strip_gguf(name: &str) -> Option<&str> {
    let n = name.len();
    (n > 5 && name.is_char_boundary(n - 5) && name[n - 5..].eq_ignore_ascii_case(".gguf"))
        .then(|| &name[..n - 5])
}

/// The GGUF models among `files`, by set; multimodal projector files
/// (`mmproj*`) are not models and are left out, as llama.cpp does.
fn gguf_sets<'a>(files: impl IntoIterator<Item = &'a str>) -> Vec<GgufSet> {
    let mut sets: BTreeMap<String, (BTreeMap<u32, String>, u32)> = BTreeMap::new();
    for f in files {
        let Some(stem) = strip_gguf(f) else { continue };
        let base = f.rsplit('/').next().unwrap_or(f);
        if base.to_ascii_lowercase().contains("mmproj") {
            continue;
        }
        let (key, index, total) = match split_part(f) {
            Some((prefix, i, n)) => (prefix.to_string(), i, n),
            None => (stem.to_string(), 1, 1),
        };
        let entry = sets.entry(key).or_insert_with(|| (BTreeMap::new(), total));
        entry.1 = entry.1.max(total);
        entry.0.insert(index, f.to_string());
    }
    sets.into_iter()
        .map(|(key, (parts, total))| GgufSet {
            key,
            parts: parts.into_values().collect(),
            total,
        })
        .collect()
}

/// Whether `tag` appears in `key` as a whole token (`q4_k_m` in
/// `model-q4_k_m` but not `q4_k` in it, nor `q4_xs` in `iq4_xs`).
fn contains_token(key: &str, tag: &str) -> bool {
    let (key, tag) = (key.to_ascii_lowercase(), tag.to_ascii_lowercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    key.match_indices(&tag).any(|(i, m)| {
        !word(key[..i].chars().next_back()) && !word(key[i + m.len()..].chars().next())
    })
}

/// The set `pick` names among `files`; `Err` says why none (or too many).
fn pick_gguf(files: &[&str], pick: &GgufPick) -> std::result::Result<GgufSet, String> {
    let sets = gguf_sets(files.iter().copied());
    let available = || {
        if sets.is_empty() {
            "it has no .gguf model files".to_string()
        } else {
            let names: Vec<String> = sets.iter().map(GgufSet::describe).collect();
            format!("its .gguf files: {}", names.join(", "))
        }
    };
    let chosen = match pick {
        GgufPick::File(name) => {
            let exact = files.iter().find(|f| **f == name.as_str());
            let by_base: Vec<&&str> = files
                .iter()
                .filter(|f| f.rsplit('/').next() == Some(name.as_str()))
                .collect();
            let file = match (exact, by_base.as_slice()) {
                (Some(f), _) => *f,
                (None, [f]) => **f,
                (None, []) => return Err(format!("no file {name} ({})", available())),
                (None, many) => {
                    let many: Vec<&str> = many.iter().map(|f| **f).collect();
                    return Err(format!(
                        "{name} names several files ({}): give its full path in the repository",
                        many.join(", ")
                    ));
                }
            };
            let key = match split_part(file) {
                Some((prefix, _, _)) => prefix.to_string(),
                None => strip_gguf(file).unwrap_or(file).to_string(),
            };
            match sets.into_iter().find(|s| s.key == key) {
                Some(set) => set,
                None => return Err(format!("{file} is not a GGUF model file")),
            }
        }
        GgufPick::Quant(tag) => {
            let lower = tag.to_ascii_lowercase();
            let mut matches: Vec<&GgufSet> = sets
                .iter()
                .filter(|s| contains_token(&s.key, tag))
                .collect();
            if matches.is_empty() {
                // Names that glue the tag to other words (`model_q4_k_m`).
                matches = sets
                    .iter()
                    .filter(|s| s.key.to_ascii_lowercase().contains(&lower))
                    .collect();
            }
            match matches.as_slice() {
                [] => return Err(format!("no .gguf file matches {tag:?} ({})", available())),
                [one] => GgufSet {
                    key: one.key.clone(),
                    parts: one.parts.clone(),
                    total: one.total,
                },
                many => {
                    let names: Vec<String> = many.iter().map(|s| s.describe()).collect();
                    return Err(format!(
                        "{tag:?} matches several .gguf files ({}): name one with --gguf-file",
                        names.join(", ")
                    ));
                }
            }
        }
    };
    if !chosen.complete() {
        return Err(format!(
            "the split GGUF set {} has {} of its {} parts",
            chosen.key,
            chosen.parts.len(),
            chosen.total
        ));
    }
    Ok(chosen)
}

/// The shard file names a `model.safetensors.index.json` lists.
fn shards_of_index(path: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{INDEX_FILE}: not valid JSON"))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| anyhow!("{INDEX_FILE}: no `weight_map`"))?;
    let mut shards = BTreeSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| anyhow!("{INDEX_FILE}: weight_map[{tensor:?}] is not a file name"))?;
        if !check_repo_file(file) {
            bail!(
                "{INDEX_FILE}: weight_map[{tensor:?}] = {file:?} is not a file in the repository"
            );
        }
        shards.insert(file.to_string());
    }
    Ok(shards.into_iter().collect())
}

// ---------------------------------------------------------------------------
// Online and offline

struct Hub<'a> {
    env: &'a HubEnv,
    id: &'a HubId,
    /// `--model` as typed, for messages.
    model: &'a str,
    revision: &'a str,
    want: &'a Want,
}

/// Why a request failed: the network (the cache may still serve), or
/// anything else (already a finished message).
enum Failure {
    Network(String),
    Other(anyhow::Error),
}

impl Hub<'_> {
    fn repo(&self) -> Repo {
        Repo::with_revision(
            self.id.repo.clone(),
            RepoType::Model,
            self.revision.to_string(),
        )
    }

    /// `…/hub/models--ORG--NAME`.
    fn repo_dir(&self) -> PathBuf {
        self.env.cache_dir.join(self.repo().folder_name())
    }

    /// `--model X`, with the revision when not the default: the start of
    /// every message.
    fn flag(&self) -> String {
        if self.revision == DEFAULT_REVISION {
            format!("--model {}", self.model)
        } else {
            format!("--model {} (revision {})", self.model, self.revision)
        }
    }

    /// `ORG/NAME` at `REV`, for messages.
    fn at(&self) -> String {
        if self.revision == DEFAULT_REVISION {
            self.id.repo.clone()
        } else {
            format!("{} (revision {})", self.id.repo, self.revision)
        }
    }

    fn api(&self) -> Result<ApiRepo> {
        let api = ApiBuilder::from_cache(Cache::new(self.env.cache_dir.clone()))
            .with_endpoint(self.env.endpoint.clone())
            .with_token(self.env.token.clone())
            // Our own bar (`Bar`) is passed per download instead.
            .with_progress(false)
            .with_user_agent("sluice", env!("CARGO_PKG_VERSION"))
            // Retries resume a body cut off mid-download from where it
            // stopped; refusals (4xx) are not retried.
            .with_retries(2)
            .build()
            .map_err(|e| anyhow!("{}: cannot set up the hub client: {e}", self.flag()))?;
        Ok(api.repo(self.repo()))
    }

    /// Downloads what is missing from the snapshot of the revision's current
    /// commit, and returns the snapshot (or GGUF file) path.
    fn fetch(&self) -> Result<PathBuf> {
        let api = self.api()?;
        let info = match self.repo_info(&api) {
            Ok(info) => info,
            Err(Failure::Other(e)) => return Err(e),
            Err(Failure::Network(msg)) => {
                // As huggingface_hub does: with the hub unreachable, a
                // complete cached snapshot still runs.
                return match self.cached() {
                    Ok(path) => {
                        eprintln!("sluice: {msg}; using the cached copy");
                        Ok(path)
                    }
                    Err(_) => Err(anyhow!(
                        "{msg} (and it is not in the cache {}; HF_HUB_OFFLINE=1 uses only the cache)",
                        self.env.cache_dir.display()
                    )),
                };
            }
        };
        if !check_repo_file(&info.sha) {
            bail!(
                "{}: the hub sent an invalid commit id {:?}",
                self.flag(),
                info.sha
            );
        }
        let names: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
        let has = |f: &str| names.contains(&f);
        let snapshot = self.repo_dir().join("snapshots").join(&info.sha);

        let result = match self.want {
            Want::Gguf(pick) => {
                let set = pick_gguf(&names, pick).map_err(|e| anyhow!("{}: {e}", self.flag()))?;
                for part in &set.parts {
                    self.download(&api, &snapshot, part)?;
                }
                snapshot.join(&set.parts[0])
            }
            Want::Safetensors { weights } => {
                if !has("config.json") {
                    let sets = gguf_sets(names.iter().copied());
                    if !sets.is_empty() {
                        // A GGUF repository with no quant named: Q4_K_M, as
                        // llama.cpp's `-hf` takes, or its only file set.
                        let set = match pick_gguf(&names, &GgufPick::Quant("Q4_K_M".into())) {
                            Ok(set) => set,
                            Err(_) if sets.len() == 1 => {
                                pick_gguf(&names, &GgufPick::File(sets[0].parts[0].clone()))
                                    .map_err(|e| anyhow!("{}: {e}", self.flag()))?
                            }
                            Err(e) => bail!(
                                "{}: a GGUF repository without a Q4_K_M file ({e}): pick one \
                                 with --model {}:QUANT or --gguf-file NAME",
                                self.flag(),
                                self.id.repo
                            ),
                        };
                        eprintln!(
                            "sluice: {}: no quantization given, using {}",
                            self.id.repo, set.parts[0]
                        );
                        for part in &set.parts {
                            self.download(&api, &snapshot, part)?;
                        }
                        return Ok(snapshot.join(&set.parts[0]));
                    }
                    bail!(
                        "{}: the repository has no config.json (not a transformers model)",
                        self.flag()
                    );
                }
                for f in REQUIRED_FILES {
                    if !has(f) {
                        bail!(
                            "{}: the repository has no {f} (sluice needs config.json and a \
                             Hugging Face fast tokenizer, tokenizer.json)",
                            self.flag()
                        );
                    }
                }
                let mut files: Vec<&str> = REQUIRED_FILES.to_vec();
                files.extend(OPTIONAL_FILES.iter().filter(|f| has(f)));
                if *weights && !has(INDEX_FILE) {
                    if !has(SINGLE_FILE) {
                        let other = names.iter().any(|n| {
                            n.ends_with(".bin") || n.ends_with(".pt") || n.ends_with(".pth")
                        });
                        bail!(
                            "{}: the repository has no {SINGLE_FILE} or {INDEX_FILE}{}",
                            self.flag(),
                            if other {
                                " (only PyTorch weights, which sluice does not load)"
                            } else {
                                ""
                            }
                        );
                    }
                    files.push(SINGLE_FILE);
                }
                for f in &files {
                    self.download(&api, &snapshot, f)?;
                }
                if *weights && has(INDEX_FILE) {
                    let index = self.download(&api, &snapshot, INDEX_FILE)?;
                    let shards =
                        shards_of_index(&index).map_err(|e| anyhow!("{}: {e:#}", self.flag()))?;
                    for shard in &shards {
                        if !has(shard) {
                            bail!(
                                "{}: {INDEX_FILE} lists the shard {shard}, which the \
                                 repository does not have",
                                self.flag()
                            );
                        }
                        self.download(&api, &snapshot, shard)?;
                    }
                }
                snapshot.clone()
            }
        };
        // A branch or tag points at its commit for offline runs (downloads
        // write it too, but not when everything was cached already); a
        // commit id needs no ref, as in huggingface_hub.
        if self.revision != info.sha {
            if let Err(e) = Cache::new(self.env.cache_dir.clone())
                .repo(self.repo())
                .create_ref(&info.sha)
            {
                bail!(
                    "{}: cannot write to the cache {}: {e}",
                    self.flag(),
                    self.env.cache_dir.display()
                );
            }
        }
        Ok(result)
    }

    fn repo_info(&self, api: &ApiRepo) -> std::result::Result<RepoInfo, Failure> {
        let response = guarded(|| api.info_request().call().map_err(Box::new))
            .map_err(|e| Failure::Other(anyhow!("{}: {e}", self.flag())))?;
        match response.map_err(|e| *e) {
            Ok(r) => r.into_json::<RepoInfo>().map_err(|e| {
                Failure::Other(anyhow!(
                    "{}: the hub's description of the repository is not what sluice expects \
                     ({e}); is HF_ENDPOINT={} a Hugging Face hub?",
                    self.flag(),
                    self.env.endpoint
                ))
            }),
            Err(ureq::Error::Transport(t)) => Err(Failure::Network(format!(
                "{}: cannot reach the hub at {}: {}",
                self.flag(),
                self.env.endpoint,
                transport_text(&t)
            ))),
            Err(ureq::Error::Status(code, r)) => {
                Err(Failure::Other(self.status_error(code, &r, None)))
            }
        }
    }

    /// `file` in the snapshot, downloaded unless already there.
    fn download(&self, api: &ApiRepo, snapshot: &Path, file: &str) -> Result<PathBuf> {
        if !check_repo_file(file) {
            bail!(
                "{}: the hub names a file {file:?} outside the repository",
                self.flag()
            );
        }
        let want = snapshot.join(file);
        // Files of a commit never change: a cached one is reused as is
        // (`exists` follows the snapshot's symlink into blobs/).
        if want.exists() {
            return Ok(want);
        }
        eprintln!("sluice: downloading {}/{file}", self.id.repo);
        let got = guarded(|| {
            if self.env.progress {
                api.download_with_progress(file, Bar(None))
            } else {
                api.download_with_progress(file, ())
            }
        })
        .map_err(|e| anyhow!("{}: {file}: {e}", self.flag()))?
        .map_err(|e| self.api_error(e, file))?;
        if got != want {
            // The revision moved to another commit between the repository's
            // description and this file: mixing commits would load garbage.
            bail!(
                "{}: the repository changed while downloading ({file} came from another \
                 commit than {}): run again",
                self.flag(),
                snapshot.file_name().unwrap_or_default().to_string_lossy()
            );
        }
        Ok(got)
    }

    fn api_error(&self, e: ApiError, file: &str) -> anyhow::Error {
        let what = format!("{}: {file}", self.flag());
        match e {
            ApiError::RequestError(e) => match *e {
                ureq::Error::Status(code, r) => self.status_error(code, &r, Some(file)),
                ureq::Error::Transport(t) => anyhow!(
                    "{what}: cannot download from the hub at {}: {}",
                    self.env.endpoint,
                    transport_text(&t)
                ),
            },
            ApiError::TooManyRetries(e) => anyhow!("{what}: download kept failing: {e}"),
            ApiError::MissingHeader(h) => anyhow!(
                "{what}: the hub's response has no {h} header; is HF_ENDPOINT={} a Hugging \
                 Face hub?",
                self.env.endpoint
            ),
            ApiError::InvalidResume => anyhow!(
                "{what}: a partial download in {} is larger than the file; delete the \
                 repository's *.part files there",
                self.repo_dir().join("blobs").display()
            ),
            ApiError::LockAcquisition(lock) => anyhow!(
                "{what}: another process is downloading it (lock {})",
                lock.display()
            ),
            ApiError::IoError(e) => anyhow!(
                "{what}: {e} (downloading into {})",
                self.env.cache_dir.display()
            ),
            other => anyhow!("{what}: {other}"),
        }
    }

    /// An HTTP refusal, explained. The hub answers 401 both for a private
    /// or missing repository without a token and for a bad token; 403 for a
    /// gated model whose terms the token's owner has not accepted.
    fn status_error(&self, code: u16, r: &ureq::Response, file: Option<&str>) -> anyhow::Error {
        let what = match file {
            Some(f) => format!("{}: {f}", self.flag()),
            None => self.flag(),
        };
        let hub_says = r
            .header("x-error-message")
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        let error_code = r.header("x-error-code").unwrap_or_default();
        match code {
            401 | 403 => {
                let hint = match &self.env.token {
                    None => "it is private or gated, or does not exist: set HF_TOKEN to a \
                             token with access"
                        .to_string(),
                    Some(_) => format!(
                        "the token from {} has no access (a gated model needs its terms \
                         accepted on the hub)",
                        self.env.token_source
                    ),
                };
                anyhow!("{what}: access refused (HTTP {code}){hub_says}: {hint}")
            }
            404 => {
                let reason = match (error_code, file) {
                    ("RevisionNotFound", _) => format!("no revision {:?}", self.revision),
                    ("EntryNotFound", Some(_)) | ("", Some(_)) => {
                        "no such file at this revision".to_string()
                    }
                    // The id was not an existing path either (those win).
                    _ => format!(
                        "no such model repository on {} (nor a local directory of that name)",
                        self.env.endpoint
                    ),
                };
                anyhow!("{what}: {reason} (HTTP 404){hub_says}")
            }
            _ => anyhow!(
                "{what}: the hub at {} answered HTTP {code}{hub_says}",
                self.env.endpoint
            ),
        }
    }

    /// The cached snapshot of the revision, if it holds everything needed.
    /// The error says what is missing (the caller adds the context).
    fn cached(&self) -> Result<PathBuf> {
        let dir = self.repo_dir();
        let not_cached = || {
            anyhow!(
                "{} is not in the cache {}",
                self.at(),
                self.env.cache_dir.display()
            )
        };
        let commit = match std::fs::read_to_string(dir.join("refs").join(self.revision)) {
            Ok(c) => c.trim().to_string(),
            // A commit id is its own snapshot's name.
            Err(_)
                if self.revision.len() == 40
                    && self.revision.chars().all(|c| c.is_ascii_hexdigit()) =>
            {
                self.revision.to_string()
            }
            Err(_) => return Err(not_cached()),
        };
        if !check_repo_file(&commit) {
            bail!(
                "{}: the cache's ref {} is corrupt",
                self.at(),
                self.revision
            );
        }
        let snapshot = dir.join("snapshots").join(&commit);
        if !snapshot.is_dir() {
            return Err(not_cached());
        }
        let missing = |f: &str| {
            anyhow!(
                "{f} of {} is not in the cache ({})",
                self.at(),
                snapshot.display()
            )
        };
        match self.want {
            Want::Gguf(pick) => {
                let mut files = Vec::new();
                list_files(&snapshot, "", &mut files);
                let names: Vec<&str> = files.iter().map(String::as_str).collect();
                let set = pick_gguf(&names, pick)
                    .map_err(|e| anyhow!("{} in the cache: {e}", self.at()))?;
                Ok(snapshot.join(&set.parts[0]))
            }
            Want::Safetensors { weights } => {
                for f in REQUIRED_FILES {
                    if !snapshot.join(f).exists() {
                        return Err(missing(f));
                    }
                }
                if *weights {
                    let index = snapshot.join(INDEX_FILE);
                    if index.exists() {
                        let shards =
                            shards_of_index(&index).map_err(|e| anyhow!("{}: {e:#}", self.at()))?;
                        for shard in &shards {
                            if !snapshot.join(shard).exists() {
                                return Err(missing(shard));
                            }
                        }
                    } else if !snapshot.join(SINGLE_FILE).exists() {
                        return Err(missing(SINGLE_FILE));
                    }
                }
                Ok(snapshot)
            }
        }
    }
}

/// A download's progress bar on stderr. indicatif draws nothing when stderr
/// is not a terminal (the "downloading" line says enough in a log), and the
/// bar is cleared when done so the next line starts clean (hf-hub's own
/// bar stays on the line and the next output runs into it).
struct Bar(Option<indicatif::ProgressBar>);

impl Progress for Bar {
    fn init(&mut self, size: usize, file: &str) {
        let bar = self.0.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                None,
                indicatif::ProgressDrawTarget::stderr(),
            );
            // `wide_bar` fits the line to the terminal: a wrapped line
            // would make the clearing erase the line above it.
            let template = "  {msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} (eta {eta})";
            if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        bar.set_message(file.to_string());
        bar.set_length(size as u64);
        // hf-hub calls `init` again before each (resumed) request, then
        // `update` with the bytes already there.
        bar.set_position(0);
    }

    fn update(&mut self, size: usize) {
        if let Some(bar) = &self.0 {
            bar.inc(size as u64);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// A network failure without the URL (the message names the endpoint).
fn transport_text(t: &ureq::Transport) -> String {
    let mut text = t.kind().to_string();
    if let Some(m) = t.message() {
        text.push_str(": ");
        text.push_str(m);
    }
    if let Some(source) = std::error::Error::source(t) {
        text.push_str(&format!(": {source}"));
    }
    text
}

/// The files under `dir` (following the snapshot's symlinks), as
/// repository paths with `/`.
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        if path.is_dir() {
            list_files(&path, &rel, out);
        } else if path.is_file() {
            out.push(rel);
        }
    }
}

/// Runs a call into `hf-hub`, turning a panic into an error: the crate
/// `unwrap`s on a few malformed responses (a redirect without a
/// `Location`), and a bad reply from a server must not crash sluice. The
/// panic hook is muted meanwhile so the user sees one line, not a
/// backtrace (nothing else runs yet: this is before the engine starts).
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    result.map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        anyhow!("the Hugging Face client failed on the hub's reply: {msg}")
    })
}

#[cfg(test)]
mod tests {
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
        assert!(e.starts_with("--model ./no/such/dir: no such file"), "{e}");
        assert!(parse_model("", |_| true)
            .unwrap_err()
            .to_string()
            .contains("--model"));
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

        assert!(
            HubEnv::from_vars(vars(&[("HOME", "/h"), ("HF_ENDPOINT", "localhost:80")])).is_err()
        );
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
}
