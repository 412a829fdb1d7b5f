//! The decision in Rust (docs/rust-front.md, "The decision in Rust"). For a worker whose
//! balancer is plain round-robin, Python installs a table of the models whose route needs
//! nothing but a model-name match and an endpoint rotation (kthena_router/front/table.py):
//! the front decides those requests on its own thread and tells Python afterwards
//! (`Event::Dispatched`), so a request no longer waits for the asyncio loop. Every doubt
//! (a header, body or route the table does not cover, a server whose endpoints are not
//! all healthy, the admission limit near) declines, and Python decides as before.
//!
//! What a decision must equal, byte for byte, is Python's for the same request: the
//! upstream header block (proxy/headers.py), the body (proxy/body.py: the same splice),
//! the endpoint order (endpoints/balancer.py's rotation, proxy/executor.py's attempts).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_ENCODING, CONTENT_TYPE};
use kthena_core::json_splice;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::fast::Plan;

/// Request headers that never go upstream (proxy/headers.py `_DROP_REQUEST`).
const DROP: [&str; 15] = [
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key", "x-request-id",
    "accept-encoding",
];
const MAX_REQUEST_ID: usize = 200;
const USAGE_ON: &[u8] = b"{\"include_usage\":true}";

pub struct Server {
    pub addrs: Vec<String>,
    pub hosts: Vec<HeaderValue>,
    /// The ModelServer's retry attempts (None: the router's default endpoint count).
    pub retries: Option<usize>,
    pub default_retry: usize,
    pub extra: Vec<(HeaderName, HeaderValue)>,
    pub timeouts: (Duration, Option<Duration>, Option<Duration>, Option<Duration>, Option<Duration>, Duration, Duration),
    pub max_buffered: usize,
    rr: AtomicUsize,
    /// Every endpoint usable and none on trial: the rotation alone is the balancer's choice.
    calm: AtomicBool,
}

impl Server {
    #[allow(clippy::too_many_arguments)]
    pub fn new(addrs: Vec<String>, hosts: Vec<HeaderValue>, retries: Option<usize>, default_retry: usize,
               extra: Vec<(HeaderName, HeaderValue)>,
               timeouts: (Duration, Option<Duration>, Option<Duration>, Option<Duration>, Option<Duration>, Duration, Duration),
               max_buffered: usize) -> Self {
        Server { addrs, hosts, retries, default_retry, extra, timeouts, max_buffered, rr: AtomicUsize::new(0), calm: AtomicBool::new(false) }
    }

    /// Endpoint indices in attempt order: the round-robin rotation, then as many attempts
    /// as the retry policy allows, cycling (decide.py `_plan`).
    fn order(&self) -> Vec<u32> {
        let n = self.addrs.len();
        let start = if n <= 1 { 0 } else { self.rr.fetch_add(1, Ordering::Relaxed) % n };
        let attempts = match self.retries {
            Some(r) => 1 + r,
            None => self.default_retry.min(n),
        };
        (0..attempts).map(|i| ((start + i) % n) as u32).collect()
    }
}

pub struct Model {
    /// (cumulative weight, server index) per target; one target: no draw.
    pub targets: Vec<(u64, u32)>,
    pub total: u64,
    /// The JSON-encoded upstream model name when it differs from the client's.
    pub rewrite: Option<Bytes>,
}

pub struct Table {
    pub version: u64,
    pub models: HashMap<String, (u32, Model)>,
    pub servers: Vec<Server>,
}

impl Table {
    pub fn set_calm(&self, flags: &[bool]) {
        for (s, f) in self.servers.iter().zip(flags) {
            s.calm.store(*f, Ordering::Release);
        }
    }
}

/// Request ids and weighted draws: SipHash of a counter under a per-process random key.
pub struct Ids {
    seed: RandomState,
    n: AtomicU64,
}

impl Default for Ids {
    fn default() -> Self {
        Ids { seed: RandomState::new(), n: AtomicU64::new(0) }
    }
}

impl Ids {
    fn draw(&self, salt: u8) -> u64 {
        let mut h = self.seed.build_hasher();
        h.write_u64(self.n.fetch_add(1, Ordering::Relaxed));
        h.write_u8(salt);
        h.finish()
    }

    /// 32 hex digits, as Python's os.urandom(16).hex().
    fn request_id(&self) -> String {
        format!("{:016x}{:016x}", self.draw(1), self.draw(2))
    }
}

/// What the front runs, and what Python learns about it.
pub struct Decided {
    pub plan: Plan,
    pub model: u32,
    pub target: u32,
    pub order: Vec<u32>,
    pub stream: bool,
    pub request_id: String,
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StreamOptions<'a> {
    #[serde(borrow, default)]
    include_usage: Option<&'a RawValue>,
}

/// Any JSON value, walked in full: strings decoded (a lone surrogate fails), numbers
/// parsed (one out of a double's range fails), nesting within serde_json's limit. The
/// raw-value reads below skip values without this; orjson refuses what fails here.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckVisitor)
    }
}

struct CheckVisitor;

impl<'de> serde::de::Visitor<'de> for CheckVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

fn integer(raw: &RawValue) -> bool {
    let s = raw.get().strip_prefix('-').unwrap_or(raw.get());
    !s.is_empty() && s.len() <= 18 && s.bytes().all(|c| c.is_ascii_digit())
}

/// What proxy/body.py's parse_body accepts, judged on this body: (model, stream, inject
/// usage). None: anything it would refuse, or cases where the Rust reading could differ
/// from orjson's (duplicate keys, an object to merge include_usage into).
fn body_facts(raw: &[u8], chat: bool) -> Option<(String, bool, bool)> {
    if raw.iter().find(|c| !c.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    serde_json::from_slice::<Checked>(raw).ok()?;
    let top: Top = serde_json::from_slice(raw).ok()?;
    let model: String = serde_json::from_str(top.model?.get()).ok()?;
    if model.is_empty() {
        return None;
    }
    let stream = match top.stream.map(|r| r.get()) {
        None | Some("false") => false,
        Some("true") => true,
        _ => return None,
    };
    if chat {
        top.messages.filter(|m| m.get().starts_with('['))?;
    } else {
        top.prompt.filter(|p| p.get().starts_with('[') || p.get().starts_with('"'))?;
    }
    for v in [top.max_tokens, top.max_completion_tokens].into_iter().flatten() {
        if !integer(v) {
            return None;
        }
    }
    let (present, wants_usage) = match top.stream_options {
        None => (false, false),
        Some(o) if o.get().starts_with('{') => {
            let so: StreamOptions = serde_json::from_str(o.get()).ok()?;
            (true, so.include_usage.is_some_and(|u| u.get() == "true"))
        }
        Some(_) => return None,
    };
    let inject = stream && !wants_usage;
    if inject && present {
        return None; // orjson's re-encoding of the client's object: Python does it
    }
    Some((model, stream, inject))
}

/// The upstream header block of proxy/headers.py's RequestHeaders, and the request id.
/// None when Python would refuse the headers or read them differently.
fn upstream_headers(h: &HeaderMap, ids: &Ids) -> Option<(HeaderMap, String)> {
    let mut ctypes = 0;
    for v in h.get_all(CONTENT_TYPE) {
        ctypes += 1;
        if v.as_bytes().starts_with(b"multipart/") {
            return None;
        }
    }
    if ctypes > 1 {
        return None;
    }
    for v in h.get_all(CONTENT_ENCODING) {
        let v = v.as_bytes().trim_ascii();
        if !v.is_empty() && !v.eq_ignore_ascii_case(b"identity") {
            return None;
        }
    }
    let named: Vec<String> = match h.get_all(CONNECTION).iter().last().map(|v| v.as_bytes()) {
        None | Some(b"") | Some(b"keep-alive") | Some(b"close") | Some(b"Keep-Alive") | Some(b"Close") => Vec::new(),
        Some(v) => {
            if !v.is_ascii() {
                return None;
            }
            std::str::from_utf8(v)
                .ok()?
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect()
        }
    };
    let rid = match h.get_all("x-request-id").iter().last().map(|v| v.as_bytes()) {
        Some(v) if !v.is_empty() && v.len() <= MAX_REQUEST_ID && v.iter().all(|c| (0x20..0x7f).contains(c)) => {
            String::from_utf8(v.to_vec()).ok()?
        }
        Some(v) if v.iter().any(|c| *c >= 0x80) => return None, // str.isprintable() per code point: Python
        _ => ids.request_id(),
    };
    let mut out = HeaderMap::with_capacity(h.len() + 2);
    for (k, v) in h.iter() {
        let n = k.as_str();
        if !DROP.contains(&n) && !named.iter().any(|m| m == n) {
            out.append(k.clone(), v.clone());
        }
    }
    out.append(HeaderName::from_static("x-request-id"), HeaderValue::from_str(&rid).ok()?);
    out.append(http::header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    Some((out, rid))
}

/// The decision for a completion whose path is `path` (one of the two fast paths), or None.
pub fn decide(table: &Table, ids: &Ids, path: &str, query: Option<&str>, headers: &HeaderMap, body: &Bytes) -> Option<Decided> {
    if query.is_some_and(|q| !q.is_empty()) {
        return None;
    }
    let (model, stream, inject) = body_facts(body, path == "/v1/chat/completions")?;
    let (mi, entry) = table.models.get(&model)?;
    let ti = if entry.targets.len() == 1 {
        0
    } else {
        let d = ids.draw(0) % entry.total.max(1);
        entry.targets.iter().position(|(cum, _)| *cum > d)?
    };
    let server = table.servers.get(entry.targets[ti].1 as usize)?;
    if !server.calm.load(Ordering::Acquire) || server.addrs.is_empty() {
        return None;
    }
    let (mut hm, rid) = upstream_headers(headers, ids)?;
    for (k, v) in &server.extra {
        hm.append(k.clone(), v.clone());
    }
    let mut reps: Vec<(&[u8], &[u8])> = Vec::with_capacity(2);
    if let Some(m) = &entry.rewrite {
        reps.push((b"model", m));
    }
    if inject {
        reps.push((b"stream_options", USAGE_ON));
    }
    let payload = if reps.is_empty() { body.clone() } else { Bytes::from(json_splice::splice_top_level(body, &reps).ok()?) };
    let order = server.order();
    if order.is_empty() {
        return None;
    }
    let t = server.timeouts;
    let plan = Plan {
        addrs: order.iter().map(|i| server.addrs[*i as usize].clone()).collect(),
        hosts: order.iter().map(|i| server.hosts[*i as usize].clone()).collect(),
        target: http::Uri::from_maybe_shared(Bytes::copy_from_slice(path.as_bytes())).ok()?,
        headers: hm,
        body: payload,
        stream,
        hide_usage: inject,
        connect: t.0,
        response: t.1,
        first_token: t.2,
        idle: t.3,
        total: t.4,
        pool_wait: t.5,
        retry_interval: t.6,
        max_buffered: server.max_buffered,
        request_id: HeaderValue::from_str(&rid).ok()?,
    };
    Some(Decided { plan, model: *mi, target: ti as u32, order, stream, request_id: rid })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_facts_follow_parse_body() {
        let f = |b: &str, chat| body_facts(b.as_bytes(), chat);
        assert_eq!(f(r#"{"model":"m","messages":[]}"#, true), Some(("m".into(), false, false)));
        assert_eq!(f(r#"{"model":"m","messages":[],"stream":true}"#, true), Some(("m".into(), true, true)));
        assert_eq!(
            f(r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#, true),
            Some(("m".into(), true, false))
        );
        assert_eq!(f(r#"{"model":"m","messages":[],"stream":true,"stream_options":{}}"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":[],"stream":true,"stream_options":null}"#, true), Some(("m".into(), true, true)));
        assert_eq!(f(r#"{"model":"m","prompt":"x","max_tokens":5}"#, false), Some(("m".into(), false, false)));
        assert_eq!(f(r#"{"model":"m","prompt":"x","max_tokens":5.0}"#, false), None);
        assert_eq!(f(r#"{"model":"m","prompt":3}"#, false), None);
        assert_eq!(f(r#"{"model":"m","model":"n","messages":[]}"#, true), None); // orjson: last wins
        assert_eq!(f(r#"{"model":"","messages":[]}"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":{}}"#, true), None);
        assert_eq!(f(r#"["m"]"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":[],"stream":1}"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":[]"#, true), None);
        // what orjson refuses is declined too
        assert_eq!(f(r#"{"model":"m","messages":[],"x":"\ud800"}"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":["\udc00x"]}"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":[],"x":1e999}"#, true), None);
        assert_eq!(f(r#"{"model":"m","messages":[[1E400]]}"#, true), None);
        let deep = format!(r#"{{"model":"m","messages":[],"x":{}{}}}"#, "[".repeat(1100), "]".repeat(1100));
        assert_eq!(f(&deep, true), None);
        let ok = format!(r#"{{"model":"m","messages":[],"x":{}{}}}"#, "[".repeat(100), "]".repeat(100));
        assert!(f(&ok, true).is_some());
        assert!(f(r#"{"model":"m","messages":[],"x":"\ud83d\ude00","y":1e300}"#, true).is_some());
    }

    #[test]
    fn headers_follow_request_headers() {
        let ids = Ids::default();
        let mut h = HeaderMap::new();
        h.append("content-type", HeaderValue::from_static("application/json"));
        h.append("connection", HeaderValue::from_static("x-hop, Keep-Alive"));
        h.append("x-hop", HeaderValue::from_static("1"));
        h.append("authorization", HeaderValue::from_static("Bearer k"));
        h.append("x-request-id", HeaderValue::from_static("abc"));
        h.append("x-kept", HeaderValue::from_static("2"));
        let (out, rid) = upstream_headers(&h, &ids).unwrap();
        assert_eq!(rid, "abc");
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-kept", "x-request-id", "accept-encoding"]);
        h.append("content-encoding", HeaderValue::from_static("gzip"));
        assert!(upstream_headers(&h, &ids).is_none());
        let mut g = HeaderMap::new();
        g.append("x-request-id", HeaderValue::from_static("bad\tid"));
        let (_, rid) = upstream_headers(&g, &ids).unwrap();
        assert_eq!(rid.len(), 32);
    }

    #[test]
    fn rotation_and_attempts() {
        let s = Server::new(vec!["a".into(), "b".into(), "c".into()], vec![HeaderValue::from_static("a"); 3], None, 2,
                            Vec::new(), (Duration::ZERO, None, None, None, None, Duration::ZERO, Duration::ZERO), 0);
        assert_eq!(s.order(), [0, 1]);
        assert_eq!(s.order(), [1, 2]);
        assert_eq!(s.order(), [2, 0]);
        let r = Server::new(vec!["a".into()], vec![HeaderValue::from_static("a")], Some(2), 2, Vec::new(),
                            (Duration::ZERO, None, None, None, None, Duration::ZERO, Duration::ZERO), 0);
        assert_eq!(r.order(), [0, 0, 0]);
    }
}
