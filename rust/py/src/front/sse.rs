//! The fast path's SSE observer: complete events out, usage and `[DONE]` seen, the
//! router's own usage chunk hidden. The Rust twin of kthena_router/proxy/sse.py for the
//! chat/text completions streams (StreamEnd.DONE); only complete events are forwarded, so
//! an event is never split between "forward" and "hide".

use bytes::{Bytes, BytesMut};

const FIELD_STARTS: [&[u8]; 5] = [b"data:", b"event:", b"id:", b"retry:", b":"];
const MAX_PENDING: usize = 1 << 20;

#[derive(Debug, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

#[derive(Default)]
pub struct SseObserver {
    hide_usage: bool,
    pending: BytesMut,
    started: bool,
    /// `data: [DONE]` has been seen (at the start of an event).
    pub ended: bool,
    /// (prompt_tokens, completion_tokens) of the last usage object seen.
    pub usage: Option<(Option<i64>, Option<i64>)>,
    /// Complete events forwarded.
    pub events: u64,
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).rposition(|w| w == needle)
}

fn trim_start_newlines(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| **c == b'\r' || **c == b'\n').count();
    &b[n..]
}

fn is_field(event: &[u8]) -> bool {
    FIELD_STARTS.iter().any(|f| event.starts_with(f))
}

fn lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event.split(|c| *c == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

fn trim(b: &[u8]) -> &[u8] {
    let s = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let e = b.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(s, |i| i + 1);
    &b[s..e.max(s)]
}

/// The data payload of one event (data lines joined by newlines), if it has one.
fn data_of(event: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for line in lines(event) {
        if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            match out.as_mut() {
                Some(o) => {
                    o.push(b'\n');
                    o.extend_from_slice(v);
                }
                None => out = Some(v.to_vec()),
            }
        }
    }
    out
}

/// Whether the event is the `data: [DONE]` marker (its first line, after any blank lines).
fn is_done(event: &[u8]) -> bool {
    let first = lines(trim_start_newlines(event)).next().unwrap_or(b"");
    match first.strip_prefix(b"data:") {
        Some(v) => trim(v) == b"[DONE]",
        None => false,
    }
}

fn split_events(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    // events end with a blank line; "\r\n\r\n" contains "\n\r\n" so a split on "\n\n" alone
    // would miss CRLF streams: normalise by splitting on LF LF and on CRLF CRLF.
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < block.len() {
        if block[i..].starts_with(b"\r\n\r\n") {
            out.push(&block[start..i]);
            i += 4;
            start = i;
        } else if block[i..].starts_with(b"\n\n") {
            out.push(&block[start..i]);
            i += 2;
            start = i;
        } else {
            i += 1;
        }
    }
    if start < block.len() {
        out.push(&block[start..]);
    }
    out.into_iter()
}

/// Event terminators in a block of complete events (no allocation: this runs per chunk).
fn count_ends(block: &[u8]) -> u64 {
    let mut n = 0;
    let mut i = 0;
    while i + 1 < block.len() {
        if block[i] == b'\n' && block[i + 1] == b'\n' {
            n += 1;
            i += 2;
        } else if block[i] == b'\n' && block[i + 1] == b'\r' && block.get(i + 2) == Some(&b'\n') {
            n += 1;
            i += 3;
        } else {
            i += 1;
        }
    }
    n
}

fn check_events(block: &[u8]) -> Result<(), Invalid> {
    for event in split_events(block) {
        let event = trim_start_newlines(event);
        if event.is_empty() {
            continue;
        }
        if !is_field(event) {
            return Err(Invalid("response is not an event stream"));
        }
        for line in lines(event) {
            if let Some(v) = line.strip_prefix(b"data:") {
                let v = trim(v);
                if v != b"[DONE]" && serde_json::from_slice::<serde_json::Value>(v).is_err() {
                    return Err(Invalid("data event is not JSON"));
                }
            }
        }
    }
    Ok(())
}

fn int(v: Option<&serde_json::Value>) -> Option<i64> {
    v.and_then(|v| v.as_i64())
}

impl SseObserver {
    pub fn new(hide_usage: bool) -> Self {
        SseObserver { hide_usage, ..Default::default() }
    }

    /// Bytes to forward for this read (maybe empty); Err on a stream that is not SSE.
    pub fn feed(&mut self, chunk: Bytes) -> Result<Bytes, Invalid> {
        let buf: Bytes = if self.pending.is_empty() {
            chunk
        } else {
            self.pending.extend_from_slice(&chunk);
            self.pending.split().freeze()
        };
        let cut = if buf.ends_with(b"\n\n") {
            buf.len()
        } else {
            let lf = rfind(&buf, b"\n\n").map_or(0, |i| i + 2);
            let crlf = rfind(&buf, b"\r\n\r\n").map_or(0, |i| i + 4);
            lf.max(crlf)
        };
        if cut == 0 {
            if buf.len() > MAX_PENDING {
                return Err(Invalid("event exceeds 1 MiB without a terminator"));
            }
            self.pending.extend_from_slice(&buf);
            return Ok(Bytes::new());
        }
        let out = buf.slice(..cut);
        if cut < buf.len() {
            self.pending.extend_from_slice(&buf[cut..]);
        }
        if !self.started {
            check_events(&out)?;
            self.started = true;
        } else if !is_field(trim_start_newlines(&out)) {
            return Err(Invalid("response is not an event stream"));
        }
        let out = if find(&out, b"\"usage\"").is_some() { self.take_usage(out) } else { out };
        if !self.ended && find(&out, b"[DONE]").is_some() && split_events(&out).any(is_done) {
            self.ended = true;
        }
        self.events += count_ends(&out);
        Ok(out)
    }

    fn take_usage(&mut self, out: Bytes) -> Bytes {
        let mut kept: Vec<&[u8]> = Vec::new();
        let mut changed = false;
        for event in split_events(&out) {
            if find(event, b"\"usage\"").is_some() {
                if let Some(data) = data_of(event) {
                    if let Ok(serde_json::Value::Object(obj)) = serde_json::from_slice::<serde_json::Value>(&data) {
                        if let Some(serde_json::Value::Object(u)) = obj.get("usage") {
                            self.usage = Some((int(u.get("prompt_tokens")), int(u.get("completion_tokens"))));
                            let no_choices = match obj.get("choices") {
                                None | Some(serde_json::Value::Null) => true,
                                Some(serde_json::Value::Array(a)) => a.is_empty(),
                                _ => false,
                            };
                            if self.hide_usage && no_choices {
                                changed = true;
                                continue;
                            }
                        }
                    }
                }
            }
            kept.push(event);
        }
        if !changed {
            return out;
        }
        let mut b = BytesMut::with_capacity(out.len());
        for e in kept {
            if e.is_empty() {
                continue;
            }
            b.extend_from_slice(e);
            b.extend_from_slice(b"\n\n");
        }
        b.freeze()
    }

    /// Whether the body ending now is a complete stream.
    pub fn clean_eof(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(o: &mut SseObserver, s: &str) -> String {
        String::from_utf8(o.feed(Bytes::copy_from_slice(s.as_bytes())).unwrap().to_vec()).unwrap()
    }

    #[test]
    fn whole_events_pass_partial_wait() {
        let mut o = SseObserver::new(false);
        assert_eq!(feed(&mut o, "data: {\"a\":1}\n\ndata: {\"b\""), "data: {\"a\":1}\n\n");
        assert_eq!(feed(&mut o, ":2}\n\n"), "data: {\"b\":2}\n\n");
        assert_eq!(o.events, 2);
        assert!(!o.ended);
    }

    #[test]
    fn done_only_at_event_start() {
        let mut o = SseObserver::new(false);
        feed(&mut o, "data: {\"text\":\"data: [DONE]\"}\n\n");
        assert!(!o.ended);
        feed(&mut o, "data: [DONE]\n\n");
        assert!(o.ended && o.clean_eof());
    }

    #[test]
    fn usage_chunk_hidden_when_injected() {
        let mut o = SseObserver::new(true);
        let s = "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n";
        assert_eq!(feed(&mut o, s), "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n");
        assert_eq!(o.usage, Some((Some(3), Some(5))));
        assert!(o.ended);
    }

    #[test]
    fn usage_kept_when_client_asked() {
        let mut o = SseObserver::new(false);
        let s = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n";
        assert_eq!(feed(&mut o, s), s);
        assert_eq!(o.usage, Some((Some(3), Some(5))));
    }

    #[test]
    fn garbage_is_invalid() {
        let mut o = SseObserver::new(false);
        assert_eq!(o.feed(Bytes::from_static(b"hello\n\n")), Err(Invalid("response is not an event stream")));
        let mut o = SseObserver::new(false);
        assert_eq!(o.feed(Bytes::from_static(b"data: {oops\n\n")), Err(Invalid("data event is not JSON")));
    }

    #[test]
    fn crlf_events() {
        let mut o = SseObserver::new(false);
        assert_eq!(feed(&mut o, "data: {}\r\n\r\ndata: [DONE]\r\n\r\n"), "data: {}\r\n\r\ndata: [DONE]\r\n\r\n");
        assert!(o.ended);
    }
}
