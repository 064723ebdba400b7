//! The prefix-cache index: (block hash, KV cache group) → cached blocks.
//!
//! The key carries the group because a block registered by one group (its
//! layers' KV) is no hit for another: with one group it is always group 0.
//!
//! Like vLLM's `BlockHashToBlockMap`, it does not de-duplicate: two requests
//! that compute the same block independently both register it, so one hash
//! can map to several blocks. They are kept in insertion order and a lookup
//! returns the earliest one still present. Block tables therefore stay
//! append-only: a block id, once handed to a request, never changes.

use crate::block_hash::BlockHash;
use crate::kv_cache::GroupId;
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
    fn write_u32(&mut self, group: u32) {
        // The group: group 0 leaves the hash as the bytes made it.
        self.0 ^= u64::from(group).rotate_left(32);
    }
}

/// What a cached block is registered under: its hash within its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub hash: BlockHash,
    pub group: GroupId,
}

impl CacheKey {
    pub fn new(hash: BlockHash, group: GroupId) -> CacheKey {
        CacheKey { hash, group }
    }
}

#[derive(Default, Debug)]
pub struct CachedBlockMap {
    map: HashMap<CacheKey, SmallVec<[BlockId; 1]>, BuildHasherDefault<PrehashedHasher>>,
}

impl CachedBlockMap {
    /// A map that never rehashes while it holds at most `blocks` entries:
    /// a block carries at most one key (it belongs to one group at a time),
    /// so the pool size bounds it. (A rehash of a large map would be a multi-millisecond step.)
    /// Fails instead of aborting when the table cannot be allocated.
    pub fn try_with_capacity(blocks: usize) -> Result<Self, String> {
        let mut map = HashMap::with_hasher(Default::default());
        map.try_reserve(blocks).map_err(|e| {
            format!("cannot allocate the prefix-cache table for {blocks} blocks: {e}")
        })?;
        Ok(CachedBlockMap { map })
    }

    /// The earliest-inserted block cached under `key`, if any.
    pub fn get(&self, key: &CacheKey) -> Option<BlockId> {
        self.map.get(key).and_then(|v| v.first().copied())
    }

    /// Whether `block` is registered under `key`.
    pub fn contains(&self, key: &CacheKey, block: BlockId) -> bool {
        self.map.get(key).is_some_and(|v| v.contains(&block))
    }

    pub fn insert(&mut self, key: CacheKey, block: BlockId) {
        self.map.entry(key).or_default().push(block);
    }

    /// Removes `block` from `key`'s entry; true if it was there.
    pub fn remove(&mut self, key: &CacheKey, block: BlockId) -> bool {
        let Some(blocks) = self.map.get_mut(key) else {
            return false;
        };
        let Some(pos) = blocks.iter().position(|&b| b == block) else {
            return false;
        };
        blocks.remove(pos);
        if blocks.is_empty() {
            self.map.remove(key);
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

    pub fn iter(&self) -> impl Iterator<Item = (&CacheKey, &[BlockId])> {
        self.map.iter().map(|(h, v)| (h, v.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_keep_insertion_order() {
        let h = CacheKey::new(BlockHash([7; 32]), GroupId(0));
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

    #[test]
    fn a_block_of_one_group_is_no_hit_for_another() {
        let hash = BlockHash([9; 32]);
        let mut m = CachedBlockMap::default();
        m.insert(CacheKey::new(hash, GroupId(0)), 4);
        assert_eq!(m.get(&CacheKey::new(hash, GroupId(0))), Some(4));
        assert_eq!(m.get(&CacheKey::new(hash, GroupId(1))), None);
    }
}
