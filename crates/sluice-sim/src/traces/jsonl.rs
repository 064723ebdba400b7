//! JSONL traces: one request object a line, every key checked.

use super::*;

/// Calls `each(line_number, text)` for every non-blank line (trailing
/// `\r` removed), stopping early when it returns `Ok(false)`.
pub(super) fn for_each_line(
    at: &At<'_>,
    mut reader: impl BufRead,
    mut each: impl FnMut(usize, &str) -> Result<bool, TraceFileError>,
) -> Result<(), TraceFileError> {
    let mut buf = Vec::new();
    let mut n = 0usize;
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| at.err(Some(n + 1), None, format!("cannot read: {e}")))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        let Ok(text) = std::str::from_utf8(&buf) else {
            return at.line(n, "not valid UTF-8");
        };
        let text = text.trim_end_matches(['\n', '\r']);
        // A byte-order mark some tools write before the first line.
        let text = if n == 1 {
            text.trim_start_matches('\u{feff}')
        } else {
            text
        };
        if text.trim().is_empty() {
            continue;
        }
        if !each(n, text)? {
            return Ok(());
        }
    }
}

/// A JSON value, shortened for a message.
pub(super) fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// A length field: an integer in `1..=MAX_TRACE_LEN`.
pub(super) fn json_len(
    at: &At<'_>,
    line: usize,
    key: &str,
    v: &Value,
) -> Result<usize, TraceFileError> {
    match v.as_u64() {
        Some(0) => at.field(line, key, "must be at least 1, got 0"),
        Some(n) if n > MAX_TRACE_LEN => at.field(
            line,
            key,
            format!("{n} is above the limit of {MAX_TRACE_LEN} (2^24)"),
        ),
        Some(n) => Ok(n as usize),
        None => at.field(
            line,
            key,
            format!("expected a positive integer, got {}", show(v)),
        ),
    }
}

pub(super) const JSONL_KEYS: [&str; 6] = [
    "arrival_s",
    "prompt_len",
    "prompt_token_ids",
    "output_len",
    "priority",
    "id",
];

pub(super) fn jsonl_request(
    at: &At<'_>,
    line: usize,
    text: &str,
    index: usize,
    rng: &mut Rng,
    vocab: u32,
) -> Result<SimRequest, TraceFileError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| at.err(Some(line), None, format!("not valid JSON: {e}")))?;
    let Some(obj): Option<&Map<String, Value>> = value.as_object() else {
        return at.line(
            line,
            format!("expected a JSON object, got {}", show(&value)),
        );
    };
    let unknown: Vec<String> = obj
        .keys()
        .filter(|k| !JSONL_KEYS.contains(&k.as_str()))
        .map(|k| format!("`{k}`"))
        .collect();
    if !unknown.is_empty() {
        return at.line(
            line,
            format!(
                "unknown field{} {} (expected arrival_s, prompt_len or prompt_token_ids, \
                 output_len, priority, id)",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", ")
            ),
        );
    }
    let arrival_s = match obj.get("arrival_s") {
        None => {
            return at.field(
                line,
                "arrival_s",
                "missing (expected seconds, a finite number ≥ 0)",
            )
        }
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && t >= 0.0 => t,
            Some(t) => {
                return at.field(
                    line,
                    "arrival_s",
                    format!("must be finite and ≥ 0, got {t}"),
                )
            }
            None => {
                return at.field(
                    line,
                    "arrival_s",
                    format!("expected a number of seconds, got {}", show(v)),
                )
            }
        },
    };
    let prompt = match (obj.get("prompt_len"), obj.get("prompt_token_ids")) {
        (Some(_), Some(_)) => {
            return at.line(
                line,
                "both `prompt_len` and `prompt_token_ids` are given (expected exactly one)",
            )
        }
        (None, None) => {
            return at.line(
                line,
                "missing `prompt_len` or `prompt_token_ids` (expected exactly one)",
            )
        }
        (Some(v), None) => {
            let n = json_len(at, line, "prompt_len", v)?;
            random_tokens(rng, n, vocab)
        }
        (None, Some(v)) => {
            let Some(items) = v.as_array() else {
                return at.field(
                    line,
                    "prompt_token_ids",
                    format!("expected an array of token ids, got {}", show(v)),
                );
            };
            if items.is_empty() {
                return at.field(line, "prompt_token_ids", "the prompt is empty");
            }
            if items.len() as u64 > MAX_TRACE_LEN {
                return at.field(
                    line,
                    "prompt_token_ids",
                    format!(
                        "{} tokens, above the limit of {MAX_TRACE_LEN} (2^24)",
                        items.len()
                    ),
                );
            }
            let mut ids = Vec::with_capacity(items.len());
            for (i, t) in items.iter().enumerate() {
                match t.as_u64().and_then(|t| u32::try_from(t).ok()) {
                    Some(t) => ids.push(t),
                    None => {
                        return at.field(
                            line,
                            &format!("prompt_token_ids[{i}]"),
                            format!(
                                "expected a token id (an integer in 0..2^32), got {}",
                                show(t)
                            ),
                        )
                    }
                }
            }
            ids
        }
    };
    let output_len = match obj.get("output_len") {
        None => return at.field(line, "output_len", "missing (expected a positive integer)"),
        Some(v) => json_len(at, line, "output_len", v)?,
    };
    let priority = match obj.get("priority") {
        None => 0,
        Some(v) => match v.as_i64().and_then(|p| i32::try_from(p).ok()) {
            Some(p) => p,
            None => {
                return at.field(
                    line,
                    "priority",
                    format!("expected an integer in the i32 range, got {}", show(v)),
                )
            }
        },
    };
    let id = match obj.get("id") {
        None => index.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => return at.field(line, "id", format!("expected a string, got {}", show(v))),
    };
    let mut req = SimRequest::new(id, arrival_s, prompt, output_len);
    req.priority = priority;
    Ok(req)
}

/// Parses a JSONL trace from `reader`; `file` names it in errors.
pub fn parse_jsonl(
    file: &str,
    reader: impl BufRead,
    opts: &TraceOptions,
) -> Result<Vec<SimRequest>, TraceFileError> {
    let at = At { file };
    let mut rng = Rng::new(opts.seed);
    let mut out: Vec<SimRequest> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let limit = opts.max_requests.unwrap_or(usize::MAX);
    if limit == 0 {
        return Ok(out);
    }
    for_each_line(&at, reader, |line, text| {
        let req = jsonl_request(&at, line, text, out.len(), &mut rng, opts.vocab)?;
        if let Some(first) = seen.insert(req.id.clone(), line) {
            return at.field(
                line,
                "id",
                format!("duplicate id {:?} (first on line {first})", req.id),
            );
        }
        out.push(req);
        Ok(out.len() < limit)
    })?;
    Ok(out)
}
