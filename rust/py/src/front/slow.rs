//! The slow path: a request, unchanged, to granian's unix socket (the full app), its answer
//! relayed as it comes. Connections to the socket are kept alive and reused: one goes back
//! when granian's answer has been relayed to its end.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::body::{error_json, BoxError, ReqBody, RespBody, BAD_BODY};
use super::Shared;

const MAX_IDLE: usize = 64;

/// granian (hyper) closes a kept-alive connection that has sent no request for its header
/// read timeout (30 s by default): one taken from the pool near that moment can be closed
/// while the request is written, which no retry can undo once the body is streamed. So a
/// connection idle for longer than this is dropped instead of reused.
const MAX_IDLE_AGE: Duration = Duration::from_secs(15);

/// Idle connections, oldest first (generic so the test can pool plain values).
pub struct Pool<T> {
    idle: Mutex<Vec<(T, Instant)>>,
}

pub type UdsPool = Pool<SendRequest<ReqBody>>;

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool { idle: Mutex::new(Vec::new()) }
    }
}

impl<T> Pool<T> {
    /// The most recently used connection that is still open and young enough.
    fn take_if(&self, now: Instant, open: impl Fn(&T) -> bool) -> Option<T> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // the oldest are at the front: drop those past the age, then take the newest
        idle.retain(|(_, since)| now.saturating_duration_since(*since) < MAX_IDLE_AGE);
        while let Some((s, _)) = idle.pop() {
            if open(&s) {
                return Some(s);
            }
        }
        None
    }

    fn put_at(&self, s: T, now: Instant) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((s, now));
        }
    }
}

impl UdsPool {
    fn take(&self) -> Option<SendRequest<ReqBody>> {
        self.take_if(Instant::now(), |s| !s.is_closed())
    }

    fn put(&self, s: SendRequest<ReqBody>) {
        if !s.is_closed() {
            self.put_at(s, Instant::now());
        }
    }
}

/// granian's answer; its connection goes back to the pool at the end of the body.
pub struct RelayBody {
    inc: Incoming,
    sender: Option<SendRequest<ReqBody>>,
    shared: Arc<Shared>,
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inc).poll_frame(cx);
        if let Poll::Ready(None) = r {
            if let Some(s) = this.sender.take() {
                this.shared.uds.put(s);
            }
        }
        r.map(|o| o.map(|r| r.map_err(|e| e.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inc.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inc.size_hint()
    }
}

fn error(status: StatusCode, message: &str) -> Response<RespBody> {
    let code = status.as_u16();
    let mut r = Response::new(RespBody::full(error_json(code, message, code.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn unavailable(what: &str) -> Response<RespBody> {
    error(StatusCode::SERVICE_UNAVAILABLE, &format!("router worker unavailable ({what})"))
}

/// How long a request waits for granian's socket to listen: the front accepts from the
/// worker's lifespan on, granian listens on the socket only once the lifespan has run
/// (and again after a respawn), so the first requests can arrive before it does.
const LISTEN_WAIT: Duration = Duration::from_secs(5);

async fn connect_uds(shared: &Shared) -> Result<UnixStream, String> {
    let deadline = tokio::time::Instant::now() + LISTEN_WAIT;
    loop {
        match UnixStream::connect(&shared.uds_path).await {
            Ok(s) => return Ok(s),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound)
                && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

async fn connect(shared: &Shared) -> Result<SendRequest<ReqBody>, String> {
    let stream = connect_uds(shared).await?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

pub async fn forward(shared: &Arc<Shared>, mut req: Request<ReqBody>) -> Response<RespBody> {
    let mut reused = true;
    loop {
        let idle = if reused { shared.uds.take() } else { None };
        let mut sender = match idle {
            Some(mut s) => match tokio::time::timeout(Duration::from_millis(50), s.ready()).await {
                Ok(Ok(())) => s,
                _ => continue, // closed meanwhile: the next one
            },
            None => {
                reused = false;
                match connect(shared).await {
                    Ok(s) => s,
                    Err(e) => return unavailable(&e),
                }
            }
        };
        match sender.try_send_request(req).await {
            Ok(resp) => {
                let (parts, inc) = resp.into_parts();
                let body = RelayBody { inc, sender: Some(sender), shared: shared.clone() };
                return Response::from_parts(parts, RespBody::Slow(Box::new(body)));
            }
            Err(mut err) => match err.take_message() {
                // not sent (a kept-alive connection granian closed meanwhile): on a new one
                Some(back) if reused => {
                    req = back;
                    reused = false;
                }
                _ => {
                    let e = err.into_error();
                    // the client's body failed while it was relayed (cut short, bad chunking):
                    // the client's fault, not the worker's
                    if e.is_user() {
                        return error(StatusCode::BAD_REQUEST, BAD_BODY);
                    }
                    return unavailable(&e.to_string());
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_reuses_the_newest_open_connection_and_drops_old_ones() {
        let pool: Pool<u32> = Pool::default();
        let t0 = Instant::now();
        pool.put_at(1, t0);
        pool.put_at(2, t0 + Duration::from_secs(10));
        pool.put_at(3, t0 + Duration::from_secs(12));
        // 3 is closed: the next newest open one
        assert_eq!(pool.take_if(t0 + Duration::from_secs(13), |c| *c != 3), Some(2));
        // 1 has been idle past the age: dropped, never handed out
        assert_eq!(pool.take_if(t0 + MAX_IDLE_AGE, |_| true), None);
        pool.put_at(4, t0 + MAX_IDLE_AGE);
        assert_eq!(pool.take_if(t0 + MAX_IDLE_AGE + Duration::from_secs(1), |_| true), Some(4));
    }
}
