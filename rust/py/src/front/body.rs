//! Response bodies of the front server: a whole body, a fast-path stream (stream.rs), or
//! granian's answer relayed as it comes (slow path, slow.rs).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::slow::RelayBody;
use super::stream::SseBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum RespBody {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
    Slow(Box<RelayBody>),
}

impl RespBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        RespBody::Full(Some(b.into()))
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespBody::Sse(b) => Pin::new(&mut **b).poll_frame(cx),
            RespBody::Slow(b) => Pin::new(&mut **b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Full(b) => b.is_none(),
            RespBody::Sse(b) => b.is_end_stream(),
            RespBody::Slow(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
            RespBody::Sse(_) => SizeHint::default(),
            RespBody::Slow(b) => b.size_hint(),
        }
    }
}

/// Request bodies towards an upstream: bytes in hand, or the client's body as it comes.
pub enum ReqBody {
    Full(Option<Bytes>),
    Stream(Incoming),
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ReqBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReqBody::Stream(inc) => Pin::new(inc).poll_frame(cx).map(|o| o.map(|r| r.map_err(|e| e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Full(b) => b.is_none(),
            ReqBody::Stream(inc) => inc.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Full(None) => SizeHint::with_exact(0),
            ReqBody::Stream(inc) => inc.size_hint(),
        }
    }
}

/// An OpenAI-style error body.
/// A client's request body that ended early or had broken chunked framing.
pub const BAD_BODY: &str = "request body incomplete or malformed (invalid chunked framing or connection closed)";

pub fn error_json(status: u16, message: &str, code: serde_json::Value) -> Bytes {
    let kind = match status {
        400 => "BadRequestError",
        413 => "RequestTooLargeError",
        500 => "InternalServerError",
        502 => "upstream_error",
        503 => "ServiceUnavailableError",
        504 => "upstream_timeout",
        _ => "error",
    };
    let v = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}
