//! Azure LLM inference trace CSVs: the header's columns, and timestamps
//! to nanoseconds since the epoch (offsets honoured).

use super::*;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard
/// Hinnant's `days_from_civil`).
pub(super) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(super) fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Fixed-width decimal digits.
pub(super) fn digits(s: &str, what: &str) -> Result<u32, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the {what} `{s}` is not a number"));
    }
    s.parse::<u32>()
        .map_err(|_| format!("the {what} `{s}` is out of range"))
}

/// Nanoseconds since the Unix epoch of `YYYY-MM-DD HH:MM:SS[.f{1,9}]`
/// with an optional `T` separator and `Z` / `±HH:MM` / `±HHMM` offset.
pub fn parse_timestamp(s: &str) -> Result<i128, String> {
    let s = s.trim();
    let bad = |why: String| {
        Err(format!(
            "`{s}` is not a date-time like 2023-11-16 18:15:46.6805900 ({why})"
        ))
    };
    let (date, rest) = match s.find([' ', 'T']) {
        Some(i) => (&s[..i], s[i + 1..].trim_start()),
        None => return bad("no time after the date".into()),
    };
    let dp: Vec<&str> = date.split('-').collect();
    let [ys, ms, ds] = dp[..] else {
        return bad("the date is not YYYY-MM-DD".into());
    };
    if ys.len() != 4 || ms.len() != 2 || ds.len() != 2 {
        return bad("the date is not YYYY-MM-DD".into());
    }
    let (y, m, d) = match (digits(ys, "year"), digits(ms, "month"), digits(ds, "day")) {
        (Ok(y), Ok(m), Ok(d)) => (i64::from(y), m, d),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return bad(e),
    };
    if !(1..=12).contains(&m) {
        return bad(format!("month {m}"));
    }
    if d == 0 || d > days_in_month(y, m) {
        return bad(format!("day {d} of month {m}"));
    }
    // Split off an offset: `Z`, or a sign after the seconds.
    let (time, offset_s) = if let Some(t) = rest.strip_suffix(['Z', 'z']) {
        (t, 0i64)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (t, off) = (&rest[..i], &rest[i..]);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let hm = off[1..].replace(':', "");
        if hm.len() != 4 || !hm.bytes().all(|b| b.is_ascii_digit()) {
            return bad(format!("offset `{off}` is not ±HH:MM"));
        }
        let (oh, om) = match (
            digits(&hm[..2], "offset hour"),
            digits(&hm[2..], "offset minute"),
        ) {
            (Ok(h), Ok(m)) if h <= 23 && m <= 59 => (i64::from(h), i64::from(m)),
            _ => return bad(format!("offset `{off}` is not ±HH:MM")),
        };
        (t, sign * (oh * 3600 + om * 60))
    } else {
        (rest, 0)
    };
    let (hms, frac) = match time.split_once('.') {
        Some((a, f)) => (a, Some(f)),
        None => (time, None),
    };
    let tp: Vec<&str> = hms.split(':').collect();
    let [hs, mins, ss] = tp[..] else {
        return bad("the time is not HH:MM:SS".into());
    };
    if hs.len() != 2 || mins.len() != 2 || ss.len() != 2 {
        return bad("the time is not HH:MM:SS".into());
    }
    let (h, mi, sec) = match (
        digits(hs, "hour"),
        digits(mins, "minute"),
        digits(ss, "second"),
    ) {
        (Ok(h), Ok(mi), Ok(sec)) => (h, mi, sec),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return bad(e),
    };
    if h > 23 || mi > 59 || sec > 59 {
        return bad(format!("time {h:02}:{mi:02}:{sec:02}"));
    }
    let nanos = match frac {
        None => 0,
        Some(f) if f.is_empty() || f.len() > 9 => {
            return bad(format!("{} fractional digits (1 to 9 allowed)", f.len()))
        }
        Some(f) => match digits(f, "fraction") {
            Ok(v) => i128::from(v) * 10i128.pow(9 - f.len() as u32),
            Err(e) => return bad(e),
        },
    };
    let secs = days_from_civil(y, m, d) * 86_400
        + i64::from(h) * 3600
        + i64::from(mi) * 60
        + i64::from(sec)
        - offset_s;
    Ok(i128::from(secs) * 1_000_000_000 + nanos)
}

/// The Azure trace's columns, as named in its header.
pub(super) const AZURE_COLUMNS: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

pub(super) fn csv_field(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(s)
}

pub(super) fn csv_len(
    at: &At<'_>,
    line: usize,
    column: &str,
    text: &str,
) -> Result<usize, TraceFileError> {
    match text.parse::<u64>() {
        Ok(0) => at.field(line, column, "must be at least 1, got 0"),
        Ok(n) if n > MAX_TRACE_LEN => at.field(
            line,
            column,
            format!("{n} is above the limit of {MAX_TRACE_LEN} (2^24)"),
        ),
        Ok(n) => Ok(n as usize),
        Err(_) => at.field(
            line,
            column,
            format!("expected a positive integer, got `{text}`"),
        ),
    }
}

/// Parses an Azure LLM inference trace CSV from `reader`; `file` names it
/// in errors.
pub fn parse_azure_csv(
    file: &str,
    reader: impl BufRead,
    opts: &TraceOptions,
) -> Result<Vec<SimRequest>, TraceFileError> {
    let at = At { file };
    let mut rng = Rng::new(opts.seed);
    let limit = opts.max_requests.unwrap_or(usize::MAX);
    // Column index of each of AZURE_COLUMNS, and the header's width.
    let mut columns: Option<([usize; 3], usize)> = None;
    let mut rows: Vec<(i128, SimRequest)> = Vec::new();
    for_each_line(&at, reader, |line, text| {
        let fields: Vec<&str> = text.split(',').map(csv_field).collect();
        let Some((idx, width)) = columns else {
            let find = |name: &str| fields.iter().position(|f| f.eq_ignore_ascii_case(name));
            let missing: Vec<String> = AZURE_COLUMNS
                .iter()
                .filter(|c| find(c).is_none())
                .map(|c| format!("`{c}`"))
                .collect();
            if !missing.is_empty() {
                return at.line(
                    line,
                    format!(
                        "the header lacks column{} {} (found {})",
                        if missing.len() == 1 { "" } else { "s" },
                        missing.join(", "),
                        fields
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
            let mut idx = [0; 3];
            for (slot, name) in idx.iter_mut().zip(AZURE_COLUMNS) {
                *slot = find(name).unwrap_or(0);
            }
            columns = Some((idx, fields.len()));
            return Ok(limit > 0);
        };
        if fields.len() != width {
            return at.line(
                line,
                format!("{} fields, but the header has {width}", fields.len()),
            );
        }
        let ts =
            parse_timestamp(fields[idx[0]]).or_else(|m| at.field(line, AZURE_COLUMNS[0], m))?;
        let prompt_len = csv_len(&at, line, AZURE_COLUMNS[1], fields[idx[1]])?;
        let output_len = csv_len(&at, line, AZURE_COLUMNS[2], fields[idx[2]])?;
        let prompt = random_tokens(&mut rng, prompt_len, opts.vocab);
        rows.push((
            ts,
            SimRequest::new(rows.len().to_string(), 0.0, prompt, output_len),
        ));
        Ok(rows.len() < limit)
    })?;
    if columns.is_none() {
        return Err(at.err(
            None,
            None,
            "empty: expected a header naming TIMESTAMP, ContextTokens, GeneratedTokens",
        ));
    }
    let first = rows.iter().map(|(t, _)| *t).min().unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(|(t, mut r)| {
            r.arrival_s = (t - first) as f64 / 1e9;
            r
        })
        .collect())
}
