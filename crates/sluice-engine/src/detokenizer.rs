//! Incremental detokenization: token ids in, whole characters out.
//!
//! The prefix / read-offset technique of vLLM and TGI: decode a small
//! window of recent tokens twice — up to the last emitted token
//! (`prefix_offset..read_offset`) and including the new ones
//! (`prefix_offset..`) — and emit the difference. Decoding a window instead
//! of a single token keeps tokenizer clean-ups (leading spaces of
//! SentencePiece pieces, byte-level merges) right.
//!
//! Promises: the text returned never ends inside a character. When the
//! window's decode ends in U+FFFD, the last token(s) hold a character split
//! across tokens (or bytes that are not UTF-8 at all): nothing is emitted
//! until a later token completes it. Bytes that never become valid are
//! released as U+FFFD once more tokens are pending than any character can
//! span, or at `flush`.

use sluice_core::TokenId;
use sluice_tokenizer::Tokenizer;

/// Prompt tokens decoded before the first output token, so the first
/// token's text is rendered in context (vLLM uses the same 5).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// Pending tokens after which trailing garbage is released: a UTF-8
/// character is at most 4 bytes, and every token is at least one byte.
const MAX_PENDING_TOKENS: usize = 8;

/// Per-completion decoding state.
#[derive(Clone, Debug)]
pub struct IncrementalDetokenizer {
    /// The prompt's last tokens, then every output token.
    tokens: Vec<TokenId>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    pub fn new(prompt_token_ids: &[TokenId], skip_special_tokens: bool) -> Self {
        let tail =
            &prompt_token_ids[prompt_token_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        IncrementalDetokenizer {
            tokens: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
            skip_special_tokens,
        }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: TokenId) -> String {
        self.tokens.push(token);
        let pending = self.tokens.len() - self.read_offset;
        self.emit(tokenizer, pending >= MAX_PENDING_TOKENS)
    }

    /// Releases whatever is pending (a split character becomes U+FFFD); for
    /// the end of a completion.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> String {
        if self.read_offset == self.tokens.len() {
            return String::new();
        }
        self.emit(tokenizer, true)
    }

    fn emit(&mut self, tokenizer: &Tokenizer, force: bool) -> String {
        let skip = self.skip_special_tokens;
        let window = &self.tokens[self.prefix_offset..];
        // Decoding failures (none for the tokenizers sluice loads) count as
        // empty text rather than failing the request.
        let prefix_text = tokenizer
            .decode(&window[..self.read_offset - self.prefix_offset], skip)
            .unwrap_or_default();
        let new_text = tokenizer.decode(window, skip).unwrap_or_default();
        let incomplete = new_text.ends_with('\u{FFFD}');
        if !force && (incomplete || new_text.len() <= prefix_text.len()) {
            return String::new();
        }
        let delta = text_after(&new_text, &prefix_text).to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        delta
    }
}

/// `new` past `prefix`. Normally `prefix` is a prefix of `new`; when it is
/// not (the prompt's context ended inside a character, so `prefix` ends in
/// U+FFFD), the text after their longest common prefix.
fn text_after<'a>(new: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = new.strip_prefix(prefix) {
        return rest;
    }
    let common = new
        .char_indices()
        .zip(prefix.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map_or(0, |((i, c), _)| i + c.len_utf8());
    &new[common..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(prompt: &[TokenId], outputs: &[TokenId]) -> Vec<String> {
        let tok = Tokenizer::builtin();
        let mut d = IncrementalDetokenizer::new(prompt, true);
        let mut pieces: Vec<String> = outputs.iter().map(|&t| d.push(&tok, t)).collect();
        pieces.push(d.flush(&tok));
        pieces
    }

    #[test]
    fn multi_byte_characters_wait_for_their_last_byte() {
        // "é" = C3 A9, "東" = E6 9D B1, "🚀" = F0 9F 9A 80
        let bytes: Vec<TokenId> = "aé東🚀".bytes().map(u32::from).collect();
        let pieces = run(b"hi".map(u32::from).as_slice(), &bytes);
        assert_eq!(
            pieces,
            ["a", "", "é", "", "", "東", "", "", "", "🚀", ""].map(String::from)
        );
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        // A lone continuation byte, then text: released with the next char.
        assert_eq!(run(&[104], &[0x80, b'x' as u32]).concat(), "\u{FFFD}x");
        // A truncated character at the end: released by flush.
        let pieces = run(&[104], &[b'x' as u32, 0xE6, 0x9D]);
        assert_eq!(pieces, ["x", "", "", "\u{FFFD}"].map(String::from));
        // Endless garbage is released after MAX_PENDING_TOKENS.
        let garbage = vec![0xFF; MAX_PENDING_TOKENS];
        let pieces = run(&[104], &garbage);
        assert_eq!(
            pieces[MAX_PENDING_TOKENS - 1].chars().count(),
            MAX_PENDING_TOKENS
        );
    }

    #[test]
    fn special_tokens_follow_skip_special_tokens() {
        let tok = Tokenizer::builtin();
        let mut d = IncrementalDetokenizer::new(&[104], false);
        assert_eq!(d.push(&tok, 257), "<|im_start|>");
        let mut d = IncrementalDetokenizer::new(&[104], true);
        assert_eq!(d.push(&tok, 257), "");
        assert_eq!(d.push(&tok, b'a' as u32), "a");
    }

    #[test]
    fn prompt_ending_inside_a_character() {
        // The prompt holds the first byte of "é"; the output completes it.
        let pieces = run(&[b'h' as u32, 0xC3], &[0xA9, b'!' as u32]);
        assert_eq!(pieces.concat(), "é!");
    }

    #[test]
    fn hf_byte_level_tokens_round_trip() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sluice-model/tests/data/tiny-qwen2");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let text = "Café 東京 🚀 über αβγ ！ def f(x):\n    return x";
        let ids = tok.encode(text, false).unwrap();
        let mut d = IncrementalDetokenizer::new(&[], true);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&d.push(&tok, id));
        }
        out.push_str(&d.flush(&tok));
        assert_eq!(out, text);
    }
}
