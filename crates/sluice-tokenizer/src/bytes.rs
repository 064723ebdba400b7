//! A token's bytes: how a vocabulary string maps back to the bytes it
//! stands for (GPT-2's byte-level table, SentencePiece's `▁` and `<0xNN>`
//! byte-fallback pieces), read once from the `tokenizers` decoder.

/// How `token_bytes` turns a vocabulary string into bytes, read once from
/// the `tokenizers` decoder.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum PieceBytes {
    /// GPT-2's byte ↔ char table.
    ByteLevel,
    /// Plain text after `replaces` (pattern, content) in order; with
    /// `byte_fallback`, `<0xNN>` is one byte.
    Text {
        replaces: Vec<(String, String)>,
        byte_fallback: bool,
    },
}

impl PieceBytes {
    pub(super) fn raw() -> Self {
        PieceBytes::Text {
            replaces: Vec::new(),
            byte_fallback: false,
        }
    }

    pub(super) fn of(decoder: &tokenizers::DecoderWrapper) -> Self {
        let mut out = Self::raw();
        out.add(decoder);
        out
    }

    pub(super) fn add(&mut self, decoder: &tokenizers::DecoderWrapper) {
        use tokenizers::DecoderWrapper as D;
        // Byte-level wins over anything else in a sequence: its table
        // already accounts for every byte.
        let PieceBytes::Text {
            replaces,
            byte_fallback,
        } = self
        else {
            return;
        };
        match decoder {
            D::ByteLevel(_) => *self = PieceBytes::ByteLevel,
            D::Metaspace(m) => replaces.push((m.get_replacement().to_string(), " ".to_string())),
            D::ByteFallback(_) => *byte_fallback = true,
            D::Replace(r) => {
                // The pattern is private; its serialized form is
                // `{"pattern": {"String": ..} | {"Regex": ..}, "content": ..}`.
                // Regex patterns are not applied (no vocabulary sluice
                // loads uses one).
                if let Ok(v) = serde_json::to_value(r) {
                    if let Some(pat) = v["pattern"]["String"].as_str() {
                        if !pat.is_empty() {
                            replaces.push((pat.to_string(), r.content.clone()));
                        }
                    }
                }
            }
            D::Sequence(seq) => {
                for d in seq.get_decoders() {
                    self.add(d);
                }
            }
            D::BPE(_) | D::WordPiece(_) | D::CTC(_) | D::Fuse(_) | D::Strip(_) => {}
        }
    }

    pub(super) fn bytes(&self, piece: String) -> Vec<u8> {
        match self {
            PieceBytes::ByteLevel => {
                let mut out = Vec::with_capacity(piece.len());
                for c in piece.chars() {
                    match gpt2_char_byte(c) {
                        Some(b) => out.push(b),
                        // As the ByteLevel decoder: a string with a char
                        // outside the table stands for its own UTF-8.
                        None => return piece.into_bytes(),
                    }
                }
                out
            }
            PieceBytes::Text {
                replaces,
                byte_fallback,
            } => {
                if *byte_fallback {
                    if let Some(b) = byte_fallback_piece(&piece) {
                        return vec![b];
                    }
                }
                let mut text = piece;
                for (pat, content) in replaces {
                    if text.contains(pat.as_str()) {
                        text = text.replace(pat.as_str(), content);
                    }
                }
                text.into_bytes()
            }
        }
    }
}

/// Whether GPT-2's byte-level table maps byte `b` to itself.
pub(super) fn gpt2_printable(b: u32) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte GPT-2's byte-level table maps to `c`: printable bytes are
/// their own char, the other 68 bytes are U+0100.. in byte order.
pub(super) fn gpt2_char_byte(c: char) -> Option<u8> {
    static SHIFTED: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let code = u32::from(c);
    if code < 256 {
        return gpt2_printable(code).then_some(code as u8);
    }
    let shifted =
        SHIFTED.get_or_init(|| (0..=255u8).filter(|&b| !gpt2_printable(b.into())).collect());
    let i = usize::try_from(code - 256).ok()?;
    shifted.get(i).copied()
}

/// `<0xNN>` (SentencePiece's byte-fallback piece) → the byte.
pub(super) fn byte_fallback_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
