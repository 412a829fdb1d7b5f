"""Upstream HTTP clients of one worker.

Proxied requests (the hot path) use `H1Pool`, a minimal HTTP/1.1 client on asyncio
protocols: pooled keep-alive connections per endpoint, TCP_NODELAY, https (SNI and
verification as configured), per-request connect and pool-wait bounds, a read deadline
plus a read-idle timeout (executor.py sets them per phase), and closing the connection
when a request is abandoned (the engine sees the disconnect and aborts). Destinations
that leave the config are pruned (`retain`), their idle connections closed.
Health probes and metrics scrapes keep using one aiohttp ClientSession (`session`).

Why not aiohttp on the hot path: its per-TCP-segment response machinery was about two
thirds of the app's Python time (measurements in docs/architecture.md, "Upstream client").

Responses and the errors live in h1_response.py (re-exported here). Failure mapping
(executor.py and the relays turn these into retry decisions): `UpstreamConnectError`
(refused, unreachable, TLS handshake, connect timeout), `UpstreamTimeout` (the read
deadline passed, or no byte within the read-idle bound), `UpstreamClosed` (the connection
broke or closed early), `UpstreamProtocolError` (not HTTP/1.x). All derive from
`UpstreamError`. Not an upstream's fault, so not an `UpstreamError`: `PoolExhausted` (no
connection slot within the pool-wait bound) and `BodyTooLarge` (a buffered body over its cap).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from typing import Any

import aiohttp

from kthena_router.proxy.h1_response import BodyTooLarge, PoolExhausted, Response, UpstreamClosed, \
    UpstreamConnectError, UpstreamError, UpstreamProtocolError, UpstreamTimeout, parse_head
from kthena_router.settings import RouterSettings

__all__ = ["BodyTooLarge", "H1Conn", "H1Pool", "PoolExhausted", "Response", "UpstreamClosed",
           "UpstreamConnectError", "UpstreamError", "UpstreamPool", "UpstreamProtocolError", "UpstreamTimeout"]

KEEPALIVE_S = 75.0
PROBE_CONNECT_S = 5.0  # probes and scrapes have their own overall timeouts as well
_SWEEP_S = 10.0
_HIGH_WATER = 1 << 18  # pause reading when this much undelivered body is buffered
_MAX_HEAD = 1 << 16


class _Dest:
    """One upstream address (plus TLS identity): its idle connections and Host header."""

    __slots__ = ("ip", "port", "ssl", "server_hostname", "host_line", "idle", "live")

    def __init__(self, ip: str, port: int, ssl_ctx: ssl.SSLContext | None, server_hostname: str | None,
                 host_header: str) -> None:
        self.ip = ip
        self.port = port
        self.ssl = ssl_ctx
        self.server_hostname = server_hostname
        self.host_line = b"host: " + host_header.encode("latin-1") + b"\r\n"
        self.idle: list[H1Conn] = []
        self.live = True  # False once pruned: its connections close instead of idling


class H1Conn(asyncio.Protocol):
    """One upstream connection; at most one request at a time."""

    __slots__ = ("pool", "dest", "transport", "buf", "waiter", "eof", "exc", "closed", "idle_since",
                 "paused", "timer", "timer_due", "wait_at", "timeout_s", "deadline", "timer_at_deadline", "counted")

    def __init__(self, pool: H1Pool, dest: _Dest) -> None:
        self.pool = pool
        self.dest = dest
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.exc: BaseException | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.timer_due = 0.0  # loop time the timer fires at
        self.wait_at: float | None = None  # the current wait's bound (None: unbounded or not waiting)
        self.timeout_s: float | None = None  # read-idle bound of each wait
        self.deadline: float | None = None  # loop time by which the awaited bytes must come
        self.timer_at_deadline = False
        self.counted = True  # holds one of the pool's connection slots

    # --- protocol callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.paused and len(self.buf) > _HIGH_WATER and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.closed = True
        if exc is not None:
            self.exc = exc
        self._wake()
        if self.idle_since:  # lost while idle in the pool
            try:
                self.dest.idle.remove(self)
            except ValueError:
                pass
            self.pool._forget(self)

    def _wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    # --- waiting --------------------------------------------------------------------

    def _on_timeout(self) -> None:
        self.timer = None
        w = self.waiter
        at = self.wait_at
        if w is None or at is None:
            return
        loop = self.pool.loop
        if loop.time() < at:  # armed by an earlier wait that ended: re-arm for this one
            self.timer = loop.call_at(at, self._on_timeout)
            self.timer_due = at
            return
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_exception(UpstreamTimeout("no data from upstream in time", self.timer_at_deadline))

    async def wait_data(self) -> None:
        """Wait until more bytes (or EOF) arrive; UpstreamTimeout after `timeout_s` idle
        or at `deadline`, whichever comes first."""
        if self.eof:
            raise UpstreamClosed("upstream closed the connection") from self.exc
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        loop = self.pool.loop
        w = self.waiter = loop.create_future()
        t = self.timeout_s
        at = self.deadline
        if t is not None:
            idle_at = loop.time() + t
            self.timer_at_deadline = at is not None and at <= idle_at
            if not self.timer_at_deadline:
                at = idle_at
        else:
            self.timer_at_deadline = True
        # One timer across a stream's waits: re-arming per read (call_at + cancel) cost more
        # than anything else per relayed event (figures: docs/overhead.md). A timer set by an
        # earlier wait fires early at worst, and re-arms for the current wait's bound.
        self.wait_at = at
        if at is not None and (self.timer is None or self.timer_due > at):
            if self.timer is not None:
                self.timer.cancel()
            self.timer = loop.call_at(at, self._on_timeout)
            self.timer_due = at
        try:
            await w
        finally:
            self.waiter = None
            self.wait_at = None

    def stop_timer(self) -> None:
        """The response is over: no timer outlives it (nor keeps this connection referenced)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        self.stop_timer()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self.pool._forget(self)

    # --- HTTP/1.1 --------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if len(body) < 16384:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))

    async def read_head(self) -> Response:
        while True:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise UpstreamProtocolError("response head too large")
                if self.eof:
                    raise UpstreamClosed("upstream closed the connection before the response") from self.exc
                await self.wait_data()
                continue
            head = bytes(buf[:end])
            del buf[:end + 4]
            resp = parse_head(head, self)
            if 100 <= resp.status < 200:  # interim response: the real one follows
                continue
            return resp


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(PoolExhausted())


class H1Pool:
    """Keep-alive connections per upstream address; at most `limit` open at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.loop = asyncio.get_running_loop()
        self._dests: dict[tuple[Any, ...], _Dest] = {}
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._verify_ctx: ssl.SSLContext | None = None
        self._sweeper: asyncio.Task[None] | None = self.loop.create_task(self._sweep_forever())
        self._closing = False

    def dest(self, ip: str, port: int, ssl_spec: ssl.SSLContext | bool | None, server_hostname: str | None,
             host: str) -> _Dest:
        key = (ip, port, server_hostname, id(ssl_spec) if isinstance(ssl_spec, ssl.SSLContext) else ssl_spec)
        d = self._dests.get(key)
        if d is None:
            if ssl_spec is True:
                if self._verify_ctx is None:
                    self._verify_ctx = ssl.create_default_context()
                ctx: ssl.SSLContext | None = self._verify_ctx
            elif isinstance(ssl_spec, ssl.SSLContext):
                ctx = ssl_spec
            else:
                ctx = None
            name = host if server_hostname is not None else (f"[{ip}]" if ":" in ip else ip)
            default_port = 443 if ctx is not None else 80
            host_header = name if port == default_port else f"{name}:{port}"
            d = self._dests[key] = _Dest(ip, port, ctx, server_hostname, host_header)
        return d

    async def acquire(self, d: _Dest, connect_s: float, wait_s: float) -> H1Conn:
        """A connection to `d`: an idle one, or a new one (connect bounded by `connect_s`);
        PoolExhausted when no slot frees up within `wait_s`."""
        idle = d.idle
        while idle:
            conn = idle.pop()
            conn.idle_since = 0.0
            if not conn.closed and not conn.eof:
                return conn
            conn.close()
        wait_until = 0.0
        while self._open >= self.limit:
            if self._close_any_idle():
                continue
            fut = self.loop.create_future()
            self._waiters.append(fut)
            if not wait_until:
                wait_until = self.loop.time() + wait_s
            timer = self.loop.call_at(wait_until, _expire, fut)
            try:
                await fut
            except PoolExhausted:
                raise PoolExhausted(f"no free upstream connection within {wait_s:g}s "
                                    f"({self.limit} in use)") from None
            except BaseException:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._wake_one()  # woken and cancelled at once: pass the slot on
                raise
            finally:
                timer.cancel()
            if idle:
                return await self.acquire(d, connect_s, max(0.0, wait_until - self.loop.time()))
        self._open += 1
        conn = H1Conn(self, d)
        try:
            async with asyncio.timeout(connect_s):
                await self.loop.create_connection(
                    lambda: conn, d.ip, d.port, ssl=d.ssl,
                    server_hostname=d.server_hostname if d.ssl is not None else None)
        except BaseException as exc:
            conn.closed = True
            self._forget_count()
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectError("connect timeout") from None
            if isinstance(exc, ssl.SSLCertVerificationError):  # the reason, not the peer's address
                raise UpstreamConnectError(f"TLS certificate verification failed: {exc.verify_message}") from None
            if isinstance(exc, (OSError, ssl.SSLError)):
                raise UpstreamConnectError(f"connection failed ({type(exc).__name__})") from None
            raise
        return conn

    def _close_any_idle(self) -> bool:
        """At the limit: free a slot held by an idle connection to another address."""
        for d in self._dests.values():
            if d.idle:
                conn = d.idle.pop(0)
                conn.idle_since = 0.0
                conn.close()
                return True
        return False

    def _release(self, conn: H1Conn) -> None:
        conn.stop_timer()
        if self._closing or not conn.dest.live:
            conn.close()
            return
        conn.idle_since = time.monotonic() or 1e-9
        conn.timeout_s = conn.deadline = None
        conn.dest.idle.append(conn)
        if self._waiters:
            self._wake_one()

    def _forget(self, conn: H1Conn) -> None:
        """A connection closed: one slot free (called once per connection)."""
        if conn.counted:
            conn.counted = False
            self._forget_count()

    def _forget_count(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def retain(self, live: set[tuple[str, int]]) -> int:
        """Drop the destinations whose (ip, port) is not in `live` and close their idle
        connections (in-use ones close when released); returns how many were dropped."""
        gone = [k for k, d in self._dests.items() if (d.ip, d.port) not in live]
        for k in gone:
            d = self._dests.pop(k)
            d.live = False
            for conn in d.idle:
                conn.idle_since = 0.0
                conn.close()
            d.idle.clear()
        return len(gone)

    @property
    def destinations(self) -> int:
        return len(self._dests)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_S)
            cutoff = time.monotonic() - KEEPALIVE_S
            for d in list(self._dests.values()):
                for conn in [c for c in d.idle if c.idle_since < cutoff]:
                    d.idle.remove(conn)
                    conn.idle_since = 0.0
                    conn.close()

    async def close(self) -> None:
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for d in self._dests.values():
            for conn in d.idle:
                conn.idle_since = 0.0
                conn.close()
            d.idle.clear()


class UpstreamPool:
    """Owns the worker's upstream clients; started in the app lifespan, closed at shutdown."""

    def __init__(self, settings: RouterSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._h1: H1Pool | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._settings.upstream_pool_size,
            limit_per_host=0,  # the total limit is the only bound
            keepalive_timeout=KEEPALIVE_S,
            ttl_dns_cache=60,  # targets are IPs already; names only for TLS hosts
            enable_cleanup_closed=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            # Only the client's headers go upstream; no aiohttp defaults (User-Agent ...).
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=PROBE_CONNECT_S),
            read_bufsize=2 ** 16,
        )
        self._h1 = H1Pool(self._settings.upstream_pool_size)

    @property
    def session(self) -> aiohttp.ClientSession:
        """aiohttp session for probes and scrapes (not the proxied requests)."""
        if self._session is None:
            raise RuntimeError("upstream pool not started")
        return self._session

    @property
    def h1(self) -> H1Pool:
        if self._h1 is None:
            raise RuntimeError("upstream pool not started")
        return self._h1

    async def close(self) -> None:
        if self._h1 is not None:
            await self._h1.close()
            self._h1 = None
        if self._session is not None:
            await self._session.close()
            self._session = None
