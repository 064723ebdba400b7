//! From a path the user gave to the GGUF file to open: split-set file
//! names and directories.
//!
//! llama.cpp's `gguf-split` (and the `gguf` Python package) name the parts
//! of a split model `PREFIX-00001-of-00003.gguf` … `PREFIX-00003-of-00003.gguf`
//! (`%s-%05d-of-%05d.gguf`, parts numbered from 1; the `split.no` key
//! inside counts from 0). A directory resolves to the one model it holds: a
//! single `.gguf` file or a single split set, not counting `mmproj*` files
//! (the vision projectors that multimodal repositories ship beside the
//! model).

use crate::{GgufError, Result, GGUF_MAGIC};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The parsed name of one part of a split set,
/// `PREFIX-{part:05}-of-{count:05}.gguf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitName {
    /// The path up to the part number: `dir/Model-Q4_K_M` for
    /// `dir/Model-Q4_K_M-00001-of-00003.gguf`.
    pub prefix: PathBuf,
    /// The part's number, from 1.
    pub part: u32,
    /// The number of parts.
    pub count: u32,
}

/// Parses a number written as `%05d` writes it, so that a name we rebuild
/// from it is the name we were given.
fn five_digits(s: &str) -> Option<u32> {
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = s.parse().ok()?;
    (format!("{n:05}") == s).then_some(n)
}

impl SplitName {
    /// The split-set name of `path`, `None` when its file name is not of
    /// the form `PREFIX-NNNNN-of-MMMMM.gguf` with `1 <= NNNNN <= MMMMM`.
    pub fn parse(path: &Path) -> Option<SplitName> {
        let name = path.file_name()?.to_str()?;
        let stem = name.strip_suffix(".gguf")?;
        let (left, count) = stem.rsplit_once("-of-")?;
        let (prefix, part) = left.rsplit_once('-')?;
        let count = five_digits(count)?;
        let part = five_digits(part)?;
        if prefix.is_empty() || part == 0 || part > count {
            return None;
        }
        Some(SplitName {
            prefix: path.with_file_name(prefix),
            part,
            count,
        })
    }

    /// The path of part `part` (from 1) of this set.
    pub fn part_path(&self, part: u32) -> PathBuf {
        split_part_path(&self.prefix, part, self.count)
    }
}

/// `PREFIX-{part:05}-of-{count:05}.gguf`, llama.cpp's `llama_split_path`.
pub fn split_part_path(prefix: &Path, part: u32, count: u32) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-{part:05}-of-{count:05}.gguf"));
    PathBuf::from(name)
}

/// Whether `path` is a file that starts with the GGUF magic. Reads four
/// bytes; any error reads as "no".
pub fn is_gguf_file(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == GGUF_MAGIC
}

fn is_model_gguf(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".gguf") && !lower.starts_with("mmproj")
}

/// The GGUF file to open for `path`: a file is itself; a directory must
/// hold exactly one model, a single `.gguf` file or one split set (for
/// which the first part is returned), not counting `mmproj*` files.
/// Symbolic links are followed (a Hugging Face cache snapshot is links).
pub fn resolve_model_path(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).map_err(|e| GgufError::io(path, e))?;
    if !meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    let mut models = BTreeSet::new();
    for entry in std::fs::read_dir(path).map_err(|e| GgufError::io(path, e))? {
        let entry = entry.map_err(|e| GgufError::io(path, e))?;
        let file = entry.path();
        let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !is_model_gguf(name) || !file.is_file() {
            continue;
        }
        models.insert(match SplitName::parse(&file) {
            Some(split) => split.part_path(1),
            None => file,
        });
    }
    let mut it = models.iter();
    match (it.next(), it.next()) {
        (Some(one), None) if !one.is_file() => Err(GgufError::Resolve {
            path: path.to_path_buf(),
            problem: format!(
                "the directory holds parts of a split model but not its first part, {}",
                one.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
        }),
        (Some(one), None) => Ok(one.clone()),
        (None, _) => Err(GgufError::Resolve {
            path: path.to_path_buf(),
            problem: "the directory holds no .gguf model file".into(),
        }),
        (Some(_), Some(_)) => {
            let names: Vec<String> = models
                .iter()
                .map(|p| {
                    p.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })
                .collect();
            Err(GgufError::Resolve {
                path: path.to_path_buf(),
                problem: format!(
                    "the directory holds {} GGUF models ({}); give the path of the one to load",
                    names.len(),
                    names.join(", ")
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let s = SplitName::parse(Path::new("/m/Qwen-Q4_K_M-00002-of-00003.gguf")).unwrap();
        assert_eq!(s.prefix, Path::new("/m/Qwen-Q4_K_M"));
        assert_eq!((s.part, s.count), (2, 3));
        assert_eq!(
            s.part_path(1),
            Path::new("/m/Qwen-Q4_K_M-00001-of-00003.gguf")
        );
        assert_eq!(
            SplitName::parse(Path::new("a-123456-of-123456.gguf")).map(|s| s.part),
            Some(123456)
        );
        for bad in [
            "model.gguf",
            "a-1-of-3.gguf",
            "a-00004-of-00003.gguf",
            "a-00000-of-00003.gguf",
            "-00001-of-00003.gguf",
            "a-00001-of-00003.bin",
            "a-0001x-of-00003.gguf",
            "a-000001-of-00003.gguf",
        ] {
            assert_eq!(SplitName::parse(Path::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn mmproj_is_not_a_model() {
        assert!(is_model_gguf("model.Q4_K_M.gguf"));
        assert!(is_model_gguf("MODEL.GGUF"));
        assert!(!is_model_gguf("mmproj-model-f16.gguf"));
        assert!(!is_model_gguf("model.safetensors"));
    }
}
