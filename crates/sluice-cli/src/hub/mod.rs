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
//! - an argument that looks like a path (ends in `.gguf`, starts with
//!   `./`, `../`, `/` or `~`, or its first component exists here) is never
//!   sent to the hub: when it does not exist the error is "no such file or
//!   directory: PATH" (exit status 2), with the `.gguf` files beside it;
//! - a refused argument (not a path nor a hub id, a bad revision or
//!   `--gguf-file`) exits 2, a failed download 1;
//! - the directory returned is a snapshot holding everything the loader and
//!   the tokenizer read, so it loads exactly like a local directory;
//! - a file already in the cache snapshot of the repository's current commit
//!   is never downloaded again;
//! - with `HF_HUB_OFFLINE` set nothing touches the network;
//! - every failure (bad id, missing repository or file, refused access,
//!   network down, not cached offline) is one line naming `--model` and the
//!   repository or file, never a panic.

use crate::exit::bad_config;
use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::{Progress, RepoInfo};
use hf_hub::{Cache, Repo, RepoType};
use sluice_server::logging;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

mod choose;
mod env;
mod fetch;
mod id;
#[cfg(test)]
mod tests;

use choose::*;
use env::*;
use fetch::*;
use id::*;
pub(crate) use id::{expand_home, looks_like_path, missing_path};

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
/// The tokenizer of `bench --tokenizer ORG/NAME`, and what it reads
/// beside it when the repository has it.
const TOKENIZER_FILE: &str = "tokenizer.json";
const TOKENIZER_OPTIONAL_FILES: &[&str] = &[
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];
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
                logging::info(&format!(
                    "--revision applies to hub ids only; ignored for the local path {model}"
                ));
            }
            let path = match gguf_file {
                // A local directory with several GGUF files: pick one by name.
                Some(name) if path.is_dir() => {
                    let file = path.join(name);
                    if !file.is_file() {
                        return Err(bad_config(format!(
                            "--gguf-file {name}: {}",
                            missing_path(&file)
                        )));
                    }
                    file
                }
                Some(name) => {
                    return Err(bad_config(format!(
                        "--gguf-file {name}: --model {model} is not a directory"
                    )))
                }
                None => path,
            };
            Ok(ResolvedModel { path, hub_id: None })
        }
        ModelRef::Hub(id) => {
            let revision = revision.unwrap_or(DEFAULT_REVISION);
            check_revision(revision).map_err(crate::exit::config_error)?;
            let want = match (&id.quant, gguf_file) {
                (Some(_), Some(_)) => {
                    return Err(bad_config(format!(
                        "--model {model}: give the GGUF file either as ORG/NAME:QUANT or with \
                         --gguf-file, not both"
                    )))
                }
                (Some(tag), None) => Want::Gguf(GgufPick::Quant(tag.clone())),
                (None, Some(name)) => {
                    if !name.to_ascii_lowercase().ends_with(".gguf") {
                        return Err(bad_config(format!(
                            "--gguf-file {name}: not a .gguf file name"
                        )));
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
            logging::info(&format!("--model {model}: {}", path.display()));
            Ok(ResolvedModel {
                path,
                hub_id: Some(model.to_string()),
            })
        }
    }
}

/// `bench --tokenizer ORG/NAME`, as vLLM takes a hub id there: the
/// repository's tokenizer files only (no config, no weights), downloaded
/// into the Hugging Face cache or, offline, found there; returns the
/// snapshot directory. `None` when `spec` is not a hub id.
pub fn resolve_tokenizer(spec: &str, revision: Option<&str>) -> Option<Result<PathBuf>> {
    let id = parse_hub_id(spec).filter(|id| id.quant.is_none())?;
    Some((|| {
        let revision = revision.unwrap_or(DEFAULT_REVISION);
        check_revision(revision).map_err(crate::exit::config_error)?;
        let env = HubEnv::from_env().map_err(|e| anyhow!("--tokenizer {spec}: {e}"))?;
        let hub = Hub {
            env: &env,
            id: &id,
            model: spec,
            revision,
            want: &Want::Tokenizer,
        };
        let path = if env.offline {
            hub.cached()
                .map_err(|e| anyhow!("--tokenizer {spec}: offline (HF_HUB_OFFLINE is set): {e}"))?
        } else {
            hub.fetch()?
        };
        eprintln!("sluice: --tokenizer {spec}: {}", path.display());
        Ok(path)
    })())
}
