//! The fast path: Python has decided (endpoints, body, headers, timeouts); the attempts,
//! the retry before the first byte and the relay of the answer happen here, with no
//! Python per chunk. Semantics follow kthena_router/proxy/executor.py, relay_sse.py and
//! relay_json.py; what the Python side needs afterwards goes back in one `Done` event.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::body::{error_json, ReqBody, RespBody};
use super::pool::{AcquireError, Conn};
use super::sse::SseObserver;
use super::stream::SseBody;
use super::{Event, Shared};

// attempt failures (kthena_router.endpoints.health.Failure, mapped in front/bridge.py)
pub const F_OK: u8 = 0;
pub const F_CONNECT: u8 = 1;
pub const F_TIMEOUT: u8 = 2;
pub const F_DIED: u8 = 3;
pub const F_HTTP_5XX: u8 = 4;
pub const F_INVALID: u8 = 5;
// request error kinds (error_type label, mapped in front/bridge.py)
pub const E_NONE: u8 = 0;
pub const E_CLIENT_DISCONNECT: u8 = 1;
pub const E_AFTER_FIRST_BYTE: u8 = 2;
pub const E_UPSTREAM_4XX: u8 = 3;
pub const E_FAILED: u8 = 4;
pub const E_TOO_LARGE: u8 = 5;
pub const E_POOL_EXHAUSTED: u8 = 6;

const MAX_ERROR_BODY: usize = 1 << 16;

pub struct Plan {
    pub addrs: Vec<String>,
    pub hosts: Vec<HeaderValue>,
    pub target: http::Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub stream: bool,
    pub hide_usage: bool,
    pub connect: Duration,
    pub response: Option<Duration>,
    pub first_token: Option<Duration>,
    pub idle: Option<Duration>,
    pub total: Option<Duration>,
    pub pool_wait: Duration,
    pub retry_interval: Duration,
    pub max_buffered: usize,
    pub request_id: HeaderValue,
    /// Report the stream's first event to Python ([`Event::FirstToken`]): prefill-cost's
    /// pending work ends there. Off otherwise (one event less per request).
    pub first_token_event: bool,
}

/// What Python learns when the request ends; sent on drop, so a request the client
/// abandoned (the service future dropped) is reported too.
pub struct Outcome {
    shared: Arc<Shared>,
    pub id: u64,
    t0: Instant,
    att_t0: Instant,
    pub status: u16,
    pub error: u8,
    pub attempts: Vec<(u32, u8)>,
    pub ttft: f64,
    pub att_ttft: f64,
    pub tpot: f64,
    pub prompt: i64,
    pub completion: i64,
    pub events: u64,
}

impl Drop for Outcome {
    fn drop(&mut self) {
        self.shared.live.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.shared.push(Event::Done {
            id: self.id,
            status: self.status,
            error: self.error,
            attempts: std::mem::take(&mut self.attempts),
            duration: self.t0.elapsed().as_secs_f64(),
            ttft: self.ttft,
            att_ttft: self.att_ttft,
            tpot: self.tpot,
            prompt: self.prompt,
            completion: self.completion,
            events: self.events,
        });
    }
}

impl Outcome {
    fn fail_last(&mut self, code: u8) {
        if let Some(a) = self.attempts.last_mut() {
            a.1 = code;
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

enum Read {
    Data(Bytes),
    End,
    Broken,
    Timeout,
}

async fn read_data(body: &mut Incoming, until: Option<Instant>) -> Read {
    loop {
        let r = match until {
            Some(t) => match tokio::time::timeout_at(t, body.frame()).await {
                Ok(r) => r,
                Err(_) => return Read::Timeout,
            },
            None => body.frame().await,
        };
        match r {
            None => return Read::End,
            Some(Err(_)) => return Read::Broken,
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    if !d.is_empty() {
                        return Read::Data(d);
                    }
                }
            }
        }
    }
}

pub fn secs(d: Option<Duration>) -> String {
    format!("{}", d.map_or(0.0, |d| d.as_secs_f64()))
}

/// What a timeout means: the request's total timeout when its deadline was the bound that
/// fired (`phase_at`: the phase's own bound), else the phase's (relay.py timeout_detail).
pub fn timeout_detail(total: Option<Duration>, deadline: Option<Instant>, phase_at: Option<Instant>, phase: String) -> String {
    match deadline {
        Some(d) if phase_at.is_none_or(|p| d <= p) => format!("the request's total timeout ({}s) passed", secs(total)),
        _ => phase,
    }
}

pub fn error_response(status: u16, message: &str, code: serde_json::Value, rid: &HeaderValue) -> Response<RespBody> {
    let mut r = Response::new(RespBody::full(error_json(status, message, code)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(HeaderName::from_static("x-request-id"), rid.clone());
    r
}

/// The engine's response headers for the client: hop-by-hop ones (and those Connection
/// names), Content-Length, x-request-id, Date and Server stay behind (proxy/headers.py).
fn client_headers(up: &HeaderMap, rid: &HeaderValue) -> HeaderMap {
    let named: Vec<String> = up
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()).collect::<Vec<_>>())
        .collect();
    let mut out = HeaderMap::with_capacity(up.len() + 1);
    for (k, v) in up.iter() {
        let n = k.as_str();
        let drop = matches!(
            n,
            "connection" | "keep-alive" | "proxy-authenticate" | "proxy-authorization" | "proxy-connection" | "te"
                | "trailer" | "transfer-encoding" | "upgrade" | "content-length" | "x-request-id" | "date" | "server"
        ) || named.iter().any(|m| m == n);
        if !drop {
            out.append(k.clone(), v.clone());
        }
    }
    out.insert(HeaderName::from_static("x-request-id"), rid.clone());
    out
}

fn encoded(h: &HeaderMap) -> bool {
    h.get(CONTENT_ENCODING).is_some_and(|v| {
        let v = v.as_bytes();
        !v.is_empty() && !v.eq_ignore_ascii_case(b"identity")
    })
}

enum Step {
    Fail(u8, String),
    Reply(Response<RespBody>),
    Stream(Box<StreamStart>),
}

struct StreamStart {
    headers: HeaderMap,
    body: Incoming,
    conn: Conn,
    addr: String,
    obs: SseObserver,
    first: Bytes,
}

/// Runs the attempts of one request; the response for the client.
pub async fn run(shared: Arc<Shared>, id: u64, plan: Plan, t0: Instant) -> Response<RespBody> {
    shared.live.fetch_add(1, std::sync::atomic::Ordering::Relaxed); // back in Outcome's drop
    let mut out = Outcome {
        shared: shared.clone(), id, t0, att_t0: t0, status: 499, error: E_CLIENT_DISCONNECT, attempts: Vec::new(),
        ttft: -1.0, att_ttft: -1.0, tpot: -1.0, prompt: -1, completion: -1, events: 0,
    };
    let deadline = plan.total.map(|d| t0 + d);
    let mut last: Option<(u8, String)> = None;
    for i in 0..plan.addrs.len() {
        if i > 0 {
            if deadline.is_some_and(|d| Instant::now() + plan.retry_interval >= d) {
                break; // no time left for another attempt
            }
            if !plan.retry_interval.is_zero() {
                tokio::time::sleep(plan.retry_interval).await;
            }
        }
        out.attempts.push((i as u32, F_OK));
        match attempt(&shared, &plan, i, deadline, &mut out).await {
            Step::Fail(code, detail) => {
                out.fail_last(code);
                last = Some((code, detail));
            }
            Step::Reply(r) => return r,
            Step::Stream(s) => return start_stream(shared, *s, out, &plan, deadline),
        }
    }
    let tried = out.attempts.len();
    out.error = E_FAILED;
    let (status, msg) = match last {
        None => (503, "no healthy endpoint for the model".to_string()),
        Some((F_TIMEOUT, d)) => (504, format!("upstream timed out: {d} ({tried} attempt(s))")),
        Some((_, d)) => (502, format!("upstream request failed ({d}; {tried} attempt(s))")),
    };
    out.status = status;
    error_response(status, &msg, status.into(), &plan.request_id)
}

fn request(plan: &Plan, i: usize) -> Request<ReqBody> {
    let mut req = Request::new(ReqBody::Full(Some(plan.body.clone())));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = plan.target.clone();
    let h = req.headers_mut();
    *h = plan.headers.clone();
    h.insert(HOST, plan.hosts[i].clone());
    h.insert(CONTENT_LENGTH, HeaderValue::from(plan.body.len()));
    req
}

async fn attempt(shared: &Arc<Shared>, plan: &Plan, i: usize, deadline: Option<Instant>, out: &mut Outcome) -> Step {
    let addr = &plan.addrs[i];
    let start = Instant::now();
    out.att_t0 = start;
    let response_at = plan.response.map(|d| start + d);
    let left = deadline.map(|d| d.saturating_duration_since(start));
    let mut connect = plan.connect;
    for bound in [left, plan.response].into_iter().flatten() {
        connect = connect.min(bound);
    }
    let wait = left.map_or(plan.pool_wait, |l| l.min(plan.pool_wait));
    let mut fresh = false;
    loop {
        let mut conn = match shared.pool.acquire(addr, connect, wait, fresh).await {
            Ok(c) => c,
            Err(AcquireError::Timeout) => {
                return Step::Fail(F_TIMEOUT, format!("connect timeout ({}s)", connect.as_secs_f64()))
            }
            Err(AcquireError::Connect(m)) => return Step::Fail(F_CONNECT, m),
            Err(AcquireError::Exhausted(n)) => {
                out.status = 503;
                out.error = E_POOL_EXHAUSTED;
                let msg = format!("the router is overloaded: no free upstream connection within {}s ({n} in use); retry later",
                                  wait.as_secs_f64());
                return Step::Reply(error_response(503, &msg, "pool_exhausted".into(), &plan.request_id));
            }
        };
        let first_at = if plan.stream { plan.first_token.map(|d| Instant::now() + d) } else { None };
        let head_at = earliest(earliest(response_at, first_at), deadline);
        let fut = conn.sender.send_request(request(plan, i));
        let res = match head_at {
            Some(t) => match tokio::time::timeout_at(t, fut).await {
                Ok(r) => r,
                Err(_) => {
                    let phase = if first_at.is_some() && (response_at.is_none() || first_at < response_at) {
                        format!("no first token within firstToken ({}s)", secs(plan.first_token))
                    } else {
                        format!("no response headers within the response timeout ({}s)", secs(plan.response))
                    };
                    let phase_at = earliest(response_at, first_at);
                    return Step::Fail(F_TIMEOUT, timeout_detail(plan.total, deadline, phase_at, phase));
                }
            },
            None => fut.await,
        };
        let resp = match res {
            Ok(r) => r,
            Err(e) => {
                // a kept-alive connection the engine closed meanwhile: once more on a new one
                if conn.reused && !fresh {
                    fresh = true;
                    continue;
                }
                let _ = e;
                return Step::Fail(F_DIED, "connection lost before the response".into());
            }
        };
        return after_head(shared, plan, addr, conn, resp, first_at, deadline, out).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn after_head(shared: &Arc<Shared>, plan: &Plan, addr: &str, conn: Conn, resp: Response<Incoming>,
                    first_at: Option<Instant>, deadline: Option<Instant>, out: &mut Outcome) -> Step {
    let status = resp.status().as_u16();
    // stall tracking ends at the response head, as in proxy/executor.py: an engine sends a
    // stream's head when it accepts the request, so a long queue before the first token
    // (a busy engine, not a stalled one) does not count against it
    shared.push(Event::FirstByte { id: out.id, attempts: out.attempts.clone() });
    let (parts, mut body) = resp.into_parts();
    if status >= 500 {
        let mut n = 0usize;
        loop {
            match read_data(&mut body, earliest(plan.idle.map(|d| Instant::now() + d), deadline)).await {
                Read::Data(d) => {
                    n += d.len();
                    if n > MAX_ERROR_BODY {
                        break;
                    }
                }
                Read::End => {
                    shared.pool.release(addr, conn);
                    break;
                }
                _ => break,
            }
        }
        return Step::Fail(F_HTTP_5XX, format!("upstream HTTP {status}"));
    }
    let is_sse = parts.headers.get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let enc = encoded(&parts.headers);
    if status == 200 && plan.stream && is_sse && !enc {
        let mut obs = SseObserver::new(plan.hide_usage);
        let until = earliest(first_at, deadline);
        loop {
            match read_data(&mut body, until).await {
                Read::Data(chunk) => match obs.feed(chunk) {
                    Err(e) => return Step::Fail(F_INVALID, format!("invalid stream from upstream: {}", e.0)),
                    Ok(b) if !b.is_empty() => {
                        let headers = client_headers(&parts.headers, &plan.request_id);
                        return Step::Stream(Box::new(StreamStart { headers, body, conn, addr: addr.to_string(), obs, first: b }));
                    }
                    Ok(_) => {}
                },
                Read::End => return Step::Fail(F_DIED, "upstream closed the stream before the first event".into()),
                Read::Broken => return Step::Fail(F_DIED, "upstream stream broke before the first event".into()),
                Read::Timeout => {
                    let phase = format!("no first token within firstToken ({}s)", secs(plan.first_token));
                    return Step::Fail(F_TIMEOUT, timeout_detail(plan.total, deadline, first_at, phase));
                }
            }
        }
    }
    // buffered: the whole body, checked, then one send
    let mut buf = BytesMut::new();
    loop {
        let idle_at = plan.idle.map(|d| Instant::now() + d);
        match read_data(&mut body, earliest(idle_at, deadline)).await {
            Read::Data(d) => {
                if buf.len() + d.len() > plan.max_buffered {
                    out.status = 502;
                    out.error = E_TOO_LARGE;
                    let msg = format!("the upstream reply exceeds the router's buffered-reply limit (maxBufferedResponseBytes: {} bytes); ask for a smaller reply or stream it", plan.max_buffered);
                    return Step::Reply(error_response(502, &msg, "response_too_large".into(), &plan.request_id));
                }
                buf.extend_from_slice(&d);
            }
            Read::End => break,
            Read::Broken => return Step::Fail(F_DIED, "response body incomplete".into()),
            Read::Timeout => {
                let phase = format!("response body stalled beyond the idle timeout ({}s)", secs(plan.idle));
                return Step::Fail(F_TIMEOUT, timeout_detail(plan.total, deadline, idle_at, phase));
            }
        }
    }
    shared.pool.release(addr, conn);
    let data = buf.freeze();
    if status == 200 && !enc {
        match serde_json::from_slice::<serde_json::Value>(&data) {
            Ok(serde_json::Value::Object(o)) => {
                if let Some(serde_json::Value::Object(u)) = o.get("usage") {
                    out.prompt = u.get("prompt_tokens").and_then(|v| v.as_i64()).unwrap_or(-1);
                    out.completion = u.get("completion_tokens").and_then(|v| v.as_i64()).unwrap_or(-1);
                }
            }
            Ok(_) => {}
            Err(_) => return Step::Fail(F_INVALID, "invalid JSON from upstream".into()),
        }
    }
    out.status = status;
    out.error = if status >= 400 { E_UPSTREAM_4XX } else { E_NONE };
    let mut r = Response::new(RespBody::full(data));
    *r.status_mut() = parts.status;
    *r.headers_mut() = client_headers(&parts.headers, &plan.request_id);
    if status == 200 {
        out.ttft = out.t0.elapsed().as_secs_f64();
        out.att_ttft = out.att_t0.elapsed().as_secs_f64();
    }
    Step::Reply(r)
}

fn start_stream(shared: Arc<Shared>, s: StreamStart, mut out: Outcome, plan: &Plan, deadline: Option<Instant>) -> Response<RespBody> {
    out.status = 200;
    out.error = E_NONE;
    out.ttft = out.t0.elapsed().as_secs_f64();
    out.att_ttft = out.att_t0.elapsed().as_secs_f64();
    if plan.first_token_event {
        shared.push(Event::FirstToken { id: out.id });
    }
    let StreamStart { headers, body, conn, addr, obs, first } = s;
    let sse = SseBody::new(shared, body, obs, first, out, conn, addr, plan.idle, plan.total, deadline);
    let mut r = Response::new(RespBody::Sse(Box::new(sse)));
    *r.headers_mut() = headers;
    r
}
