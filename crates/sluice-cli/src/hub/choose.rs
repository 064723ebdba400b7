//! Which files of a repository a model needs: the safetensors set (the
//! index and its shards, or one file) or one GGUF model, chosen by
//! quantization tag or by name among the repository's files.

use super::*;

// Which files

pub(super) enum Want {
    Safetensors {
        weights: bool,
    },
    /// `bench --tokenizer ORG/NAME`: tokenizer.json and the files beside it
    /// that the tokenizer reads, nothing else.
    Tokenizer,
    Gguf(GgufPick),
}

pub(super) enum GgufPick {
    Quant(String),
    File(String),
}

/// A GGUF model: one file, or the parts of a split set
/// (`NAME-00001-of-00003.gguf`, ...), first part first.
#[derive(Debug, PartialEq)]
pub(super) struct GgufSet {
    /// The name without `.gguf` and without the `-0000i-of-0000n` suffix.
    pub(super) key: String,
    pub(super) parts: Vec<String>,
    /// Parts the set's names say it has (1 for a single file).
    pub(super) total: u32,
}

impl GgufSet {
    pub(super) fn complete(&self) -> bool {
        self.parts.len() == self.total as usize
    }

    pub(super) fn describe(&self) -> String {
        match self.parts.first() {
            Some(first) if self.total > 1 => format!("{first} ({} parts)", self.total),
            Some(first) => first.clone(),
            None => self.key.clone(),
        }
    }
}

/// `dir/name-00001-of-00003.gguf` → (`dir/name`, 1, 3).
pub(super) fn split_part(name: &str) -> Option<(&str, u32, u32)> {
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

pub(super) fn strip_gguf(name: &str) -> Option<&str> {
    let n = name.len();
    (n > 5 && name.is_char_boundary(n - 5) && name[n - 5..].eq_ignore_ascii_case(".gguf"))
        .then(|| &name[..n - 5])
}

/// The GGUF models among `files`, by set; multimodal projector files
/// (`mmproj*`) are not models and are left out, as llama.cpp does.
pub(super) fn gguf_sets<'a>(files: impl IntoIterator<Item = &'a str>) -> Vec<GgufSet> {
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
pub(super) fn contains_token(key: &str, tag: &str) -> bool {
    let (key, tag) = (key.to_ascii_lowercase(), tag.to_ascii_lowercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    key.match_indices(&tag).any(|(i, m)| {
        !word(key[..i].chars().next_back()) && !word(key[i + m.len()..].chars().next())
    })
}

/// The set `pick` names among `files`; `Err` says why none (or too many).
pub(super) fn pick_gguf(files: &[&str], pick: &GgufPick) -> std::result::Result<GgufSet, String> {
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
pub(super) fn shards_of_index(path: &Path) -> Result<Vec<String>> {
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
