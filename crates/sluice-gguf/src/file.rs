//! [`GgufFile`]: an opened GGUF model, one file or a whole split set, with
//! its metadata and one tensor list; [`TensorInfo`]: one tensor.
//!
//! Opening maps every part and runs the full structural check of
//! `parse.rs` on each; a split set is also checked for consistency (each
//! part's `split.count` equal, `split.no` in order, `split.tensors.count`
//! equal to the tensors found, no tensor name twice). Metadata comes from
//! the first part, as in llama.cpp (`gguf-split` writes it there only).

use crate::bytes::MappedBytes;
use crate::metadata::Metadata;
use crate::parse::{parse, ParsedPart};
use crate::resolve::{resolve_model_path, SplitName};
use crate::{GgmlType, GgufError, Result, MAX_DIMS};
use crate::{KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};
use memmap2::{Mmap, MmapMut};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tensor: its name, type, shape and bytes.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    name: String,
    dims: [u64; MAX_DIMS],
    n_dims: usize,
    ggml_type: GgmlType,
    n_elements: u64,
    offset: u64,
    part: usize,
    data: MappedBytes,
}

impl TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dimensions as stored, `dims()[0]` the fastest-varying one (the
    /// row length): a `[out, in]` PyTorch weight is stored as `[in, out]`.
    pub fn dims(&self) -> &[u64] {
        self.dims.get(..self.n_dims).unwrap_or(&self.dims)
    }

    /// The type of the elements.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// The number of elements (1 for a tensor with no dimensions).
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// The row length, `dims()[0]` (1 for a tensor with no dimensions).
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }

    /// The number of rows: the product of the dimensions after the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// The size of the data in bytes.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }

    /// The offset of the data from the start of its part's data section,
    /// as stored in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Which part of a split set holds the tensor (0 for a single file):
    /// an index into [`GgufFile::paths`].
    pub fn part(&self) -> usize {
        self.part
    }

    /// The tensor's bytes, borrowed from the mapping.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Drops the resident pages of the tensor's data
    /// ([`MappedBytes::release_pages`]): for a loader that has made its own
    /// copy of it.
    pub fn release_pages(&self) {
        self.data.release_pages();
    }

    /// The tensor's bytes as a [`MappedBytes`] that keeps the mapping
    /// alive on its own: what a weight that outlives the [`GgufFile`]
    /// holds.
    pub fn bytes(&self) -> MappedBytes {
        self.data.clone()
    }
}

/// An opened GGUF model: one file, or every part of a split set.
pub struct GgufFile {
    name: String,
    paths: Vec<PathBuf>,
    version: u32,
    alignment: u32,
    data_offset: usize,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

/// The paths, version and counts; not every key and tensor (a vocabulary
/// alone can be 150 000 strings).
impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("paths", &self.paths)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Maps `path` read-only.
fn map_file(path: &Path, name: &str) -> Result<Arc<Mmap>> {
    let file = std::fs::File::open(path).map_err(|e| GgufError::io(path, e))?;
    let len = file.metadata().map_err(|e| GgufError::io(path, e))?.len();
    if len == 0 {
        // Mapping zero bytes fails on some systems; the answer is known.
        return Err(GgufError::Unsupported {
            file: name.to_string(),
            problem: "not a GGUF file: it is empty".into(),
        });
    }
    // SAFETY: the file is opened read-only and only read through the
    // mapping. As with every mmap-based loader (llama.cpp's included), we
    // rely on nobody truncating or rewriting the file while it is mapped;
    // the format checks cannot protect against that.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::io(path, e))?;
    Ok(Arc::new(map))
}

/// The `(split.no, split.count)` of a part, `None` when it is not part of
/// a set of more than one.
fn split_keys(md: &Metadata) -> Result<Option<(u32, u32)>> {
    let Some(count) = md.opt(KEY_SPLIT_COUNT, Metadata::u32)? else {
        return Ok(None);
    };
    let no = md.opt(KEY_SPLIT_NO, Metadata::u32)?;
    let problem = match (no, count) {
        (_, 0) => Some(format!("{KEY_SPLIT_COUNT} is 0")),
        (None, 1) => None,
        (None, _) => Some(format!(
            "{KEY_SPLIT_COUNT} is {count} but {KEY_SPLIT_NO} is missing"
        )),
        (Some(no), _) if no >= count => Some(format!(
            "{KEY_SPLIT_NO} is {no}, but {KEY_SPLIT_COUNT} is {count} (split.no counts from 0)"
        )),
        _ => None,
    };
    if let Some(problem) = problem {
        return Err(GgufError::Split {
            file: md.file().to_string(),
            problem,
        });
    }
    Ok((count > 1).then_some((no.unwrap_or(0), count)))
}

struct Builder {
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl Builder {
    /// Adds a part's tensors, refusing a name already seen.
    fn add(
        &mut self,
        name: &str,
        part: usize,
        map: &Arc<Mmap>,
        parsed: &mut ParsedPart,
        file_backed: bool,
    ) -> Result<()> {
        self.tensors.reserve(parsed.tensors.len());
        self.index.reserve(parsed.tensors.len());
        for t in parsed.tensors.drain(..) {
            let data = MappedBytes::new(Arc::clone(map), t.start..t.end).map(|d| {
                if file_backed {
                    d.of_file()
                } else {
                    d
                }
            });
            let Some(data) = data else {
                // parse() checked the range against this very mapping.
                return Err(GgufError::Malformed {
                    file: name.to_string(),
                    context: t.name,
                    problem: "data runs past the end of the file".into(),
                });
            };
            if let Some(&first) = self.index.get(&t.name) {
                let where_first = self
                    .tensors
                    .get(first)
                    .map(|f| f.part)
                    .filter(|&p| p != part)
                    .map(|p| format!(" (first in part {})", p + 1))
                    .unwrap_or_default();
                return Err(GgufError::Malformed {
                    file: name.to_string(),
                    context: t.name,
                    problem: format!("duplicate tensor name{where_first}"),
                });
            }
            self.index.insert(t.name.clone(), self.tensors.len());
            self.tensors.push(TensorInfo {
                name: t.name,
                dims: t.dims,
                n_dims: t.n_dims,
                ggml_type: t.ggml_type,
                n_elements: t.n_elements,
                offset: t.offset,
                part,
                data,
            });
        }
        Ok(())
    }
}

impl GgufFile {
    /// Opens a GGUF model: a `.gguf` file, the first part of a split set
    /// (all parts are opened), or a directory holding exactly one model
    /// (see [`crate::resolve_model_path`]). Opening a later part of a
    /// split set is an error that names the first.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = resolve_model_path(path.as_ref())?;
        let name = path.display().to_string();
        let map = map_file(&path, &name)?;
        let mut first = parse(&name, &map)?;
        let split = split_keys(&first.metadata)?;
        let mut b = Builder {
            tensors: Vec::new(),
            index: HashMap::new(),
        };
        b.add(&name, 0, &map, &mut first, true)?;
        let mut paths = vec![path.clone()];

        if let Some((no, count)) = split {
            let split_name = SplitName::parse(&path).filter(|s| s.count == count);
            if no != 0 {
                let hint = match &split_name {
                    Some(s) => format!(": {}", s.part_path(1).display()),
                    None => String::new(),
                };
                return Err(GgufError::Split {
                    file: name,
                    problem: format!(
                        "this is part {} of {count} of a split model; open the first part{hint}",
                        no + 1
                    ),
                });
            }
            let Some(split_name) = split_name.filter(|s| s.part == 1) else {
                return Err(GgufError::Split {
                    file: name,
                    problem: format!(
                        "{KEY_SPLIT_COUNT} says this is part 1 of {count}, but its name does not \
                         end in -00001-of-{count:05}.gguf, so the other parts cannot be found"
                    ),
                });
            };
            for part in 2..=count {
                let part_path = split_name.part_path(part);
                let part_name = part_path.display().to_string();
                if !part_path.is_file() {
                    return Err(GgufError::Split {
                        file: name,
                        problem: format!("part {part} of {count} is missing: {part_name}"),
                    });
                }
                let part_map = map_file(&part_path, &part_name)?;
                let mut parsed = parse(&part_name, &part_map)?;
                let expected_no = part - 1;
                let problem = match split_keys(&parsed.metadata)? {
                    Some((n, c)) if n == expected_no && c == count => None,
                    Some((n, c)) => Some(format!(
                        "{KEY_SPLIT_NO} {n} of {KEY_SPLIT_COUNT} {c} does not match \
                         part {part} of {count} (expected {KEY_SPLIT_NO} {expected_no} \
                         of {count})"
                    )),
                    None => Some(format!(
                        "part {part} of {count} has no {KEY_SPLIT_NO} / {KEY_SPLIT_COUNT} \
                         keys of a split set"
                    )),
                };
                if let Some(problem) = problem {
                    return Err(GgufError::Split {
                        file: part_name,
                        problem,
                    });
                }
                b.add(&part_name, paths.len(), &part_map, &mut parsed, true)?;
                paths.push(part_path);
            }
            if let Some(total) = first.metadata.opt(KEY_SPLIT_TENSORS_COUNT, Metadata::u64)? {
                if total != b.tensors.len() as u64 {
                    return Err(GgufError::Split {
                        file: name,
                        problem: format!(
                            "{KEY_SPLIT_TENSORS_COUNT} is {total}, but the {count} parts hold {} tensors",
                            b.tensors.len()
                        ),
                    });
                }
            }
        }

        Ok(GgufFile {
            name,
            paths,
            version: first.version,
            alignment: first.alignment,
            data_offset: first.data_offset,
            metadata: first.metadata,
            tensors: b.tensors,
            index: b.index,
        })
    }

    /// Reads a GGUF file held in memory (copied into an anonymous mapping,
    /// so that tensor data is page-aligned as a mapped file's is); `name`
    /// names it in errors. A part of a split set of more than one part is
    /// refused: its other parts are files.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<GgufFile> {
        let io = |e| GgufError::io(name, e);
        if bytes.is_empty() {
            return Err(GgufError::Unsupported {
                file: name.to_string(),
                problem: "not a GGUF file: it is empty".into(),
            });
        }
        let mut anon = MmapMut::map_anon(bytes.len()).map_err(io)?;
        anon.copy_from_slice(bytes);
        let map = Arc::new(anon.make_read_only().map_err(io)?);
        let mut parsed = parse(name, &map)?;
        if let Some((no, count)) = split_keys(&parsed.metadata)? {
            return Err(GgufError::Split {
                file: name.to_string(),
                problem: format!(
                    "part {} of a split model of {count} parts; split models open from files",
                    no + 1
                ),
            });
        }
        let mut b = Builder {
            tensors: Vec::new(),
            index: HashMap::new(),
        };
        b.add(name, 0, &map, &mut parsed, false)?;
        Ok(GgufFile {
            name: name.to_string(),
            paths: vec![PathBuf::from(name)],
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            tensors: b.tensors,
            index: b.index,
        })
    }

    /// The (first) file's path as errors show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The files opened: one, or every part of a split set in order.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The GGUF version of the (first) file: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of tensor data in the (first) file.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Where the (first) file's data section starts, in bytes.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The metadata (of the first part, for a split set).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.architecture()
    }

    /// Every tensor, in file order (part by part for a split set).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let &i = self.index.get(name)?;
        self.tensors.get(i)
    }

    /// The tensor named `name`, or an error naming it and the file.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            file: self.name.clone(),
            name: name.to_string(),
        })
    }

    /// The bytes of `tensor` (which must come from this file's
    /// [`GgufFile::tensors`]; any [`TensorInfo`] carries its own bytes, so
    /// this is [`TensorInfo::data`]).
    pub fn data<'a>(&self, tensor: &'a TensorInfo) -> &'a [u8] {
        tensor.data()
    }

    /// The bytes of the tensor named `name` as a [`MappedBytes`], which
    /// keeps its mapping alive after this [`GgufFile`] is dropped.
    pub fn tensor_bytes(&self, name: &str) -> Result<MappedBytes> {
        self.require_tensor(name).map(TensorInfo::bytes)
    }
}
