//! Chained block hashes for prefix caching, bit for bit as vLLM 0.33 computes
//! them.
//!
//! The hash of block `i` covers block `i - 1`'s hash, the block's `B` token ids
//! and its extra keys, so one hash identifies the whole prefix ending at that
//! block: a lookup can stop at the first miss. Like vLLM, only full blocks are
//! hashed, and the first block of a request with a cache salt also covers the
//! salt (so tenants with different salts never share KV).
//!
//! vLLM hashes the Python value `(parent_hash, tuple(token_ids), extra_keys)`
//! serialized with `pickle` protocol 5 (`sha256`, `xxhash`) or canonical CBOR
//! (`sha256_cbor`, `xxhash_cbor`); `extra_keys` is `None`, or
//! `(("cache_salt", salt),)` on a salted request's first block. The parent of
//! a request's first block is `NONE_HASH = hash_fn(seed)`, with `seed` the
//! string `PYTHONHASHSEED` when that variable is set and `"vllm-none-hash"`
//! otherwise. This module reproduces both serializations for exactly the
//! values that occur (bytes, ints, tuples, `None`, str), with no Python at run
//! time, so the hashes (and the external hashes in KV cache events) equal
//! vLLM's: a router can mix sluice and vLLM replicas.
//!
//! One deviation: vLLM seeds the xxhash algorithms with random bytes per
//! process unless `PYTHONHASHSEED` is set, so its xxhash values are not
//! reproducible at all; sluice uses the fixed default seed there too.
//! SHA-256 is the default; XXH3-128 is the faster choice when collisions from
//! a non-cryptographic hash are acceptable.

use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// A block hash. vLLM's hashes are 32 bytes (SHA-256) or 16 (XXH3-128); a
/// 16-byte one is stored right-aligned (the first 16 bytes zero) so that the
/// external hash is always the last 8 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    /// vLLM's external hash (`maybe_convert_block_hash` with
    /// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, its default): the low 64 bits
    /// of the digest read as a big-endian integer.
    pub fn external(&self) -> u64 {
        let mut low = [0u8; 8];
        low.copy_from_slice(&self.0[24..]);
        u64::from_be_bytes(low)
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.external())
    }
}

/// Which function chains the block hashes (vLLM's
/// `--prefix-caching-hash-algo`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashAlgo {
    /// SHA-256 over pickle protocol 5, vLLM's default (`sha256`).
    #[default]
    Sha256,
    /// SHA-256 over canonical CBOR (`sha256_cbor`), for consumers outside
    /// Python.
    Sha256Cbor,
    /// XXH3-128 over pickle (`xxhash`): several times faster, not collision
    /// resistant against an adversary.
    Xxh3_128,
    /// XXH3-128 over canonical CBOR (`xxhash_cbor`).
    Xxh3_128Cbor,
}

impl HashAlgo {
    /// vLLM's name for the algorithm.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha256Cbor => "sha256_cbor",
            Self::Xxh3_128 => "xxhash",
            Self::Xxh3_128Cbor => "xxhash_cbor",
        }
    }

    fn cbor(self) -> bool {
        matches!(self, Self::Sha256Cbor | Self::Xxh3_128Cbor)
    }

    /// Digest length in bytes.
    fn digest_len(self) -> usize {
        match self {
            Self::Sha256 | Self::Sha256Cbor => 32,
            Self::Xxh3_128 | Self::Xxh3_128Cbor => 16,
        }
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HashAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sha256" => Ok(Self::Sha256),
            "sha256_cbor" => Ok(Self::Sha256Cbor),
            "xxhash" | "xxh3" | "xxh3_128" => Ok(Self::Xxh3_128),
            "xxhash_cbor" => Ok(Self::Xxh3_128Cbor),
            other => Err(format!(
                "unknown prefix caching hash algorithm {other:?} \
                 (expected sha256, sha256_cbor, xxhash or xxhash_cbor)"
            )),
        }
    }
}

/// The serialization buffer: on the stack up to 1 KiB (a block of 16 tokens
/// pickles to under 200 bytes), so that hashing the block a decode step
/// fills allocates nothing.
pub type Buf = smallvec::SmallVec<[u8; 1024]>;

/// vLLM's `DEFAULT_NONE_HASH_SEED`: the root seed when `PYTHONHASHSEED` is
/// not set.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// Computes the hashes of a request's full blocks, incrementally.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    algo: HashAlgo,
    block_size: usize,
    root: BlockHash,
}

impl BlockHasher {
    /// A hasher whose chain starts at vLLM's `NONE_HASH` for `seed` (the
    /// value of `PYTHONHASHSEED`, or `None` when it is not set).
    pub fn new(algo: HashAlgo, block_size: usize, seed: Option<&str>) -> Self {
        let seed = seed.unwrap_or(DEFAULT_NONE_HASH_SEED);
        let mut buf = Buf::new();
        if algo.cbor() {
            cbor::str(&mut buf, seed);
        } else {
            let mut p = pickle::Pickler::new(&mut buf);
            p.str(seed);
            p.finish();
        }
        Self {
            algo,
            block_size,
            root: digest(algo, &buf),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// vLLM's `NONE_HASH`: the parent of every request's first block.
    pub fn none_hash(&self) -> BlockHash {
        self.root
    }

    /// Hashes every full block of `tokens` not yet in `hashes`, appending to
    /// it. `cache_salt` is folded into block 0 only (and, as in vLLM, an
    /// empty salt is no salt).
    pub fn extend(&self, tokens: &[u32], cache_salt: Option<&str>, hashes: &mut Vec<BlockHash>) {
        let b = self.block_size;
        if b == 0 {
            return;
        }
        let mut buf = Buf::new();
        while (hashes.len() + 1) * b <= tokens.len() {
            let i = hashes.len();
            let parent = hashes.last().copied().unwrap_or(self.root);
            let salt = if i == 0 {
                cache_salt.filter(|s| !s.is_empty())
            } else {
                None
            };
            let h = self.hash_block(&mut buf, &parent, &tokens[i * b..(i + 1) * b], salt);
            hashes.push(h);
        }
    }

    /// `hash_fn((parent, tuple(tokens), extra_keys))`, serializing into
    /// `buf` (reused across the blocks of one call).
    fn hash_block(
        &self,
        buf: &mut Buf,
        parent: &BlockHash,
        tokens: &[u32],
        salt: Option<&str>,
    ) -> BlockHash {
        buf.clear();
        let parent = &parent.0[32 - self.algo.digest_len()..];
        if self.algo.cbor() {
            cbor::head(buf, 4, 3);
            cbor::bytes(buf, parent);
            cbor::head(buf, 4, tokens.len() as u64);
            for &t in tokens {
                cbor::head(buf, 0, u64::from(t));
            }
            match salt {
                None => cbor::none(buf),
                Some(s) => {
                    cbor::head(buf, 4, 1);
                    cbor::head(buf, 4, 2);
                    cbor::str(buf, "cache_salt");
                    cbor::str(buf, s);
                }
            }
        } else {
            let mut p = pickle::Pickler::new(buf);
            p.bytes(parent);
            p.boundary();
            p.tuple_start(tokens.len());
            for &t in tokens {
                p.int(i128::from(t));
                p.boundary();
            }
            p.tuple_end(tokens.len());
            p.boundary();
            match salt {
                None => p.none(),
                Some(s) => {
                    p.tuple_start(1);
                    p.tuple_start(2);
                    p.str("cache_salt");
                    p.boundary();
                    p.str(s);
                    p.boundary();
                    p.tuple_end(2);
                    p.boundary();
                    p.tuple_end(1);
                }
            }
            p.boundary();
            p.tuple_end(3);
            p.boundary();
            p.finish();
        }
        digest(self.algo, buf)
    }
}

fn digest(algo: HashAlgo, data: &[u8]) -> BlockHash {
    let mut out = [0u8; 32];
    match algo {
        HashAlgo::Sha256 | HashAlgo::Sha256Cbor => {
            out.copy_from_slice(&Sha256::digest(data));
        }
        HashAlgo::Xxh3_128 | HashAlgo::Xxh3_128Cbor => {
            // Python's `xxh3_128_digest` is the canonical (big-endian) form.
            out[16..].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(data).to_be_bytes());
        }
    }
    BlockHash(out)
}

/// CPython's `pickle.dumps(value, protocol=5)` (the C pickler), for bytes,
/// ints, str, `None` and tuples of them, none appearing twice (so the memo
/// is written but never read back).
pub mod pickle {
    use super::Buf;
    const PROTO: u8 = 0x80;
    const FRAME: u8 = 0x95;
    const STOP: u8 = b'.';
    const MEMOIZE: u8 = 0x94;
    const MARK: u8 = b'(';
    const TUPLE: u8 = b't';
    const EMPTY_TUPLE: u8 = b')';
    const TUPLE1: u8 = 0x85;
    const NONE: u8 = b'N';
    /// CPython's `_FRAME_SIZE_TARGET`: a frame is closed at the first opcode
    /// boundary past 64 KiB.
    const FRAME_SIZE_TARGET: usize = 64 * 1024;
    /// CPython's `FRAME_SIZE_MIN`: shorter frames get no header.
    const FRAME_SIZE_MIN: usize = 4;
    const FRAME_HEADER: usize = 9;

    /// Writes one pickle into a buffer. The caller mirrors CPython's call
    /// structure: `boundary()` after each complete object, as CPython's
    /// `save()` does, since that is where frames may be split.
    pub struct Pickler<'a> {
        out: &'a mut Buf,
        /// Where the open frame's 9-byte header was reserved.
        frame_start: Option<usize>,
    }

    impl<'a> Pickler<'a> {
        pub fn new(out: &'a mut Buf) -> Self {
            out.extend_from_slice(&[PROTO, 5]);
            Pickler {
                out,
                frame_start: None,
            }
        }

        fn write(&mut self, data: &[u8]) {
            if self.frame_start.is_none() {
                self.frame_start = Some(self.out.len());
                self.out.extend_from_slice(&[0; FRAME_HEADER]);
            }
            self.out.extend_from_slice(data);
        }

        fn commit_frame(&mut self) {
            let Some(start) = self.frame_start.take() else {
                return;
            };
            let len = self.out.len() - start - FRAME_HEADER;
            if len >= FRAME_SIZE_MIN {
                self.out[start] = FRAME;
                self.out[start + 1..start + FRAME_HEADER]
                    .copy_from_slice(&(len as u64).to_le_bytes());
            } else {
                self.out.drain(start..start + FRAME_HEADER);
            }
        }

        /// The end of one `save()`: closes the frame once it is large enough.
        pub fn boundary(&mut self) {
            if let Some(start) = self.frame_start {
                if self.out.len() - start - FRAME_HEADER >= FRAME_SIZE_TARGET {
                    self.commit_frame();
                }
            }
        }

        /// Ends the pickle (STOP) and closes the last frame.
        pub fn finish(mut self) {
            self.write(&[STOP]);
            self.commit_frame();
        }

        pub fn none(&mut self) {
            self.write(&[NONE]);
        }

        /// A bytes object (memoized, as CPython does).
        pub fn bytes(&mut self, data: &[u8]) {
            let n = data.len();
            if n <= 0xff {
                self.write(&[b'C', n as u8]);
            } else if n <= 0xffff_ffff {
                self.write(b"B");
                self.write(&(n as u32).to_le_bytes());
            } else {
                self.write(&[0x8e]);
                self.write(&(n as u64).to_le_bytes());
            }
            self.write(data);
            self.write(&[MEMOIZE]);
        }

        /// A str object (UTF-8, memoized).
        pub fn str(&mut self, s: &str) {
            let n = s.len();
            if n <= 0xff {
                self.write(&[0x8c, n as u8]);
            } else if n <= 0xffff_ffff {
                self.write(b"X");
                self.write(&(n as u32).to_le_bytes());
            } else {
                self.write(&[0x8d]);
                self.write(&(n as u64).to_le_bytes());
            }
            self.write(s.as_bytes());
            self.write(&[MEMOIZE]);
        }

        /// An int: BININT1/2/BININT when it fits 32 signed bits, else LONG1
        /// with the shortest two's-complement little-endian bytes.
        pub fn int(&mut self, v: i128) {
            if (0..=0xff).contains(&v) {
                self.write(&[b'K', v as u8]);
            } else if (0..=0xffff).contains(&v) {
                self.write(b"M");
                self.write(&(v as u16).to_le_bytes());
            } else if i128::from(i32::MIN) <= v && v <= i128::from(i32::MAX) {
                self.write(b"J");
                self.write(&(v as i32).to_le_bytes());
            } else {
                let le = v.to_le_bytes();
                // Shortest length whose top bit still carries the sign.
                let mut n = 16;
                while n > 1 {
                    let top = le[n - 1];
                    let next_sign = le[n - 2] & 0x80;
                    if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                        n -= 1;
                    } else {
                        break;
                    }
                }
                self.write(&[0x8a, n as u8]);
                self.write(&le[..n]);
            }
        }

        /// Opens a tuple of `len` elements (a MARK past 3 elements; protocol
        /// 2+ has dedicated opcodes for 1 to 3).
        pub fn tuple_start(&mut self, len: usize) {
            if len > 3 {
                self.write(&[MARK]);
            }
        }

        /// Closes a tuple of `len` elements (memoized unless empty).
        pub fn tuple_end(&mut self, len: usize) {
            match len {
                0 => self.write(&[EMPTY_TUPLE]),
                1..=3 => self.write(&[TUPLE1 + (len as u8 - 1), MEMOIZE]),
                _ => self.write(&[TUPLE, MEMOIZE]),
            }
        }
    }
}

/// `cbor2.dumps(value, canonical=True)` for bytes, ints, str, `None` and
/// tuples (arrays). Canonical mode only reorders maps and shrinks floats,
/// neither of which occurs here, so this is plain shortest-form CBOR.
pub mod cbor {
    use super::Buf;
    /// A major type with its shortest-form argument.
    pub fn head(out: &mut Buf, major: u8, arg: u64) {
        let m = major << 5;
        if arg < 24 {
            out.push(m | arg as u8);
        } else if arg <= 0xff {
            out.extend_from_slice(&[m | 24, arg as u8]);
        } else if arg <= 0xffff {
            out.push(m | 25);
            out.extend_from_slice(&(arg as u16).to_be_bytes());
        } else if arg <= 0xffff_ffff {
            out.push(m | 26);
            out.extend_from_slice(&(arg as u32).to_be_bytes());
        } else {
            out.push(m | 27);
            out.extend_from_slice(&arg.to_be_bytes());
        }
    }

    pub fn bytes(out: &mut Buf, data: &[u8]) {
        head(out, 2, data.len() as u64);
        out.extend_from_slice(data);
    }

    pub fn str(out: &mut Buf, s: &str) {
        head(out, 3, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }

    pub fn none(out: &mut Buf) {
        out.push(0xf6);
    }

    /// An int; past 64 bits, a bignum (tag 2 or 3 over big-endian bytes).
    pub fn int(out: &mut Buf, v: i128) {
        let (major, tag, mag) = if v >= 0 {
            (0, 2, v as u128)
        } else {
            // -1 - v, without overflow at i128::MIN.
            (1, 3, !(v as u128))
        };
        if let Ok(small) = u64::try_from(mag) {
            head(out, major, small);
        } else {
            head(out, 6, tag);
            let be = mag.to_be_bytes();
            let skip = be.iter().take_while(|&&b| b == 0).count();
            bytes(out, &be[skip..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_only_full_blocks_and_chains() {
        let h = BlockHasher::new(HashAlgo::Sha256, 4, None);
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
        for algo in [
            HashAlgo::Sha256,
            HashAlgo::Sha256Cbor,
            HashAlgo::Xxh3_128,
            HashAlgo::Xxh3_128Cbor,
        ] {
            let h = BlockHasher::new(algo, 2, None);
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            h.extend(&[1, 2, 3, 4], Some("tenant-a"), &mut a);
            h.extend(&[1, 2, 3, 4], None, &mut b);
            h.extend(&[1, 2, 3, 4], Some(""), &mut c);
            assert_ne!(a[0], b[0]);
            assert_ne!(a[1], b[1]);
            assert_eq!(b, c, "an empty salt is no salt");
        }
    }

    #[test]
    fn the_seed_moves_the_root() {
        let a = BlockHasher::new(HashAlgo::Sha256, 2, None);
        let b = BlockHasher::new(HashAlgo::Sha256, 2, Some(DEFAULT_NONE_HASH_SEED));
        let c = BlockHasher::new(HashAlgo::Sha256, 2, Some("0"));
        assert_eq!(a.none_hash(), b.none_hash());
        assert_ne!(a.none_hash(), c.none_hash());
    }

    #[test]
    fn algo_names_round_trip() {
        for algo in [
            HashAlgo::Sha256,
            HashAlgo::Sha256Cbor,
            HashAlgo::Xxh3_128,
            HashAlgo::Xxh3_128Cbor,
        ] {
            assert_eq!(algo.as_str().parse::<HashAlgo>(), Ok(algo));
        }
        assert!("md5".parse::<HashAlgo>().is_err());
    }
}
