//! Fixtures shared by the integration tests: a writer-made file with every
//! metadata value type and tensors of several GGML types.

#![allow(dead_code)]

use sluice_gguf::{Array, GgmlType, GgufWriter, Value};

/// One value of every type, arrays of every element type (strings, nested
/// and empty ones included), in a fixed order.
pub fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("llama")),
        ("general.name", Value::from("writer fixture")),
        ("v.u8", Value::U8(200)),
        ("v.i8", Value::I8(-100)),
        ("v.u16", Value::U16(60000)),
        ("v.i16", Value::I16(-30000)),
        ("v.u32", Value::U32(4_000_000_000)),
        ("v.i32", Value::I32(-2_000_000_000)),
        ("v.f32", Value::F32(1.5)),
        ("v.bool", Value::Bool(true)),
        (
            "v.string",
            Value::from("h\u{e9}llo \u{2713} \u{65e5}\u{672c}"),
        ),
        ("v.empty_string", Value::from("")),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("a.u8", Value::from(vec![0u8, 1, 255])),
        ("a.i8", Value::from(vec![-128i8, 0, 127])),
        ("a.u16", Value::from(vec![0u16, 65535])),
        ("a.i16", Value::from(vec![-32768i16, 32767])),
        ("a.u32", Value::from(vec![0u32, u32::MAX])),
        ("a.i32", Value::from(vec![i32::MIN, -1, 0, 1, i32::MAX])),
        ("a.f32", Value::from(vec![0.5f32, -0.25, f32::INFINITY])),
        ("a.bool", Value::from(vec![true, false, true])),
        (
            "a.string",
            Value::from(vec!["a", "bc", "", "\u{65e5}\u{672c}"]),
        ),
        ("a.u64", Value::from(vec![u64::MAX])),
        ("a.i64", Value::from(vec![i64::MIN, i64::MAX])),
        ("a.f64", Value::from(vec![0.125f64, -1e300])),
        ("a.empty", Value::Array(Array::I32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::F64(vec![1.0]), Array::U8(vec![])]),
                Array::Array(vec![]),
            ])),
        ),
        ("llama.block_count", Value::U32(4)),
        ("llama.context_length", Value::U64(2048)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        (
            "split.note",
            Value::from("not a split key the reader cares about"),
        ),
    ]
}

/// Bytes of a tensor of `ty` with `n` elements: a recognisable pattern.
pub fn pattern(ty: GgmlType, n: u64, seed: u8) -> Vec<u8> {
    let len = ty.bytes_for(n).unwrap() as usize;
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `(name, type, dims)` of the sample tensors.
pub fn sample_tensors() -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    vec![
        ("token_embd.weight", GgmlType::F32, vec![8, 5]),
        ("output_norm.weight", GgmlType::F32, vec![8]),
        ("blk.0.attn_q.weight", GgmlType::F16, vec![8, 8]),
        ("blk.0.attn_k.weight", GgmlType::BF16, vec![8, 4]),
        ("blk.1.ffn_up.weight", GgmlType::Q8_0, vec![64, 3]),
        ("blk.1.ffn_gate.weight", GgmlType::Q4_1, vec![32, 2, 1]),
        ("blk.2.ffn_down.weight", GgmlType::Q4_K, vec![256, 2]),
        ("blk.3.attn_k.weight", GgmlType::Q6_K, vec![256, 1, 1, 1]),
        ("blk.3.scalar", GgmlType::F32, vec![]),
    ]
}

/// A writer holding [`every_value`] and [`sample_tensors`].
pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v);
    }
    for (i, (name, ty, dims)) in sample_tensors().into_iter().enumerate() {
        let n = dims.iter().product();
        w.add_tensor(name, ty, &dims, pattern(ty, n, i as u8));
    }
    w
}
