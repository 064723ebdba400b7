//! The prefix-cache index: block hash → cached blocks.
//!
//! Like vLLM's `BlockHashToBlockMap`, it does not de-duplicate: two requests
//! that compute the same block independently both register it, so one hash
//! can map to several blocks. They are kept in insertion order and a lookup
//! returns the earliest one still present. Block tables therefore stay
//! append-only: a block id, once handed to a request, never changes.

use crate::block_hash::BlockHash;
use crate::request::BlockId;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The keys are already uniformly distributed hash bytes: use eight of them
/// as the table hash instead of hashing them again.
#[derive(Default)]
pub struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 32]`'s Hash writes a length prefix first, then the bytes.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }
    fn write_usize(&mut self, _: usize) {}
}

#[derive(Default, Debug)]
pub struct CachedBlockMap {
    map: HashMap<BlockHash, SmallVec<[BlockId; 1]>, BuildHasherDefault<PrehashedHasher>>,
}

impl CachedBlockMap {
    /// A map that never rehashes while it holds at most `blocks` entries:
    /// with one KV group a block carries at most one hash, so the pool size
    /// bounds it. (A rehash of a large map would be a multi-millisecond step.)
    /// Fails instead of aborting when the table cannot be allocated.
    pub fn try_with_capacity(blocks: usize) -> Result<Self, String> {
        let mut map = HashMap::with_hasher(Default::default());
        map.try_reserve(blocks).map_err(|e| {
            format!("cannot allocate the prefix-cache table for {blocks} blocks: {e}")
        })?;
        Ok(CachedBlockMap { map })
    }

    /// The earliest-inserted block cached under `hash`, if any.
    pub fn get(&self, hash: &BlockHash) -> Option<BlockId> {
        self.map.get(hash).and_then(|v| v.first().copied())
    }

    /// Whether `block` is registered under `hash`.
    pub fn contains(&self, hash: &BlockHash, block: BlockId) -> bool {
        self.map.get(hash).is_some_and(|v| v.contains(&block))
    }

    pub fn insert(&mut self, hash: BlockHash, block: BlockId) {
        self.map.entry(hash).or_default().push(block);
    }

    /// Removes `block` from `hash`'s entry; true if it was there.
    pub fn remove(&mut self, hash: &BlockHash, block: BlockId) -> bool {
        let Some(blocks) = self.map.get_mut(hash) else {
            return false;
        };
        let Some(pos) = blocks.iter().position(|&b| b == block) else {
            return false;
        };
        blocks.remove(pos);
        if blocks.is_empty() {
            self.map.remove(hash);
        }
        true
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Number of distinct hashes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&BlockHash, &[BlockId])> {
        self.map.iter().map(|(h, v)| (h, v.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_keep_insertion_order() {
        let h = BlockHash([7; 32]);
        let mut m = CachedBlockMap::default();
        m.insert(h, 5);
        m.insert(h, 3);
        assert_eq!(m.get(&h), Some(5));
        assert!(m.remove(&h, 5));
        assert_eq!(m.get(&h), Some(3));
        m.insert(h, 5);
        assert_eq!(m.get(&h), Some(3));
        assert!(m.remove(&h, 3) && m.remove(&h, 5));
        assert!(m.is_empty());
        assert!(!m.remove(&h, 5));
    }
}
