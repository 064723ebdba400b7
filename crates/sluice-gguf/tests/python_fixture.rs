//! Files made by the `gguf` Python package (llama.cpp's own writer), by
//! `tests/data/make_fixture.py`: the reader agrees with it on every value
//! and tensor, refuses its big-endian output clearly, and has its type
//! table. Also, when `SLUICE_GGUF_TEST_DIR` names a directory, every
//! `.gguf` file in it (real llama.cpp files) must open and read.

use sluice_gguf::{Array, GgmlType, GgufError, GgufFile, Value};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `make_fixture.py`'s `values(n, scale)`.
fn values(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 - (n / 2) as f32) * scale)
        .collect()
}

#[test]
fn reads_the_python_packages_file() {
    let f = GgufFile::open(data("python-v3.gguf")).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    let md = f.metadata();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(md.str("general.name").unwrap(), "python fixture");
    assert_eq!(md.get("fixture.u8"), Some(&Value::U8(200)));
    assert_eq!(md.get("fixture.i8"), Some(&Value::I8(-100)));
    assert_eq!(md.get("fixture.u16"), Some(&Value::U16(60000)));
    assert_eq!(md.get("fixture.i16"), Some(&Value::I16(-30000)));
    assert_eq!(md.get("fixture.u32"), Some(&Value::U32(4_000_000_000)));
    assert_eq!(md.get("fixture.i32"), Some(&Value::I32(-2_000_000_000)));
    assert_eq!(md.get("fixture.f32"), Some(&Value::F32(1.5)));
    assert_eq!(md.get("fixture.bool"), Some(&Value::Bool(true)));
    assert_eq!(md.str("fixture.string").unwrap(), "héllo ✓ 日本");
    assert_eq!(md.get("fixture.u64"), Some(&Value::U64((1 << 63) + 5)));
    assert_eq!(md.get("fixture.i64"), Some(&Value::I64(-(1 << 62))));
    assert_eq!(
        md.get("fixture.f64"),
        Some(&Value::F64(std::f64::consts::PI))
    );
    assert_eq!(
        md.get("fixture.array.i32"),
        Some(&Value::from(vec![1i32, -2, 3]))
    );
    assert_eq!(&*md.f32_array("fixture.array.f32").unwrap(), &[0.5, -0.25]);
    assert_eq!(
        md.get("fixture.array.bool"),
        Some(&Value::from(vec![true, false, true]))
    );
    assert_eq!(
        md.str_array("fixture.array.string").unwrap(),
        &["a", "bc", "", "日本"]
    );
    assert_eq!(
        md.get("fixture.array.nested"),
        Some(&Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![3])
        ])))
    );
    assert_eq!(
        md.get("fixture.array.u8"),
        Some(&Value::from(vec![1u8, 2, 255]))
    );
    assert_eq!(
        md.get("fixture.array.u64"),
        Some(&Value::from(vec![u64::MAX]))
    );
    assert_eq!(&*md.f32_array("fixture.array.f64").unwrap(), &[0.125]);
    assert_eq!(md.u32("llama.block_count").unwrap(), 1);
    assert_eq!(md.u32("llama.context_length").unwrap(), 64);
    assert_eq!(md.f32("llama.rope.freq_base").unwrap(), 10000.0);

    let shapes: Vec<(&str, GgmlType, &[u64])> = f
        .tensors()
        .iter()
        .map(|t| (t.name(), t.ggml_type(), t.dims()))
        .collect();
    assert_eq!(
        shapes,
        [
            ("token_embd.weight", GgmlType::F32, &[8u64, 3][..]),
            ("output_norm.weight", GgmlType::F32, &[8][..]),
            ("blk.0.attn_q.weight", GgmlType::F16, &[4, 2][..]),
            ("blk.0.attn_k.weight", GgmlType::BF16, &[4, 2][..]),
            ("blk.0.ffn_up.weight", GgmlType::Q8_0, &[64, 2][..]),
            ("blk.0.ffn_down.weight", GgmlType::Q4_0, &[32, 1][..]),
            ("blk.0.ids", GgmlType::I32, &[3][..]),
        ]
    );
    let t = f.tensor("token_embd.weight").unwrap();
    assert_eq!(f32s(t.data()), values(24, 0.25));
    assert_eq!(
        f32s(f.tensor("output_norm.weight").unwrap().data()),
        values(8, 0.5)
    );
    // bf16 is the top half of the f32 (these values are exact in bf16).
    let bf16: Vec<f32> = f
        .tensor("blk.0.attn_k.weight")
        .unwrap()
        .data()
        .chunks_exact(2)
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect();
    assert_eq!(bf16, values(8, 0.5));
    assert_eq!(
        f.tensor("blk.0.ffn_up.weight").unwrap().n_bytes(),
        2 * 2 * 34
    );
    assert_eq!(f.tensor("blk.0.ffn_down.weight").unwrap().n_bytes(), 18);
    let ids: Vec<i32> = f
        .tensor("blk.0.ids")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ids, [1, -2, 3]);
}

#[test]
fn refuses_the_python_packages_big_endian_file() {
    let e = GgufFile::open(data("python-big-endian.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Unsupported { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("python-big-endian.gguf: version field reads 0x03000000")
            && e.contains("the file is big-endian"),
        "{e}"
    );
}

#[test]
fn type_table_matches_the_python_package() {
    let text = std::fs::read_to_string(data("ggml_types.txt")).unwrap();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [name, id, block, size] = f[..] else {
            panic!("bad line {line:?}")
        };
        let id: u32 = id.parse().unwrap();
        let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("{name} ({id}) is missing"));
        assert_eq!(ty.name(), name);
        assert_eq!(ty.block_size().to_string(), block, "{name}");
        assert_eq!(ty.type_size().to_string(), size, "{name}");
        n += 1;
    }
    assert_eq!(
        n,
        GgmlType::all().count(),
        "the table has types the package lacks"
    );
}

/// Real files, when a directory of them is given: every file opens, and
/// every tensor's bytes can be read.
#[test]
fn real_files_from_the_environment() {
    let Some(dir) = std::env::var_os("SLUICE_GGUF_TEST_DIR") else {
        eprintln!("SLUICE_GGUF_TEST_DIR not set: skipped");
        return;
    };
    let mut opened = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let is_gguf = path.extension().is_some_and(|e| e == "gguf");
        // Later parts of a split set are opened through their first part.
        let later_part = sluice_gguf::SplitName::parse(&path).is_some_and(|s| s.part > 1);
        if !is_gguf || later_part {
            continue;
        }
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut sum = 0u64;
        for t in f.tensors() {
            sum = t
                .data()
                .iter()
                .fold(sum, |s, &b| s.wrapping_add(u64::from(b)));
        }
        eprintln!(
            "{}: {} {} tensors, {} keys (checksum {sum})",
            path.display(),
            f.architecture().unwrap_or("?"),
            f.tensors().len(),
            f.metadata().len()
        );
        opened += 1;
    }
    assert!(opened > 0, "no .gguf file in {}", Path::new(&dir).display());
}
