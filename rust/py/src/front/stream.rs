//! A fast-path stream's body: the engine's SSE body polled directly by the client
//! connection (no relay task, no channel between them), complete events out as they come.
//!
//! After the first event (fast.rs) the rules of relay_sse.py hold: a failure ends the
//! stream with an error event and no [DONE]; the idle timeout bounds the gap between
//! reads and the total timeout all of it; a client that leaves drops this body, which
//! drops the engine's connection (the engine aborts). The outcome goes to Python once.
//!
//! Coalescing: events that have already arrived go to the client in one write. hyper's
//! client hands the engine's body over one chunk per poll (its connection task decodes the
//! next one only after this body took the previous one), so a burst the engine sent in one
//! TCP segment would cost one client write per event. When the engine's body has nothing
//! ready right after a chunk, this body yields (`tokio::task::yield_now`'s deferred wake-up:
//! the scheduler first runs every task already woken, among them the engine connection's,
//! which hands over what it has buffered, and polls the sockets once) and then writes
//! everything held in one go. No timer and no waiting for the engine: only bytes already
//! in the process are merged (at most COALESCE_MAX per write).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

use super::body::{error_json, BoxError};
use super::fast::{
    secs, timeout_detail, Outcome, E_AFTER_FIRST_BYTE, E_CLIENT_DISCONNECT, F_DIED, F_INVALID, F_TIMEOUT,
};
use super::pool::Conn;
use super::sse::SseObserver;
use super::{Event, Shared};

/// The most bytes merged into one client write.
const COALESCE_MAX: usize = 64 * 1024;

/// Bytes held for the next client write: one chunk as is, more merged into one buffer.
#[derive(Default)]
pub struct Coalesce {
    one: Option<Bytes>,
    more: BytesMut,
}

impl Coalesce {
    pub fn hold(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        if self.one.is_none() && self.more.is_empty() {
            self.one = Some(b);
            return;
        }
        if let Some(first) = self.one.take() {
            self.more.reserve(first.len() + b.len());
            self.more.extend_from_slice(&first);
        }
        self.more.extend_from_slice(&b);
    }

    pub fn len(&self) -> usize {
        self.one.as_ref().map_or(0, |b| b.len()) + self.more.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything held, as one buffer.
    pub fn take(&mut self) -> Option<Bytes> {
        if let Some(b) = self.one.take() {
            return Some(b);
        }
        (!self.more.is_empty()).then(|| self.more.split().freeze())
    }
}

/// One yield of the task polling a stream body: fired when the scheduler wakes it, i.e.
/// after the tasks already woken have run (hyper may poll the body again within the same
/// task poll: that poll must not count as "after the yield").
pub struct YieldMark {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for YieldMark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        if let Some(w) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }
}

impl YieldMark {
    /// Starts a yield of the task of `cx`: its deferred wake-up is registered with the scheduler.
    pub fn start(cx: &Context<'_>) -> Arc<Self> {
        let mark = Arc::new(YieldMark { fired: AtomicBool::new(false), task: Mutex::new(Some(cx.waker().clone())) });
        let waker = Waker::from(mark.clone());
        let mut ycx = Context::from_waker(&waker);
        let y = std::pin::pin!(tokio::task::yield_now());
        let _ = y.poll(&mut ycx); // Pending: the waker is deferred (outside a runtime: woken at once)
        mark
    }

    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

pub struct SseBody {
    up: Option<Incoming>,
    held: Coalesce,
    /// a yield in progress (bytes held, the engine's body not ready)
    mark: Option<Arc<YieldMark>>,
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
    /// events already reported as progress, and when the next report is due
    counted: u64,
    count_at: Instant,
}

/// How often a running stream's output is reported (proxy/relay_sse.py's COUNT_INTERVAL_S).
pub const COUNT_INTERVAL: Duration = Duration::from_secs(1);

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl SseBody {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: Arc<Shared>,
        up: Incoming,
        obs: SseObserver,
        first: Bytes,
        out: Outcome,
        conn: Conn,
        addr: String,
        idle: Option<Duration>,
        total: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Self {
        let now = Instant::now();
        let idle_at = idle.map(|d| now + d);
        let timer = earliest(idle_at, deadline).map(|t| Box::pin(tokio::time::sleep_until(t)));
        SseBody {
            up: Some(up),
            held: Coalesce::default(),
            mark: None,
            obs,
            first: Some(first),
            out: Some(out),
            conn: Some((conn, addr)),
            shared,
            idle,
            total,
            deadline,
            timer,
            idle_at,
            t_first: now,
            t_last: now,
            done: false,
            counted: 0,
            count_at: now + COUNT_INTERVAL,
        }
    }

    /// The events since the last report, to Python (a minutes-long generation's tokens
    /// reach the per-endpoint token counter every second, not only at its end).
    fn report_progress(&mut self, now: Instant) {
        self.count_at = now + COUNT_INTERVAL;
        let Some(out) = self.out.as_ref() else { return };
        let n = self.obs.events.saturating_sub(self.counted);
        if n == 0 {
            return;
        }
        self.counted = self.obs.events;
        let endpoint = out.attempts.last().map_or(0, |a| a.0);
        self.shared.push(Event::Progress { id: out.id, endpoint, events: n });
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
            // the first event goes out at once, with the response head (time to first token)
            if this.obs.ended {
                this.finish(false);
            }
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        loop {
            if this.done || this.held.len() >= COALESCE_MAX {
                this.mark = None;
                return Poll::Ready(this.held.take().map(|b| Ok(Frame::data(b))));
            }
            let Some(up) = this.up.as_mut() else { return Poll::Ready(this.held.take().map(|b| Ok(Frame::data(b)))) };
            match Pin::new(up).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    match this.obs.feed(data) {
                        Err(_) => {
                            let ev = this.fail(F_INVALID, "invalid event");
                            this.held.hold(ev);
                        }
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => {
                            let now = Instant::now();
                            this.t_last = now;
                            this.idle_at = this.idle.map(|d| now + d);
                            this.held.hold(out);
                            if this.obs.ended {
                                this.finish(false);
                            } else if now >= this.count_at {
                                this.report_progress(now);
                            }
                        }
                    }
                }
                Poll::Ready(Some(Err(_))) => {
                    let ev = this.fail(F_DIED, "died");
                    this.held.hold(ev);
                }
                Poll::Ready(None) => {
                    if this.obs.clean_eof() {
                        this.finish(true);
                    } else {
                        let ev = this.fail(F_DIED, "died");
                        this.held.hold(ev);
                    }
                }
                Poll::Pending => {
                    if !this.held.is_empty() {
                        // let the engine's connection task (woken by our poll) hand over what
                        // it has already buffered before we write
                        match &this.mark {
                            None => {
                                this.mark = Some(YieldMark::start(cx));
                                return Poll::Pending;
                            }
                            Some(m) if !m.fired() => {
                                *m.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
                                return Poll::Pending;
                            }
                            Some(_) => {
                                this.mark = None;
                                return Poll::Ready(this.held.take().map(|b| Ok(Frame::data(b))));
                            }
                        }
                    }
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
        self.done && self.first.is_none() && self.held.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chunk_goes_out_uncopied() {
        let mut c = Coalesce::default();
        let b = Bytes::from_static(b"data: {}\n\n");
        c.hold(b.clone());
        assert_eq!(c.len(), b.len());
        let out = c.take().unwrap();
        assert_eq!(out.as_ptr(), b.as_ptr());
        assert!(c.take().is_none() && c.is_empty());
    }

    #[test]
    fn chunks_held_merge_in_order() {
        let mut c = Coalesce::default();
        c.hold(Bytes::from_static(b"data: 1\n\n"));
        c.hold(Bytes::new());
        c.hold(Bytes::from_static(b"data: 2\n\n"));
        c.hold(Bytes::from_static(b"data: [DONE]\n\n"));
        assert_eq!(&c.take().unwrap()[..], b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
        assert!(c.is_empty());
        c.hold(Bytes::from_static(b"x"));
        assert_eq!(&c.take().unwrap()[..], b"x");
    }

    #[test]
    fn yield_mark_fires_after_the_woken_tasks_ran() {
        use std::sync::atomic::AtomicUsize;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let ran = Arc::new(AtomicUsize::new(0));
            let seen = Arc::new(AtomicUsize::new(usize::MAX));
            let (r, s) = (ran.clone(), seen.clone());
            let main = tokio::spawn(async move {
                let mut mark: Option<Arc<YieldMark>> = None;
                std::future::poll_fn(|cx| {
                    match &mark {
                        None => {
                            // another task becomes ready now (like the engine connection's)
                            let r = r.clone();
                            tokio::spawn(async move {
                                r.fetch_add(1, Ordering::SeqCst);
                            });
                            let m = YieldMark::start(cx);
                            // polled again within the same task poll (hyper does): not fired yet
                            assert!(!m.fired());
                            mark = Some(m);
                            Poll::Pending
                        }
                        Some(m) if !m.fired() => Poll::Pending,
                        Some(_) => {
                            s.store(r.load(Ordering::SeqCst), Ordering::SeqCst);
                            Poll::Ready(())
                        }
                    }
                })
                .await;
            });
            main.await.unwrap();
            assert_eq!(seen.load(Ordering::SeqCst), 1, "the woken task ran before the yield ended");
        });
    }
}
