//! Logprobs in the two OpenAI shapes: the legacy completions arrays and the
//! chat `content` list.

use crate::protocol::{ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use sluice_engine::{SampleLogprobs, Tokenizer};
use std::collections::HashMap;

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Appends `lps` to the legacy arrays; `offset` is the text offset of the
/// first token (the choice's text length so far).
pub fn extend_completion(
    tok: &Tokenizer,
    out: &mut CompletionLogprobs,
    lps: &[SampleLogprobs],
    mut offset: usize,
) {
    for lp in lps {
        let text = token_text(tok, lp.sampled.token_id);
        out.text_offset.push(offset);
        offset += text.len();
        out.tokens.push(text);
        out.token_logprobs.push(Some(lp.sampled.logprob));
        let top: HashMap<String, f32> = lp
            .top
            .iter()
            .map(|t| (token_text(tok, t.token_id), t.logprob))
            .collect();
        out.top_logprobs.push(Some(top));
    }
}

pub fn chat_content(
    tok: &Tokenizer,
    lps: &[SampleLogprobs],
    top_n: usize,
) -> Vec<ChatTokenLogprob> {
    lps.iter()
        .map(|lp| {
            let text = token_text(tok, lp.sampled.token_id);
            ChatTokenLogprob {
                bytes: text.as_bytes().to_vec(),
                token: text,
                logprob: lp.sampled.logprob,
                top_logprobs: lp
                    .top
                    .iter()
                    .take(top_n)
                    .map(|t| {
                        let s = token_text(tok, t.token_id);
                        TopLogprob {
                            bytes: s.as_bytes().to_vec(),
                            token: s,
                            logprob: t.logprob,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// vLLM's `prompt_logprobs`: `null` for the first position, then for each
/// position a map token id → {logprob, rank, decoded_token} holding the
/// actual token and the top-N.
pub fn prompt_logprobs_json(tok: &Tokenizer, lps: &[SampleLogprobs]) -> serde_json::Value {
    let mut rows = vec![serde_json::Value::Null];
    for lp in lps {
        let mut m = serde_json::Map::new();
        let mut put = |id: u32, logprob: f32, rank: usize| {
            m.insert(
                id.to_string(),
                serde_json::json!({"logprob": logprob, "rank": rank, "decoded_token": token_text(tok, id)}),
            );
        };
        put(lp.sampled.token_id, lp.sampled.logprob, lp.rank);
        for (i, t) in lp.top.iter().enumerate() {
            put(t.token_id, t.logprob, i + 1);
        }
        rows.push(serde_json::Value::Object(m));
    }
    serde_json::Value::Array(rows)
}
