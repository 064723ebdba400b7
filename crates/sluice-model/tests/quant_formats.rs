//! The weight-format table against gguf-py: for every committed fixture
//! (`tests/data/quants/`, made by `make_quants.py` with `gguf.quants`),
//! `QuantFormat::dequantize_row` gives exactly gguf-py's f32 values, bit for
//! bit, and the quantizers gguf-py implements (Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1, and F32 / F16 / BF16) give exactly its bytes. A `PackedWeight` of
//! each fixture dequantizes to the same bits too.

use sluice_model::kernels::{PackedWeight, QuantFormat};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quants")
}

struct Case {
    name: String,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    src: bool,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(dir().join("manifest.json")).expect("manifest.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("manifest is JSON");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|c| {
            let ty = c["type"].as_str().expect("type");
            Case {
                name: c["name"].as_str().expect("name").to_string(),
                format: QuantFormat::from_name(ty).unwrap_or_else(|| panic!("unknown type {ty}")),
                rows: c["rows"].as_u64().expect("rows") as usize,
                cols: c["cols"].as_u64().expect("cols") as usize,
                src: c["src"].as_bool().expect("src"),
            }
        })
        .collect()
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn every_type_has_fixtures() {
    let cases = cases();
    for f in QuantFormat::ALL {
        assert!(cases.iter().any(|c| c.format == f), "no fixture for {f}");
        if f.can_quantize() {
            assert!(
                cases.iter().any(|c| c.format == f && c.src),
                "no quantize fixture for {f}"
            );
        }
    }
    // The quantizers the loader needs for `--quantization q8_0|q4_0`.
    assert!(QuantFormat::Q8_0.can_quantize() && QuantFormat::Q4_0.can_quantize());
}

#[test]
fn dequantize_equals_gguf_py_bit_for_bit() {
    for c in cases() {
        let q = read(&format!("{}.q", c.name));
        let want = f32s(&read(&format!("{}.deq", c.name)));
        let rb = c.format.row_bytes(c.cols).expect("whole blocks");
        assert_eq!(q.len(), rb * c.rows, "{}: byte length", c.name);
        let mut got = vec![0.0f32; c.cols];
        for r in 0..c.rows {
            c.format
                .dequantize_row(&q[r * rb..(r + 1) * rb], &mut got)
                .expect("row fits");
            for (j, (g, w)) in got.iter().zip(&want[r * c.cols..]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} row {r} element {j}: {g:e} vs gguf-py {w:e}",
                    c.name
                );
            }
        }
    }
}

#[test]
fn quantize_equals_gguf_py_bit_for_bit() {
    for c in cases().into_iter().filter(|c| c.src) {
        let src = f32s(&read(&format!("{}.src", c.name)));
        let want = read(&format!("{}.q", c.name));
        let got = c.format.quantize(&src, c.cols).expect("quantizes");
        assert_eq!(got.len(), want.len(), "{}: length", c.name);
        if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!(
                "{}: byte {at} is {:#04x}, gguf-py wrote {:#04x}",
                c.name, got[at], want[at]
            );
        }
    }
}

#[test]
fn packed_weights_dequantize_to_the_same_bits() {
    for c in cases().into_iter().filter(|c| !c.format.is_float()) {
        let q = read(&format!("{}.q", c.name));
        let want = f32s(&read(&format!("{}.deq", c.name)));
        let packed = PackedWeight::new(c.format, &q, c.rows, c.cols).expect("packs");
        let mut got = vec![0.0f32; c.cols];
        for r in 0..c.rows {
            packed.dequantize_row(r, &mut got);
            assert!(
                got.iter()
                    .zip(&want[r * c.cols..])
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "{} row {r}",
                c.name
            );
        }
    }
}

#[test]
fn table_geometry_and_names() {
    let expect = [
        (QuantFormat::F32, "F32", 0, 1, 4),
        (QuantFormat::F16, "F16", 1, 1, 2),
        (QuantFormat::Bf16, "BF16", 30, 1, 2),
        (QuantFormat::Q8_0, "Q8_0", 8, 32, 34),
        (QuantFormat::Q4_0, "Q4_0", 2, 32, 18),
        (QuantFormat::Q4_1, "Q4_1", 3, 32, 20),
        (QuantFormat::Q5_0, "Q5_0", 6, 32, 22),
        (QuantFormat::Q5_1, "Q5_1", 7, 32, 24),
        (QuantFormat::Q4K, "Q4_K", 12, 256, 144),
        (QuantFormat::Q5K, "Q5_K", 13, 256, 176),
        (QuantFormat::Q6K, "Q6_K", 14, 256, 210),
        (QuantFormat::IQ4NL, "IQ4_NL", 20, 32, 18),
        (QuantFormat::IQ4XS, "IQ4_XS", 23, 256, 136),
        (QuantFormat::Q2K, "Q2_K", 10, 256, 84),
        (QuantFormat::Q3K, "Q3_K", 11, 256, 110),
    ];
    for (f, name, id, block, bytes) in expect {
        assert_eq!(f.name(), name);
        assert_eq!(f.ggml_type(), id);
        assert_eq!(f.block_size(), block);
        assert_eq!(f.block_bytes(), bytes);
        assert_eq!(QuantFormat::from_ggml_type(id), Some(f));
        assert_eq!(QuantFormat::from_name(&name.to_lowercase()), Some(f));
    }
    assert_eq!(
        QuantFormat::from_ggml_type(16),
        None,
        "IQ2_XXS is not supported"
    );
    assert!(QuantFormat::Q4K.row_bytes(100).is_err());
    assert!(QuantFormat::Q4K
        .quantize_row(&[0.0; 256], &mut [0; 144])
        .is_err());
    let mut out = [0.0f32; 32];
    assert!(QuantFormat::Q8_0
        .dequantize_row(&[0; 33], &mut out)
        .is_err());
}
