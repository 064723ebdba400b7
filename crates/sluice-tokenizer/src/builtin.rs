//! The built-in byte-level tokenizer: ids 0..=255 are the bytes, then
//! `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`.

/// The built-in tokenizer's special tokens, in id order from 256.
pub(super) const BUILTIN_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// First id after the 256 byte tokens.
pub(super) const BUILTIN_FIRST_SPECIAL: u32 = 256;
pub(super) fn builtin_special(id: u32) -> Option<&'static str> {
    let i = id.checked_sub(BUILTIN_FIRST_SPECIAL)? as usize;
    BUILTIN_SPECIALS.get(i).copied()
}

/// Bytes to ids, matching the special tokens written in the text.
pub(super) fn builtin_encode(text: &str) -> Vec<u32> {
    let bytes = text.as_bytes();
    let mut ids = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let special = (bytes[i] == b'<')
            .then(|| {
                BUILTIN_SPECIALS
                    .iter()
                    .position(|s| bytes[i..].starts_with(s.as_bytes()))
            })
            .flatten();
        match special {
            Some(k) => {
                ids.push(BUILTIN_FIRST_SPECIAL + k as u32);
                i += BUILTIN_SPECIALS[k].len();
            }
            None => {
                ids.push(u32::from(bytes[i]));
                i += 1;
            }
        }
    }
    ids
}
