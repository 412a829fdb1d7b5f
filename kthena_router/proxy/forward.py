"""One proxied request: validate, route, try candidates until one answers, relay.

Retry rule: an attempt may fail and move to the next candidate only while nothing has
been sent to the client. A streamed response is committed (status line sent) only when
the engine's first complete SSE event is in hand, so an engine that dies, stalls or
sends garbage before its first event is retried too. After the commit a failure ends
the stream with an SSE error event and no [DONE].

Client disconnect: granian does not raise from send() when the client is gone; its
receive() returns http.disconnect instead (also while the request waits). A pending
receive() watches for it and cancels the request task, which closes the upstream
connection (the engine sees the disconnect and aborts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

import orjson

from kthena_router.endpoints.balancer import Balancer
from kthena_router.endpoints.health import Failure, HealthProber
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError, send_error, sse_error_event
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.body import ClientDisconnected, content_length, needs_usage_injection, parse_body, \
    read_body, rewrite
from kthena_router.proxy.sse import InvalidStream, SseRelay
from kthena_router.proxy.upstream import H1Conn, Response, UpstreamConnectError, UpstreamError, \
    UpstreamPool, UpstreamTimeout
from kthena_router.routing.table import RouteMatch, RouteNotFound
from kthena_router.scheduling.request import RequestInfo
from kthena_router.settings import RouterSettings
from kthena_router.state import StateHolder

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Request headers never forwarded: hop-by-hop, recomputed, or the client's credentials.
_DROP_REQUEST = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length", "authorization",
    "x-request-id",
})
_DROP_RESPONSE = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
    b"te", b"trailer", b"transfer-encoding", b"upgrade", b"content-length", b"x-request-id",
    b"date", b"server",
})
# Bounded "path" label values; any other forwarded /v1/* path counts as "/v1/other".
_KNOWN_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/score",
    "/v1/rerank", "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/tokenize",
    "/v1/detokenize", "/v1/chat/completions/render",
})


_KNOWN_TARGETS = {p: p.encode() for p in _KNOWN_PATHS}
_REQUEST_TAIL = b" HTTP/1.1\r\n"


# Engine management endpoints under /v1 that a client must not reach through the router.
_ENGINE_ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})


def _path_label(path: str) -> str:
    return path if path in _KNOWN_PATHS else "/v1/other"


def _request_line(path: str) -> bytes:
    """b"POST <target> HTTP/1.1\\r\\n" for the (decoded) ASGI path."""
    target = _KNOWN_TARGETS.get(path)
    if target is None:
        target = quote(path, safe="/:@!$&'()*+,;=-._~%").encode("ascii")
    return b"POST " + target + _REQUEST_TAIL


class _Attempt:
    """Result of one failed attempt (nothing was sent to the client)."""

    __slots__ = ("failure", "detail")

    def __init__(self, failure: Failure, detail: str) -> None:
        self.failure = failure
        self.detail = detail


class _Disconnect:
    """Watches receive() for http.disconnect and cancels the request task."""

    __slots__ = ("task", "fut", "fired", "finished")

    def __init__(self, receive: Receive) -> None:
        self.task = asyncio.current_task()
        self.fired = False
        self.finished = False
        self.fut: asyncio.Future[Message] | None = asyncio.ensure_future(receive())
        self.fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Message]) -> None:
        if self.finished or fut.cancelled():
            return
        exc = fut.exception()
        if exc is None and fut.result().get("type") != "http.disconnect":
            return
        self.fired = True
        if self.task is not None:
            self.task.cancel()

    def close(self) -> None:
        self.finished = True
        fut = self.fut
        if fut is None:
            return
        if not fut.done():
            fut.cancel()
        # granian's receive() awaitable keeps its done callback after it completes or is
        # cancelled, and the GC cannot see references held by that native object: the
        # cycle awaitable -> self._done -> self -> awaitable would keep this watcher, the
        # request task and its frames alive for ever. Break it from both sides.
        fut.remove_done_callback(self._done)
        self.fut = None
        self.task = None


class Forwarder:
    """The hot path: an ASGI callable for every proxied /v1/* request."""

    def __init__(self, settings: RouterSettings, holder: StateHolder, pool: UpstreamPool,
                 balancer: Balancer, metrics: RouterMetrics, prober: HealthProber) -> None:
        self.settings = settings
        self.holder = holder
        self.pool = pool
        self.balancer = balancer
        self.metrics = metrics
        self.prober = prober
        # Weighted route splits; per worker. A fixed seed makes a 1-worker run reproducible.
        self.rng = random.Random(settings.route_seed)
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        self.in_flight += 1
        self.idle.clear()
        req = _Request(self, scope, t0)
        try:
            await req.run(receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()


class _Request:
    """State of one request; methods are the steps of Forwarder's hot path."""

    __slots__ = ("fw", "scope", "t0", "path", "request_id", "fwd_headers", "header_map", "model_label",
                 "route_label", "server_label", "endpoint_label", "status", "error_type", "committed",
                 "response_headers", "watch", "att_t0", "att_ttft", "att_tpot",
                 "att_prompt_tokens")

    def __init__(self, fw: Forwarder, scope: Scope, t0: float) -> None:
        self.fw = fw
        self.scope = scope
        self.t0 = t0
        self.path: str = scope["path"]
        self.request_id = ""
        self.fwd_headers = b""  # forwarded header lines, CRLF-terminated, x-request-id last
        self.header_map: dict[str, str] = {}
        self.model_label = ""
        self.route_label = ""
        self.server_label = ""
        self.endpoint_label = ""
        self.status = 0
        self.error_type = ""
        self.committed = False
        self.response_headers: list[tuple[bytes, bytes]] = []
        self.watch: _Disconnect | None = None
        # the current attempt's start and what it measured (fed back to the scheduler)
        self.att_t0 = 0.0
        self.att_ttft: float | None = None
        self.att_tpot: float | None = None
        self.att_prompt_tokens: int | None = None  # the engine's usage.prompt_tokens

    # --- entry ----------------------------------------------------------------------

    async def run(self, receive: Receive, send: Send) -> None:
        raw_headers: list[tuple[bytes, bytes]] = self.scope["headers"]
        self._split_headers(raw_headers)
        self.response_headers = [(b"x-request-id", self.request_id.encode("latin-1"))]
        watch: _Disconnect | None = None
        downstream = None
        try:
            try:
                if self.path in _ENGINE_ADMIN_PATHS:  # engine management is not for clients
                    raise RequestError(404, f"no such endpoint: {self.path}")
                if self.scope["method"] != "POST":
                    raise RequestError(405, f"method {self.scope['method']} is not allowed on {self.path}")
                raw = await read_body(receive, content_length(raw_headers), self.fw.settings.max_body_bytes)
                body = parse_body(raw, self.path)
                state = self.fw.holder.current
                if state is None:
                    raise RequestError(503, "router has no configuration loaded yet")
                try:
                    match = state.table.match(body.model, self.path, self.header_map, self.fw.rng)
                except RouteNotFound as exc:
                    raise RequestError(404, exc.message, param="model") from None
                self.model_label = body.model
                downstream = self.fw.metrics.downstream(body.model)
                downstream.inc()
                watch = self.watch = _Disconnect(receive)
                await self._forward(send, body, match, state.targets.get(match.server.key, ()))
            except RequestError as err:
                self.status = err.status
                self.error_type = err.type
                if not self.committed:
                    self._last_send()
                    await send_error(send, err, self.response_headers)
        except ClientDisconnected:
            # While reading the body. granian reports invalid chunk framing the same way as a
            # client that left: answer 400 (if the client is gone, the send is a no-op), so
            # a present client never gets granian's text/plain 500.
            self.status, self.error_type = 400, "incomplete_body"
            if not self.committed:
                self._last_send()
                with contextlib.suppress(Exception):
                    await send_error(send, RequestError(400, "request body incomplete or malformed "
                                                             "(invalid chunked framing or connection closed)"),
                                     self.response_headers)
        except asyncio.CancelledError:
            if watch is None or not watch.fired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self.status, self.error_type = 499, "client_disconnect"
        except Exception:
            log.exception("unexpected error on %s", self.path)
            self.status, self.error_type = 500, "internal_error"
            if not self.committed:
                try:
                    await send_error(send, RequestError(500, "internal router error"), self.response_headers)
                except Exception:
                    pass
        finally:
            if watch is not None:
                watch.close()
            if downstream is not None:
                downstream.dec()
            self.fw.metrics.observe_request(
                self.model_label, _path_label(self.path), self.status, self.error_type, self.route_label,
                self.server_label, self.endpoint_label, time.perf_counter() - self.t0)

    def _last_send(self) -> None:
        """From here on the response completes; a disconnect seen now must not cancel us
        (granian's receive() also reports http.disconnect once the response is done)."""
        if self.watch is not None:
            self.watch.finished = True

    def _split_headers(self, raw_headers: list[tuple[bytes, bytes]]) -> None:
        fwd: list[bytes] = []
        hmap = self.header_map
        for k, v in raw_headers:
            name = k.decode("latin-1").lower()
            value = v.decode("latin-1")
            hmap[name] = value
            if name in _DROP_REQUEST:
                if name == "x-request-id" and value:
                    self.request_id = value
                continue
            fwd.append(name.encode("latin-1") + b": " + v + b"\r\n")
        if not self.request_id:
            self.request_id = os.urandom(16).hex()
        fwd.append(b"x-request-id: " + self.request_id.encode("latin-1") + b"\r\n")
        self.fwd_headers = b"".join(fwd)

    # --- forwarding -------------------------------------------------------------------

    async def _forward(self, send: Send, body: Any, match: RouteMatch, targets: tuple[EndpointState, ...]) -> None:
        fw = self.fw
        server = match.server
        self.route_label = f"{match.route.namespace}/{match.route.name}"
        self.server_label = f"{server.namespace}/{server.name}"
        inject = needs_usage_injection(body)
        payload = rewrite(body, None if match.is_lora else match.upstream_model, inject)
        info = None
        if fw.balancer.needs_request_info:
            info = RequestInfo(self.request_id, self.path, body.obj, server.model or match.upstream_model,
                               body.model if match.is_lora else "", body.model)
            await fw.balancer.prepare(info)
        candidates = fw.balancer.candidates(server.key, targets, info)
        if not candidates:
            fw.prober.probe_soon(targets)
            raise RequestError(503, f"no healthy endpoint for model `{body.model}`")
        if server.retry_attempts is not None:  # explicit policy, 0 = no retry
            attempts = 1 + server.retry_attempts
        else:  # no retry policy: each candidate at most once, up to the default count
            attempts = min(fw.settings.default_retry_endpoints, len(candidates))
        first_byte_s = server.timeout_s if server.timeout_s is not None else fw.settings.default_first_byte_timeout_s
        headers = self.fwd_headers
        if server.upstream_headers:
            headers += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in server.upstream_headers.items())
        # request line and headers except Host (per endpoint), then the body's length
        head = _request_line(self.path)
        tail = headers + b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n"
        last: _Attempt | None = None
        idx = 0
        for attempt in range(attempts):
            ep = _next_healthy(candidates, idx)
            if ep is None:
                break
            idx = candidates.index(ep) + 1
            if attempt:
                fw.metrics.retry(self.server_label)
                if server.retry_interval_s > 0:
                    await asyncio.sleep(server.retry_interval_s)
            self.endpoint_label = ep.key
            last = await self._attempt(send, ep, head, tail, payload, first_byte_s, body, inject, info)
            if last is None:
                return
            fw.metrics.upstream_error(self.server_label, ep.key, last.failure.value)
            ep.health.record_failure(last.failure)
        if last is None:
            raise RequestError(503, f"no healthy endpoint for model `{body.model}`")
        n = attempts if attempts > 1 else 1
        if last.failure is Failure.TIMEOUT:
            raise RequestError(504, f"upstream timed out before the first byte ({last.detail}; {n} attempt(s))",
                               code=504)
        raise RequestError(502, f"upstream request failed ({last.detail}; {n} attempt(s))", code=502)

    async def _attempt(self, send: Send, ep: EndpointState, head: bytes, tail: bytes, payload: bytes,
                       first_byte_s: float | None, body: Any, inject: bool,
                       info: RequestInfo | None) -> _Attempt | None:
        """One upstream attempt; None when the response went to the client."""
        fw = self.fw
        gauge = fw.metrics.upstream(self.route_label, self.server_label, ep.key)
        gauge.inc()
        conn: H1Conn | None = None
        resp: Response | None = None
        self.att_t0 = time.perf_counter()
        self.att_ttft = self.att_tpot = self.att_prompt_tokens = None
        fw.balancer.dispatched(ep, info)
        try:
            pool = fw.pool.h1
            dest = pool.dest(ep.ip, ep.port, ep.ssl, ep.server_hostname, ep.host)
            try:
                conn = await pool.acquire(dest)
                conn.timeout_s = first_byte_s
                conn.send(head + dest.host_line + tail, payload)
                resp = await conn.read_head()
            except UpstreamTimeout:
                return _Attempt(Failure.TIMEOUT, "no response")
            except UpstreamConnectError:
                return _Attempt(Failure.CONNECT, "connection failed")
            except (UpstreamError, OSError) as exc:
                return _Attempt(Failure.DIED, f"connection lost before the response ({type(exc).__name__})")
            status = resp.status
            if status >= 500:
                try:
                    await resp.read_all()
                except (UpstreamError, OSError):
                    pass
                return _Attempt(Failure.HTTP_5XX, f"upstream HTTP {status}")
            if status == 200 and body.stream and resp.content_type.startswith("text/event-stream"):
                return await self._relay_stream(send, ep, resp, body, inject)
            return await self._relay_buffered(send, ep, resp, body)
        finally:
            gauge.dec()
            fw.balancer.finished(ep, self.att_ttft, self.att_tpot)
            if info is not None and self.att_prompt_tokens:
                fw.balancer.observe_prompt_tokens(info, self.att_prompt_tokens)
            # A fully read response has already gone back to the pool (close is a no-op
            # then); otherwise this drops the connection and the engine aborts.
            if resp is not None:
                resp.close()
            elif conn is not None:
                conn.close()

    def _start_headers(self, resp: Response, body_len: int | None) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in resp.raw_headers if k.lower() not in _DROP_RESPONSE]
        if body_len is not None:
            out.append((b"content-length", str(body_len).encode()))
        out.extend(self.response_headers)
        return out

    async def _relay_buffered(self, send: Send, ep: EndpointState, resp: Response,
                              body: Any) -> _Attempt | None:
        """Non-streamed answers (and every non-200): read whole, check, pass on unchanged."""
        try:
            data = await resp.read_all()
        except (UpstreamError, OSError) as exc:
            kind = Failure.TIMEOUT if isinstance(exc, UpstreamTimeout) else Failure.DIED
            return _Attempt(kind, "response body incomplete")
        status = resp.status
        usage = None
        if status == 200:
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                ctype = resp.content_type
                if ctype.startswith("application/json") or self.path in ("/v1/chat/completions", "/v1/completions"):
                    return _Attempt(Failure.INVALID, "invalid JSON from upstream")
                obj = None
            if type(obj) is dict:
                usage = obj.get("usage")
        ep.health.record_success()
        self.committed = True
        self.status = status
        if status >= 400:
            self.error_type = "upstream_4xx"
        self._last_send()
        await send({"type": "http.response.start", "status": status,
                    "headers": self._start_headers(resp, len(data))})
        await send({"type": "http.response.body", "body": data, "more_body": False})
        now = time.perf_counter()
        metrics = self.fw.metrics
        path = _path_label(self.path)
        if status == 200:
            metrics.observe_ttft(self.model_label, path, now - self.t0)
            if type(usage) is dict:
                self.att_prompt_tokens = _int(usage.get("prompt_tokens"))
                metrics.observe_tokens(self.model_label, path, self.att_prompt_tokens,
                                       _int(usage.get("completion_tokens")))
        return None

    async def _relay_stream(self, send: Send, ep: EndpointState, resp: Response, body: Any,
                            inject: bool) -> _Attempt | None:
        relay = SseRelay(hide_usage=inject)
        # Before the commit: wait for the first complete event; failures here are retried.
        first = b""
        try:
            while not first:
                chunk = await resp.read_some()
                if not chunk:
                    return _Attempt(Failure.DIED, "upstream closed the stream before the first event")
                first = relay.feed(chunk)
        except InvalidStream as exc:
            return _Attempt(Failure.INVALID, f"invalid stream from upstream: {exc}")
        except UpstreamTimeout:
            return _Attempt(Failure.TIMEOUT, "no first event")
        except (UpstreamError, OSError):
            return _Attempt(Failure.DIED, "upstream stream broke before the first event")
        self.committed = True
        self.status = 200
        await send({"type": "http.response.start", "status": 200, "headers": self._start_headers(resp, None)})
        t_first = time.perf_counter()
        self.att_ttft = t_first - self.att_t0
        # When the engine's body has ended with [DONE] in the bytes at hand, the data goes
        # out as the final body message (one ASGI send less per request).
        ended = resp.done and relay.saw_done
        if relay.saw_done:
            self._last_send()
        await send({"type": "http.response.body", "body": first, "more_body": not ended})
        t_last = t_first
        failure: Failure | None = None
        if not ended:
            try:
                while True:
                    chunk = await resp.read_some()
                    if not chunk:
                        break
                    out = relay.feed(chunk)
                    if out:
                        if relay.saw_done:
                            # The client has everything it needs and may hang up now; that
                            # is a completed request, not a cancellation.
                            self._last_send()
                            ended = resp.done
                        await send({"type": "http.response.body", "body": out, "more_body": not ended})
                        t_last = time.perf_counter()
                        if ended:
                            break
            except InvalidStream:
                failure = Failure.INVALID
            except UpstreamTimeout:
                failure = Failure.TIMEOUT
            except (UpstreamError, OSError):
                failure = Failure.DIED
            if failure is None and not relay.saw_done:
                failure = Failure.DIED
        metrics = self.fw.metrics
        if failure is not None:
            # Bytes reached the client: no retry; end with an error event and no [DONE].
            metrics.upstream_error(self.server_label, ep.key, failure.value)
            ep.health.record_failure(failure)
            self.status, self.error_type = 502, "upstream_error_after_first_byte"
            self._last_send()
            await send({"type": "http.response.body", "more_body": False,
                        "body": sse_error_event("upstream failed during the stream "
                                                f"({failure.value}); the response is incomplete")})
        else:
            ep.health.record_success()
            if not ended:
                self._last_send()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        path = _path_label(self.path)
        metrics.observe_ttft(self.model_label, path, t_first - self.t0)
        usage = relay.usage
        if usage is not None:
            completion = _int(usage.get("completion_tokens"))
            self.att_prompt_tokens = _int(usage.get("prompt_tokens"))
            metrics.observe_tokens(self.model_label, path, self.att_prompt_tokens, completion)
            if completion is not None and completion > 1 and failure is None:
                self.att_tpot = (t_last - t_first) / (completion - 1)
                metrics.observe_tpot(self.model_label, path, self.att_tpot)
        return None


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def _next_healthy(candidates: list[EndpointState], start: int) -> EndpointState | None:
    """The next candidate in cyclic order from `start` that is not ejected."""
    n = len(candidates)
    for i in range(n):
        ep = candidates[(start + i) % n]
        if ep.health.healthy:
            return ep
    return None

