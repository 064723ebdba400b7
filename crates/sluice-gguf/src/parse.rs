//! The byte-level parser of one GGUF file (one part of a split set).
//!
//! It reads from a byte slice (the mapping) through [`Cursor`], whose every
//! read is bounds-checked, and checks every count against the bytes that
//! remain before it reserves anything: an array of `n` elements of type `t`
//! needs at least `n × t.min_size()` bytes, `n` metadata pairs at least
//! `n × MIN_KV_BYTES`. What it returns is fully validated: each tensor's
//! type is known and its byte range lies inside the buffer, aligned, and
//! overlapping no other. Split sets and tensor-name lookup are
//! `file.rs`'s business.

use crate::metadata::Metadata;
use crate::value::{Array, Value, ValueType};
use crate::{GgmlType, GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT};
use crate::{MAX_ARRAY_DEPTH, MAX_DIMS};
use std::collections::HashMap;

/// Magic, version, tensor count, metadata count.
const HEADER_BYTES: usize = 4 + 4 + 8 + 8;

/// The fewest bytes one metadata pair takes: key length, a one-byte key
/// (empty keys are refused), value type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;

/// The fewest bytes one tensor info takes: name length, dimension count,
/// type, offset (an empty name and no dimensions).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor as read from one part, with its byte range checked.
#[derive(Debug)]
pub(crate) struct RawTensor {
    pub name: String,
    pub dims: [u64; MAX_DIMS],
    pub n_dims: usize,
    pub ggml_type: GgmlType,
    pub n_elements: u64,
    /// Offset from the start of the data section, as stored in the file.
    pub offset: u64,
    /// Absolute byte range in the buffer.
    pub start: usize,
    pub end: usize,
}

/// One parsed part.
#[derive(Debug)]
pub(crate) struct ParsedPart {
    pub version: u32,
    pub metadata: Metadata,
    pub alignment: u32,
    pub data_offset: usize,
    pub tensors: Vec<RawTensor>,
}

/// A bounds-checked reader over the file's bytes. Errors are plain
/// messages; the caller adds the context (key or tensor) it knows.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let past_end = || {
            format!(
                "{what} at byte {} runs past the end of the file ({} bytes)",
                self.pos,
                self.buf.len()
            )
        };
        let end = self.pos.checked_add(n).ok_or_else(past_end)?;
        let bytes = self.buf.get(self.pos..end).ok_or_else(past_end)?;
        self.pos = end;
        Ok(bytes)
    }

    fn fixed<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let bytes = self.take(N, what)?;
        let (chunks, _) = bytes.as_chunks::<N>();
        chunks
            .first()
            .copied()
            .ok_or_else(|| format!("{what} at byte {} is short", self.pos))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.fixed(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.fixed(what).map(u64::from_le_bytes)
    }

    /// Checks that `n` items of at least `min_size` bytes each can fit in
    /// what remains, and returns `n` as a `usize`.
    fn count(&self, n: u64, min_size: u64, what: &str) -> Result<usize, String> {
        let remaining = self.remaining();
        match n.checked_mul(min_size) {
            Some(need) if need <= remaining as u64 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => Err(format!(
                "{n} {what} need at least {} bytes, but only {remaining} remain in the file",
                (n as u128) * (min_size as u128)
            )),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.u64("string length")?;
        let remaining = self.remaining();
        if len > remaining as u64 {
            return Err(format!(
                "string length {len} runs past the end of the file ({remaining} bytes remain)"
            ));
        }
        let bytes = self.take(usize::try_from(len).unwrap_or(usize::MAX), "string")?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(format!(
                "string of {len} bytes is not valid UTF-8 (bad byte at {})",
                e.valid_up_to()
            )),
        }
    }

    fn value_type(&mut self, what: &str) -> Result<ValueType, String> {
        let id = self.u32(what)?;
        ValueType::from_id(id).ok_or_else(|| format!("unknown {what} {id}"))
    }

    fn value(&mut self, ty: ValueType) -> Result<Value, String> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.fixed("u8 value")?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.fixed("i8 value")?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.fixed("u16 value")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.fixed("i16 value")?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.fixed("u32 value")?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.fixed("i32 value")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.fixed("f32 value")?)),
            // As llama.cpp: any non-zero byte is true.
            ValueType::Bool => Value::Bool(self.fixed::<1>("bool value")? != [0]),
            ValueType::String => Value::String(self.string()?),
            ValueType::Array => Value::Array(self.array(1)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.fixed("u64 value")?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.fixed("i64 value")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.fixed("f64 value")?)),
        })
    }

    /// Reads `n` fixed-size numbers with one bounds check.
    fn numbers<const N: usize, T>(
        &mut self,
        n: usize,
        f: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, String> {
        // `count` already checked n × N against what remains.
        let bytes = self.take(n.saturating_mul(N), "array elements")?;
        let (chunks, _) = bytes.as_chunks::<N>();
        Ok(chunks.iter().map(|&c| f(c)).collect())
    }

    /// An array whose element type tag comes next; `depth` counts this one
    /// and the arrays around it.
    fn array(&mut self, depth: usize) -> Result<Array, String> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"));
        }
        let elem = self.value_type("array element type")?;
        let n = self.u64("array length")?;
        let n = self.count(
            n,
            elem.min_size(),
            &format!("array elements of type {elem}"),
        )?;
        Ok(match elem {
            ValueType::U8 => Array::U8(self.numbers(n, u8::from_le_bytes)?),
            ValueType::I8 => Array::I8(self.numbers(n, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.numbers(n, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.numbers(n, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.numbers(n, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.numbers(n, i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.numbers(n, f32::from_le_bytes)?),
            ValueType::Bool => Array::Bool(self.numbers(n, |b: [u8; 1]| b != [0])?),
            ValueType::U64 => Array::U64(self.numbers(n, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.numbers(n, i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.numbers(n, f64::from_le_bytes)?),
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string().map_err(|e| format!("element {i}: {e}"))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(
                        self.array(depth + 1)
                            .map_err(|e| format!("element {i}: {e}"))?,
                    );
                }
                Array::Array(v)
            }
        })
    }
}

fn align_up(pos: usize, alignment: u32) -> Option<usize> {
    let a = usize::try_from(alignment).ok().filter(|&a| a > 0)?;
    pos.checked_add(a - 1).map(|p| p / a * a)
}

/// A file that is not a GGUF this reader takes (magic, version).
fn unsupported(file: &str, problem: String) -> GgufError {
    GgufError::Unsupported {
        file: file.to_string(),
        problem,
    }
}

/// A GGUF file whose bytes break the format at `context`.
fn malformed(file: &str, context: &str, problem: String) -> GgufError {
    GgufError::Malformed {
        file: file.to_string(),
        context: context.to_string(),
        problem,
    }
}

/// Parses one GGUF file held in `buf`; `file` names it in errors.
pub(crate) fn parse(file: &str, buf: &[u8]) -> Result<ParsedPart, GgufError> {
    check_magic(file, buf)?;
    let mut c = Cursor { buf, pos: 4 };
    let (version, n_kv, n_tensors) = header(file, &mut c)?;
    let metadata = read_metadata(file, &mut c, n_kv)?;
    let alignment = alignment(file, &metadata)?;
    let mut tensors = read_tensor_infos(file, &mut c, n_tensors, alignment)?;
    // The data section starts at the next multiple of the alignment.
    let data_offset = align_up(c.pos, alignment).unwrap_or(usize::MAX);
    if !tensors.is_empty() && data_offset > buf.len() {
        return Err(malformed(
            file,
            "tensor data",
            format!(
                "the data section would start at byte {data_offset}, past the end of the file ({} bytes)",
                buf.len()
            ),
        ));
    }
    place_tensors(file, buf, data_offset, &mut tensors)?;
    check_overlaps(file, &tensors)?;
    Ok(ParsedPart {
        version,
        metadata,
        alignment,
        data_offset,
        tensors,
    })
}

/// The magic, and a buffer long enough for the header.
fn check_magic(file: &str, buf: &[u8]) -> Result<(), GgufError> {
    let unsupported = |problem: String| unsupported(file, problem);
    let malformed = |context: &str, problem: String| malformed(file, context, problem);
    match buf.get(..4) {
        Some(m) if m == GGUF_MAGIC => {}
        Some(m) => {
            return Err(unsupported(format!(
                "not a GGUF file: it starts with {m:02x?}, not \"GGUF\""
            )))
        }
        None => {
            return Err(unsupported(format!(
                "not a GGUF file: only {} bytes long",
                buf.len()
            )))
        }
    }
    if buf.len() < HEADER_BYTES {
        return Err(malformed(
            "header",
            format!(
                "the file is {} bytes, too short for a GGUF header ({HEADER_BYTES} bytes)",
                buf.len()
            ),
        ));
    }
    Ok(())
}

/// The version and the two counts, each count bounded by the bytes its
/// section needs at least: `(version, metadata pairs, tensor infos)`.
fn header(file: &str, c: &mut Cursor<'_>) -> Result<(u32, usize, usize), GgufError> {
    let unsupported = |problem: String| unsupported(file, problem);
    let header = |e: String| malformed(file, "header", e);

    let version = c.u32("version").map_err(header)?;
    match version {
        2 | 3 => {}
        0 => return Err(unsupported("GGUF version 0 is invalid".into())),
        1 => {
            return Err(unsupported(
                "GGUF version 1 is not supported (llama.cpp dropped it too); \
                 convert the model again to get a version 3 file"
                    .into(),
            ))
        }
        // A big-endian file's version (2 or 3) read little-endian has its
        // low 16 bits zero: 0x03000000 for version 3. llama.cpp uses the
        // same test.
        v if v & 0xFFFF == 0 => {
            return Err(unsupported(format!(
                "version field reads {v:#010x}, a byte-swapped version {}: \
                 the file is big-endian, and only little-endian GGUF files are supported",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(unsupported(format!(
                "GGUF version {v} is newer than this reader supports (2 and 3)"
            )))
        }
    }
    let n_tensors = c.u64("tensor count").map_err(header)?;
    let n_kv = c.u64("metadata count").map_err(header)?;
    // Both sections follow the header; bound each count by the bytes its
    // section needs at least, then the two together.
    let n_kv_usize = c
        .count(n_kv, MIN_KV_BYTES, "metadata key/value pairs")
        .map_err(header)?;
    let n_tensors_usize = c
        .count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensor infos")
        .map_err(header)?;
    let need = u128::from(n_kv) * u128::from(MIN_KV_BYTES)
        + u128::from(n_tensors) * u128::from(MIN_TENSOR_INFO_BYTES);
    if need > c.remaining() as u128 {
        return Err(header(format!(
            "{n_kv} metadata pairs and {n_tensors} tensor infos need at least {need} bytes, \
             but only {} remain in the file",
            c.remaining()
        )));
    }

    Ok((version, n_kv_usize, n_tensors_usize))
}

/// The `n_kv` metadata pairs: keys non-empty and unique.
fn read_metadata(file: &str, c: &mut Cursor<'_>, n_kv: usize) -> Result<Metadata, GgufError> {
    let malformed = |context: &str, problem: String| malformed(file, context, problem);
    let mut entries: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut index: HashMap<String, usize> = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let unread = || match entries.last() {
            Some((prev, _)) => format!("metadata key {i} (after \"{prev}\")"),
            None => format!("metadata key {i}"),
        };
        let key = c.string().map_err(|e| malformed(&unread(), e))?;
        if key.is_empty() {
            return Err(malformed(&unread(), "the key is empty".into()));
        }
        let context = format!("metadata key \"{key}\"");
        if let Some(&first) = index.get(&key) {
            return Err(malformed(
                &context,
                format!("duplicate key (keys {first} and {i})"),
            ));
        }
        let ty = c
            .value_type("value type")
            .map_err(|e| malformed(&context, e))?;
        let value = c.value(ty).map_err(|e| malformed(&context, e))?;
        index.insert(key.clone(), i);
        entries.push((key, value));
    }
    Ok(Metadata::new(file.to_string(), entries, index))
}

/// `general.alignment`: a power of two, `DEFAULT_ALIGNMENT` when absent.
fn alignment(file: &str, metadata: &Metadata) -> Result<u32, GgufError> {
    let malformed = |context: &str, problem: String| malformed(file, context, problem);
    Ok(match metadata.get(KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let context = format!("metadata key \"{KEY_ALIGNMENT}\"");
            // llama.cpp insists on UINT32; any integer type whose value
            // fits is taken here, as for every integer field.
            let Some(a) = v.as_integer() else {
                return Err(malformed(
                    &context,
                    format!(
                        "the alignment must be an integer, not {}",
                        v.type_description()
                    ),
                ));
            };
            match u32::try_from(a) {
                Ok(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(malformed(
                        &context,
                        format!("alignment {a} is not a power of two"),
                    ))
                }
            }
        }
    })
}

/// The `n_tensors` tensor infos: known types, shapes that fit, offsets
/// aligned. Their byte ranges are relative until `place_tensors`.
fn read_tensor_infos(
    file: &str,
    c: &mut Cursor<'_>,
    n_tensors: usize,
    alignment: u32,
) -> Result<Vec<RawTensor>, GgufError> {
    let malformed = |context: &str, problem: String| malformed(file, context, problem);
    let mut tensors: Vec<RawTensor> = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let unread = || match tensors.last() {
            Some(prev) => format!("tensor info {i} (after \"{}\")", prev.name),
            None => format!("tensor info {i}"),
        };
        let name = c.string().map_err(|e| malformed(&unread(), e))?;
        let named = |e: String| malformed(&name, e);
        let n_dims = c.u32("dimension count").map_err(named)?;
        let n_dims = match usize::try_from(n_dims) {
            Ok(n) if n <= MAX_DIMS => n,
            _ => return Err(named(format!("{n_dims} dimensions (at most {MAX_DIMS})"))),
        };
        let mut dims = [1u64; MAX_DIMS];
        for (j, d) in dims.iter_mut().take(n_dims).enumerate() {
            *d = c.u64("dimension").map_err(named)?;
            // ggml stores dimensions as int64.
            if *d > i64::MAX as u64 {
                return Err(named(format!("dimension {j} is {d}, more than 2^63 - 1")));
            }
        }
        let type_id = c.u32("type").map_err(named)?;
        let offset = c.u64("data offset").map_err(named)?;
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownType {
                file: file.to_string(),
                tensor: name,
                id: type_id,
            });
        };
        let shape = dims.get(..n_dims).unwrap_or(&dims);
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| named(format!("shape {shape:?} has more than 2^63 - 1 elements")))?;
        let block = u64::from(ggml_type.block_size());
        if !dims[0].is_multiple_of(block) {
            return Err(named(format!(
                "row length {} is not a multiple of {ggml_type}'s block size {block}",
                dims[0]
            )));
        }
        let n_bytes = ggml_type
            .bytes_for(n_elements)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| named(format!("shape {shape:?} of {ggml_type} is too large")))?;
        if !offset.is_multiple_of(u64::from(alignment)) {
            return Err(named(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        tensors.push(RawTensor {
            name,
            dims,
            n_dims,
            ggml_type,
            n_elements,
            offset,
            start: 0,
            end: n_bytes,
        });
    }

    Ok(tensors)
}

/// Turns each tensor's offset into its absolute byte range, inside `buf`.
fn place_tensors(
    file: &str,
    buf: &[u8],
    data_offset: usize,
    tensors: &mut [RawTensor],
) -> Result<(), GgufError> {
    let malformed = |context: &str, problem: String| malformed(file, context, problem);
    for t in tensors.iter_mut() {
        let n_bytes = t.end;
        let range = usize::try_from(t.offset)
            .ok()
            .and_then(|o| data_offset.checked_add(o))
            .and_then(|s| Some((s, s.checked_add(n_bytes)?)));
        match range {
            Some((start, end)) if end <= buf.len() => {
                t.start = start;
                t.end = end;
            }
            _ => {
                return Err(malformed(
                    &t.name,
                    format!(
                        "data runs past the end of the file ({n_bytes} bytes at offset {} \
                         of the data section, which starts at byte {data_offset} of {})",
                        t.offset,
                        buf.len()
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// No two tensors may share bytes.
fn check_overlaps(file: &str, tensors: &[RawTensor]) -> Result<(), GgufError> {
    let malformed = |context: &str, problem: String| malformed(file, context, problem);
    // No two tensors may share bytes: sort by start, then each must end
    // before the next begins. Empty tensors own no bytes.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors.get(i).is_some_and(|t| t.end > t.start))
        .collect();
    order.sort_unstable_by_key(|&i| tensors.get(i).map(|t| t.start));
    for w in order.windows(2) {
        if let (Some(a), Some(b)) = (
            w.first().and_then(|&i| tensors.get(i)),
            w.get(1).and_then(|&i| tensors.get(i)),
        ) {
            if b.start < a.end {
                return Err(malformed(
                    &b.name,
                    format!("data overlaps that of \"{}\"", a.name),
                ));
            }
        }
    }

    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b
    }

    #[test]
    fn empty_file_parses() {
        let p = parse("t", &header(3, 0, 0)).unwrap();
        assert_eq!(p.version, 3);
        assert!(p.tensors.is_empty());
        assert_eq!(p.alignment, 32);
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let e = parse("t", &header(3, 0, u64::MAX)).unwrap_err().to_string();
        assert!(
            e.contains("header") && e.contains("metadata key/value pairs"),
            "{e}"
        );
        let e = parse("t", &header(3, u64::MAX / 2, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tensor infos"), "{e}");
    }

    #[test]
    fn string_length_past_end_names_previous_key() {
        let mut b = header(3, 0, 2);
        b.extend(12u64.to_le_bytes());
        b.extend(b"general.name");
        b.extend(8u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(b"x");
        b.extend(u64::MAX.to_le_bytes());
        b.extend([0u8; 20]);
        let e = parse("m.gguf", &b).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "m.gguf: metadata key 1 (after \"general.name\"): string length \
                 18446744073709551615 runs past the end of the file"
            ),
            "{e}"
        );
    }

    #[test]
    fn deep_arrays_are_refused() {
        let mut b = header(3, 0, 1);
        b.extend(1u64.to_le_bytes());
        b.extend(b"k");
        b.extend(9u32.to_le_bytes());
        for _ in 0..20 {
            b.extend(9u32.to_le_bytes());
            b.extend(1u64.to_le_bytes());
        }
        b.extend([0u8; 64]);
        let e = parse("t", &b).unwrap_err().to_string();
        assert!(e.contains("nested more than 8 deep"), "{e}");
    }

    #[test]
    fn align_up_works() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(1, 32), Some(32));
        assert_eq!(align_up(33, 1), Some(33));
        assert_eq!(align_up(usize::MAX, 32), None);
    }
}
