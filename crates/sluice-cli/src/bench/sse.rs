//! Server-sent events, parsed incrementally from the bytes of a streamed
//! response: lines end with LF, CRLF or CR; `data:` lines accumulate; a
//! blank line ends an event; `:` lines are comments (keep-alives); an event
//! may arrive split across any number of network reads, even inside a
//! UTF-8 character or between the CR and LF of one line ending.

/// One dispatched event: its `event:` type (if any) and its data, the
/// `data:` lines joined with `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Default)]
pub struct SseParser {
    /// Bytes of the line not yet terminated.
    line: Vec<u8>,
    /// The previous read ended with CR: an LF that starts the next read
    /// belongs to that line ending.
    after_cr: bool,
    data: Option<String>,
    event: Option<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next bytes of the body; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &b in bytes {
            if std::mem::take(&mut self.after_cr) && b == b'\n' {
                continue;
            }
            match b {
                b'\n' => self.end_line(&mut out),
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut out);
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    /// The body ended: a last line without its line ending, and an event
    /// without its closing blank line, still count. (The SSE spec discards
    /// such an event; vLLM's client keeps one that is valid JSON or
    /// `[DONE]`, and a truncated `[DONE]` is better reported than lost.)
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.end_line(&mut out);
        out
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(SseEvent {
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            return;
        }
        // A line ending never falls inside a UTF-8 sequence (CR and LF are
        // ASCII), so a complete line decodes on its own.
        let line = String::from_utf8_lossy(&line);
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = Some(value.to_string()),
            // id, retry and unknown fields do not matter to a benchmark.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(events: &[SseEvent]) -> Vec<&str> {
        events.iter().map(|e| e.data.as_str()).collect()
    }

    #[test]
    fn events_end_at_blank_lines() {
        let mut p = SseParser::new();
        let ev = p.feed(b"data: {\"a\":1}\n\ndata: [DONE]\n\n");
        assert_eq!(data(&ev), vec!["{\"a\":1}", "[DONE]"]);
        assert!(p.finish().is_empty());
    }

    #[test]
    fn an_event_split_across_reads_at_every_byte() {
        let body = "data: {\"text\":\"h\u{e9}llo \u{1f600}\"}\r\n\r\n: ping\n\ndata: [DONE]\n\n";
        for split in 0..body.len() {
            let (a, b) = body.as_bytes().split_at(split);
            let mut p = SseParser::new();
            let mut ev = p.feed(a);
            ev.extend(p.feed(b));
            ev.extend(p.finish());
            assert_eq!(
                data(&ev),
                vec!["{\"text\":\"h\u{e9}llo \u{1f600}\"}", "[DONE]"],
                "split at {split}"
            );
        }
    }

    #[test]
    fn byte_by_byte_with_cr_line_endings() {
        let body = b"event: message\rdata: one\rdata: two\r\rdata:three\n\n";
        let mut p = SseParser::new();
        let ev: Vec<SseEvent> = body.iter().flat_map(|b| p.feed(&[*b])).collect();
        assert_eq!(
            ev,
            vec![
                SseEvent {
                    event: Some("message".into()),
                    data: "one\ntwo".into()
                },
                SseEvent {
                    event: None,
                    data: "three".into()
                }
            ]
        );
    }

    #[test]
    fn comments_and_other_fields_are_not_events() {
        let mut p = SseParser::new();
        assert!(p
            .feed(b":\n\n: keep-alive\n\nid: 3\nretry: 10\n\n")
            .is_empty());
    }

    #[test]
    fn an_unterminated_last_event_still_counts() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: [DONE]").is_empty());
        assert_eq!(data(&p.finish()), vec!["[DONE]"]);
    }
}
