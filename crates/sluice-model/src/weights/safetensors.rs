//! safetensors checkpoints: `model.safetensors`, or the shards listed in
//! `model.safetensors.index.json`, memory-mapped and converted tensor by
//! tensor into the format the model asks for.

use super::{append_f32_rows, TensorSource, Weight};
use ::safetensors::{tensor::Metadata, Dtype, SafeTensors};
use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the tensor data (after the 8-byte length and header).
    data_start: usize,
    metadata: Metadata,
}

/// A memory-mapped checkpoint: `model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`.
pub struct SafetensorsSource {
    files: Vec<MappedFile>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl SafetensorsSource {
    /// Opens the checkpoint in `dir`, preferring a shard index when present.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let single_path = dir.join("model.safetensors");
        if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .with_context(|| format!("cannot read {}", index_path.display()))?;
            let shard_index: ShardIndex = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a safetensors index (no `weight_map`)",
                    index_path.display()
                )
            })?;
            let mut shard_names: Vec<&String> = shard_index.weight_map.values().collect();
            shard_names.sort();
            shard_names.dedup();
            let mut files = Vec::with_capacity(shard_names.len());
            let mut file_of_shard = HashMap::new();
            for shard in shard_names {
                let path = dir.join(shard);
                file_of_shard.insert(shard.clone(), files.len());
                files.push(MappedFile::open(&path)?);
            }
            let mut index = HashMap::with_capacity(shard_index.weight_map.len());
            for (name, shard) in &shard_index.weight_map {
                let f = file_of_shard[shard];
                if files[f].metadata.info(name).is_none() {
                    bail!(
                        "{} lists tensor {name} in {shard}, but that file does not contain it",
                        index_path.display()
                    );
                }
                index.insert(name.clone(), f);
            }
            Ok(SafetensorsSource { files, index })
        } else if single_path.exists() {
            let file = MappedFile::open(&single_path)?;
            let index = file
                .metadata
                .tensors()
                .into_keys()
                .map(|n| (n, 0))
                .collect();
            Ok(SafetensorsSource {
                files: vec![file],
                index,
            })
        } else {
            bail!(
                "no model weights in {}: expected model.safetensors or model.safetensors.index.json",
                dir.display()
            )
        }
    }

    /// Every tensor name, for diagnostics.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(|s| s.as_str()).collect();
        v.sort_unstable();
        v
    }
}

impl MappedFile {
    fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path)
            .with_context(|| format!("cannot open weights file {}", path.display()))?;
        // SAFETY: the checkpoint is opened read-only and only read while
        // mapped; like every mmap-based loader, we rely on nobody truncating
        // the file underneath us during loading.
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot memory-map {}", path.display()))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
            metadata,
        })
    }

    /// Lets the kernel drop the pages of a tensor we have copied, so that the
    /// resident set does not hold the checkpoint and the model at once.
    fn release(&self, start: usize, end: usize) {
        // SAFETY: the mapping is read-only and file-backed, so MADV_DONTNEED
        // only drops page-table entries; a later read faults the same file
        // contents back in. No data visible through `self.mmap` changes.
        let _ = unsafe {
            self.mmap
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }
}

impl TensorSource for SafetensorsSource {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> Result<()> {
        let &f = self
            .index
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {name} in the checkpoint"))?;
        let file = &self.files[f];
        let info = file
            .metadata
            .info(name)
            .ok_or_else(|| anyhow!("missing tensor {name} in {}", file.path.display()))?;
        if info.shape != shape {
            bail!(
                "tensor {name} in {} has shape {:?}, expected {:?}",
                file.path.display(),
                info.shape,
                shape
            );
        }
        let (start, end) = (
            file.data_start + info.data_offsets.0,
            file.data_start + info.data_offsets.1,
        );
        let bytes = &file.mmap[start..end];
        let cols = shape.last().copied().unwrap_or(1);
        convert_into(bytes, info.dtype, cols, out)
            .with_context(|| format!("tensor {name} in {}", file.path.display()))?;
        file.release(start, end);
        Ok(())
    }
}

/// Appends little-endian `bytes` of dtype `src` (rows of `cols` values) to
/// `out`, converting (or quantizing, for a quantized `out`).
fn convert_into(bytes: &[u8], src: Dtype, cols: usize, out: &mut Weight) -> Result<()> {
    let f16_to_f32 = |b: u16| half::f16::from_bits(b).to_f32();
    let f32_to_bf16 = |x: f32| half::bf16::from_f32(x).to_bits();
    let u16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    let f32s = || {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    };
    match (src, out) {
        (Dtype::F32, Weight::F32(v)) => v.extend(f32s()),
        (Dtype::F32, Weight::Bf16(v)) => v.extend(f32s().map(f32_to_bf16)),
        (Dtype::BF16, Weight::F32(v)) => v.extend(u16s().map(crate::kernels::bf16_to_f32)),
        (Dtype::BF16, Weight::Bf16(v)) => v.extend(u16s()),
        (Dtype::F16, Weight::F32(v)) => v.extend(u16s().map(f16_to_f32)),
        (Dtype::F16, Weight::Bf16(v)) => v.extend(u16s().map(|b| f32_to_bf16(f16_to_f32(b)))),
        (Dtype::F16, Weight::F16(v)) => v.extend(u16s()),
        (Dtype::F32 | Dtype::BF16 | Dtype::F16, out @ (Weight::F16(_) | Weight::Quant { .. })) => {
            // Through f32 (exact for every source), one row at a time so a
            // large tensor never exists in f32 all at once.
            let width = if src == Dtype::F32 { 4 } else { 2 };
            let cols = cols.max(1);
            let mut row = Vec::with_capacity(cols);
            for chunk in bytes.chunks(cols * width) {
                row.clear();
                row.extend(chunk.chunks_exact(width).map(|c| match src {
                    Dtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    Dtype::BF16 => crate::kernels::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])),
                    _ => f16_to_f32(u16::from_le_bytes([c[0], c[1]])),
                }));
                append_f32_rows(&row, cols, out)?;
            }
        }
        (other, _) => bail!("unsupported dtype {other:?} (supported: F32, BF16, F16)"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::QuantFormat;

    #[test]
    fn conversion_rounds_to_bf16() {
        let bytes: Vec<u8> = [1.0f32, 1.0 + 1.0 / 256.0, 1.004]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut w = Weight::empty(QuantFormat::Bf16, 2);
        convert_into(&bytes, Dtype::F32, 3, &mut w).unwrap();
        assert_eq!(w.into_f32(), vec![1.0, 1.0, 1.0078125], "ties go to even");
        let mut w = Weight::empty(QuantFormat::F32, 2);
        assert!(convert_into(&bytes, Dtype::I64, 3, &mut w).is_err());
    }
}
