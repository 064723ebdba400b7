//! The base log-probability file of `llama-perplexity --kl-divergence-base`,
//! byte for byte, so a base computed by either program is read by the
//! other.
//!
//! Layout (little-endian, as llama.cpp writes it on x86 and ARM): the
//! magic `_logits_`; `n_ctx`, `n_vocab`, `n_chunk` as 32-bit integers;
//! `n_chunk · n_ctx` token ids (i32), the evaluated windows one after the
//! other; then per chunk `n_ctx − 1 − n_ctx/2` rows of
//! `scoring::base_row_len(n_vocab)` 16-bit words (the scored positions,
//! packed by `scoring::encode_base_row`).

use super::scoring::base_row_len;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"_logits_";

/// What a base file says before its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// The windows' tokens, `n_chunk · n_ctx` of them.
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    /// Scored positions per chunk.
    pub fn rows_per_chunk(&self) -> usize {
        super::scored_per_window(self.n_ctx)
    }

    /// Words of one chunk's rows.
    pub fn chunk_words(&self) -> usize {
        self.rows_per_chunk() * base_row_len(self.n_vocab)
    }

    /// Writes the header.
    pub fn write(&self, w: &mut (impl Write + ?Sized)) -> Result<()> {
        w.write_all(MAGIC)?;
        for v in [self.n_ctx, self.n_vocab, self.n_chunk] {
            let v = i32::try_from(v).context("a header field does not fit 32 bits")?;
            w.write_all(&v.to_le_bytes())?;
        }
        for &t in &self.tokens {
            w.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(())
    }

    /// Reads and checks a header: the magic, positive sizes, every token.
    pub fn read(r: &mut impl Read) -> Result<BaseHeader> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)
            .context("shorter than the 8-byte magic")?;
        if &magic != MAGIC {
            bail!("does not start with \"_logits_\": not a base log-probability file");
        }
        let mut field = |name: &str| -> Result<usize> {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)
                .with_context(|| format!("ends before its {name}"))?;
            let v = i32::from_le_bytes(b);
            if v <= 0 {
                bail!("{name} is {v}");
            }
            Ok(v as usize)
        };
        let n_ctx = field("n_ctx")?;
        let n_vocab = field("n_vocab")?;
        let n_chunk = field("n_chunk")?;
        if n_ctx < 2 {
            bail!("n_ctx is {n_ctx}: nothing is scored below 2");
        }
        let n = n_ctx
            .checked_mul(n_chunk)
            .filter(|n| *n <= 1 << 31)
            .with_context(|| format!("n_ctx {n_ctx} × n_chunk {n_chunk} is too large"))?;
        let mut bytes = vec![0u8; 4 * n];
        r.read_exact(&mut bytes)
            .with_context(|| format!("ends inside its {n} tokens"))?;
        let mut tokens = Vec::with_capacity(n);
        for (i, b) in bytes.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes(b.try_into().unwrap());
            if t < 0 || t as usize >= n_vocab {
                bail!("token {i} is {t}, outside the vocabulary of {n_vocab}");
            }
            tokens.push(t as u32);
        }
        Ok(BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
        })
    }
}

/// Writes one chunk's packed rows.
pub fn write_rows(w: &mut (impl Write + ?Sized), rows: &[u16]) -> Result<()> {
    let mut bytes = Vec::with_capacity(2 * rows.len());
    for &v in rows {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&bytes)?;
    Ok(())
}

/// Reads chunk `chunk`'s packed rows into `rows` (`header.chunk_words()`).
pub fn read_rows(
    r: &mut impl Read,
    header: &BaseHeader,
    chunk: usize,
    rows: &mut Vec<u16>,
) -> Result<()> {
    let words = header.chunk_words();
    let mut bytes = vec![0u8; 2 * words];
    r.read_exact(&mut bytes).with_context(|| {
        format!(
            "ends inside the log probabilities of chunk {} of {}",
            chunk + 1,
            header.n_chunk
        )
    })?;
    rows.clear();
    rows.extend(
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]])),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_round_trips_and_bad_ones_are_named() {
        let h = BaseHeader {
            n_ctx: 4,
            n_vocab: 3,
            n_chunk: 2,
            tokens: vec![0, 1, 2, 0, 2, 2, 1, 0],
        };
        // 4 − 1 − 2 = 1 row per chunk of 2·2 + 4 = 8 words.
        assert_eq!(h.chunk_words(), 8);
        let mut buf = Vec::new();
        h.write(&mut buf).unwrap();
        let rows: Vec<u16> = (0..8).collect();
        write_rows(&mut buf, &rows).unwrap();
        write_rows(&mut buf, &rows).unwrap();
        assert_eq!(buf.len(), 8 + 12 + 32 + 2 * 16);
        assert_eq!(&buf[8..12], &4i32.to_le_bytes());

        let mut r = &buf[..];
        let back = BaseHeader::read(&mut r).unwrap();
        assert_eq!(back, h);
        let mut got = Vec::new();
        read_rows(&mut r, &back, 0, &mut got).unwrap();
        assert_eq!(got, rows);
        read_rows(&mut r, &back, 1, &mut got).unwrap();
        let e = read_rows(&mut r, &back, 2, &mut got).unwrap_err();
        assert!(e.to_string().contains("chunk 3 of 2"), "{e}");

        let e = BaseHeader::read(&mut &b"_logit"[..]).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        let e = BaseHeader::read(&mut &b"_tokens_"[..]).unwrap_err();
        assert!(e.to_string().contains("not a base"), "{e}");
        let mut bad = buf.clone();
        bad[20..24].copy_from_slice(&7i32.to_le_bytes());
        let e = BaseHeader::read(&mut &bad[..]).unwrap_err();
        assert!(e.to_string().contains("token 0 is 7"), "{e}");
        let e = BaseHeader::read(&mut &buf[..30]).unwrap_err();
        assert!(e.to_string().contains("inside its 8 tokens"), "{e}");
    }
}
