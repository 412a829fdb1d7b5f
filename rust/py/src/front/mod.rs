//! The experimental Rust front end (`--interface rust`, docs/rust-front.md): an HTTP/1.1
//! server per worker on the public port whose data path never runs Python per chunk.
//!
//! Python runs on the worker's asyncio loop only. Rust queues events (a request needing a
//! decision; a fast-path request that ended, with what it observed) and wakes the loop
//! through one end of a socket pair registered with `loop.add_reader`; Python drains all
//! queued events in one call and answers each decision through a thread-safe method
//! (`fast`, `slow`, `reply`).

mod body;
mod fast;
mod pool;
mod server;
mod slow;
pub mod sse;
pub mod render;
mod stream;
mod table;

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::prefix::{BlockHashes, PrefixIndex};
use crate::rotation::Rotation;
use crate::scorer::Scorer;
use fast::Plan;

pub enum Event {
    /// The front decided this request itself (table.rs): what Python needs to account for it
    /// (the installed table's version, the model's and target's index in it, the endpoints in
    /// attempt order), before its other events.
    Dispatched {
        id: u64,
        version: u64,
        model: u32,
        target: u32,
        order: Vec<u32>,
        stream: bool,
        chat: bool,
        request_id: String,
        at: Instant,
        sched: Option<table::Scheduled>,
    },
    Decide { id: u64, path: String, query: Vec<u8>, headers: Vec<(String, String)>, body: Bytes },
    /// A stream's first event is in hand (its attempts so far; the last one answers).
    FirstByte { id: u64, attempts: Vec<(u32, u8)> },
    /// A running stream's events since its last progress report (the attempt's endpoint
    /// index): output counted while it runs, as proxy/relay_sse.py does.
    Progress { id: u64, endpoint: u32, events: u64 },
    /// A stream's first event reached the front (plans with `first_token_event`).
    FirstToken { id: u64 },
    Done {
        id: u64,
        status: u16,
        error: u8,
        attempts: Vec<(u32, u8)>,
        duration: f64,
        ttft: f64,
        att_ttft: f64,
        tpot: f64,
        prompt: i64,
        completion: i64,
        events: u64,
    },
}

pub enum Decision {
    Fast(Box<Plan>),
    Slow,
    Reply(u16, Bytes, Vec<(HeaderName, HeaderValue)>),
}

pub struct Shared {
    events: Mutex<Vec<Event>>,
    notified: AtomicBool,
    wake: StdUnixStream,
    lazy: tokio::sync::Notify,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Decision>>>,
    next: AtomicU64,
    pool: pool::Pool,
    uds_path: PathBuf,
    uds: slow::UdsPool,
    max_body: usize,
    table: RwLock<Option<Arc<table::Table>>>,
    ids: table::Ids,
    /// Fast-path requests running (decided by either side), and the admission limit with
    /// the worker's other requests in flight as Python last reported them (0: no limit).
    live: AtomicUsize,
    limit: AtomicUsize,
    others: AtomicUsize,
}

/// How long a report (first byte, end of a request) may wait for a wake-up of the loop:
/// it rides along with the next decision's, or this timer's. One wake less per event.
const LAZY_WAKE: Duration = Duration::from_micros(1500);

impl Shared {
    /// Queues an event; a decision wakes the loop at once, a report within LAZY_WAKE.
    fn push(&self, ev: Event) {
        let urgent = matches!(ev, Event::Decide { .. });
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(ev);
        if urgent {
            self.wake_now();
        } else if !self.notified.load(Ordering::Acquire) {
            self.lazy.notify_one();
        }
    }

    fn wake_now(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let _ = (&self.wake).write(b"!"); // non-blocking; a full buffer already wakes the loop
        }
    }

    async fn lazy_waker(self: Arc<Self>) {
        loop {
            self.lazy.notified().await;
            tokio::time::sleep(LAZY_WAKE).await;
            self.wake_now();
        }
    }

    /// The front's own decision for a completion, when the installed table covers it.
    fn decide(&self, path: &str, query: Option<&str>, headers: &HeaderMap, body: &Bytes) -> Option<(u64, table::Decided)> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit > 0 && self.live.load(Ordering::Relaxed) + self.others.load(Ordering::Relaxed) >= limit {
            return None; // near the limit Python decides: it sheds with 503 + Retry-After
        }
        let t = self.table.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        let d = table::decide(&t, &self.ids, path, query, headers, body)?;
        Some((t.version, d))
    }

    fn wait(&self, tx: oneshot::Sender<Decision>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        id
    }

    fn forget(&self, id: u64) {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    fn answer(&self, id: u64, d: Decision) -> bool {
        let tx = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        match tx {
            Some(tx) => tx.send(d).is_ok(),
            None => false,
        }
    }
}

fn opt(s: f64) -> Option<Duration> {
    (s >= 0.0 && s.is_finite()).then(|| Duration::from_secs_f64(s))
}

fn header_lines(block: &[u8]) -> PyResult<Vec<(HeaderName, HeaderValue)>> {
    let mut out = Vec::new();
    for line in block.split(|c| *c == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let colon = line.iter().position(|c| *c == b':').ok_or_else(|| PyValueError::new_err("header line without ':'"))?;
        let name = HeaderName::from_bytes(&line[..colon]).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let value = line[colon + 1..].trim_ascii();
        out.push((name, HeaderValue::from_bytes(value).map_err(|e| PyValueError::new_err(e.to_string()))?));
    }
    Ok(out)
}

fn parse_header_block(block: &[u8]) -> PyResult<HeaderMap> {
    let mut h = HeaderMap::new();
    for (k, v) in header_lines(block)? {
        h.append(k, v);
    }
    Ok(h)
}

/// One worker's front server. `Front(host, port, uds, threads, max_body, pool_size)` binds
/// host:port (SO_REUSEPORT) and serves on its own tokio runtime (`threads` threads).
#[pyclass(module = "kthena_router._core")]
pub struct Front {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    close: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    fd: i32,
}

#[pymethods]
impl Front {
    #[new]
    #[pyo3(signature = (host, port, uds, threads=1, max_body=33554432, pool_size=512))]
    fn new(host: &str, port: u16, uds: PathBuf, threads: usize, max_body: usize, pool_size: usize) -> PyResult<Self> {
        let listener = server::bind(host, port).map_err(|e| PyOSError::new_err(format!("cannot bind {host}:{port}: {e}")))?;
        let (mine, theirs) = StdUnixStream::pair()?;
        mine.set_nonblocking(true)?;
        theirs.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            events: Mutex::new(Vec::new()),
            notified: AtomicBool::new(false),
            wake: mine,
            lazy: tokio::sync::Notify::new(),
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            pool: pool::Pool::new(pool_size),
            uds_path: uds,
            uds: slow::UdsPool::default(),
            max_body,
            table: RwLock::new(None),
            ids: table::Ids::default(),
            live: AtomicUsize::new(0),
            limit: AtomicUsize::new(0),
            others: AtomicUsize::new(0),
        });
        let rt = if threads <= 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()?
        } else {
            tokio::runtime::Builder::new_multi_thread().worker_threads(threads).thread_name("kthena-front").enable_all().build()?
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (close_tx, close_rx) = oneshot::channel::<()>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new().name("kthena-front".into()).spawn(move || {
            rt.block_on(async move {
                tokio::spawn(sh.clone().lazy_waker());
                tokio::spawn(server::serve(sh, listener, stop_rx));
                let _ = close_rx.await; // connections keep being served until close()
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(Front {
            shared,
            stop: stop_tx,
            close: Mutex::new(Some(close_tx)),
            thread: Mutex::new(Some(thread)),
            fd: theirs.into_raw_fd(),
        })
    }

    /// The loop's end of the wake-up socket pair (the caller owns it: wrap it in a socket).
    #[getter]
    fn wake_fd(&self) -> i32 {
        self.fd
    }

    /// Every queued event, oldest first: `(0, id, path, query, headers, body)` for a decision,
    /// `(1, id, status, error, attempts, duration, ttft, att_ttft, tpot, prompt, completion, events)`
    /// for a finished fast-path request, `(2, id, attempts)` when a stream's first event is in hand,
    /// `(3, id, endpoint, events)` every `stream::COUNT_INTERVAL` of a running stream,
    /// `(5, id)` at a stream's first event when its plan asked (`fast`'s `first_token_event`),
    /// `(4, id, version, model, target, order, stream, chat, request_id, age, sched)` for a request
    /// the front decided itself (`install`), `age` seconds ago; `sched`: None (rotation) or the
    /// scheduler's `(hashes or None, prompt bytes, match s, schedule s, best match share or -1,
    /// blocks added to the chosen endpoint's pending prefill work or -1)`.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.shared.notified.store(false, Ordering::Release);
        let events = std::mem::take(&mut *self.shared.events.lock().unwrap_or_else(|e| e.into_inner()));
        let out = PyList::empty(py);
        for ev in events {
            let t = match ev {
                Event::Dispatched { id, version, model, target, order, stream, chat, request_id, at, sched } => PyTuple::new(py, [
                    4u8.into_pyobject(py)?.into_any(),
                    id.into_pyobject(py)?.into_any(),
                    version.into_pyobject(py)?.into_any(),
                    model.into_pyobject(py)?.into_any(),
                    target.into_pyobject(py)?.into_any(),
                    order.into_pyobject(py)?.into_any(),
                    stream.into_pyobject(py)?.to_owned().into_any(),
                    chat.into_pyobject(py)?.to_owned().into_any(),
                    request_id.into_pyobject(py)?.into_any(),
                    at.elapsed().as_secs_f64().into_pyobject(py)?.into_any(),
                    match sched {
                        None => py.None().into_bound(py),
                        Some(s) => PyTuple::new(py, [
                            match s.hashes {
                                None => py.None().into_bound(py),
                                Some(h) => Bound::new(py, BlockHashes::from_vec(h))?.into_any(),
                            },
                            s.prompt_bytes.into_pyobject(py)?.into_any(),
                            s.match_s.into_pyobject(py)?.into_any(),
                            s.schedule_s.into_pyobject(py)?.into_any(),
                            s.best.into_pyobject(py)?.into_any(),
                            s.pending.into_pyobject(py)?.into_any(),
                        ])?.into_any(),
                    },
                ])?,
                Event::Decide { id, path, query, headers, body } => PyTuple::new(py, [
                    0u8.into_pyobject(py)?.into_any(),
                    id.into_pyobject(py)?.into_any(),
                    path.into_pyobject(py)?.into_any(),
                    PyBytes::new(py, &query).into_any(),
                    headers.into_pyobject(py)?.into_any(),
                    PyBytes::new(py, &body).into_any(),
                ])?,
                Event::FirstByte { id, attempts } => PyTuple::new(py, [
                    2u8.into_pyobject(py)?.into_any(),
                    id.into_pyobject(py)?.into_any(),
                    attempts.into_pyobject(py)?.into_any(),
                ])?,
                Event::FirstToken { id } => PyTuple::new(py, [
                    5u8.into_pyobject(py)?.into_any(),
                    id.into_pyobject(py)?.into_any(),
                ])?,
                Event::Progress { id, endpoint, events } => PyTuple::new(py, [
                    3u8.into_pyobject(py)?.into_any(),
                    id.into_pyobject(py)?.into_any(),
                    endpoint.into_pyobject(py)?.into_any(),
                    events.into_pyobject(py)?.into_any(),
                ])?,
                Event::Done { id, status, error, attempts, duration, ttft, att_ttft, tpot, prompt, completion, events } => {
                    PyTuple::new(py, [
                        1u8.into_pyobject(py)?.into_any(),
                        id.into_pyobject(py)?.into_any(),
                        status.into_pyobject(py)?.into_any(),
                        error.into_pyobject(py)?.into_any(),
                        attempts.into_pyobject(py)?.into_any(),
                        duration.into_pyobject(py)?.into_any(),
                        ttft.into_pyobject(py)?.into_any(),
                        att_ttft.into_pyobject(py)?.into_any(),
                        tpot.into_pyobject(py)?.into_any(),
                        prompt.into_pyobject(py)?.into_any(),
                        completion.into_pyobject(py)?.into_any(),
                        events.into_pyobject(py)?.into_any(),
                    ])?
                }
            };
            out.append(t)?;
        }
        Ok(out)
    }

    /// Fast path for request `id`: attempts go to `addrs[i]` ("ip:port") with Host `hosts[i]`,
    /// in order, while no byte reached the client. `timeouts`: (connect, response, firstToken,
    /// idle, total, poolWait, retryInterval) in seconds, negative = none;
    /// `first_token_event`: report a stream's first event (`drain`'s kind 5). False when the
    /// client has gone meanwhile (the caller undoes its accounting).
    #[pyo3(signature = (id, addrs, hosts, target, headers, body, stream, hide_usage, timeouts, max_buffered, request_id, first_token_event=false))]
    #[allow(clippy::too_many_arguments)]
    fn fast(&self, id: u64, addrs: Vec<String>, hosts: Vec<String>, target: &str, headers: &[u8], body: &[u8],
            stream: bool, hide_usage: bool, timeouts: (f64, f64, f64, f64, f64, f64, f64), max_buffered: usize,
            request_id: &str, first_token_event: bool) -> PyResult<bool> {
        if addrs.is_empty() || addrs.len() != hosts.len() {
            return Err(PyValueError::new_err("addrs and hosts: one each per attempt"));
        }
        let hosts = hosts
            .iter()
            .map(|h| HeaderValue::from_str(h).map_err(|e| PyValueError::new_err(e.to_string())))
            .collect::<PyResult<Vec<_>>>()?;
        let plan = Plan {
            addrs,
            hosts,
            target: target.parse().map_err(|e: http::uri::InvalidUri| PyValueError::new_err(e.to_string()))?,
            headers: parse_header_block(headers)?,
            body: Bytes::copy_from_slice(body),
            stream,
            hide_usage,
            connect: opt(timeouts.0).unwrap_or(Duration::from_secs(3600)),
            response: opt(timeouts.1),
            first_token: opt(timeouts.2),
            idle: opt(timeouts.3),
            total: opt(timeouts.4),
            pool_wait: opt(timeouts.5).unwrap_or(Duration::ZERO),
            retry_interval: opt(timeouts.6).unwrap_or(Duration::ZERO),
            max_buffered,
            request_id: HeaderValue::from_str(request_id).map_err(|e| PyValueError::new_err(e.to_string()))?,
            first_token_event,
        };
        Ok(self.shared.answer(id, Decision::Fast(Box::new(plan))))
    }

    /// Installs the table of models the front decides alone (kthena_router/front/table.py):
    /// `models`: (name, [(cumulative weight, server index)], total weight, the JSON upstream
    /// model name when it differs from the client's, the prefix seed per target); `servers`:
    /// (addrs, hosts, retry attempts (negative: the default), default retry endpoints, extra
    /// header lines, timeouts as in `fast`, max buffered bytes, None (round-robin) or the
    /// scheduler's (Scorer, endpoint id per endpoint), the round-robin position Python's
    /// balancer shares (None: the front's own)); `prefix`: the scheduler's prefix index
    /// and (block size, max blocks, balance misses, pending cost), if a prefix plugin scores;
    /// pending cost (prefill-cost): the chosen endpoint's uncached blocks are added to its
    /// pending work, and a stream reports its first event (`drain`'s kind 5). Servers start
    /// not calm (`calm`).
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (version, models, servers, prefix=None))]
    fn install(&self, version: u64, models: Vec<(String, Vec<(u64, u32)>, u64, Option<Vec<u8>>, Vec<u64>)>,
               servers: Vec<(Vec<String>, Vec<String>, i64, usize, Vec<u8>, (f64, f64, f64, f64, f64, f64, f64), usize,
                             Option<(Bound<'_, Scorer>, Vec<u32>)>, Option<Bound<'_, Rotation>>)>,
               prefix: Option<(Bound<'_, PrefixIndex>, usize, usize, bool, bool)>) -> PyResult<()> {
        let mut built = Vec::with_capacity(servers.len());
        for (addrs, hosts, retries, default_retry, extra, t, max_buffered, sched, rotation) in servers {
            if addrs.len() != hosts.len() {
                return Err(PyValueError::new_err("addrs and hosts: one each per endpoint"));
            }
            let hosts = hosts
                .iter()
                .map(|h| HeaderValue::from_str(h).map_err(|e| PyValueError::new_err(e.to_string())))
                .collect::<PyResult<Vec<_>>>()?;
            let lines = header_lines(&extra)?;
            let timeouts = (opt(t.0).unwrap_or(Duration::from_secs(3600)), opt(t.1), opt(t.2), opt(t.3), opt(t.4),
                            opt(t.5).unwrap_or(Duration::ZERO), opt(t.6).unwrap_or(Duration::ZERO));
            let sched = match sched {
                None => None,
                Some((scorer, ids)) => {
                    if ids.len() != addrs.len() {
                        return Err(PyValueError::new_err("scheduler ids: one per endpoint"));
                    }
                    Some(table::Sched { scorer: scorer.borrow().shared(), ids })
                }
            };
            built.push(table::Server::new(addrs, hosts, (retries >= 0).then_some(retries as usize), default_retry, lines,
                                          timeouts, max_buffered, sched,
                                          rotation.map(|r| r.get().shared()).unwrap_or_default()));
        }
        let mut by_name = HashMap::with_capacity(models.len());
        for (i, (name, targets, total, rewrite, seeds)) in models.into_iter().enumerate() {
            if targets.is_empty() || targets.iter().any(|(_, s)| *s as usize >= built.len()) || seeds.len() != targets.len() {
                return Err(PyValueError::new_err(format!("model {name:?}: a target without its server or seed")));
            }
            by_name.insert(name, (i as u32, table::Model { targets, total, rewrite: rewrite.map(Bytes::from), seeds }));
        }
        let prefix = match prefix {
            None => None,
            Some((_, 0, _, _, _)) => return Err(PyValueError::new_err("block_size must be positive")),
            Some((index, block_size, max_blocks, balance_misses, pending_cost)) => Some(table::Prefix {
                index: index.borrow().shared(), block_size, max_blocks, balance_misses, pending_cost,
            }),
        };
        let t = table::Table { version, models: by_name, servers: built, prefix };
        *self.shared.table.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(t));
        Ok(())
    }

    /// Which servers of the installed table `version` the front may decide for.
    fn calm(&self, version: u64, flags: Vec<bool>) {
        if let Some(t) = self.shared.table.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if t.version == version {
                t.set_calm(&flags);
            }
        }
    }

    /// No table: every completion asks Python again.
    fn uninstall(&self) {
        *self.shared.table.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The worker's admission limit (0: none) and its requests in flight besides the fast path's.
    fn admission(&self, limit: usize, others: usize) {
        self.shared.limit.store(limit, Ordering::Relaxed);
        self.shared.others.store(others, Ordering::Relaxed);
    }

    /// Fast-path requests running now (the ones the front decided included).
    fn live(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Slow path for request `id`: forwarded unchanged to the full app (granian's socket).
    fn slow(&self, id: u64) -> bool {
        self.shared.answer(id, Decision::Slow)
    }

    /// An immediate answer for request `id` (a JSON body).
    #[pyo3(signature = (id, status, body, headers=Vec::new()))]
    fn reply(&self, id: u64, status: u16, body: &[u8], headers: Vec<(String, String)>) -> PyResult<bool> {
        let mut hs = Vec::with_capacity(headers.len());
        for (k, v) in headers {
            hs.push((
                HeaderName::from_bytes(k.as_bytes()).map_err(|e| PyValueError::new_err(e.to_string()))?,
                HeaderValue::from_str(&v).map_err(|e| PyValueError::new_err(e.to_string()))?,
            ));
        }
        Ok(self.shared.answer(id, Decision::Reply(status, Bytes::copy_from_slice(body), hs)))
    }

    /// Requests waiting for a decision (they are answered slow path if Python goes away).
    fn waiting(&self) -> usize {
        self.shared.waiting.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Stops accepting connections; open ones are still served.
    fn stop_accepting(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops the runtime (in-flight fast-path requests end); waits for its thread.
    fn close(&self, py: Python<'_>) {
        let _ = self.stop.send(true);
        if let Some(tx) = self.close.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(());
        }
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            py.allow_threads(move || {
                let _ = h.join();
            });
        }
    }
}
