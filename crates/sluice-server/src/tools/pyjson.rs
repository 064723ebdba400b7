//! JSON as the tool parsers need it: an order-preserving parser with
//! Python's `json.JSONDecoder().raw_decode` semantics (a value at a position,
//! trailing text allowed), Python `json.dumps(v, ensure_ascii=False)`
//! output, and scans of *partial* objects and arrays for streaming.
//!
//! Promises: never panics on any input (depth is capped at `MAX_DEPTH`, so
//! hostile nesting is "invalid", not a stack overflow); a prefix of a
//! document is reported `Partial`, never `Invalid`, unless the prefix itself
//! breaks the grammar. Differences from Python: `NaN`/`Infinity` literals
//! are rejected, and a lone surrogate escape decodes to U+FFFD.

use std::collections::HashMap;

/// Deeper nesting is treated as invalid JSON (Python's own limit is its
/// recursion limit, about 1000; tool arguments never come close).
pub(crate) const MAX_DEPTH: usize = 256;

/// A JSON value with object members in document order (a duplicate key
/// keeps its first position and its last value, as a Python dict does).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum J {
    Null,
    Bool(bool),
    /// The number as written (re-formatted by `dumps`).
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    pub(crate) fn get(&self, key: &str) -> Option<&J> {
        match self {
            J::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why a parse stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The text ended inside the value: more text may complete it.
    Partial,
    /// The text breaks the grammar.
    Invalid,
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    /// The text is complete: running out ends a number, anything else is
    /// invalid.
    at_end: bool,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && is_ws(self.s[self.i]) {
            self.i += 1;
        }
    }

    fn eof(&self) -> Stop {
        if self.at_end {
            Stop::Invalid
        } else {
            Stop::Partial
        }
    }

    fn peek(&self) -> Result<u8, Stop> {
        self.s.get(self.i).copied().ok_or(self.eof())
    }

    /// Past a container's opening byte: whether it closes at once (`close`
    /// consumed).
    fn opens_empty(&mut self, close: u8) -> Result<bool, Stop> {
        self.i += 1;
        self.ws();
        if self.peek()? == close {
            self.i += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// After a container's element: `,` (false) or its `close` (true).
    fn comma_or_close(&mut self, close: u8) -> Result<bool, Stop> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.i += 1;
                Ok(false)
            }
            b if b == close => {
                self.i += 1;
                Ok(true)
            }
            _ => Err(Stop::Invalid),
        }
    }

    /// An object member's `"key":`, and the whitespace after it.
    fn member_key(&mut self) -> Result<String, Stop> {
        self.ws();
        if self.peek()? != b'"' {
            return Err(Stop::Invalid);
        }
        let key = self.string()?;
        self.ws();
        if self.peek()? != b':' {
            return Err(Stop::Invalid);
        }
        self.i += 1;
        self.ws();
        Ok(key)
    }

    fn value(&mut self, depth: usize) -> Result<J, Stop> {
        if depth > MAX_DEPTH {
            return Err(Stop::Invalid);
        }
        match self.peek()? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(J::Str),
            b't' => self.literal(b"true", J::Bool(true)),
            b'f' => self.literal(b"false", J::Bool(false)),
            b'n' => self.literal(b"null", J::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(Stop::Invalid),
        }
    }

    fn literal(&mut self, word: &[u8], v: J) -> Result<J, Stop> {
        for &w in word {
            match self.s.get(self.i) {
                None => return Err(self.eof()),
                Some(&b) if b == w => self.i += 1,
                Some(_) => return Err(Stop::Invalid),
            }
        }
        Ok(v)
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<J, Stop> {
        let start = self.i;
        if self.s[self.i] == b'-' {
            self.i += 1;
        }
        match self.s.get(self.i) {
            None => return Err(self.eof()),
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            Some(_) => return Err(Stop::Invalid),
        }
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(if self.i >= self.s.len() {
                    self.eof()
                } else {
                    Stop::Invalid
                });
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(if self.i >= self.s.len() {
                    self.eof()
                } else {
                    Stop::Invalid
                });
            }
        }
        // A number that runs to the end of unfinished text may go on.
        if self.i >= self.s.len() && !self.at_end {
            return Err(Stop::Partial);
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        Ok(J::Num(text))
    }

    fn hex4(&mut self) -> Result<u32, Stop> {
        let mut v = 0u32;
        for _ in 0..4 {
            let b = self.peek()?;
            let d = (b as char).to_digit(16).ok_or(Stop::Invalid)?;
            v = v * 16 + d;
            self.i += 1;
        }
        Ok(v)
    }

    fn string(&mut self) -> Result<String, Stop> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let run = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\' | 0..=0x1f) {
                self.i += 1;
            }
            // The run stops at an ASCII byte, so it is whole UTF-8.
            out.push_str(&String::from_utf8_lossy(&self.s[run..self.i]));
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.i += 1;
                    let c = self.peek()?;
                    self.i += 1;
                    match c {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let ch = if (0xD800..0xDC00).contains(&hi)
                                && self.s.get(self.i) == Some(&b'\\')
                                && self.s.get(self.i + 1) == Some(&b'u')
                            {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                } else {
                                    // Not a pair: the second escape stands alone.
                                    self.i = save;
                                    None
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(ch.unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(Stop::Invalid),
                    }
                }
                // A raw control character: Python's strict decoder refuses it.
                _ => return Err(Stop::Invalid),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<J, Stop> {
        let mut items = Vec::new();
        if self.opens_empty(b']')? {
            return Ok(J::Arr(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            if self.comma_or_close(b']')? {
                return Ok(J::Arr(items));
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<J, Stop> {
        let mut members: Vec<(String, J)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        if self.opens_empty(b'}')? {
            return Ok(J::Obj(members));
        }
        loop {
            let key = self.member_key()?;
            let v = self.value(depth + 1)?;
            match index.get(&key) {
                Some(&k) => members[k].1 = v,
                None => {
                    index.insert(key.clone(), members.len());
                    members.push((key, v));
                }
            }
            if self.comma_or_close(b'}')? {
                return Ok(J::Obj(members));
            }
        }
    }
}

/// Python's `JSONDecoder().raw_decode(text[start:])`: the value that starts
/// exactly at `start` (no leading whitespace) and the byte offset where it
/// ends. The text is taken as complete.
pub(crate) fn raw_decode(text: &str, start: usize) -> Option<(J, usize)> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: start,
        at_end: true,
    };
    let v = p.value(0).ok()?;
    Some((v, p.i))
}

/// Python's `json.loads(text)`: one value, whitespace around it allowed.
pub(crate) fn loads(text: &str) -> Option<J> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        at_end: true,
    };
    p.ws();
    let v = p.value(0).ok()?;
    p.ws();
    (p.i == text.len()).then_some(v)
}

/// Where the value starting at `start` ends, in text that may still grow
/// (`at_end` false) or is complete.
pub(crate) fn scan_value(text: &str, start: usize, at_end: bool) -> Result<usize, Stop> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: start,
        at_end,
    };
    p.value(0)?;
    Ok(p.i)
}

/// One member of a partially scanned object, recorded once its value has
/// started.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub key: String,
    /// Byte offset of the value's first character.
    pub start: usize,
    /// The value and its end, once complete.
    pub done: Option<(J, usize)>,
}

/// A scan of an object that may be unfinished.
#[derive(Clone, Debug, Default)]
pub(crate) struct ObjScan {
    pub members: Vec<Member>,
    /// One past the closing brace, once the object is complete.
    pub end: Option<usize>,
    /// The text breaks the grammar; what was scanned before still stands.
    pub invalid: bool,
}

impl ObjScan {
    /// The first member named `key` (streaming announces what it sees
    /// first; a later duplicate cannot be taken back).
    pub(crate) fn member(&self, key: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.key == key)
    }

    /// The member's string value, once complete.
    pub(crate) fn str_member(&self, key: &str) -> Option<&str> {
        match self.member(key)?.done.as_ref()? {
            (J::Str(s), _) => Some(s),
            _ => None,
        }
    }
}

/// Scans the object whose `{` is at `start`.
pub(crate) fn scan_object(text: &str, start: usize, at_end: bool) -> ObjScan {
    let mut out = ObjScan::default();
    let mut p = Parser {
        s: text.as_bytes(),
        i: start,
        at_end,
    };
    let r = (|| -> Result<(), Stop> {
        if p.peek()? != b'{' {
            return Err(Stop::Invalid);
        }
        if p.opens_empty(b'}')? {
            out.end = Some(p.i);
            return Ok(());
        }
        loop {
            let key = p.member_key()?;
            p.peek()?;
            let vstart = p.i;
            out.members.push(Member {
                key,
                start: vstart,
                done: None,
            });
            let v = p.value(1)?;
            if let Some(m) = out.members.last_mut() {
                m.done = Some((v, p.i));
            }
            if p.comma_or_close(b'}')? {
                out.end = Some(p.i);
                return Ok(());
            }
        }
    })();
    out.invalid = r == Err(Stop::Invalid);
    out
}

/// One element of a partially scanned array.
#[derive(Clone, Debug)]
pub(crate) enum Elem {
    Obj(ObjScan),
    /// Not an object (complete or not).
    Other,
}

/// A scan of an array that may be unfinished.
#[derive(Clone, Debug, Default)]
pub(crate) struct ArrScan {
    pub elems: Vec<Elem>,
    pub end: Option<usize>,
    pub invalid: bool,
}

/// Scans the array whose `[` is at `start`, element by element.
pub(crate) fn scan_array(text: &str, start: usize, at_end: bool) -> ArrScan {
    let mut out = ArrScan::default();
    let mut p = Parser {
        s: text.as_bytes(),
        i: start,
        at_end,
    };
    let r = (|| -> Result<(), Stop> {
        if p.peek()? != b'[' {
            return Err(Stop::Invalid);
        }
        if p.opens_empty(b']')? {
            out.end = Some(p.i);
            return Ok(());
        }
        loop {
            p.ws();
            if p.peek()? == b'{' {
                let o = scan_object(text, p.i, at_end);
                let (end, invalid) = (o.end, o.invalid);
                out.elems.push(Elem::Obj(o));
                match end {
                    Some(e) => p.i = e,
                    None if invalid => return Err(Stop::Invalid),
                    None => return Err(p.eof()),
                }
            } else {
                out.elems.push(Elem::Other);
                p.value(1)?;
            }
            if p.comma_or_close(b']')? {
                out.end = Some(p.i);
                return Ok(());
            }
        }
    })();
    out.invalid = r == Err(Stop::Invalid);
    out
}

/// Python's `json.dumps(v, ensure_ascii=False)`: separators `", "` and
/// `": "`, members in order, numbers as Python prints them.
pub(crate) fn dumps(v: &J) -> String {
    let mut out = String::new();
    write_py(v, &mut out);
    out
}

fn write_py(v: &J, out: &mut String) {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(true) => out.push_str("true"),
        J::Bool(false) => out.push_str("false"),
        J::Num(n) => out.push_str(&py_number(n)),
        J::Str(s) => py_string(s, out),
        J::Arr(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                write_py(item, out);
            }
            out.push(']');
        }
        J::Obj(members) => {
            out.push('{');
            for (k, (key, item)) in members.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                py_string(key, out);
                out.push_str(": ");
                write_py(item, out);
            }
            out.push('}');
        }
    }
}

fn py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON number as Python re-prints it: integers exactly (`-0` is `0`),
/// floats as `repr(float)`.
fn py_number(n: &str) -> String {
    if !n.contains(['.', 'e', 'E']) {
        let digits = n.trim_start_matches('-');
        if digits.bytes().all(|b| b == b'0') {
            return "0".into();
        }
        return n.to_string();
    }
    let Ok(x) = n.parse::<f64>() else {
        return n.to_string();
    };
    py_float(x)
}

/// `repr(x)` of a Python float: the shortest round-trip digits, fixed
/// notation for exponents in [-4, 16), else `d.ddde+XX`.
pub(crate) fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{:e}", x.abs()); // e.g. "1.5e-5", "1e16", "0e0"
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                format!("{digits}{}.0", "0".repeat((int_len - n) as usize))
            } else {
                let (a, b) = digits.split_at(int_len as usize);
                format!("{a}.{b}")
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_matches_python() {
        let v = loads(r#" {"b": 1, "a": [1.50, 1e5, -0, 1E-7, 2.5e20, {}], "s": "é\u00e9\n\"\\/\u0001", "b": true} "#).unwrap();
        assert_eq!(
            dumps(&v),
            r#"{"b": true, "a": [1.5, 100000.0, 0, 1e-07, 2.5e+20, {}], "s": "éé\n\"\\/\u0001"}"#
        );
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(123456789012345.6), "123456789012345.6");
        assert_eq!(py_float(-0.0), "-0.0");
        assert_eq!(dumps(&loads(r#""\ud83d\ude00""#).unwrap()), "\"😀\"");
    }

    #[test]
    fn raw_decode_and_partial() {
        let (v, end) = raw_decode(r#"xx{"a": "}"} tail"#, 2).unwrap();
        assert_eq!(end, 12);
        assert_eq!(v.get("a"), Some(&J::Str("}".into())));
        assert!(raw_decode("[1, 2", 0).is_none());
        assert_eq!(scan_value("[1, 2", 0, false), Err(Stop::Partial));
        assert_eq!(scan_value("12", 0, false), Err(Stop::Partial));
        assert_eq!(scan_value("12", 0, true), Ok(2));
        assert_eq!(scan_value("[1, }", 0, false), Err(Stop::Invalid));
        assert_eq!(scan_value("tr", 0, false), Err(Stop::Partial));
        assert_eq!(scan_value("tx", 0, false), Err(Stop::Invalid));
        let deep = "[".repeat(100_000);
        assert_eq!(scan_value(&deep, 0, true), Err(Stop::Invalid));
        assert!(loads("\"a\u{1}\"").is_none());
        assert!(loads("NaN").is_none());
    }

    #[test]
    fn scans_partial_objects() {
        let o = scan_object(r#"{"name": "f", "arguments": {"x": [1"#, 0, false);
        assert_eq!(o.str_member("name"), Some("f"));
        let a = o.member("arguments").unwrap();
        assert_eq!(a.start, 27);
        assert!(a.done.is_none() && o.end.is_none() && !o.invalid);
        let arr = scan_array(r#"[{"a": 1}, 3, {"b""#, 0, false);
        assert_eq!(arr.elems.len(), 3);
        assert!(arr.end.is_none() && !arr.invalid);
    }
}
