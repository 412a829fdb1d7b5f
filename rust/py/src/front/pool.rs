//! Keep-alive HTTP/1.1 connections to engines (TCP_NODELAY), at most `limit` open at once
//! (settings.upstream_pool_size, as the Python pool), a slot waited for within poolWait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::body::ReqBody;

pub struct Conn {
    pub sender: SendRequest<ReqBody>,
    pub reused: bool,
    _permit: OwnedSemaphorePermit,
}

pub enum AcquireError {
    Connect(String),
    Timeout,
    Exhausted(usize),
}

pub struct Pool {
    idle: Mutex<HashMap<String, Vec<Conn>>>,
    slots: Arc<Semaphore>,
    limit: usize,
}

const MAX_IDLE_PER_HOST: usize = 256;

impl Pool {
    pub fn new(limit: usize) -> Self {
        Pool { idle: Mutex::new(HashMap::new()), slots: Arc::new(Semaphore::new(limit.max(1))), limit }
    }

    fn take_idle(&self, addr: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(addr)?;
        while let Some(mut c) = list.pop() {
            if !c.sender.is_closed() {
                c.reused = true;
                return Some(c);
            }
        }
        None
    }

    /// Drops one idle connection to any address (frees its slot for another address).
    fn evict_one(&self) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        for list in idle.values_mut() {
            if list.pop().is_some() {
                return true;
            }
        }
        false
    }

    /// An idle connection to `addr`, or a new one (connect within `connect`, a slot within `wait`).
    pub async fn acquire(&self, addr: &str, connect: Duration, wait: Duration, fresh: bool) -> Result<Conn, AcquireError> {
        if !fresh {
            while let Some(mut c) = self.take_idle(addr) {
                // just released: its connection task may not have seen the end of the body yet
                if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(50), c.sender.ready()).await {
                    return Ok(c);
                }
            }
        }
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.evict_one();
                match tokio::time::timeout(wait, self.slots.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => return Err(AcquireError::Exhausted(self.limit)),
                }
            }
        };
        let stream = match tokio::time::timeout(connect, TcpStream::connect(addr)).await {
            Err(_) => return Err(AcquireError::Timeout),
            // Client-facing text (as proxy/upstream.py's): no address of an engine in it.
            Ok(Err(e)) => return Err(AcquireError::Connect(format!("connection failed ({:?})", e.kind()))),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| AcquireError::Connect(format!("connection failed (handshake: {e})")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, reused: false, _permit: permit })
    }

    /// A connection whose exchange completed goes back for reuse.
    pub fn release(&self, addr: &str, c: Conn) {
        if c.sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(addr.to_string()).or_default();
        if list.len() < MAX_IDLE_PER_HOST {
            list.push(c);
        }
    }
}
