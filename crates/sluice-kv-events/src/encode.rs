//! The msgpack payload of one published batch, byte for byte what msgspec
//! writes for vLLM 0.33's `KVEventBatch` (`vllm/distributed/kv_events.py`):
//!
//! ```text
//! [ts: f64, events: [event...], data_parallel_rank: int | nil]   (array_like)
//! BlockStored:      {"type": "BlockStored", "block_hashes", "parent_block_hash",
//!                    "token_ids", "block_size", "lora_id", "medium", "lora_name"}
//! BlockRemoved:     {"type": "BlockRemoved", "block_hashes", "medium"}
//! AllBlocksCleared: {"type": "AllBlocksCleared"}
//! ```
//!
//! Events are tagged maps (`tag=True`, not array_like), tag first, fields in
//! declaration order; `omit_defaults` drops the trailing optional fields
//! vLLM 0.33 added (`extra_keys`, `locality`, ...) since sluice never sets
//! them, and the group fields (`group_idx`, `kv_cache_spec_kind`,
//! `kv_cache_spec_sliding_window`) unless the model has several KV cache
//! groups, while `lora_id` / `medium` / `lora_name` have no default and are
//! always written (nil when absent). Integers and lengths take the smallest
//! marker; floats are always float64, as msgspec writes them.
//! tests/encode.rs checks all this against bytes msgspec produced.

use sluice_core::kv_events::KvCacheEvent;

/// vLLM's `KVEventBatch`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// Seconds since the Unix epoch (Python's `time.time()`).
    pub ts: f64,
    pub events: Vec<KvCacheEvent>,
    /// vLLM's publisher fills in its rank (0 without data parallelism)
    /// when the scheduler leaves it `None`.
    pub data_parallel_rank: Option<u32>,
}

/// msgspec's map header for a struct is sized for every field it could
/// write (tag included), then patched with the count actually written:
/// BlockStored has 15 fields + the tag, so its header is a map16 even for
/// 8 entries; BlockRemoved (5 + 1) and AllBlocksCleared fit a fixmap.
const BLOCK_STORED_HEADER: [u8; 3] = [0xde, 0x00, 0x08];
const BLOCK_REMOVED_HEADER: u8 = 0x83;
const ALL_BLOCKS_CLEARED_HEADER: u8 = 0x81;

impl KvEventBatch {
    /// The payload frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        // msgspec writes all three elements even when the rank is None.
        array_len(out, 3);
        out.push(0xcb);
        out.extend_from_slice(&self.ts.to_bits().to_be_bytes());
        array_len(out, self.events.len());
        for e in &self.events {
            encode_event(out, e);
        }
        opt_uint(out, self.data_parallel_rank.map(u64::from));
    }
}

fn encode_event(out: &mut Vec<u8>, event: &KvCacheEvent) {
    match event {
        KvCacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            group,
        } => {
            let mut header = BLOCK_STORED_HEADER;
            if let Some(g) = group {
                header[2] += 2 + u8::from(g.sliding_window.is_some());
            }
            out.extend_from_slice(&header);
            str(out, "type");
            str(out, "BlockStored");
            str(out, "block_hashes");
            uint_list(out, block_hashes.iter().copied());
            str(out, "parent_block_hash");
            opt_uint(out, *parent_block_hash);
            str(out, "token_ids");
            uint_list(out, token_ids.iter().map(|&t| u64::from(t)));
            str(out, "block_size");
            uint(out, *block_size as u64);
            str(out, "lora_id");
            opt_uint(out, *lora_id);
            str(out, "medium");
            opt_str(out, medium.as_deref());
            // sluice has no LoRA adapters, so no name.
            str(out, "lora_name");
            out.push(0xc0);
            if let Some(g) = group {
                str(out, "group_idx");
                uint(out, u64::from(g.group_idx));
                str(out, "kv_cache_spec_kind");
                str(out, g.kind);
                if let Some(w) = g.sliding_window {
                    str(out, "kv_cache_spec_sliding_window");
                    uint(out, w as u64);
                }
            }
        }
        KvCacheEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        } => {
            out.push(BLOCK_REMOVED_HEADER + u8::from(group_idx.is_some()));
            str(out, "type");
            str(out, "BlockRemoved");
            str(out, "block_hashes");
            uint_list(out, block_hashes.iter().copied());
            str(out, "medium");
            opt_str(out, medium.as_deref());
            if let Some(g) = group_idx {
                str(out, "group_idx");
                uint(out, u64::from(*g));
            }
        }
        KvCacheEvent::AllBlocksCleared => {
            out.push(ALL_BLOCKS_CLEARED_HEADER);
            str(out, "type");
            str(out, "AllBlocksCleared");
        }
    }
}

fn uint(out: &mut Vec<u8>, n: u64) {
    if n < 0x80 {
        out.push(n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[0xcc, n as u8]);
    } else if n <= 0xffff {
        out.push(0xcd);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= 0xffff_ffff {
        out.push(0xce);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn opt_uint(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => uint(out, n),
        None => out.push(0xc0),
    }
}

fn uint_list(out: &mut Vec<u8>, items: impl ExactSizeIterator<Item = u64>) {
    array_len(out, items.len());
    for n in items {
        uint(out, n);
    }
}

/// Lengths past u32 cannot be written in msgpack at all; no event comes
/// near that (a step's blocks number in the thousands).
fn array_len(out: &mut Vec<u8>, len: usize) {
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if len <= 0xffff {
        out.push(0xdc);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

fn str(out: &mut Vec<u8>, s: &str) {
    let len = s.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= 0xff {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => str(out, s),
        None => out.push(0xc0),
    }
}
