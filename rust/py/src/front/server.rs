//! The public listener (SO_REUSEPORT, TCP_NODELAY) and the per-request choice: chat and
//! text completions ask Python for a decision (fast path, slow path or an error); every
//! other request goes unchanged to granian's unix socket (slow path).

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use socket2::{Domain, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::time::{timeout, Instant};

use super::body::{error_json, ReqBody, RespBody, BAD_BODY};
use super::{fast, slow, Decision, Event, Shared};

pub const FAST_PATHS: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

/// A bound, listening socket (std), made before the runtime starts so that errors reach Python.
pub fn bind(host: &str, port: u16) -> std::io::Result<std::net::TcpListener> {
    let addr: SocketAddr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"))?;
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?; // every worker binds: the kernel spreads connections
    sock.set_nodelay(true)?; // Linux copies it to accepted sockets; set again per socket anyway
    sock.bind(&addr.into())?;
    sock.listen(2048)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

pub async fn serve(shared: Arc<Shared>, listener: std::net::TcpListener, mut stop: watch::Receiver<bool>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(_) => return,
    };
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => r,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let sh = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(sh.clone(), req));
            let _ = server_http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

fn json(status: StatusCode, body: Bytes) -> Response<RespBody> {
    let mut r = Response::new(RespBody::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|c| *c as char).collect()
}

/// Bytes past the limit read and dropped before the 413 goes out: closing a connection with
/// unread input sends a TCP reset, which can destroy the 413 before a client still sending
/// reads it (proxy/body.py's DRAIN_BYTES, as Go's net/http). A body that ends within it
/// leaves the connection reusable.
const DRAIN_BYTES: usize = 1 << 20;
/// A longer body is read and dropped after the 413 (`Connection: close`), as nginx's
/// lingering close: clients that send the whole body before reading (most SDKs) then get
/// the 413 rather than a reset. Bounded in time, as nginx's lingering_time/_timeout.
const LINGER_TOTAL: Duration = Duration::from_secs(30);
const LINGER_IDLE: Duration = Duration::from_secs(5);

enum BodyError {
    /// Longer than the limit: the body, with the bytes read so far.
    TooLarge(Incoming, usize),
    /// Broken framing, or the connection closed.
    Broken,
}

/// The whole body within `max` bytes.
async fn read_limited(mut body: Incoming, max: usize) -> Result<Bytes, BodyError> {
    let mut first: Option<Bytes> = None; // a one-frame body goes on uncopied
    let mut buf = BytesMut::new();
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyError::Broken)?.into_data() else { continue };
        size += data.len();
        if size > max {
            return Err(BodyError::TooLarge(body, size));
        }
        if let Some(f) = first.take() {
            buf.extend_from_slice(&f);
        }
        if buf.is_empty() {
            first = Some(data);
        } else {
            buf.extend_from_slice(&data);
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

/// Reads and drops the rest of `body`, at most `budget` bytes: whether it ended (or broke).
async fn drain(body: &mut Incoming, mut budget: usize) -> bool {
    loop {
        match body.frame().await {
            Some(Ok(f)) => {
                let n = f.into_data().map_or(0, |d| d.len());
                if n > budget {
                    return false;
                }
                budget -= n;
            }
            _ => return true,
        }
    }
}

async fn linger(mut body: Incoming) {
    let _ = timeout(LINGER_TOTAL, async {
        while let Ok(Some(Ok(_))) = timeout(LINGER_IDLE, body.frame()).await {}
    })
    .await;
}

/// The 413 for a body over the limit (`seen` bytes of it read so far), answered here rather
/// than by the full app: a worker that refuses a body mid-upload breaks the relay's write,
/// which would surface as a 503.
async fn too_large(max: usize, mut body: Incoming, seen: usize, declared: Option<usize>) -> Response<RespBody> {
    let budget = (max + DRAIN_BYTES).saturating_sub(seen);
    let ended = declared.is_none_or(|n| n <= max + DRAIN_BYTES) && drain(&mut body, budget).await;
    let msg = format!("request body exceeds the router's limit ({max} bytes)");
    let mut r = json(StatusCode::PAYLOAD_TOO_LARGE, error_json(413, &msg, 413.into()));
    if !ended {
        r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        tokio::spawn(linger(body));
    }
    r
}

/// Removes the waiting entry when the client leaves before Python has answered.
struct Waiting<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.shared.forget(self.id);
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<RespBody>, Infallible> {
    let t0 = Instant::now();
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if declared.is_some_and(|n| n > shared.max_body) {
        return Ok(too_large(shared.max_body, req.into_body(), 0, declared).await);
    }
    let fast = req.method() == Method::POST && FAST_PATHS.contains(&req.uri().path());
    // A chunked body is read here, within the limit, even for the full app: see too_large.
    if !fast && (declared.is_some() || req.body().is_end_stream()) {
        return Ok(slow::forward(&shared, req.map(ReqBody::Stream)).await);
    }
    let (parts, body) = req.into_parts();
    let raw = match read_limited(body, shared.max_body).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(body, seen)) => return Ok(too_large(shared.max_body, body, seen, None).await),
        Err(BodyError::Broken) => return Ok(json(StatusCode::BAD_REQUEST, error_json(400, BAD_BODY, 400.into()))),
    };
    if !fast {
        return Ok(slow::forward(&shared, Request::from_parts(parts, ReqBody::Full(Some(raw)))).await);
    }
    let path = parts.uri.path();
    if let Some((version, d)) = shared.decide(path, parts.uri.query(), &parts.headers, &raw) {
        let id = shared.next.fetch_add(1, Ordering::Relaxed);
        shared.push(Event::Dispatched {
            id,
            version,
            model: d.model,
            target: d.target,
            order: d.order,
            stream: d.stream,
            chat: path == FAST_PATHS[0],
            request_id: d.request_id,
            at: Instant::now(),
            sched: d.sched,
        });
        return Ok(fast::run(shared.clone(), id, d.plan, t0).await);
    }
    let (tx, rx) = oneshot::channel();
    let id = shared.wait(tx);
    let headers = parts.headers.iter().map(|(k, v)| (k.as_str().to_string(), latin1(v.as_bytes()))).collect();
    shared.push(Event::Decide {
        id,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").as_bytes().to_vec(),
        headers,
        body: raw.clone(),
    });
    let waiting = Waiting { shared: &shared, id };
    let decision = rx.await;
    drop(waiting);
    Ok(match decision {
        Ok(Decision::Fast(plan)) => fast::run(shared.clone(), id, *plan, t0).await,
        Ok(Decision::Reply(status, body, headers)) => {
            let mut r = json(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body);
            for (k, v) in headers {
                r.headers_mut().append(k, v);
            }
            r
        }
        Ok(Decision::Slow) | Err(_) => slow::forward(&shared, Request::from_parts(parts, ReqBody::Full(Some(raw)))).await,
    })
}
