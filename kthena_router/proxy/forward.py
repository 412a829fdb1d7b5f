"""One proxied request: validate, route, build the upstream request, hand it to the executor.

The attempts (retry before the first byte) are executor.py's, the response bodies the
relays' (relay.py). This module owns what is about the client's request: the method and
path checks, headers forwarded upstream and returned to the client, the body, the route
match, and the mapping of every failure to an OpenAI-style error.

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
from typing import Any
from urllib.parse import quote

from kthena_router.endpoints.balancer import Balancer
from kthena_router.endpoints.health import HealthProber
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError, send_error
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.body import ClientDisconnected, content_length, needs_usage_injection, parse_body, \
    read_body, rewrite
from kthena_router.proxy.executor import Executor
from kthena_router.proxy.relay import Exchange, Message, Receive, Scope, Send
from kthena_router.proxy.upstream import Response, UpstreamPool
from kthena_router.routing.table import RouteMatch, RouteNotFound
from kthena_router.scheduling.request import RequestInfo
from kthena_router.settings import RouterSettings
from kthena_router.state import StateHolder

log = logging.getLogger(__name__)

__all__ = ["Forwarder", "Message", "Receive", "Scope", "Send"]

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


class _Disconnect:
    """Watches receive() for http.disconnect and cancels the request task."""

    __slots__ = ("task", "fut", "fired", "finished")

    def __init__(self, receive: Receive) -> None:
        self.task = asyncio.current_task()
        self.fired = False
        self.finished = False
        self.fut = asyncio.ensure_future(receive())
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
        if not self.fut.done():
            self.fut.cancel()


class Forwarder:
    """The hot path: an ASGI callable for every proxied /v1/* request."""

    def __init__(self, settings: RouterSettings, holder: StateHolder, pool: UpstreamPool,
                 balancer: Balancer, metrics: RouterMetrics, prober: HealthProber,
                 executor: Executor | None = None) -> None:
        self.settings = settings
        self.holder = holder
        self.metrics = metrics
        self.executor = executor or Executor(settings, pool, balancer, metrics, prober)
        self.needs_info = balancer.needs_request_info
        # Weighted route splits; per worker. A fixed seed makes a 1-worker run reproducible.
        self.rng = random.Random(settings.route_seed)
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        self.in_flight += 1
        self.idle.clear()
        req = _Request(self, scope, t0, send)
        try:
            await req.run(receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()


class _Request(Exchange):
    """State of one request; methods are the steps of Forwarder's hot path."""

    __slots__ = ("fw", "scope", "fwd_headers", "header_map", "response_headers", "watch")

    def __init__(self, fw: Forwarder, scope: Scope, t0: float, send: Send) -> None:
        path: str = scope["path"]
        super().__init__(fw.metrics, t0, path, _path_label(path))
        self.send = send
        self.fw = fw
        self.scope = scope
        self.fwd_headers = b""  # forwarded header lines, CRLF-terminated, x-request-id last
        self.header_map: dict[str, str] = {}
        self.response_headers: list[tuple[bytes, bytes]] = []
        self.watch: _Disconnect | None = None

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
                await self._forward(body, match, state.targets.get(match.server.key, ()))
            except RequestError as err:
                self.status = err.status
                self.error_type = err.type
                if not self.committed:
                    self.last_send()
                    await send_error(send, err, self.response_headers)
        except ClientDisconnected:
            # While reading the body. granian reports invalid chunk framing the same way as a
            # client that left: answer 400 (if the client is gone, the send is a no-op), so
            # a present client never gets granian's text/plain 500.
            self.status, self.error_type = 400, "incomplete_body"
            if not self.committed:
                self.last_send()
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
                self.model_label, self.path_label, self.status, self.error_type, self.route_label,
                self.server_label, self.endpoint_label, time.perf_counter() - self.t0)

    def last_send(self) -> None:
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

    async def _forward(self, body: Any, match: RouteMatch, targets: tuple[EndpointState, ...]) -> None:
        fw = self.fw
        server = match.server
        self.route_label = f"{match.route.namespace}/{match.route.name}"
        self.server_label = f"{server.namespace}/{server.name}"
        self.stream = body.stream
        self.inject = inject = needs_usage_injection(body)
        payload = rewrite(body, None if match.is_lora else match.upstream_model, inject)
        info = None
        if fw.needs_info:
            info = RequestInfo(self.request_id, self.path, body.obj, server.model or match.upstream_model,
                               body.model if match.is_lora else "", body.model)
        headers = self.fwd_headers
        if server.upstream_headers:
            headers += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in server.upstream_headers.items())
        # request line and headers except Host (per endpoint), then the body's length
        head = _request_line(self.path)
        tail = headers + b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n"
        await fw.executor.run(self, match, targets, info, head, tail, payload)

    def start_headers(self, resp: Response, body_len: int | None) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in resp.raw_headers if k.lower() not in _DROP_RESPONSE]
        if body_len is not None:
            out.append((b"content-length", str(body_len).encode()))
        out.extend(self.response_headers)
        return out
