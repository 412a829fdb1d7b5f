//! The slow path: a request, unchanged, to granian's unix socket (the full app), its answer
//! relayed as it comes. Connections to the socket are kept alive and reused: one goes back
//! when granian's answer has been relayed to its end.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

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

#[derive(Default)]
pub struct UdsPool {
    idle: Mutex<Vec<SendRequest<ReqBody>>>,
}

impl UdsPool {
    fn take(&self) -> Option<SendRequest<ReqBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put(&self, s: SendRequest<ReqBody>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE && !s.is_closed() {
            idle.push(s);
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
