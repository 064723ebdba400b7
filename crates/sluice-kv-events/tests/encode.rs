//! The encoder against bytes msgspec wrote for vLLM 0.33's KVEventBatch
//! (tests/data/reference.txt, made by tests/data/make_reference.py): the
//! same batches built in Rust must encode to the same bytes.

use sluice_kv_events::{KvCacheEvent, KvEventBatch};

const REFERENCE: &str = include_str!("data/reference.txt");

fn reference(name: &str) -> Vec<u8> {
    let hex = REFERENCE
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no case {name} in reference.txt"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

fn stored(
    hashes: Vec<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
    block_size: usize,
    lora_id: Option<u64>,
    medium: Option<&str>,
) -> KvCacheEvent {
    KvCacheEvent::BlockStored {
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: tokens,
        block_size,
        lora_id,
        medium: medium.map(str::to_string),
        group: None,
    }
}

fn removed(hashes: Vec<u64>, medium: Option<&str>) -> KvCacheEvent {
    KvCacheEvent::BlockRemoved {
        block_hashes: hashes,
        medium: medium.map(str::to_string),
        group_idx: None,
    }
}

const INTS: [u64; 13] = [
    0,
    1,
    127,
    128,
    255,
    256,
    65535,
    65536,
    (1 << 32) - 1,
    1 << 32,
    (1 << 63) - 1,
    1 << 63,
    u64::MAX,
];

fn cases() -> Vec<(&'static str, KvEventBatch)> {
    vec![
        (
            "mixed",
            KvEventBatch {
                ts: 1.5,
                events: vec![
                    stored(
                        vec![1, u64::MAX],
                        None,
                        vec![1, 2, 3],
                        16,
                        None,
                        Some("GPU"),
                    ),
                    removed(vec![5], None),
                    KvCacheEvent::AllBlocksCleared,
                ],
                data_parallel_rank: Some(0),
            },
        ),
        (
            "empty_events",
            KvEventBatch {
                ts: 0.0,
                events: vec![],
                data_parallel_rank: Some(0),
            },
        ),
        (
            "no_rank",
            KvEventBatch {
                ts: 1733059200.123456,
                events: vec![KvCacheEvent::AllBlocksCleared],
                data_parallel_rank: None,
            },
        ),
        (
            "rank3",
            KvEventBatch {
                ts: -2.25,
                events: vec![removed(vec![], Some("CPU"))],
                data_parallel_rank: Some(3),
            },
        ),
        (
            "int_widths",
            KvEventBatch {
                ts: 1_764_590_000.987_654_3,
                events: vec![
                    stored(
                        INTS.to_vec(),
                        Some((1 << 63) + 12345),
                        vec![0, 127, 128, 255, 256, 65535, 65536, 151935],
                        256,
                        Some(1 << 40),
                        None,
                    ),
                    removed(INTS.to_vec(), Some("GPU")),
                ],
                data_parallel_rank: Some(0),
            },
        ),
        (
            "long_lists",
            KvEventBatch {
                ts: 3.0,
                events: [
                    stored(
                        (0..20).collect(),
                        Some(99),
                        (0..320).collect(),
                        16,
                        None,
                        Some(&"m".repeat(40)),
                    ),
                    removed((70000..70017).collect(), Some(&"s".repeat(300))),
                ]
                .into_iter()
                .chain(std::iter::repeat_n(KvCacheEvent::AllBlocksCleared, 17))
                .collect(),
                data_parallel_rank: Some(65536),
            },
        ),
    ]
}

#[test]
fn encodes_byte_for_byte_as_msgspec() {
    let cases = cases();
    assert_eq!(
        cases.len(),
        REFERENCE.lines().count(),
        "a case per reference line"
    );
    for (name, batch) in cases {
        let want = reference(name);
        let got = batch.encode();
        assert!(
            got == want,
            "{name}: encoding differs from msgspec's\n got {}\nwant {}",
            hex(&got),
            hex(&want)
        );
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// With several KV cache groups the events carry vLLM's group fields after
/// `lora_name` (declaration order; the window only when there is one), and
/// msgspec's header counts them.
#[test]
fn group_fields_follow_lora_name() {
    use sluice_core::kv_events::EventGroup;
    let e = KvCacheEvent::BlockStored {
        block_hashes: vec![1],
        parent_block_hash: None,
        token_ids: vec![2],
        block_size: 16,
        lora_id: None,
        medium: None,
        group: Some(EventGroup {
            group_idx: 1,
            kind: "sliding_window",
            sliding_window: Some(128),
        }),
    };
    let bytes = KvEventBatch {
        ts: 0.0,
        events: vec![e],
        data_parallel_rank: None,
    }
    .encode();
    // array(3), f64 (9 bytes), array(1), then the map16 header.
    assert_eq!(&bytes[11..14], &[0xde, 0x00, 11]);
    let tail: Vec<u8> = [
        &b"\xa9group_idx\x01"[..],
        b"\xb2kv_cache_spec_kind\xaesliding_window",
        b"\xbckv_cache_spec_sliding_window\xcc\x80",
        b"\xc0",
    ]
    .concat();
    assert!(bytes.ends_with(&tail), "{bytes:x?}");
    let r = KvCacheEvent::BlockRemoved {
        block_hashes: vec![1],
        medium: None,
        group_idx: Some(0),
    };
    let bytes = KvEventBatch {
        ts: 0.0,
        events: vec![r],
        data_parallel_rank: None,
    }
    .encode();
    assert_eq!(bytes[11], 0x84);
    assert!(bytes.ends_with(b"\xa9group_idx\x00\xc0"), "{bytes:x?}");
}
