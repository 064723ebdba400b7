//! Online and offline: downloading the chosen files into the Hugging Face
//! cache (with a progress bar), or finding them in it when offline or when
//! the hub cannot be reached.

use super::*;

// Online and offline

pub(super) struct Hub<'a> {
    pub(super) env: &'a HubEnv,
    pub(super) id: &'a HubId,
    /// `--model` as typed, for messages.
    pub(super) model: &'a str,
    pub(super) revision: &'a str,
    pub(super) want: &'a Want,
}

/// Why a request failed: the network (the cache may still serve), or
/// anything else (already a finished message).
pub(super) enum Failure {
    Network(String),
    Other(anyhow::Error),
}

impl Hub<'_> {
    pub(super) fn repo(&self) -> Repo {
        Repo::with_revision(
            self.id.repo.clone(),
            RepoType::Model,
            self.revision.to_string(),
        )
    }

    /// `…/hub/models--ORG--NAME`.
    pub(super) fn repo_dir(&self) -> PathBuf {
        self.env.cache_dir.join(self.repo().folder_name())
    }

    /// `--model X`, with the revision when not the default: the start of
    /// every message.
    pub(super) fn flag(&self) -> String {
        let flag = match self.want {
            Want::Tokenizer => "--tokenizer",
            _ => "--model",
        };
        if self.revision == DEFAULT_REVISION {
            format!("{flag} {}", self.model)
        } else {
            format!("{flag} {} (revision {})", self.model, self.revision)
        }
    }

    /// `ORG/NAME` at `REV`, for messages.
    pub(super) fn at(&self) -> String {
        if self.revision == DEFAULT_REVISION {
            self.id.repo.clone()
        } else {
            format!("{} (revision {})", self.id.repo, self.revision)
        }
    }

    pub(super) fn api(&self) -> Result<ApiRepo> {
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
    pub(super) fn fetch(&self) -> Result<PathBuf> {
        let api = self.api()?;
        let info = match self.repo_info(&api) {
            Ok(info) => info,
            Err(Failure::Other(e)) => return Err(e),
            Err(Failure::Network(msg)) => {
                // As huggingface_hub does: with the hub unreachable, a
                // complete cached snapshot still runs.
                return match self.cached() {
                    Ok(path) => {
                        logging::info(&format!("{msg}; using the cached copy"));
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
            Want::Tokenizer => {
                if !has(TOKENIZER_FILE) {
                    bail!(
                        "{}: the repository has no {TOKENIZER_FILE} (a Hugging Face fast \
                         tokenizer); pass a local tokenizer directory or a .gguf file",
                        self.flag()
                    );
                }
                self.download(&api, &snapshot, TOKENIZER_FILE)?;
                for f in TOKENIZER_OPTIONAL_FILES.iter().filter(|f| has(f)) {
                    self.download(&api, &snapshot, f)?;
                }
                snapshot.clone()
            }
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
                        logging::info(&format!(
                            "{}: no quantization given, using {}",
                            self.id.repo, set.parts[0]
                        ));
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

    pub(super) fn repo_info(&self, api: &ApiRepo) -> std::result::Result<RepoInfo, Failure> {
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
    pub(super) fn download(&self, api: &ApiRepo, snapshot: &Path, file: &str) -> Result<PathBuf> {
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
        logging::info(&format!("downloading {}/{file}", self.id.repo));
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

    pub(super) fn api_error(&self, e: ApiError, file: &str) -> anyhow::Error {
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
    pub(super) fn status_error(
        &self,
        code: u16,
        r: &ureq::Response,
        file: Option<&str>,
    ) -> anyhow::Error {
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
    pub(super) fn cached(&self) -> Result<PathBuf> {
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
            Want::Tokenizer => {
                if !snapshot.join(TOKENIZER_FILE).exists() {
                    return Err(missing(TOKENIZER_FILE));
                }
                Ok(snapshot)
            }
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
pub(super) struct Bar(Option<indicatif::ProgressBar>);

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
pub(super) fn transport_text(t: &ureq::Transport) -> String {
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
pub(super) fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) {
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
pub(super) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T> {
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
