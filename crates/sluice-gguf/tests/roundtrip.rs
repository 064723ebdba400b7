//! Writer → reader round trips: every value type, arrays (of strings,
//! nested, empty), tensors of several types, alignments, versions, and the
//! borrowing of tensor bytes past the file's lifetime.

mod common;

use common::{every_value, pattern, sample_tensors, sample_writer};
use proptest::prelude::*;
use sluice_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Metadata, Value};

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes("test.gguf", bytes)
}

#[test]
fn every_value_type_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    sample_writer().write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.paths(), std::slice::from_ref(&path));
    let md = f.metadata();
    let expected = every_value();
    assert_eq!(md.len(), expected.len());
    // File order is kept.
    let got: Vec<(&str, &Value)> = md.iter().collect();
    for ((k, v), (gk, gv)) in expected.iter().zip(&got) {
        assert_eq!(k, gk);
        assert_eq!(v, *gv, "{k}");
    }
    assert_eq!(md.keys().next(), Some("general.architecture"));
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(md.get("v.u16"), Some(&Value::U16(60000)));
    assert_eq!(md.get("nope"), None);
}

#[test]
fn typed_getters_read_the_sample() {
    let f = open_bytes(&sample_writer().to_bytes().unwrap()).unwrap();
    let md = f.metadata();
    assert_eq!(md.u32("llama.block_count").unwrap(), 4);
    assert_eq!(md.u32("llama.context_length").unwrap(), 2048);
    assert_eq!(md.u64("v.u64").unwrap(), u64::MAX);
    assert_eq!(md.i64("v.i64").unwrap(), i64::MIN);
    assert_eq!(md.i32("v.i8").unwrap(), -100);
    assert_eq!(md.f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(md.f64("v.f64").unwrap(), std::f64::consts::PI);
    assert!(md.bool("v.bool").unwrap());
    assert_eq!(md.str("general.name").unwrap(), "writer fixture");
    assert_eq!(md.str_array("a.string").unwrap(), &["a", "bc", "", "日本"]);
    assert_eq!(&*md.i32_array("a.i8").unwrap(), &[-128, 0, 127]);
    assert_eq!(&*md.u32_array("a.u16").unwrap(), &[0, 65535]);
    assert_eq!(
        &*md.f32_array("a.f64").unwrap(),
        &[0.125, f32::NEG_INFINITY]
    );
    assert!(md.i32_array("a.empty").unwrap().is_empty());
    assert_eq!(md.array("a.nested").unwrap().len(), 4);
    // Errors name the file and the key.
    let e = md.u32("v.i64").unwrap_err().to_string();
    assert_eq!(
        e,
        "test.gguf: metadata key \"v.i64\": value -9223372036854775808 does not fit in u32"
    );
    let e = md.str("v.u8").unwrap_err().to_string();
    assert_eq!(
        e,
        "test.gguf: metadata key \"v.u8\": expected a string, found u8"
    );
    let e = md.str_array("a.i32").unwrap_err().to_string();
    assert!(
        e.contains("expected an array of string, found array of i32"),
        "{e}"
    );
    let e = md.bool("missing.key").unwrap_err().to_string();
    assert_eq!(e, "test.gguf: metadata key \"missing.key\" is missing");
    assert_eq!(md.opt("missing.key", Metadata::f32).unwrap(), None);
}

#[test]
fn tensors_round_trip_with_their_bytes() {
    let f = open_bytes(&sample_writer().to_bytes().unwrap()).unwrap();
    let expected = sample_tensors();
    assert_eq!(f.tensors().len(), expected.len());
    for (i, ((name, ty, dims), t)) in expected.iter().zip(f.tensors()).enumerate() {
        assert_eq!(t.name(), *name);
        assert_eq!(t.ggml_type(), *ty);
        assert_eq!(t.dims(), dims.as_slice());
        let n: u64 = dims.iter().product();
        assert_eq!(t.n_elements(), n);
        assert_eq!(t.n_bytes() as u64, ty.bytes_for(n).unwrap());
        assert_eq!(t.data(), pattern(*ty, n, i as u8).as_slice(), "{name}");
        assert_eq!(f.data(t), t.data());
        assert_eq!(t.part(), 0);
        assert_eq!(t.offset() % 32, 0);
        // The mapping is page-aligned, so the data is aligned in memory.
        assert_eq!(t.data().as_ptr() as usize % 32, 0, "{name}");
        let same = f.tensor(name).unwrap();
        assert_eq!(same.name(), *name);
    }
    let q6 = f.require_tensor("blk.3.attn_k.weight").unwrap();
    assert_eq!((q6.row_len(), q6.n_rows()), (256, 1));
    let scalar = f.tensor("blk.3.scalar").unwrap();
    assert_eq!((scalar.dims(), scalar.n_elements()), (&[][..], 1));
    assert!(f.tensor("nope").is_none());
    let e = f.require_tensor("nope").unwrap_err().to_string();
    assert_eq!(e, "test.gguf: tensor \"nope\" is missing");
}

#[test]
fn mapped_bytes_outlive_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    sample_writer().write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let want = f.tensor("blk.1.ffn_up.weight").unwrap().data().to_vec();
    let bytes = f.tensor_bytes("blk.1.ffn_up.weight").unwrap();
    let range = bytes.range();
    drop(f);
    assert_eq!(&*bytes, want.as_slice());
    assert_eq!(bytes.mmap().get(range).unwrap(), want.as_slice());
    let head = bytes.slice(0..34).unwrap();
    assert_eq!(&*head, &want[..34]);
    assert!(bytes.slice(0..want.len() + 1).is_none());
    assert_send_sync::<GgufFile>();
    assert_send_sync::<sluice_gguf::MappedBytes>();
}

/// Compiles only for `Send + Sync` types: weights are shared across the
/// kernel threads.
fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn alignments_are_honoured() {
    // llama.cpp takes any power of two, 1 included (2^0).
    for alignment in [1u32, 2, 8, 32, 64, 4096] {
        let mut w = sample_writer();
        w.alignment(alignment);
        let f = open_bytes(&w.to_bytes().unwrap()).unwrap();
        assert_eq!(f.alignment(), alignment);
        assert_eq!(f.data_offset() % alignment as usize, 0);
        for t in f.tensors() {
            assert_eq!(t.offset() % u64::from(alignment), 0);
            assert_eq!(t.data().as_ptr() as usize % alignment as usize, 0);
        }
        assert_eq!(f.metadata().u32("general.alignment").unwrap(), alignment);
    }
    // Another integer width is taken when the value fits.
    let mut w = sample_writer();
    w.add("general.alignment", Value::U64(64));
    assert_eq!(open_bytes(&w.to_bytes().unwrap()).unwrap().alignment(), 64);
}

#[test]
fn invalid_alignments_are_refused() {
    for (value, problem) in [
        (Value::U32(0), "alignment 0 is not a power of two"),
        (Value::U32(3), "alignment 3 is not a power of two"),
        (Value::U32(48), "alignment 48 is not a power of two"),
        (Value::I32(-32), "alignment -32 is not a power of two"),
        (
            Value::U64(1 << 40),
            "alignment 1099511627776 is not a power of two",
        ),
        (
            Value::from("32"),
            "the alignment must be an integer, not string",
        ),
    ] {
        let mut w = sample_writer();
        w.add("general.alignment", value);
        let e = open_bytes(&w.to_bytes().unwrap()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("test.gguf: metadata key \"general.alignment\": {problem}")
        );
    }
}

#[test]
fn versions() {
    let mut w = sample_writer();
    w.version(2);
    let f = open_bytes(&w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), sample_tensors().len());
    for (version, problem) in [
        (1, "GGUF version 1 is not supported"),
        (0, "GGUF version 0 is invalid"),
        (
            4,
            "GGUF version 4 is newer than this reader supports (2 and 3)",
        ),
        (0x0300_0000, "the file is big-endian"),
        (0x0200_0000, "a byte-swapped version 2"),
    ] {
        let mut w = sample_writer();
        w.version(version);
        let e = open_bytes(&w.to_bytes().unwrap()).unwrap_err();
        assert!(matches!(e, GgufError::Unsupported { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("test.gguf: ") && e.contains(problem), "{e}");
    }
}

#[test]
fn not_gguf_at_all() {
    for bytes in [
        &b""[..],
        b"GG",
        b"PK\x03\x04 not gguf",
        b"GGUF\x03\x00\x00\x00",
    ] {
        let e = open_bytes(bytes).unwrap_err().to_string();
        assert!(e.starts_with("test.gguf: "), "{e}");
    }
    let e = open_bytes(b"{\"safetensors\": 1}").unwrap_err().to_string();
    assert!(e.contains("not a GGUF file"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = GgufFile::open(&empty).unwrap_err().to_string();
    assert!(
        e.contains("empty.gguf: not a GGUF file: it is empty"),
        "{e}"
    );
    let e = GgufFile::open(dir.path().join("absent.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e:?}");
}

#[test]
fn an_empty_file_has_no_tensors() {
    let f = open_bytes(&GgufWriter::new().to_bytes().unwrap()).unwrap();
    assert!(f.metadata().is_empty());
    assert!(f.tensors().is_empty());
    assert!(f.architecture().is_err());
}

#[test]
fn writer_checks_tensor_sizes() {
    let mut w = GgufWriter::new();
    w.add_tensor("t", GgmlType::Q8_0, &[32, 2], vec![0u8; 67]);
    let e = w.to_bytes().unwrap_err().to_string();
    assert_eq!(e, "GGUF writer: t: Q8_0 [32, 2] takes 68 bytes, 67 given");
    let mut w = GgufWriter::new();
    w.add_tensor("t", GgmlType::Q4_K, &[128], vec![]);
    assert!(w.to_bytes().is_err());
    let mut w = GgufWriter::new();
    w.add_tensor_f32("t", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let f = open_bytes(&w.to_bytes().unwrap()).unwrap();
    let floats: Vec<f32> = f.tensors()[0]
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn every_ggml_type_round_trips() {
    let mut w = GgufWriter::new();
    let types: Vec<GgmlType> = GgmlType::all().collect();
    for (i, ty) in types.iter().enumerate() {
        let n = u64::from(ty.block_size()) * 2;
        w.add_tensor(format!("t{i}"), *ty, &[n], pattern(*ty, n, i as u8));
    }
    let f = open_bytes(&w.to_bytes().unwrap()).unwrap();
    for (t, ty) in f.tensors().iter().zip(&types) {
        assert_eq!(t.ggml_type(), *ty);
        assert_eq!(t.n_bytes(), 2 * ty.type_size() as usize);
    }
}

fn leaf_array() -> impl Strategy<Value = Array> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..6).prop_map(Array::U8),
        prop::collection::vec(any::<i8>(), 0..6).prop_map(Array::I8),
        prop::collection::vec(any::<u16>(), 0..6).prop_map(Array::U16),
        prop::collection::vec(any::<i16>(), 0..6).prop_map(Array::I16),
        prop::collection::vec(any::<u32>(), 0..6).prop_map(Array::U32),
        prop::collection::vec(any::<i32>(), 0..6).prop_map(Array::I32),
        prop::collection::vec(-1e6f32..1e6, 0..6).prop_map(Array::F32),
        prop::collection::vec(any::<bool>(), 0..6).prop_map(Array::Bool),
        prop::collection::vec(".{0,8}", 0..6).prop_map(Array::String),
        prop::collection::vec(any::<u64>(), 0..6).prop_map(Array::U64),
        prop::collection::vec(any::<i64>(), 0..6).prop_map(Array::I64),
        prop::collection::vec(-1e300f64..1e300, 0..6).prop_map(Array::F64),
    ]
}

fn any_array() -> impl Strategy<Value = Array> {
    // Up to 3 levels of nesting inside the leaf level.
    leaf_array().prop_recursive(3, 24, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Array::Array)
    })
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        (-1e30f32..1e30).prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,16}".prop_map(Value::String),
        any_array().prop_map(Value::Array),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        (-1e300f64..1e300).prop_map(Value::F64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any metadata the writer takes, the reader gives back, in order.
    #[test]
    fn metadata_round_trips(
        values in prop::collection::vec(any_value(), 0..12),
        version in 2u32..=3,
    ) {
        let mut w = GgufWriter::new();
        w.version(version);
        for (i, v) in values.iter().enumerate() {
            w.add(format!("k.{i}"), v.clone());
        }
        let f = open_bytes(&w.to_bytes().unwrap()).unwrap();
        let got: Vec<Value> = f.metadata().iter().map(|(_, v)| v.clone()).collect();
        prop_assert_eq!(got, values);
    }
}

/// Dropping a tensor's pages (what a loader does once it holds a copy)
/// changes nothing a reader sees: a file's pages fault back in from the
/// file, and an in-memory file's are never dropped (they would read back
/// as zeros).
#[test]
fn released_pages_read_back_the_same_bytes() {
    let n = 64 * 1024; // 68 KiB of Q8_0: whole pages inside the tensor
    let data = pattern(GgmlType::Q8_0, n, 7);
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    w.add_tensor("big.weight", GgmlType::Q8_0, &[n], data.clone());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    w.write(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for f in [GgufFile::open(&path).unwrap(), open_bytes(&bytes).unwrap()] {
        let t = f.require_tensor("big.weight").unwrap();
        assert_eq!(t.data(), &data[..]);
        t.release_pages();
        assert_eq!(t.data(), &data[..], "{}", f.name());
        t.bytes().release_pages();
        assert_eq!(&*t.bytes(), &data[..], "{}", f.name());
    }
}
