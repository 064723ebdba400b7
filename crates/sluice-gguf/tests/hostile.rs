//! Hostile input: crafted files get errors that name the key or tensor, and
//! a fuzz run (every truncation and thousands of byte mutations of a
//! writer-made and a `gguf`-package-made file) checks that opening and
//! reading every tensor never panics and never holds more heap than a
//! bound derived from the file size.
//!
//! The heap is measured by a counting global allocator (per thread, as in
//! `sluice-core/tests/allocations.rs`): the peak of live bytes while
//! `GgufFile::from_bytes` runs and every tensor's bytes are read.

mod common;

use common::sample_writer;
use sluice_gguf::{GgufFile, GgufWriter, Metadata, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

struct Counting;

// Per thread, so that the test harness's other threads do not count.
// `const` initialisation without a destructor: reading these never
// allocates, so the allocator can use them.
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn record(delta: i64) {
    // `try_with`: an allocation during thread teardown must not panic.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = LIVE.try_with(|live| {
                let now = live.get() + delta;
                live.set(now);
                let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
            });
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only
// records sizes while `COUNTING` is set on the calling thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size() as i64);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size() as i64);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record(-(layout.size() as i64));
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size as i64 - layout.size() as i64);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f`, returning its result and the most heap bytes it held at once.
fn peak_heap<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, PEAK.with(|p| p.get()).max(0) as usize)
}

/// The heap a parse may hold: every structure is a small multiple of the
/// bytes it was read from (the worst, `dense_files_stay_within_the_bound`,
/// is a file of nothing but tiny keys and tensor infos), plus a constant
/// for the fixed-size parts and the error message.
fn heap_bound(file_len: usize) -> usize {
    16 * file_len + 64 * 1024
}

/// Opens `bytes` and reads every tensor, inside `catch_unwind` and the
/// heap measurement; then, outside the measurement, runs every getter on
/// every key. Panics (the test fails) if anything panicked or the heap
/// bound was passed. Returns whether the file opened.
fn open_and_read(bytes: &[u8], what: &str) -> bool {
    let (result, peak) = peak_heap(|| {
        catch_unwind(AssertUnwindSafe(|| {
            match GgufFile::from_bytes("fuzz.gguf", bytes) {
                Ok(f) => {
                    let mut sum = 0u64;
                    for t in f.tensors() {
                        sum = t
                            .data()
                            .iter()
                            .fold(sum, |s, &b| s.wrapping_add(u64::from(b)));
                        sum = sum
                            .wrapping_add(t.n_elements())
                            .wrapping_add(t.dims().len() as u64);
                        assert!(f.tensor(t.name()).is_some());
                    }
                    std::hint::black_box(sum);
                    Ok(f)
                }
                Err(e) => Err(e),
            }
        }))
    });
    let Ok(result) = result else {
        panic!("{what}: opening panicked");
    };
    assert!(
        peak <= heap_bound(bytes.len()),
        "{what}: held {peak} heap bytes for a {}-byte file (bound {})",
        bytes.len(),
        heap_bound(bytes.len())
    );
    let getters = catch_unwind(AssertUnwindSafe(|| match &result {
        Ok(f) => {
            let md = f.metadata();
            for (k, v) in md.iter() {
                let _ = v.to_string();
                let _ = (md.u32(k), md.u64(k), md.i64(k), md.f32(k), md.bool(k));
                let _ = (md.str(k), md.str_array(k), md.i32_array(k));
                let _ = (md.u32_array(k), md.f32_array(k), md.opt(k, Metadata::u32));
            }
            let _ = f.architecture();
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("fuzz.gguf"),
                "{what}: error without the file: {msg}"
            );
        }
    }));
    assert!(getters.is_ok(), "{what}: a getter panicked");
    result.is_ok()
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Every truncation, then `mutations` mutated copies, of `bytes`.
fn fuzz(name: &str, bytes: &[u8], mutations: usize, seed: u64) {
    for len in 0..=bytes.len() {
        open_and_read(&bytes[..len], &format!("{name} truncated to {len}"));
    }
    // Most mutations land before the tensor data, where the structure is;
    // a flipped weight byte changes nothing the reader checks.
    let header_len = GgufFile::from_bytes("x", bytes).unwrap().data_offset();
    let interesting: [u64; 8] = [
        0,
        1,
        0x7f,
        0xffff_ffff,
        1 << 31,
        1 << 63,
        u64::MAX,
        bytes.len() as u64,
    ];
    let mut rng = Rng(seed);
    let mut opened = 0;
    for i in 0..mutations {
        let mut m = bytes.to_vec();
        let edits = 1 + rng.below(4);
        for _ in 0..edits {
            let region = if rng.below(10) < 8 {
                header_len
            } else {
                m.len()
            };
            let pos = rng.below(region);
            match rng.below(4) {
                0 => m[pos] ^= 1 << rng.below(8),
                1 => m[pos] = rng.next() as u8,
                2 => m[pos] = [0x00, 0xff, 0x7f, 0x80][rng.below(4)],
                _ => {
                    let v = interesting[rng.below(interesting.len())].to_le_bytes();
                    let end = (pos + 8).min(m.len());
                    m[pos..end].copy_from_slice(&v[..end - pos]);
                }
            }
        }
        if rng.below(8) == 0 {
            let cut = rng.below(m.len());
            m.truncate(cut);
        }
        if open_and_read(&m, &format!("{name} mutation {i}")) {
            opened += 1;
        }
    }
    eprintln!("{name}: {mutations} mutations, {opened} still opened");
}

#[test]
fn fuzz_the_writer_fixture() {
    let bytes = sample_writer().to_bytes().unwrap();
    fuzz("writer fixture", &bytes, 4000, 0x5eed_0001);
}

#[test]
fn fuzz_the_python_fixture() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/python-v3.gguf");
    let bytes = std::fs::read(path).unwrap();
    fuzz("python fixture", &bytes, 4000, 0x5eed_0002);
}

/// A file of nothing but tiny metadata pairs and tiny tensors (alignment
/// 1, so no padding): the most parsed structure per byte of file.
#[test]
fn dense_files_stay_within_the_bound() {
    let mut w = GgufWriter::new();
    w.alignment(1);
    for i in 0..3000u32 {
        w.add(format!("{i:x}"), Value::U8(1));
    }
    for i in 0..2000u32 {
        w.add_tensor_raw(format!("{i:x}"), 24, &[], vec![0u8]);
    }
    let bytes = w.to_bytes().unwrap();
    let (r, peak) = peak_heap(|| GgufFile::from_bytes("dense", &bytes).map(|f| f.tensors().len()));
    assert_eq!(r.unwrap(), 2000);
    eprintln!(
        "dense file: {} bytes, peak heap {peak} ({:.1}x)",
        bytes.len(),
        peak as f64 / bytes.len() as f64
    );
    assert!(
        peak <= heap_bound(bytes.len()),
        "{peak} > {}",
        heap_bound(bytes.len())
    );
    // An array of strings is the densest value.
    let mut w = GgufWriter::new();
    w.add("s", Value::from(vec![""; 20000]));
    let nested: Vec<sluice_gguf::Array> =
        (0..5000).map(|_| sluice_gguf::Array::U8(vec![])).collect();
    w.add("n", Value::Array(sluice_gguf::Array::Array(nested)));
    let bytes = w.to_bytes().unwrap();
    let (r, peak) = peak_heap(|| GgufFile::from_bytes("dense", &bytes).map(|f| f.metadata().len()));
    assert_eq!(r.unwrap(), 2);
    eprintln!(
        "dense arrays: {} bytes, peak heap {peak} ({:.1}x)",
        bytes.len(),
        peak as f64 / bytes.len() as f64
    );
    assert!(peak <= heap_bound(bytes.len()));
}

// ---- crafted files: each error names what is at fault ----

fn open_err(bytes: &[u8]) -> String {
    let what = "crafted file";
    assert!(!open_and_read(bytes, what), "the crafted file opened");
    GgufFile::from_bytes("test.gguf", bytes)
        .unwrap_err()
        .to_string()
}

/// Replaces the first occurrence of `from` (same length as `to`).
fn patch(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern not found");
    bytes[at..at + to.len()].copy_from_slice(to);
}

/// Where the tensor info of `name` continues after the name (its
/// dimension count).
fn after_tensor_name(bytes: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend(name.as_bytes());
    // The last occurrence: a metadata string could hold the same bytes.
    let at = bytes
        .windows(pat.len())
        .rposition(|w| w == pat)
        .expect("tensor not found");
    at + pat.len()
}

/// The position of the data offset field of tensor `name`.
fn offset_field(bytes: &[u8], name: &str) -> usize {
    let p = after_tensor_name(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    p + 4 + 8 * n_dims + 4
}

#[test]
fn truncated_tensor_data_names_the_tensor() {
    let bytes = sample_writer().to_bytes().unwrap();
    let f = GgufFile::from_bytes("x", &bytes).unwrap();
    let t = f.tensor("blk.3.attn_k.weight").unwrap();
    let cut = f.data_offset() + t.offset() as usize + 10;
    let e = open_err(&bytes[..cut]);
    assert!(
        e.starts_with("test.gguf: blk.3.attn_k.weight: data runs past the end of the file"),
        "{e}"
    );
}

#[test]
fn a_huge_offset_names_the_tensor() {
    let mut bytes = sample_writer().to_bytes().unwrap();
    let at = offset_field(&bytes, "blk.0.attn_q.weight");
    bytes[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let e = open_err(&bytes);
    assert!(
        e.starts_with("test.gguf: blk.0.attn_q.weight: data runs past the end of the file"),
        "{e}"
    );
}

#[test]
fn overlapping_and_misaligned_data_is_refused() {
    let bytes = sample_writer().to_bytes().unwrap();
    let mut overlap = bytes.clone();
    let at = offset_field(&overlap, "blk.0.attn_k.weight");
    overlap[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    let e = open_err(&overlap);
    assert!(
        e.contains("blk.0.attn_k.weight: data overlaps that of \"token_embd.weight\"")
            || e.contains("token_embd.weight: data overlaps that of \"blk.0.attn_k.weight\""),
        "{e}"
    );
    let mut misaligned = bytes;
    let at = offset_field(&misaligned, "blk.0.attn_k.weight");
    misaligned[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    let e = open_err(&misaligned);
    assert_eq!(
        e,
        "test.gguf: blk.0.attn_k.weight: data offset 4 is not a multiple of the alignment 32"
    );
}

#[test]
fn bad_tensor_infos_name_the_tensor() {
    let cases: Vec<(u32, Vec<u64>, usize, &str)> =
        vec![
        (99, vec![32], 4, "test.gguf: blk.0.x: unknown ggml type id 99"),
        (4, vec![32], 4, "test.gguf: blk.0.x: unknown ggml type id 4"),
        (
            0,
            vec![1, 1, 1, 1, 1],
            4,
            "test.gguf: blk.0.x: 5 dimensions (at most 4)",
        ),
        (
            0,
            vec![1 << 32, 1 << 32],
            4,
            "test.gguf: blk.0.x: shape [4294967296, 4294967296] has more than 2^63 - 1 elements",
        ),
        (
            0,
            vec![u64::MAX],
            4,
            "test.gguf: blk.0.x: dimension 0 is 18446744073709551615, more than 2^63 - 1",
        ),
        (
            8,
            vec![33],
            34,
            "test.gguf: blk.0.x: row length 33 is not a multiple of Q8_0's block size 32",
        ),
        (
            0,
            vec![1 << 40],
            4,
            "test.gguf: blk.0.x: data runs past the end of the file",
        ),
    ];
    for (type_id, dims, len, want) in cases {
        let mut w = GgufWriter::new();
        w.add("general.architecture", "llama");
        w.add_tensor_raw("blk.0.x", type_id, &dims, vec![0u8; len]);
        let e = open_err(&w.to_bytes().unwrap());
        assert!(e.starts_with(want), "{e}\nwanted {want}");
    }
}

#[test]
fn duplicates_are_refused() {
    let mut w = GgufWriter::new();
    w.add_tensor_f32("t.a", &[1], &[1.0]);
    w.add_tensor_f32("t.a", &[1], &[2.0]);
    let e = open_err(&w.to_bytes().unwrap());
    assert_eq!(e, "test.gguf: t.a: duplicate tensor name");

    let mut w = GgufWriter::new();
    w.add("dup.a1", Value::U8(1));
    w.add("dup.a2", Value::U8(2));
    let mut bytes = w.to_bytes().unwrap();
    patch(&mut bytes, b"dup.a2", b"dup.a1");
    let e = open_err(&bytes);
    assert_eq!(
        e,
        "test.gguf: metadata key \"dup.a1\": duplicate key (keys 0 and 1)"
    );
}

#[test]
fn bad_metadata_names_the_key() {
    // An empty key.
    let mut w = GgufWriter::new();
    w.add("general.name", "x");
    w.add("", Value::U8(1));
    let e = open_err(&w.to_bytes().unwrap());
    assert_eq!(
        e,
        "test.gguf: metadata key 1 (after \"general.name\"): the key is empty"
    );

    // An unknown value type.
    let mut w = GgufWriter::new();
    w.add("k.type", Value::U32(0x1234_5678));
    let mut bytes = w.to_bytes().unwrap();
    patch(&mut bytes, &4u32.to_le_bytes(), &13u32.to_le_bytes());
    let e = open_err(&bytes);
    assert_eq!(
        e,
        "test.gguf: metadata key \"k.type\": unknown value type 13"
    );

    // Invalid UTF-8 in a value, in a key.
    let mut w = GgufWriter::new();
    w.add("k.utf8", "abcdef");
    let mut bytes = w.to_bytes().unwrap();
    patch(&mut bytes, b"cd", b"\xff\xfe");
    let e = open_err(&bytes);
    assert_eq!(
        e,
        "test.gguf: metadata key \"k.utf8\": string of 6 bytes is not valid UTF-8 (bad byte at 2)"
    );
    patch(&mut bytes, b"k.u", b"k\xc3u");
    let e = open_err(&bytes);
    assert!(
        e.starts_with("test.gguf: metadata key 0: string of 6 bytes is not valid UTF-8"),
        "{e}"
    );

    // A huge string length inside an array of strings.
    let mut w = GgufWriter::new();
    w.add("k.tokens", Value::from(vec!["ab", "cd"]));
    let mut bytes = w.to_bytes().unwrap();
    let mut from = 2u64.to_le_bytes().to_vec();
    from.extend(b"cd");
    let mut to = u64::MAX.to_le_bytes().to_vec();
    to.extend(b"cd");
    patch(&mut bytes, &from, &to);
    let e = open_err(&bytes);
    assert!(
        e.starts_with(
            "test.gguf: metadata key \"k.tokens\": element 1: string length \
             18446744073709551615 runs past the end of the file"
        ),
        "{e}"
    );

    // An array count no file could hold.
    let mut w = GgufWriter::new();
    w.add("k.big", Value::from(vec![7u64; 3]));
    let mut bytes = w.to_bytes().unwrap();
    let mut from = 10u32.to_le_bytes().to_vec();
    from.extend(3u64.to_le_bytes());
    let mut to = 10u32.to_le_bytes().to_vec();
    to.extend((1u64 << 61).to_le_bytes());
    patch(&mut bytes, &from, &to);
    let e = open_err(&bytes);
    assert!(
        e.starts_with(
            "test.gguf: metadata key \"k.big\": 2305843009213693952 array elements of type u64 \
             need at least 18446744073709551616 bytes"
        ),
        "{e}"
    );
}

#[test]
fn a_string_length_past_the_end_names_the_key_before() {
    // A string whose length runs past the end: key 12 cannot be read; the message says which
    // key came before it.
    let mut w = GgufWriter::new();
    for i in 0..11 {
        w.add(format!("k{i}"), Value::U8(i));
    }
    w.add("general.name", "x");
    w.add("zz.next", Value::U8(0));
    let mut bytes = w.to_bytes().unwrap();
    let mut from = 7u64.to_le_bytes().to_vec();
    from.extend(b"zz.next");
    let mut to = u64::MAX.to_le_bytes().to_vec();
    to.extend(b"zz.next");
    patch(&mut bytes, &from, &to);
    let e = open_err(&bytes);
    assert!(
        e.starts_with(
            "test.gguf: metadata key 12 (after \"general.name\"): string length \
             18446744073709551615 runs past the end of the file"
        ),
        "{e}"
    );
}
