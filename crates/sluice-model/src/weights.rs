//! Weight storage and the two places weights come from: a memory-mapped
//! safetensors checkpoint (single file or sharded with an index) and a
//! deterministic dummy generator (`--load-format dummy`).
//!
//! Promises: a tensor is only handed out with exactly the shape the model
//! asked for, converted to the compute dtype (f32 or bf16 bit patterns);
//! anything else is an error naming the tensor and the file. Tensors can be
//! appended into one buffer, which is how q/k/v and gate/up are fused at
//! load time. Checkpoint pages are released once copied, so loading peaks at
//! about the size of the model plus one tensor, not twice the model.

use crate::kernels::WeightRef;
use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;
use safetensors::{tensor::Metadata, Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The dtype linear-layer weights are kept in. Norm weights and biases are
/// always f32 (they are tiny and feed f32 arithmetic directly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDType {
    F32,
    Bf16,
}

/// An owned weight buffer in its compute dtype, row-major.
#[derive(Clone, Debug)]
pub enum Weight {
    F32(Vec<f32>),
    /// bf16 values as raw bit patterns (what the kernels take).
    Bf16(Vec<u16>),
}

impl Weight {
    pub fn empty(dtype: WeightDType, capacity: usize) -> Self {
        match dtype {
            WeightDType::F32 => Weight::F32(Vec::with_capacity(capacity)),
            WeightDType::Bf16 => Weight::Bf16(Vec::with_capacity(capacity)),
        }
    }

    pub fn dtype(&self) -> WeightDType {
        match self {
            Weight::F32(_) => WeightDType::F32,
            Weight::Bf16(_) => WeightDType::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Weight::F32(v) => v.len(),
            Weight::Bf16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_in_bytes(&self) -> usize {
        match self {
            Weight::F32(v) => v.len() * 4,
            Weight::Bf16(v) => v.len() * 2,
        }
    }

    pub fn as_weight_ref(&self) -> WeightRef<'_> {
        match self {
            Weight::F32(v) => WeightRef::F32(v),
            Weight::Bf16(v) => WeightRef::Bf16(v),
        }
    }

    /// Copies row `row` of a `[rows × width]` matrix into `out` as f32 (the
    /// embedding lookup).
    pub fn row_to_f32(&self, row: usize, width: usize, out: &mut [f32]) {
        match self {
            Weight::F32(v) => out.copy_from_slice(&v[row * width..(row + 1) * width]),
            Weight::Bf16(v) => {
                for (o, &b) in out.iter_mut().zip(&v[row * width..(row + 1) * width]) {
                    *o = crate::kernels::bf16_to_f32(b);
                }
            }
        }
    }

    /// The values as f32, for weights that are always kept in f32.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Weight::F32(v) => v,
            Weight::Bf16(v) => v.into_iter().map(crate::kernels::bf16_to_f32).collect(),
        }
    }
}

/// Where the model's tensors come from.
pub trait TensorSource {
    /// Appends tensor `name`, which must have exactly `shape`, to `out`
    /// converted to `out`'s dtype.
    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> Result<()>;

    /// Whether the source has tensor `name` (for optional tensors such as an
    /// untied `lm_head.weight`).
    fn contains(&self, name: &str) -> bool;

    /// One tensor on its own.
    fn read(&self, name: &str, shape: &[usize], dtype: WeightDType) -> Result<Weight> {
        let mut out = Weight::empty(dtype, shape.iter().product());
        self.read_into(name, shape, &mut out)?;
        Ok(out)
    }

    /// Several tensors concatenated along their first axis (each given with
    /// its own shape), e.g. q/k/v into one `[(nq + 2·nkv)·hd × hidden]`
    /// matrix.
    fn read_fused(&self, parts: &[(String, Vec<usize>)], dtype: WeightDType) -> Result<Weight> {
        let total = parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        let mut out = Weight::empty(dtype, total);
        for (name, shape) in parts {
            self.read_into(name, shape, &mut out)?;
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------
// safetensors checkpoints

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
        convert_into(bytes, info.dtype, out)
            .with_context(|| format!("tensor {name} in {}", file.path.display()))?;
        file.release(start, end);
        Ok(())
    }
}

/// Appends little-endian `bytes` of dtype `src` to `out`, converting.
fn convert_into(bytes: &[u8], src: Dtype, out: &mut Weight) -> Result<()> {
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
        (other, _) => bail!("unsupported dtype {other:?} (supported: F32, BF16, F16)"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// dummy weights

/// Deterministic random weights of any shape (vLLM's `--load-format dummy`).
///
/// Every tensor's values depend only on the seed and the tensor's name, so
/// the same seed gives the same model whatever the load order. Norm weights
/// are 1.0, everything else is uniform with standard deviation 0.02 (the
/// usual initializer range), which keeps activations of a deep stack in a
/// sane range.
pub struct DummySource {
    seed: u64,
}

impl DummySource {
    pub const STD: f32 = 0.02;

    pub fn new(seed: u64) -> Self {
        DummySource { seed }
    }
}

impl TensorSource for DummySource {
    fn contains(&self, _name: &str) -> bool {
        false
    }

    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> Result<()> {
        let n: usize = shape.iter().product();
        let start = out.len();
        match out {
            Weight::F32(v) => v.resize(start + n, 0.0),
            Weight::Bf16(v) => v.resize(start + n, 0),
        }
        if name.ends_with("norm.weight") {
            match out {
                Weight::F32(v) => v[start..].fill(1.0),
                Weight::Bf16(v) => v[start..].fill(half::bf16::ONE.to_bits()),
            }
            return Ok(());
        }
        // Uniform(-a, a) has standard deviation a / sqrt(3).
        let a = Self::STD * 3f32.sqrt();
        let name_seed = fnv1a(name.as_bytes()) ^ self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        const CHUNK: usize = 1 << 16;
        let num_chunks = n.div_ceil(CHUNK);
        let fill = |chunk: usize, write: &mut dyn FnMut(usize, f32)| {
            let mut rng =
                SplitMix64(name_seed ^ (chunk as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            for i in chunk * CHUNK..((chunk + 1) * CHUNK).min(n) {
                write(i, (rng.next_f32() * 2.0 - 1.0) * a);
            }
        };
        // Chunks are seeded independently so they can be filled in parallel.
        match out {
            Weight::F32(v) => {
                let dst = crate::model::SyncPtr(v[start..].as_mut_ptr());
                crate::kernels::parallel_for(num_chunks, |c| {
                    // SAFETY: chunk `c` writes only indices in its own
                    // disjoint range of the n-element tail.
                    fill(c, &mut |i, x| unsafe { *dst.get().add(i) = x });
                });
            }
            Weight::Bf16(v) => {
                let dst = crate::model::SyncPtr(v[start..].as_mut_ptr());
                crate::kernels::parallel_for(num_chunks, |c| {
                    // SAFETY: as above, disjoint ranges per chunk.
                    fill(c, &mut |i, x| unsafe {
                        *dst.get().add(i) = half::bf16::from_f32(x).to_bits()
                    });
                });
            }
        }
        Ok(())
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A small, fast, well-mixed generator; plenty for dummy weights.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_is_deterministic_and_scaled() {
        let s = DummySource::new(7);
        let a = s
            .read("w", &[300, 400], WeightDType::F32)
            .unwrap()
            .into_f32();
        let b = s
            .read("w", &[300, 400], WeightDType::F32)
            .unwrap()
            .into_f32();
        assert_eq!(a, b);
        let c = DummySource::new(8)
            .read("w", &[300, 400], WeightDType::F32)
            .unwrap()
            .into_f32();
        assert_ne!(a, c);
        let var = a.iter().map(|x| x * x).sum::<f32>() / a.len() as f32;
        assert!(
            (var.sqrt() - DummySource::STD).abs() < 0.002,
            "{}",
            var.sqrt()
        );
        let n = s.read("model.norm.weight", &[8], WeightDType::F32).unwrap();
        assert_eq!(n.into_f32(), vec![1.0; 8]);
    }

    #[test]
    fn conversion_rounds_to_bf16() {
        let bytes: Vec<u8> = [1.0f32, 1.0 + 1.0 / 256.0, 1.004]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut w = Weight::empty(WeightDType::Bf16, 2);
        convert_into(&bytes, Dtype::F32, &mut w).unwrap();
        assert_eq!(w.into_f32(), vec![1.0, 1.0, 1.0078125], "ties go to even");
        let mut w = Weight::empty(WeightDType::F32, 2);
        assert!(convert_into(&bytes, Dtype::I64, &mut w).is_err());
    }
}
