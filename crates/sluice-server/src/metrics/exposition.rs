//! The Prometheus text format as prometheus_client writes it: Python's and
//! Go's float spellings (sample values, `le` bounds), label escaping, and
//! the exposition written family by family (HELP, TYPE, samples,
//! `_created` companions).

use sluice_engine::Histogram;
use std::fmt::Write;

/// `repr()` of a Python float: the shortest digits that round-trip, in
/// positional notation for decimal exponents -4..16, else `1e+16` style;
/// positional values always carry a fraction (`1.0`).
pub fn python_float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sign = if v.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` prints the same shortest round-trip digits Python
    // uses, as `d.ddde<exp>`.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Position of the decimal point relative to the first digit.
    let point = exp + 1;
    if v == 0.0 {
        return format!("{sign}0.0");
    }
    if (-4 < point) && (point <= 16) {
        let n = digits.len() as i32;
        if point <= 0 {
            let zeros = "0".repeat((-point) as usize);
            format!("{sign}0.{zeros}{digits}")
        } else if point >= n {
            let zeros = "0".repeat((point - n) as usize);
            format!("{sign}{digits}{zeros}.0")
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs())
    }
}

/// prometheus_client's `floatToGoString`: how it renders every sample
/// value and every `le` bound. `+Inf`, `-Inf`, `NaN`; positive values of 7
/// or more integer digits switch to Go's exponent form (`1e+06`,
/// `1.796115002389645e+09`); everything else is Python's `repr`
/// (`1.0`, `0.3`, `2560.0`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    let s = python_float_repr(v);
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let mantissa = format!("{}.{}{}", &s[..1], &s[1..dot], &s[dot + 1..]);
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+{:02}", dot - 1)
        }
        _ => s,
    }
}

/// A label value, escaped as the text format wants it.
fn escape_label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample's labels as `(key, value)` pairs, in any order.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// The text of one exposition, written family by family.
pub struct Exposition {
    out: String,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition::new()
    }
}

impl Exposition {
    pub fn new() -> Self {
        Exposition {
            out: String::with_capacity(64 * 1024),
        }
    }

    pub fn finish(self) -> String {
        self.out
    }

    /// `# HELP` and `# TYPE` lines.
    pub fn header(&mut self, name: &str, help: &str, kind: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; labels are written sorted by key, as prometheus_client
    /// writes them.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            let mut sorted: Vec<&(&str, &str)> = labels.iter().collect();
            sorted.sort_by_key(|(k, _)| *k);
            self.out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", go_float(value));
    }

    pub fn gauge(&mut self, name: &str, help: &str, children: &[(Labels<'_>, f64)]) {
        self.header(name, help, "gauge");
        for (labels, v) in children {
            self.sample(name, labels, *v);
        }
    }

    /// A counter `base_total` and its `base_created` gauge family (one
    /// creation time per child).
    pub fn counter(&mut self, base: &str, help: &str, children: &[(Labels<'_>, f64, f64)]) {
        let total = format!("{base}_total");
        self.header(&total, help, "counter");
        for (labels, v, _) in children {
            self.sample(&total, labels, *v);
        }
        self.created(base, help, children.iter().map(|(l, _, c)| (*l, *c)));
    }

    /// A histogram (buckets with `le`, `_count`, `_sum` per child) and its
    /// `_created` gauge family.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        children: &[(Labels<'_>, &Histogram, f64)],
    ) {
        self.header(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (base, h, _) in children {
            let cumulative = h.cumulative();
            let bounds = h.bounds.iter().copied().chain([f64::INFINITY]);
            for (bound, n) in bounds.zip(cumulative) {
                let le = go_float(bound);
                let mut labels: Vec<(&str, &str)> = base.to_vec();
                labels.push(("le", &le));
                self.sample(&bucket, &labels, n as f64);
            }
            self.sample(&format!("{name}_count"), base, h.count as f64);
            self.sample(&format!("{name}_sum"), base, h.sum);
        }
        self.created(name, help, children.iter().map(|(l, _, c)| (*l, *c)));
    }

    /// A summary without quantiles (`_count`, `_sum`) and its `_created`.
    pub fn summary(&mut self, name: &str, help: &str, children: &[(Labels<'_>, u64, f64, f64)]) {
        self.header(name, help, "summary");
        for (labels, count, sum, _) in children {
            self.sample(&format!("{name}_count"), labels, *count as f64);
            self.sample(&format!("{name}_sum"), labels, *sum);
        }
        self.created(name, help, children.iter().map(|(l, _, _, c)| (*l, *c)));
    }

    /// prometheus_client moves each child's `_created` sample into a gauge
    /// family of its own after the family.
    fn created<'a>(
        &mut self,
        base: &str,
        help: &str,
        children: impl Iterator<Item = (Labels<'a>, f64)>,
    ) {
        let name = format!("{base}_created");
        self.header(&name, help, "gauge");
        for (labels, created) in children {
            self.sample(&name, labels, created);
        }
    }
}
