//! Weight storage and the two places weights come from: a memory-mapped
//! safetensors checkpoint (single file or sharded with an index; its reader
//! is `weights/safetensors.rs`) and a deterministic dummy generator
//! (`--load-format dummy`).
//!
//! Promises: a tensor is only handed out with exactly the shape the model
//! asked for, converted to the compute dtype (f32, bf16 or f16 bit
//! patterns, or a block-quantized format: f32 / bf16 / f16 checkpoints are
//! quantized at load, row by row, when the dtype asks for Q8_0, Q4_0 or
//! another format with a quantizer); anything else is an error naming the
//! tensor and the file. Quantized bytes may be owned or borrowed from a
//! memory map (`WeightBytes::mapped`, kept alive by an `Arc`), and
//! `Weight::pack` repacks them for the kernels. Tensors can be
//! appended into one buffer, which is how q/k/v and gate/up are fused at
//! load time. Checkpoint pages are released once copied, so loading peaks at
//! about the size of the model plus one tensor, not twice the model.

mod safetensors;

pub use self::safetensors::SafetensorsSource;

use crate::kernels::{PackedWeight, QuantFormat, WeightRef};
use crate::model::arch::TensorNaming;
use anyhow::{bail, Result};
use std::ops::Range;
use std::sync::Arc;

/// The bytes of a quantized weight: owned, or a range of a buffer (a memory
/// map) that the `Arc` keeps alive, so a GGUF loader can hand mapped tensor
/// data to the kernels without copying.
#[derive(Clone)]
pub struct WeightBytes(BytesRepr);

#[derive(Clone)]
enum BytesRepr {
    Owned(Vec<u8>),
    Mapped {
        source: Arc<dyn AsRef<[u8]> + Send + Sync>,
        range: Range<usize>,
    },
}

impl WeightBytes {
    pub fn owned(bytes: Vec<u8>) -> WeightBytes {
        WeightBytes(BytesRepr::Owned(bytes))
    }

    /// `source[range]`, borrowed. Errors if the range is not inside the
    /// source.
    pub fn mapped(
        source: Arc<dyn AsRef<[u8]> + Send + Sync>,
        range: Range<usize>,
    ) -> Result<WeightBytes> {
        let len = (*source).as_ref().len();
        if range.start > range.end || range.end > len {
            bail!("bytes {range:?} are outside a buffer of {len} bytes");
        }
        Ok(WeightBytes(BytesRepr::Mapped { source, range }))
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            BytesRepr::Owned(v) => v,
            BytesRepr::Mapped { source, range } => &(**source).as_ref()[range.clone()],
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes are borrowed from a mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, BytesRepr::Mapped { .. })
    }

    /// The owned buffer, copying mapped bytes first (to append to them).
    pub fn make_owned(&mut self) -> &mut Vec<u8> {
        if let BytesRepr::Mapped { .. } = self.0 {
            self.0 = BytesRepr::Owned(self.as_slice().to_vec());
        }
        match &mut self.0 {
            BytesRepr::Owned(v) => v,
            BytesRepr::Mapped { .. } => unreachable!("made owned above"),
        }
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "WeightBytes({} {kind} bytes)", self.len())
    }
}

/// A weight buffer in its compute dtype, row-major.
#[derive(Clone, Debug)]
pub enum Weight {
    F32(Vec<f32>),
    /// bf16 values as raw bit patterns (what the kernels take).
    Bf16(Vec<u16>),
    /// IEEE f16 values as raw bit patterns.
    F16(Vec<u16>),
    /// Rows of whole blocks in `format`'s ggml layout (a GGUF tensor's
    /// bytes), used by the kernels as they are.
    Quant {
        format: QuantFormat,
        bytes: WeightBytes,
    },
    /// The same, repacked for the kernels (`Weight::pack`): bit-identical
    /// results, faster, and always owned.
    Packed(PackedWeight),
}

impl Weight {
    /// An empty buffer in `format`, with room for `capacity` elements.
    pub fn empty(format: QuantFormat, capacity: usize) -> Self {
        match format {
            QuantFormat::F32 => Weight::F32(Vec::with_capacity(capacity)),
            QuantFormat::Bf16 => Weight::Bf16(Vec::with_capacity(capacity)),
            QuantFormat::F16 => Weight::F16(Vec::with_capacity(capacity)),
            format => Weight::Quant {
                format,
                bytes: WeightBytes::owned(Vec::with_capacity(
                    capacity / format.block_size() * format.block_bytes(),
                )),
            },
        }
    }

    /// The format the values are held in (a packed weight reports the
    /// format it was packed from).
    pub fn dtype(&self) -> QuantFormat {
        match self {
            Weight::F32(_) => QuantFormat::F32,
            Weight::Bf16(_) => QuantFormat::Bf16,
            Weight::F16(_) => QuantFormat::F16,
            Weight::Quant { format, .. } => *format,
            Weight::Packed(p) => p.format(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Weight::F32(v) => v.len(),
            Weight::Bf16(v) | Weight::F16(v) => v.len(),
            Weight::Quant { format, bytes } => {
                bytes.len() / format.block_bytes() * format.block_size()
            }
            Weight::Packed(p) => p.rows() * p.cols(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_in_bytes(&self) -> usize {
        match self {
            Weight::F32(v) => v.len() * 4,
            Weight::Bf16(v) | Weight::F16(v) => v.len() * 2,
            Weight::Quant { bytes, .. } => bytes.len(),
            Weight::Packed(p) => p.size_in_bytes(),
        }
    }

    pub fn as_weight_ref(&self) -> WeightRef<'_> {
        match self {
            Weight::F32(v) => WeightRef::F32(v),
            Weight::Bf16(v) => WeightRef::Bf16(v),
            Weight::F16(v) => WeightRef::F16(v),
            Weight::Quant { format, bytes } => WeightRef::Quant {
                format: *format,
                data: bytes.as_slice(),
            },
            Weight::Packed(p) => WeightRef::Packed(p),
        }
    }

    /// Copies row `row` of a `[rows × width]` matrix into `out` as f32 (the
    /// embedding lookup; quantized rows are dequantized exactly as
    /// gguf-py does).
    pub fn row_to_f32(&self, row: usize, width: usize, out: &mut [f32]) {
        self.as_weight_ref().row_to_f32(row, width, out);
    }

    /// The values as f32, for weights that are always kept in f32.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Weight::F32(v) => v,
            Weight::Bf16(v) => v.into_iter().map(crate::kernels::bf16_to_f32).collect(),
            Weight::F16(v) => v
                .into_iter()
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect(),
            Weight::Quant { format, bytes } => {
                let mut out =
                    vec![0.0f32; bytes.len() / format.block_bytes() * format.block_size()];
                // Whole blocks by construction; blocks decode independently
                // of the row they sit in.
                let _ = format.dequantize_row(bytes.as_slice(), &mut out);
                out
            }
            Weight::Packed(p) => {
                let mut out = vec![0.0f32; p.rows() * p.cols()];
                for (r, row) in out.chunks_exact_mut(p.cols().max(1)).enumerate() {
                    p.dequantize_row(r, row);
                }
                out
            }
        }
    }

    /// Quantizes a `[rows × cols]` f32 matrix to `format` (Q8_0, Q4_0 and the
    /// other formats with a quantizer; the float formats convert).
    pub fn quantize(values: &[f32], cols: usize, format: QuantFormat) -> Result<Weight> {
        let mut out = Weight::empty(format, values.len());
        append_f32_rows(values, cols, &mut out)?;
        Ok(out)
    }

    /// The weight repacked for the integer kernels (`PackedWeight`) when it
    /// is a quantized `[rows × cols]` matrix; anything else is returned as
    /// it is. Mapped bytes are copied into the packed buffer (the mapping
    /// may be dropped afterwards).
    /// Whether the weight reads its bytes from a source's memory map (a
    /// quantized tensor used as stored) rather than owning them.
    pub fn borrows_mapping(&self) -> bool {
        matches!(self, Weight::Quant { bytes, .. } if bytes.is_mapped())
    }

    pub fn pack(self, rows: usize, cols: usize) -> Weight {
        match self {
            Weight::Quant { format, bytes } if !format.is_float() => {
                match PackedWeight::new(format, bytes.as_slice(), rows, cols) {
                    Some(p) => Weight::Packed(p),
                    None => Weight::Quant { format, bytes },
                }
            }
            other => other,
        }
    }
}

/// Appends f32 `values` (rows of `cols`) to `out`, converting or quantizing
/// to its dtype.
pub(crate) fn append_f32_rows(values: &[f32], cols: usize, out: &mut Weight) -> Result<()> {
    match out {
        Weight::F32(v) => v.extend_from_slice(values),
        Weight::Bf16(v) => v.extend(values.iter().map(|&x| crate::kernels::f32_to_bf16(x))),
        Weight::F16(v) => v.extend(values.iter().map(|&x| half::f16::from_f32(x).to_bits())),
        Weight::Quant { format, bytes } => {
            let format = *format;
            if !format.can_quantize() {
                bail!(
                    "cannot quantize to {format} at load (supported: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)"
                );
            }
            let row_bytes = format.row_bytes(cols)?;
            if cols == 0 || !values.len().is_multiple_of(cols) {
                bail!("{} values are not rows of {cols}", values.len());
            }
            let v = bytes.make_owned();
            let start = v.len();
            v.resize(start + values.len() / cols * row_bytes, 0);
            for (src, dst) in values
                .chunks_exact(cols)
                .zip(v[start..].chunks_exact_mut(row_bytes))
            {
                format.quantize_row(src, dst)?;
            }
        }
        Weight::Packed(_) => bail!("cannot append to a packed weight"),
    }
    Ok(())
}

/// Where the model's tensors come from.
pub trait TensorSource {
    /// Appends tensor `name`, which must have exactly `shape`, to `out`
    /// converted to `out`'s dtype.
    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> Result<()>;

    /// Whether the source has tensor `name` (for optional tensors such as an
    /// untied `lm_head.weight`).
    fn contains(&self, name: &str) -> bool;

    /// The model holds its own copy of tensor `name` (converted, fused or
    /// repacked) and will not read the source's again: a memory-mapped
    /// source may drop its pages, so that the resident set does not hold
    /// the file and the model at once.
    fn release(&self, name: &str) {
        let _ = name;
    }

    /// How this source spells tensor names; the model asks for every tensor
    /// by role and the architecture spells it in this naming
    /// (`model/arch/`). Hugging Face names unless the source says otherwise
    /// (a GGUF source speaks llama.cpp's).
    fn naming(&self) -> TensorNaming {
        TensorNaming::HuggingFace
    }

    /// The format tensor `name` is handed out in when `requested` is asked
    /// for. Sources that convert (safetensors, dummy) hand out `requested`;
    /// one that keeps stored formats (a GGUF file's quantized types) names
    /// the stored one. The model reads each tensor in the format named here,
    /// and fuses the parts of a linear layer (q/k/v, gate/up) into one
    /// matrix only when their formats agree.
    fn format_of(&self, name: &str, requested: QuantFormat) -> Result<QuantFormat> {
        let _ = name;
        Ok(requested)
    }

    /// One tensor on its own.
    fn read(&self, name: &str, shape: &[usize], dtype: QuantFormat) -> Result<Weight> {
        let mut out = Weight::empty(dtype, shape.iter().product());
        self.read_into(name, shape, &mut out)?;
        Ok(out)
    }

    /// Several tensors concatenated along their first axis (each given with
    /// its own shape), e.g. q/k/v into one `[(nq + 2·nkv)·hd × hidden]`
    /// matrix.
    fn read_fused(&self, parts: &[(String, Vec<usize>)], dtype: QuantFormat) -> Result<Weight> {
        let total = parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        let mut out = Weight::empty(dtype, total);
        for (name, shape) in parts {
            self.read_into(name, shape, &mut out)?;
        }
        Ok(out)
    }
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
        if matches!(
            out,
            Weight::F16(_) | Weight::Quant { .. } | Weight::Packed(_)
        ) {
            // Made in f32, then converted or quantized (`--quantization`).
            let mut values = Weight::F32(Vec::new());
            self.read_into(name, shape, &mut values)?;
            let cols = shape.last().copied().unwrap_or(1);
            return append_f32_rows(&values.into_f32(), cols, out);
        }
        let n: usize = shape.iter().product();
        let start = out.len();
        match out {
            Weight::F32(v) => v.resize(start + n, 0.0),
            Weight::Bf16(v) => v.resize(start + n, 0),
            _ => unreachable!("handled above"),
        }
        if name.ends_with("norm.weight") {
            match out {
                Weight::F32(v) => v[start..].fill(1.0),
                Weight::Bf16(v) => v[start..].fill(half::bf16::ONE.to_bits()),
                _ => unreachable!("handled above"),
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
                let dst = crate::kernels::SyncPtr(v[start..].as_mut_ptr());
                crate::kernels::parallel_for(num_chunks, |c| {
                    // SAFETY: chunk `c` writes only indices in its own
                    // disjoint range of the n-element tail.
                    fill(c, &mut |i, x| unsafe { *dst.get().add(i) = x });
                });
            }
            Weight::Bf16(v) => {
                let dst = crate::kernels::SyncPtr(v[start..].as_mut_ptr());
                crate::kernels::parallel_for(num_chunks, |c| {
                    // SAFETY: as above, disjoint ranges per chunk.
                    fill(c, &mut |i, x| unsafe {
                        *dst.get().add(i) = half::bf16::from_f32(x).to_bits()
                    });
                });
            }
            _ => unreachable!("handled above"),
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
            .read("w", &[300, 400], QuantFormat::F32)
            .unwrap()
            .into_f32();
        let b = s
            .read("w", &[300, 400], QuantFormat::F32)
            .unwrap()
            .into_f32();
        assert_eq!(a, b);
        let c = DummySource::new(8)
            .read("w", &[300, 400], QuantFormat::F32)
            .unwrap()
            .into_f32();
        assert_ne!(a, c);
        let var = a.iter().map(|x| x * x).sum::<f32>() / a.len() as f32;
        assert!(
            (var.sqrt() - DummySource::STD).abs() < 0.002,
            "{}",
            var.sqrt()
        );
        let n = s.read("model.norm.weight", &[8], QuantFormat::F32).unwrap();
        assert_eq!(n.into_f32(), vec![1.0; 8]);
    }

    #[test]
    fn quantized_weights_load_convert_and_pack() {
        let s = DummySource::new(3);
        let f = s.read("w", &[40, 64], QuantFormat::F32).unwrap().into_f32();
        for format in [QuantFormat::Q8_0, QuantFormat::Q4_0] {
            let q = s.read("w", &[40, 64], format).unwrap();
            assert_eq!(q.dtype(), format);
            assert_eq!(q.len(), 40 * 64);
            assert_eq!(q.size_in_bytes(), 40 * format.row_bytes(64).unwrap());
            // Quantizing at load is the format's quantizer on the f32 rows.
            let want = Weight::quantize(&f, 64, format).unwrap();
            let (Weight::Quant { bytes: a, .. }, Weight::Quant { bytes: b, .. }) = (&q, &want)
            else {
                panic!("quantized weights");
            };
            assert_eq!(a.as_slice(), b.as_slice());
            // Round trip within half a quantization step of each block.
            let back = q.clone().into_f32();
            for (x, y) in f.iter().zip(&back) {
                assert!((x - y).abs() < 0.01, "{format}: {x} vs {y}");
            }
            // Packing keeps every row and the reported dtype.
            let packed = q.clone().pack(40, 64);
            assert!(matches!(packed, Weight::Packed(_)));
            assert_eq!(packed.dtype(), format);
            let (mut r1, mut r2) = (vec![0.0; 64], vec![0.0; 64]);
            for row in [0, 17, 39] {
                q.row_to_f32(row, 64, &mut r1);
                packed.row_to_f32(row, 64, &mut r2);
                assert_eq!(r1, r2);
            }
        }
        // A format without a quantizer is refused at load, with its name.
        let err = s.read("w", &[2, 256], QuantFormat::Q4K).unwrap_err();
        assert!(format!("{err:#}").contains("Q4_K"), "{err:#}");
        // F16 converts.
        let h = s.read("w", &[40, 64], QuantFormat::F16).unwrap();
        assert_eq!(h.size_in_bytes(), 40 * 64 * 2);
    }

    #[test]
    fn mapped_bytes_are_borrowed_and_checked() {
        let buf: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![7u8; 100]);
        let b = WeightBytes::mapped(Arc::clone(&buf), 10..44).unwrap();
        assert!(b.is_mapped());
        assert_eq!(b.len(), 34);
        assert_eq!(
            b.as_slice().as_ptr(),
            (*buf).as_ref()[10..].as_ptr(),
            "no copy"
        );
        assert!(WeightBytes::mapped(Arc::clone(&buf), 90..101).is_err());
        let w = Weight::Quant {
            format: QuantFormat::Q8_0,
            bytes: b,
        };
        assert_eq!(w.len(), 32);
        let mut row = vec![0.0; 32];
        w.row_to_f32(0, 32, &mut row);
        // d = f16 0x0707, q = 7.
        let d = half::f16::from_bits(0x0707).to_f32();
        assert!(row.iter().all(|&v| v == 7.0 * d));
    }
}
