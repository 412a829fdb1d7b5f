//! A fast-path stream's body: the engine's SSE body polled directly by the client
//! connection (no relay task, no channel between them), complete events out as they come.
//!
//! After the first event (fast.rs) the rules of relay_sse.py hold: a failure ends the
//! stream with an error event and no [DONE]; the idle timeout bounds the gap between
//! reads and the total timeout all of it; a client that leaves drops this body, which
//! drops the engine's connection (the engine aborts). The outcome goes to Python once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

use super::body::{error_json, BoxError};
use super::fast::{secs, timeout_detail, Outcome, E_AFTER_FIRST_BYTE, E_CLIENT_DISCONNECT, F_DIED, F_INVALID, F_TIMEOUT};
use super::pool::Conn;
use super::sse::SseObserver;
use super::Shared;

pub struct SseBody {
    up: Option<Incoming>,
    obs: SseObserver,
    first: Option<Bytes>,
    out: Option<Outcome>,
    conn: Option<(Conn, String)>,
    shared: Arc<Shared>,
    idle: Option<Duration>,
    total: Option<Duration>,
    deadline: Option<Instant>,
    /// fires at the earliest of `idle_at` (as of when it was set) and the deadline; moved
    /// lazily (a chunk only stores the new `idle_at`)
    timer: Option<Pin<Box<Sleep>>>,
    idle_at: Option<Instant>,
    t_first: Instant,
    t_last: Instant,
    done: bool,
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl SseBody {
    #[allow(clippy::too_many_arguments)]
    pub fn new(shared: Arc<Shared>, up: Incoming, obs: SseObserver, first: Bytes, out: Outcome, conn: Conn,
               addr: String, idle: Option<Duration>, total: Option<Duration>, deadline: Option<Instant>) -> Self {
        let now = Instant::now();
        let idle_at = idle.map(|d| now + d);
        let timer = earliest(idle_at, deadline).map(|t| Box::pin(tokio::time::sleep_until(t)));
        SseBody {
            up: Some(up), obs, first: Some(first), out: Some(out), conn: Some((conn, addr)), shared, idle, total, deadline, timer,
            idle_at, t_first: now, t_last: now, done: false,
        }
    }

    /// The stream is complete: usage and TPOT to the outcome, the connection back to the pool.
    fn finish(&mut self, upstream_ended: bool) {
        self.done = true;
        if let Some(mut out) = self.out.take() {
            out.events = self.obs.events;
            if let Some((p, c)) = self.obs.usage {
                out.prompt = p.unwrap_or(-1);
                out.completion = c.unwrap_or(-1);
                if let Some(c) = c.filter(|c| *c > 1) {
                    out.tpot = (self.t_last - self.t_first).as_secs_f64() / (c - 1) as f64;
                }
            }
        }
        let Some((conn, addr)) = self.conn.take() else { return };
        let Some(mut up) = self.up.take() else { return };
        if upstream_ended || up.is_end_stream() {
            self.shared.pool.release(&addr, conn);
            return;
        }
        // [DONE] came before the body's end (its last chunk is usually on the way): read
        // the rest aside, then reuse the connection
        let shared = self.shared.clone();
        let idle = self.idle.unwrap_or(Duration::from_secs(5)).min(Duration::from_secs(5));
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            loop {
                match tokio::time::timeout(idle, up.frame()).await {
                    Ok(None) => break,
                    Ok(Some(Ok(_))) => {}
                    _ => return,
                }
            }
            shared.pool.release(&addr, conn);
        });
    }

    /// Bytes reached the client: no retry; an error event, no [DONE].
    fn fail(&mut self, code: u8, detail: &str) -> Bytes {
        self.done = true;
        self.conn = None;
        if let Some(out) = self.out.as_mut() {
            out.status = 502;
            out.error = E_AFTER_FIRST_BYTE;
            out.events = self.obs.events;
            if let Some(a) = out.attempts.last_mut() {
                a.1 = code;
            }
        }
        self.out = None;
        let msg = format!("upstream failed during the stream ({detail}); the response is incomplete");
        let mut ev = BytesMut::from(&b"data: "[..]);
        ev.extend_from_slice(&error_json(502, &msg, 502.into()));
        ev.extend_from_slice(b"\n\n");
        ev.freeze()
    }

    /// Pending unless the idle or total timeout has passed.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let Some(timer) = self.timer.as_mut() else { return false };
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = earliest(self.idle_at, self.deadline);
            match due {
                Some(t) if t > Instant::now() => timer.as_mut().reset(t), // moved since: wait on
                _ => return true,
            }
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if let Some(out) = self.out.as_mut() {
            out.status = 499; // the client left (hyper drops the body); the engine's connection goes too
            out.error = E_CLIENT_DISCONNECT;
        }
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            if this.obs.ended {
                this.finish(false);
            }
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let Some(up) = this.up.as_mut() else { return Poll::Ready(None) };
            match Pin::new(up).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    match this.obs.feed(data) {
                        Err(_) => {
                            let ev = this.fail(F_INVALID, "invalid event");
                            return Poll::Ready(Some(Ok(Frame::data(ev))));
                        }
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => {
                            let now = Instant::now();
                            this.t_last = now;
                            this.idle_at = this.idle.map(|d| now + d);
                            if this.obs.ended {
                                this.finish(false);
                            }
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                }
                Poll::Ready(Some(Err(_))) => {
                    let ev = this.fail(F_DIED, "died");
                    return Poll::Ready(Some(Ok(Frame::data(ev))));
                }
                Poll::Ready(None) => {
                    if this.obs.clean_eof() {
                        this.finish(true);
                        return Poll::Ready(None);
                    }
                    let ev = this.fail(F_DIED, "died");
                    return Poll::Ready(Some(Ok(Frame::data(ev))));
                }
                Poll::Pending => {
                    if this.poll_timer(cx) {
                        let phase = format!("no event within the idle timeout ({}s)", secs(this.idle));
                        let detail = timeout_detail(this.total, this.deadline, this.idle_at, phase);
                        let ev = this.fail(F_TIMEOUT, &detail);
                        return Poll::Ready(Some(Ok(Frame::data(ev))));
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
