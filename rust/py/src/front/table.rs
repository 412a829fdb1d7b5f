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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_ENCODING, CONTENT_TYPE};
use kthena_core::prefix_index::PrefixIndex;
use kthena_core::{json_splice, prefix_hash, scorer};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::fast::Plan;
use super::render::{render_chat, render_completion};

/// Request headers that never go upstream (proxy/headers.py `_DROP_REQUEST`).
const DROP: [&str; 15] = [
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key", "x-request-id",
    "accept-encoding",
];
const MAX_REQUEST_ID: usize = 200;
const USAGE_ON: &[u8] = b"{\"include_usage\":true}";
/// balanceMisses: a best match below this share of the prompt is a miss (scheduler.py).
const MISS_FRACTION: f64 = 0.5;

/// A server the router configuration's scheduler ranks (scheduling/scheduler.py): its
/// Scorer, shared with Python, and the scheduler's endpoint id per endpoint index.
pub struct Sched {
    pub scorer: Arc<Mutex<scorer::Scorer>>,
    pub ids: Vec<u32>,
}

/// The prefix plugin's index (shared with Python) and its arguments.
pub struct Prefix {
    pub index: Arc<Mutex<PrefixIndex>>,
    pub block_size: usize,
    pub max_blocks: usize,
    pub balance_misses: bool,
    /// prefill-cost: the chosen endpoint's uncached blocks are pending there until the
    /// stream's first event (Python releases them: decide.py `first_token`).
    pub pending_cost: bool,
}

/// A server's timeouts: connect, response, first token, idle, total, pool wait, retry interval.
pub type Timeouts = (Duration, Option<Duration>, Option<Duration>, Option<Duration>, Option<Duration>, Duration, Duration);

pub struct Server {
    pub addrs: Vec<String>,
    pub hosts: Vec<HeaderValue>,
    /// The ModelServer's retry attempts (None: the router's default endpoint count).
    pub retries: Option<usize>,
    pub default_retry: usize,
    pub extra: Vec<(HeaderName, HeaderValue)>,
    pub timeouts: Timeouts,
    pub max_buffered: usize,
    pub sched: Option<Sched>,
    /// The rotation Python's balancer shares for this server (rotation.rs).
    rr: Arc<AtomicUsize>,
    /// Every endpoint usable and none on trial: the rotation alone is the balancer's choice.
    calm: AtomicBool,
}

impl Server {
    #[allow(clippy::too_many_arguments)]
    pub fn new(addrs: Vec<String>, hosts: Vec<HeaderValue>, retries: Option<usize>, default_retry: usize,
               extra: Vec<(HeaderName, HeaderValue)>,
               timeouts: Timeouts,
               max_buffered: usize, sched: Option<Sched>, rr: Arc<AtomicUsize>) -> Self {
        Server { addrs, hosts, retries, default_retry, extra, timeouts, max_buffered, sched, rr, calm: AtomicBool::new(false) }
    }

    /// Attempts in order over ranked endpoint indices (front/decide.py `_plan` for calm
    /// servers: every endpoint usable): the retry policy's count, the unranked endpoints
    /// appended when it exceeds the ranking (executor.py `with_fallbacks`), cycling.
    fn attempts(&self, mut ranked: Vec<u32>) -> Vec<u32> {
        let attempts = match self.retries {
            Some(r) => {
                if 1 + r > ranked.len() {
                    for i in 0..self.addrs.len() as u32 {
                        if !ranked.contains(&i) {
                            ranked.push(i);
                        }
                    }
                }
                1 + r
            }
            None => self.default_retry.min(ranked.len()),
        };
        if ranked.is_empty() {
            return Vec::new();
        }
        (0..attempts).map(|i| ranked[i % ranked.len()]).collect()
    }

    /// Endpoint indices in attempt order: the round-robin rotation, then as many attempts
    /// as the retry policy allows, cycling (decide.py `_plan`).
    fn order(&self) -> Vec<u32> {
        let n = self.addrs.len();
        let start = crate::rotation::start(&self.rr, n);
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
    /// The prefix hash chain's seed per target (its ModelServer's model).
    pub seeds: Vec<u64>,
}

pub struct Table {
    pub version: u64,
    pub models: HashMap<String, (u32, Model)>,
    pub servers: Vec<Server>,
    pub prefix: Option<Prefix>,
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
    pub sched: Option<Scheduled>,
}

/// What a scheduler decision leaves for Python's bookkeeping (scheduler.py `candidates`'
/// metrics, `dispatched`'s relays, `observe_prompt_tokens`).
pub struct Scheduled {
    pub hashes: Option<Vec<u64>>,
    pub prompt_bytes: usize,
    pub match_s: f64,
    pub schedule_s: f64,
    /// The best match's share of the prompt's blocks; negative: no blocks (no ratio).
    pub best: f64,
    /// prefill-cost: the uncached blocks added to the chosen endpoint's pending work;
    /// negative: none added.
    pub pending: f64,
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
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
}

/// What body_facts read: the model, stream, whether usage is injected, and the raw prompt
/// fields (the scheduler renders them).
struct Facts<'a> {
    model: String,
    stream: bool,
    inject: bool,
    prompt: &'a RawValue,
    tools: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StreamOptions<'a> {
    #[serde(borrow, default)]
    include_usage: Option<&'a RawValue>,
}

/// Any JSON value, walked in full: strings decoded (a lone surrogate fails), numbers
/// parsed (one out of a double's range fails), nesting within serde_json's limit. The
/// raw-value reads below skip values without this; orjson refuses what fails here.
pub(super) struct Checked;

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
fn body_facts(raw: &[u8], chat: bool) -> Option<Facts<'_>> {
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
    let prompt = if chat {
        top.messages.filter(|m| m.get().starts_with('['))?
    } else {
        top.prompt.filter(|p| p.get().starts_with('[') || p.get().starts_with('"'))?
    };
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
    Some(Facts { model, stream, inject, prompt, tools: top.tools })
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
    let named: Vec<String> = match h.get_all(CONNECTION).iter().next_back().map(|v| v.as_bytes()) {
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
    let rid = match h.get_all("x-request-id").iter().next_back().map(|v| v.as_bytes()) {
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
    let chat = path == "/v1/chat/completions";
    let facts = body_facts(body, chat)?;
    let (model, stream, inject) = (&facts.model, facts.stream, facts.inject);
    let (mi, entry) = table.models.get(model)?;
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
    // what can still fail, before the scheduler's side effects
    let target = http::Uri::from_maybe_shared(Bytes::copy_from_slice(path.as_bytes())).ok()?;
    let request_id = HeaderValue::from_str(&rid).ok()?;
    let (order, sched) = match &server.sched {
        None => (server.order(), None),
        Some(sc) => {
            let (order, done) = schedule(table, sc, server, &facts, chat, entry.seeds[ti], &rid)?;
            (order, Some(done))
        }
    };
    if order.is_empty() {
        return None;
    }
    let t = server.timeouts;
    let plan = Plan {
        addrs: order.iter().map(|i| server.addrs[*i as usize].clone()).collect(),
        hosts: order.iter().map(|i| server.hosts[*i as usize].clone()).collect(),
        target,
        headers: hm,
        body: payload,
        stream,
        hide_usage: inject,
        first_token_event: stream && sched.as_ref().is_some_and(|s| s.pending >= 0.0),
        connect: t.0,
        response: t.1,
        first_token: t.2,
        idle: t.3,
        total: t.4,
        pool_wait: t.5,
        retry_interval: t.6,
        max_buffered: server.max_buffered,
        request_id,
    };
    Some(Decided { plan, model: *mi, target: ti as u32, order, stream, request_id: rid, sched })
}

/// The scheduler's decision for a calm server, as scheduler.py `candidates` and decide.py
/// `_plan` make it: the prompt rendered and matched on the prefix index, misses balanced,
/// the Scorer's ranking, the attempts. The chosen endpoint is counted in flight and owns
/// the prompt's blocks at once (as `dispatched`), so the next request sees this one.
fn schedule(table: &Table, sc: &Sched, server: &Server, facts: &Facts, chat: bool, seed: u64, rid: &str)
            -> Option<(Vec<u32>, Scheduled)> {
    let t0 = Instant::now();
    let mut matches: Vec<(u32, u32)> = Vec::new();
    let mut hashes: Option<Vec<u64>> = None;
    let mut total = 0u32;
    let mut best = -1.0;
    let mut prompt_bytes = 0;
    let mut real: Option<Vec<(u32, u32)>> = None; // the matches balanceMisses replaced, for prefill-cost
    if let Some(p) = &table.prefix {
        let prompt = if chat { render_chat(facts.prompt, facts.tools)? } else { render_completion(facts.prompt)? };
        prompt_bytes = prompt.len();
        let mut hs = Vec::new();
        prefix_hash::chain_hashes(&prompt, p.block_size, seed, p.max_blocks, &mut hs);
        total = u32::try_from(hs.len()).ok()?;
        let mut index = p.index.lock().unwrap_or_else(|e| e.into_inner());
        index.match_hashes(&hs, &mut matches);
        let top = matches.iter().map(|m| m.1).max().unwrap_or(0);
        if total > 0 {
            best = f64::from(top) / f64::from(total);
        }
        if p.balance_misses && total > 0 && best < MISS_FRACTION {
            let replaced = std::mem::replace(&mut matches, index.miss_scores(&sc.ids, total));
            if p.pending_cost {
                real = Some(replaced);
            }
        }
        drop(index);
        hashes = Some(hs);
    }
    let t1 = Instant::now();
    let mut ids = Vec::new();
    let rid_hash = scorer::request_hash(rid.as_bytes());
    // ranked and counted under one lock: a decision on another front thread sees this one
    let mut scorer = sc.scorer.lock().unwrap_or_else(|e| e.into_inner());
    scorer.schedule_keyed(rid_hash, None, &matches, None, total, &mut ids);
    let t2 = Instant::now();
    let mut ranked: Vec<u32> = ids.iter().filter_map(|id| sc.ids.iter().position(|e| e == id)).map(|i| i as u32).collect();
    if ranked.is_empty() {
        ranked = (0..server.addrs.len() as u32).collect(); // every ranked one is out: any endpoint
    }
    let order = server.attempts(ranked);
    let first = sc.ids[*order.first()? as usize];
    scorer.add_in_flight(first, 1);
    let mut pending = -1.0;
    if table.prefix.as_ref().is_some_and(|p| p.pending_cost) {
        let own = real.as_ref().unwrap_or(&matches).iter().find(|m| m.0 == first).map_or(0, |m| m.1);
        pending = f64::from(total.saturating_sub(own));
        scorer.add_pending(first, pending);
    }
    drop(scorer);
    if let (Some(p), Some(hs)) = (&table.prefix, &hashes) {
        if !hs.is_empty() {
            p.index.lock().unwrap_or_else(|e| e.into_inner()).insert(first, hs);
        }
    }
    let done = Scheduled {
        hashes, prompt_bytes, match_s: (t1 - t0).as_secs_f64(), schedule_s: (t2 - t1).as_secs_f64(), best, pending,
    };
    Some((order, done))
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
