//! [`GgufWriter`]: writes GGUF v3 files (or v2, same layout), one file or a
//! split set, for fixtures built inside tests — this crate's and others'.
//!
//! The layout is the one llama.cpp and the `gguf` Python package write:
//! tensor data in the order the tensors were added, each at an offset that
//! is a multiple of the alignment, padded to the alignment after it (the
//! last one too). A split set puts all the metadata in the first part and
//! only the `split.*` keys (and `general.alignment`, when set) in the
//! others, as `gguf-split` does.
//!
//! [`GgufWriter::add_tensor_raw`] writes what it is given without checks,
//! so that tests can make files the reader must refuse.

use crate::value::{Array, Value};
use crate::{GgmlType, GgufError, Result, DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT};
use crate::{KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
struct Tensor {
    name: String,
    type_id: u32,
    dims: Vec<u64>,
    data: Vec<u8>,
    /// Whether to check `data` against the type and dims when writing.
    checked: bool,
}

/// Builds a GGUF file in memory and writes it out.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend(a.element_type().id().to_le_bytes());
    out.extend((a.len() as u64).to_le_bytes());
    match a {
        Array::U8(v) => out.extend(v),
        Array::I8(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::Bool(v) => v.iter().for_each(|&x| out.push(u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        Array::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        Array::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
    }
}

/// A value without its type tag.
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend(x.to_le_bytes()),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: usize) {
    let rem = out.len() % alignment;
    if rem != 0 {
        out.resize(out.len() + alignment - rem, 0);
    }
}

impl GgufWriter {
    /// An empty version-3 file.
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version field (2 and 3 share one layout; other values make
    /// files the reader refuses).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets `general.alignment` (as `UINT32`, as llama.cpp requires), which
    /// also sets the padding of tensor data.
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.add(KEY_ALIGNMENT, Value::U32(alignment))
    }

    /// Sets metadata `key` to `value`, replacing (in place) a value already
    /// set for it. Keys are written in the order first set.
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        let key = key.into();
        let value = value.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Adds a tensor of `ggml_type` with `dims` (`dims[0]` the row length)
    /// and its raw bytes, checked when written: their length must be what
    /// the type and dims make.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        dims: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensors.push(Tensor {
            name: name.into(),
            type_id: ggml_type.id(),
            dims: dims.to_vec(),
            data: data.into(),
            checked: true,
        });
        self
    }

    /// Adds an `F32` tensor from its values.
    pub fn add_tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        values: &[f32],
    ) -> &mut Self {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, dims, data)
    }

    /// Adds a tensor exactly as given, unchecked: any type id, any dims,
    /// any bytes (its data offset is still aligned). For files a reader
    /// must refuse.
    pub fn add_tensor_raw(
        &mut self,
        name: impl Into<String>,
        type_id: u32,
        dims: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensors.push(Tensor {
            name: name.into(),
            type_id,
            dims: dims.to_vec(),
            data: data.into(),
            checked: false,
        });
        self
    }

    /// The padding alignment: `general.alignment` when it holds a valid
    /// one, else the default (a file with an invalid one is for a test
    /// that expects the reader to refuse it anyway).
    fn layout_alignment(metadata: &[(String, Value)]) -> usize {
        metadata
            .iter()
            .find(|(k, _)| k == KEY_ALIGNMENT)
            .and_then(|(_, v)| v.as_integer())
            .and_then(|a| u32::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT) as usize
    }

    fn check(t: &Tensor) -> Result<()> {
        if !t.checked {
            return Ok(());
        }
        let ty = GgmlType::from_id(t.type_id).ok_or_else(|| {
            GgufError::writer(format!("{}: unknown type id {}", t.name, t.type_id))
        })?;
        if t.dims.len() > crate::MAX_DIMS {
            return Err(GgufError::writer(format!(
                "{}: {} dimensions (at most {})",
                t.name,
                t.dims.len(),
                crate::MAX_DIMS
            )));
        }
        let n = t
            .dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| GgufError::writer(format!("{}: too many elements", t.name)))?;
        let want = ty.bytes_for(n).ok_or_else(|| {
            GgufError::writer(format!(
                "{}: {n} elements do not fill whole {ty} blocks of {}",
                t.name,
                ty.block_size()
            ))
        })?;
        if want != t.data.len() as u64 {
            return Err(GgufError::writer(format!(
                "{}: {ty} {:?} takes {want} bytes, {} given",
                t.name,
                t.dims,
                t.data.len()
            )));
        }
        Ok(())
    }

    fn encode(version: u32, metadata: &[(String, Value)], tensors: &[&Tensor]) -> Result<Vec<u8>> {
        for t in tensors {
            Self::check(t)?;
        }
        let alignment = Self::layout_alignment(metadata);
        let mut out = Vec::new();
        out.extend(GGUF_MAGIC);
        out.extend(version.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            put_string(&mut out, k);
            out.extend(v.value_type().id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for t in tensors {
            put_string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
            let len = t.data.len() as u64;
            offset += len.div_ceil(alignment as u64) * alignment as u64;
        }
        pad_to(&mut out, alignment);
        for t in tensors {
            out.extend(&t.data);
            pad_to(&mut out, alignment);
        }
        Ok(out)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let tensors: Vec<&Tensor> = self.tensors.iter().collect();
        Self::encode(self.version, &self.metadata, &tensors)
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|e| GgufError::io(path, e))
    }

    /// Writes a split set into `dir`: `STEM-00001-of-0000N.gguf` …, at
    /// most `max_tensors_per_part` tensors in each part (at least one part,
    /// even without tensors). Returns the paths in order.
    pub fn write_split(
        &self,
        dir: impl AsRef<Path>,
        stem: &str,
        max_tensors_per_part: usize,
    ) -> Result<Vec<PathBuf>> {
        if max_tensors_per_part == 0 {
            return Err(GgufError::writer("max_tensors_per_part must be at least 1"));
        }
        let all: Vec<&Tensor> = self.tensors.iter().collect();
        let mut chunks: Vec<&[&Tensor]> = all.chunks(max_tensors_per_part).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let count = u16::try_from(chunks.len())
            .map_err(|_| GgufError::writer(format!("{} parts (at most 65535)", chunks.len())))?;
        let total = i32::try_from(self.tensors.len())
            .map_err(|_| GgufError::writer("too many tensors for split.tensors.count"))?;
        let alignment = self.metadata.iter().find(|(k, _)| k == KEY_ALIGNMENT);
        let mut paths = Vec::with_capacity(chunks.len());
        for (i, tensors) in chunks.iter().enumerate() {
            let mut md: Vec<(String, Value)> = if i == 0 {
                self.metadata.clone()
            } else {
                alignment.into_iter().cloned().collect()
            };
            md.retain(|(k, _)| {
                ![KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT].contains(&k.as_str())
            });
            md.push((KEY_SPLIT_NO.into(), Value::U16(i as u16)));
            md.push((KEY_SPLIT_COUNT.into(), Value::U16(count)));
            md.push((KEY_SPLIT_TENSORS_COUNT.into(), Value::I32(total)));
            let bytes = Self::encode(self.version, &md, tensors)?;
            let prefix = dir.as_ref().join(stem);
            let path = crate::split_part_path(&prefix, i as u32 + 1, u32::from(count));
            std::fs::write(&path, bytes).map_err(|e| GgufError::io(&path, e))?;
            paths.push(path);
        }
        Ok(paths)
    }
}
