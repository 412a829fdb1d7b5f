//! Byte-level rewrite of top-level members of a JSON object, without re-encoding.
//!
//! The router must change `model` (and sometimes `stream_options`) in request bodies of up
//! to 32 MiB while passing every other byte through untouched. A full parse + dump costs
//! tens of milliseconds on such bodies and may change number spellings; this module instead
//! scans the object at depth 1 only, skipping nested values with fast scans, and copies
//! everything it does not replace verbatim.
//!
//! Semantics of [`splice_top_level`]:
//! * each `(key, raw_value)`: every top-level member whose key's raw bytes (between the
//!   quotes) equal `key` gets its value replaced by `raw_value` (all duplicates, so that a
//!   last-wins parser sees the same value whichever occurrence it keeps); when the key is
//!   absent, `,"key":raw_value` is inserted before the closing `}` (no comma for an empty
//!   object);
//! * the same key given twice in `replacements`: the last value wins, appended at the first
//!   one's position (like `{**a, **b}`);
//! * keys are compared on raw bytes: an escaped spelling such as `"mod\u0065l"` is not
//!   matched. We accept that limitation: the key is then appended at the end, and since the
//!   appended member comes last, last-wins parsers (Python's json, orjson, pydantic in vLLM
//!   and SGLang) still read our value; no extra check is needed in the caller;
//! * `raw_value` is inserted as given (the caller encodes it with orjson); `key` must not
//!   contain `"`, `\` or control bytes (it is written between quotes as is);
//! * invalid input never panics: it yields a [`SpliceError`].

use memchr::memchr;

/// Why a body could not be spliced (byte offset + reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpliceError {
    pub pos: usize,
    pub msg: &'static str,
}

impl std::fmt::Display for SpliceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid JSON object at byte {}: {}", self.pos, self.msg)
    }
}

impl std::error::Error for SpliceError {}

fn err<T>(pos: usize, msg: &'static str) -> Result<T, SpliceError> {
    Err(SpliceError { pos, msg })
}

/// The edits to apply: found in one scan, written in one pass into a buffer of known size
/// (the binding writes straight into the Python `bytes` object, avoiding a second copy).
#[derive(Debug)]
pub struct SplicePlan {
    /// (value start, value end, replacement index), in body order.
    edits: Vec<(usize, usize, usize)>,
    /// Replacement indices to append, in the caller's order.
    appends: Vec<usize>,
    /// Offset of the closing `}` of the top-level object.
    close: usize,
    /// Whether the object has at least one member (decides the first appended comma).
    has_members: bool,
    out_len: usize,
}

#[inline]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// `start` is an opening quote; returns the offset just past the closing quote.
/// Looks for quotes only (one SIMD memchr per quote, backslashes cost nothing): a quote is
/// escaped iff an odd run of backslashes precedes it; the run cannot cross the opening quote.
#[inline]
fn string_end(b: &[u8], start: usize) -> Result<usize, SpliceError> {
    let mut i = start + 1;
    loop {
        match memchr(b'"', b.get(i..).unwrap_or(&[])) {
            None => return err(start, "unterminated string"),
            Some(off) => {
                let p = i + off;
                let mut q = p;
                while q > start + 1 && b[q - 1] == b'\\' {
                    q -= 1;
                }
                if (p - q).is_multiple_of(2) {
                    return Ok(p + 1);
                }
                i = p + 1;
            }
        }
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

#[inline(always)]
fn zero_bytes(v: u64) -> u64 {
    // Classic "has zero byte": the lowest set bit is exact (borrows only run upwards),
    // which is all we need since we want the first match.
    v.wrapping_sub(LO) & !v & HI
}

/// Offset of the next `"`, `{`, `}`, `[` or `]` at or after `from`, 8 bytes at a time
/// (memchr handles at most 3 needles; token-id arrays and numbers are long runs without
/// any of these).
#[inline]
fn next_structural(b: &[u8], from: usize) -> Option<usize> {
    let tail = b.get(from..)?;
    let mut chunks = tail.chunks_exact(8);
    let mut base = from;
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // Clearing bit 0x20 folds `{`->`[` and `}`->`]`; no other byte maps onto them.
        let f = w & !(0x20 * LO);
        let m =
            zero_bytes(f ^ (0x5B * LO)) | zero_bytes(f ^ (0x5D * LO)) | zero_bytes(w ^ (0x22 * LO));
        if m != 0 {
            return Some(base + (m.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| matches!(c, b'"' | b'{' | b'}' | b'[' | b']'))
        .map(|p| base + p)
}

/// `start` is `{` or `[`; returns the offset just past the matching closer. Iterative with an
/// explicit stack so deep nesting cannot overflow the thread stack.
fn nested_end(b: &[u8], start: usize) -> Result<usize, SpliceError> {
    let mut stack: Vec<u8> = Vec::new();
    let mut i = start;
    loop {
        let p = match next_structural(b, i) {
            Some(p) => p,
            None => return err(start, "unterminated object or array"),
        };
        match b[p] {
            b'"' => {
                i = string_end(b, p)?;
                continue;
            }
            b'{' => stack.push(b'}'),
            b'[' => stack.push(b']'),
            c => {
                if stack.pop() != Some(c) {
                    return err(p, "mismatched bracket");
                }
                if stack.is_empty() {
                    return Ok(p + 1);
                }
            }
        }
        i = p + 1;
    }
}

fn value_end(b: &[u8], start: usize) -> Result<usize, SpliceError> {
    match b.get(start) {
        None => err(start, "missing value"),
        Some(b'"') => string_end(b, start),
        Some(b'{') | Some(b'[') => nested_end(b, start),
        Some(c) if c.is_ascii_digit() || matches!(c, b'-' | b't' | b'f' | b'n') => {
            let mut i = start + 1;
            while i < b.len()
                && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'+' | b'-' | b'.'))
            {
                i += 1;
            }
            Ok(i)
        }
        Some(_) => err(start, "unexpected byte where a value starts"),
    }
}

fn check_key(key: &[u8]) -> Result<(), SpliceError> {
    if key.iter().any(|&c| c == b'"' || c == b'\\' || c < 0x20) {
        return err(
            0,
            "replacement key contains a quote, backslash or control byte",
        );
    }
    Ok(())
}

/// Scan `body` and compute the edits for `replacements` (see the module docs).
pub fn plan<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    body: &[u8],
    replacements: &[(K, V)],
) -> Result<SplicePlan, SpliceError> {
    // Effective replacements, as `{**a, **b}` does: the value of the last occurrence of a
    // key, appended at the position of its first occurrence.
    let mut active: Vec<usize> = Vec::with_capacity(replacements.len());
    for (idx, (k, _)) in replacements.iter().enumerate() {
        check_key(k.as_ref())?;
        let k = k.as_ref();
        if !replacements[..idx].iter().any(|(k2, _)| k2.as_ref() == k) {
            let last = replacements
                .iter()
                .rposition(|(k2, _)| k2.as_ref() == k)
                .unwrap_or(idx);
            active.push(last);
        }
    }
    let mut found = vec![false; replacements.len()];
    let mut edits = Vec::new();

    let b = body;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return err(i, "expected a JSON object");
    }
    i = skip_ws(b, i + 1);
    let close;
    let mut has_members = false;
    if b.get(i) == Some(&b'}') {
        close = i;
    } else {
        loop {
            if b.get(i) != Some(&b'"') {
                return err(i, "expected a key");
            }
            let kend = string_end(b, i)?;
            let key = &b[i + 1..kend - 1];
            i = skip_ws(b, kend);
            if b.get(i) != Some(&b':') {
                return err(i, "expected ':'");
            }
            let vstart = skip_ws(b, i + 1);
            let vend = value_end(b, vstart)?;
            has_members = true;
            if let Some(&r) = active.iter().find(|&&r| replacements[r].0.as_ref() == key) {
                edits.push((vstart, vend, r));
                found[r] = true;
            }
            i = skip_ws(b, vend);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b'}') => {
                    close = i;
                    break;
                }
                _ => return err(i, "expected ',' or '}'"),
            }
        }
    }
    if skip_ws(b, close + 1) != b.len() {
        return err(close + 1, "trailing bytes after the object");
    }
    let appends: Vec<usize> = active.iter().copied().filter(|&r| !found[r]).collect();

    let mut out_len = b.len();
    for &(s, e, r) in &edits {
        out_len = out_len - (e - s) + replacements[r].1.as_ref().len();
    }
    for (n, &r) in appends.iter().enumerate() {
        let comma = usize::from(n > 0 || has_members);
        out_len += comma + 3 + replacements[r].0.as_ref().len() + replacements[r].1.as_ref().len();
    }
    Ok(SplicePlan {
        edits,
        appends,
        close,
        has_members,
        out_len,
    })
}

impl SplicePlan {
    /// Exact size of the spliced body.
    pub fn output_len(&self) -> usize {
        self.out_len
    }

    /// Write the spliced body into `out`, which must be exactly `output_len()` bytes long
    /// (checked: a wrong size is an error, not a panic).
    pub fn write_into<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        body: &[u8],
        replacements: &[(K, V)],
        out: &mut [u8],
    ) -> Result<(), SpliceError> {
        if out.len() != self.out_len {
            return err(0, "output buffer has the wrong size");
        }
        let mut w = 0usize;
        let mut put = |s: &[u8], w: &mut usize| {
            out[*w..*w + s.len()].copy_from_slice(s);
            *w += s.len();
        };
        let mut last = 0usize;
        for &(s, e, r) in &self.edits {
            put(&body[last..s], &mut w);
            put(replacements[r].1.as_ref(), &mut w);
            last = e;
        }
        put(&body[last..self.close], &mut w);
        for (n, &r) in self.appends.iter().enumerate() {
            if n > 0 || self.has_members {
                put(b",", &mut w);
            }
            put(b"\"", &mut w);
            put(replacements[r].0.as_ref(), &mut w);
            put(b"\":", &mut w);
            put(replacements[r].1.as_ref(), &mut w);
        }
        put(&body[self.close..], &mut w);
        Ok(())
    }
}

/// Convenience wrapper: scan and write into a new `Vec`.
pub fn splice_top_level<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    body: &[u8],
    replacements: &[(K, V)],
) -> Result<Vec<u8>, SpliceError> {
    let p = plan(body, replacements)?;
    let mut out = vec![0u8; p.output_len()];
    p.write_into(body, replacements, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(body: &str, reps: &[(&str, &str)]) -> Result<String, SpliceError> {
        let reps: Vec<(&[u8], &[u8])> = reps
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
            .collect();
        splice_top_level(body.as_bytes(), &reps).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn replaces_present_key() {
        assert_eq!(
            s(r#"{"model":"a","x":1}"#, &[("model", r#""b""#)]).unwrap(),
            r#"{"model":"b","x":1}"#
        );
    }

    #[test]
    fn appends_absent_key() {
        assert_eq!(
            s(r#"{"x":1}"#, &[("model", r#""b""#)]).unwrap(),
            r#"{"x":1,"model":"b"}"#
        );
    }

    #[test]
    fn empty_object_has_no_comma() {
        assert_eq!(
            s("{}", &[("a", "1"), ("b", "2")]).unwrap(),
            r#"{"a":1,"b":2}"#
        );
        assert_eq!(s(" { \n } ", &[("a", "1")]).unwrap(), " { \n \"a\":1} ");
    }

    #[test]
    fn nested_same_keys_untouched() {
        let body = r#"{"m":{"model":"in","l":[{"model":1}]},"model":"out","z":["model"]}"#;
        assert_eq!(
            s(body, &[("model", "2")]).unwrap(),
            r#"{"m":{"model":"in","l":[{"model":1}]},"model":2,"z":["model"]}"#
        );
    }

    #[test]
    fn strings_with_escapes_and_braces() {
        let body = r#"{"p":"a\"}{[\\","q":"\\","model":"x\u0041"}"#;
        assert_eq!(
            s(body, &[("model", "null")]).unwrap(),
            r#"{"p":"a\"}{[\\","q":"\\","model":null}"#
        );
    }

    #[test]
    fn backslash_runs_before_quotes() {
        for n in 0..9 {
            // n escaped backslashes, then optionally an escaped quote, then the closing quote.
            let bs = "\\\\".repeat(n);
            for tail in ["", "\\\"", "x"] {
                let body = format!(r#"{{"a":"{bs}{tail}","model":0,"b":"{tail}{bs}"}}"#);
                let want = body.replace(r#""model":0"#, r#""model":1"#);
                assert_eq!(s(&body, &[("model", "1")]).unwrap(), want, "{body}");
            }
        }
    }

    #[test]
    fn whitespace_everywhere_preserved() {
        let body = "\n{ \"a\" :\t[ 1 , 2 ] ,\r\n \"model\" : \"x\" \n}\n";
        assert_eq!(
            s(body, &[("model", "\"y\"")]).unwrap(),
            "\n{ \"a\" :\t[ 1 , 2 ] ,\r\n \"model\" : \"y\" \n}\n"
        );
    }

    #[test]
    fn duplicates_all_replaced_and_last_rep_wins() {
        assert_eq!(
            s(r#"{"k":1,"a":0,"k":2}"#, &[("k", "3"), ("k", "4")]).unwrap(),
            r#"{"k":4,"a":0,"k":4}"#
        );
    }

    #[test]
    fn appended_in_first_occurrence_order() {
        assert_eq!(
            s("{}", &[("x", "1"), ("y", "2"), ("x", "3")]).unwrap(),
            r#"{"x":3,"y":2}"#
        );
    }

    #[test]
    fn escaped_key_not_matched_appended() {
        assert_eq!(
            s(r#"{"mod\u0065l":"a"}"#, &[("model", "1")]).unwrap(),
            r#"{"mod\u0065l":"a","model":1}"#
        );
    }

    #[test]
    fn scalars_and_literals() {
        assert_eq!(
            s(
                r#"{"a":-1.5e+3,"b":true,"c":null,"d":false}"#,
                &[("b", "0"), ("d", "1")]
            )
            .unwrap(),
            r#"{"a":-1.5e+3,"b":0,"c":null,"d":1}"#
        );
    }

    #[test]
    fn no_replacements_is_identity() {
        let body = r#" {"a" : [1,{"b":"}"}]} "#;
        assert_eq!(s(body, &[]).unwrap(), body);
    }

    #[test]
    fn long_values_cross_chunk_boundaries() {
        for n in 0..40 {
            let inner = "x".repeat(n);
            let body =
                format!(r#"{{"a":[{inner:?},[[{{}}]],"{{"],"b":{{"c":"{inner}"}},"model":0}}"#);
            let want = body.replace(r#""model":0"#, r#""model":1"#);
            assert_eq!(s(&body, &[("model", "1")]).unwrap(), want);
        }
    }

    #[test]
    fn invalid_inputs_error_without_panic() {
        let bad = [
            "",
            " ",
            "[]",
            "1",
            "\"a\"",
            "{",
            "}",
            "{\"a\"",
            "{\"a\":",
            "{\"a\":1",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":\"x}",
            "{\"a\":\"x\\",
            "{\"a\":[1}",
            "{\"a\":{]}",
            "{\"a\":[[[",
            "{a:1}",
            "{\"a\":1}x",
            "{\"a\":1}}",
            "{\"a\":}",
            "{\"a\":#}",
            "{,}",
            "{\"a\":1 \"b\":2}",
        ];
        for b in bad {
            assert!(s(b, &[("model", "1")]).is_err(), "accepted {b:?}");
        }
        assert!(s("{}", &[("a\"b", "1")]).is_err());
        assert!(s("{}", &[("a\\b", "1")]).is_err());
    }

    #[test]
    fn truncations_never_panic() {
        let body = r#"{"a":"x\"y\\","b":[1,{"c":"}"}],"model":"m","n":-1e5,"t":true}"#;
        for cut in 0..body.len() {
            let _ = splice_top_level(&body.as_bytes()[..cut], &[(b"model", b"1")]);
        }
        // Arbitrary byte soup: only must not panic.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let mut v = Vec::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(b"{}[]\":,\\ a1-tn"[(x % 14) as usize]);
            }
            let _ = splice_top_level(&v, &[(b"a", b"1")]);
        }
    }

    #[test]
    fn deep_nesting_no_stack_overflow() {
        let depth = 1_000_000;
        let body = format!(
            "{{\"a\":{}{},\"model\":0}}",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let out = s(&body, &[("model", "1")]).unwrap();
        assert!(out.ends_with(",\"model\":1}"));
    }

    #[test]
    fn wrong_buffer_size_is_error() {
        let p = plan(b"{}", &[(b"a", b"1")]).unwrap();
        let mut out = vec![0u8; p.output_len() + 1];
        assert!(p.write_into(b"{}", &[(b"a", b"1")], &mut out).is_err());
    }
}
