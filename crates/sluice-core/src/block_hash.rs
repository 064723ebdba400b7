//! Chained block hashes for prefix caching.
//!
//! The hash of block `i` covers block `i - 1`'s hash, the block's `B` token ids
//! and its extra keys, so one hash identifies the whole prefix ending at that
//! block: a lookup can stop at the first miss. Like vLLM, only full blocks are
//! hashed, and the first block of a request with a cache salt also covers the
//! salt (so tenants with different salts never share KV).
//!
//! Decisions depend only on hash equality, so any collision-resistant chain
//! over the same inputs reproduces vLLM's scheduling exactly. SHA-256 is the
//! default (as in vLLM); XXH3-128 is the faster choice when collisions from a
//! non-cryptographic hash are acceptable.

use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// A block hash. XXH3-128 fills the first 16 bytes and leaves the rest zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…")
    }
}

/// Which function chains the block hashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashAlgo {
    /// SHA-256, vLLM's default (`prefix_caching_hash_algo = "sha256"`).
    #[default]
    Sha256,
    /// XXH3 with a 128-bit output: several times faster, not collision
    /// resistant against an adversary.
    Xxh3_128,
}

impl FromStr for HashAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sha256" => Ok(Self::Sha256),
            "xxhash" | "xxh3" | "xxh3_128" => Ok(Self::Xxh3_128),
            other => Err(format!(
                "unknown prefix caching hash algorithm {other:?} (expected sha256 or xxhash)"
            )),
        }
    }
}

/// Computes the hashes of a request's full blocks, incrementally.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    algo: HashAlgo,
    block_size: usize,
    root: BlockHash,
}

/// Seed of the chain, the parent of every request's first block (vLLM's
/// `NONE_HASH`).
const ROOT_SEED: &[u8] = b"sluice-root-block-hash";

impl BlockHasher {
    pub fn new(algo: HashAlgo, block_size: usize) -> Self {
        let root = digest(algo, &[ROOT_SEED]);
        Self {
            algo,
            block_size,
            root,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Hashes every full block of `tokens` not yet in `hashes`, appending to
    /// it. `cache_salt` is folded into block 0 only.
    pub fn extend(&self, tokens: &[u32], cache_salt: Option<&str>, hashes: &mut Vec<BlockHash>) {
        let b = self.block_size;
        while (hashes.len() + 1) * b <= tokens.len() {
            let i = hashes.len();
            let parent = hashes.last().copied().unwrap_or(self.root);
            let salt = if i == 0 { cache_salt } else { None };
            hashes.push(self.hash_block(&parent, &tokens[i * b..(i + 1) * b], salt));
        }
    }

    fn hash_block(&self, parent: &BlockHash, tokens: &[u32], salt: Option<&str>) -> BlockHash {
        // Token ids as little-endian u32s; a fixed-size stack buffer keeps the
        // common block sizes allocation-free.
        let mut buf = [0u8; 4 * 64];
        let mut heap;
        let bytes: &[u8] = if tokens.len() <= 64 {
            for (chunk, t) in buf.chunks_exact_mut(4).zip(tokens) {
                chunk.copy_from_slice(&t.to_le_bytes());
            }
            &buf[..tokens.len() * 4]
        } else {
            heap = Vec::with_capacity(tokens.len() * 4);
            for t in tokens {
                heap.extend_from_slice(&t.to_le_bytes());
            }
            &heap
        };
        match salt {
            None => digest(self.algo, &[&parent.0, bytes]),
            Some(s) => {
                let len = (s.len() as u64).to_le_bytes();
                digest(self.algo, &[&parent.0, bytes, b"salt", &len, s.as_bytes()])
            }
        }
    }
}

fn digest(algo: HashAlgo, parts: &[&[u8]]) -> BlockHash {
    let mut out = [0u8; 32];
    match algo {
        HashAlgo::Sha256 => {
            let mut h = Sha256::new();
            for p in parts {
                h.update(p);
            }
            out.copy_from_slice(&h.finalize());
        }
        HashAlgo::Xxh3_128 => {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for p in parts {
                h.update(p);
            }
            out[..16].copy_from_slice(&h.digest128().to_le_bytes());
        }
    }
    BlockHash(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_only_full_blocks_and_chains() {
        let h = BlockHasher::new(HashAlgo::Sha256, 4);
        let mut hashes = Vec::new();
        h.extend(&[1, 2, 3], None, &mut hashes);
        assert!(hashes.is_empty());
        h.extend(&[1, 2, 3, 4, 5, 6, 7, 8, 9], None, &mut hashes);
        assert_eq!(hashes.len(), 2);

        // Same second block after a different first block: different hash.
        let mut other = Vec::new();
        h.extend(&[0, 2, 3, 4, 5, 6, 7, 8], None, &mut other);
        assert_ne!(hashes[1], other[1]);

        // Incremental equals one-shot.
        let mut inc = Vec::new();
        for n in 1..=9 {
            h.extend(&[1, 2, 3, 4, 5, 6, 7, 8, 9][..n], None, &mut inc);
        }
        assert_eq!(inc, hashes);
    }

    #[test]
    fn salt_changes_every_block_through_the_chain() {
        for algo in [HashAlgo::Sha256, HashAlgo::Xxh3_128] {
            let h = BlockHasher::new(algo, 2);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            h.extend(&[1, 2, 3, 4], Some("tenant-a"), &mut a);
            h.extend(&[1, 2, 3, 4], None, &mut b);
            assert_ne!(a[0], b[0]);
            assert_ne!(a[1], b[1]);
        }
    }

    #[test]
    fn large_blocks_hash_like_small_ones() {
        let h = BlockHasher::new(HashAlgo::Sha256, 100);
        let toks: Vec<u32> = (0..200).collect();
        let mut out = Vec::new();
        h.extend(&toks, None, &mut out);
        assert_eq!(out.len(), 2);
        assert_ne!(out[0], out[1]);
    }
}
