"""RouterApp: the worker's application object, served as ASGI or as granian RSGI.

As ASGI it is a plain ASGI callable (lifespan included) that any ASGI server can mount.
granian finds `__rsgi__` (and the `__rsgi_init__` / `__rsgi_del__` hooks) when the router
runs with `--interface rsgi` (or behind the Rust front end, on its unix socket): proxied requests then go from granian's RSGI
protocol straight to the Forwarder's Downstream (proxy/downstream.py), without ASGI
message dicts. The few other requests (/v1/models, 404s) take a small RSGI -> ASGI
bridge into the same starlette app; the lifespan runs through granian's own ASGI
LifespanProtocol in the RSGI hooks, so start-up and shutdown are the same code.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from kthena_router.errors import RequestError, send_error
from kthena_router.proxy.downstream import RsgiDownstream, str_headers
from kthena_router.proxy.forward import Forwarder, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

# Every method reaches our handlers, so that wrong ones get OpenAI-style JSON, not starlette's text.
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"]
_KNOWN_METHODS = frozenset(ALL_METHODS)


def _refusal(method: str, path: str) -> RequestError | None:
    """What starlette would answer in plain text (or a redirect for a target such as "PUT")."""
    if method not in _KNOWN_METHODS:
        return RequestError(405 if path == "/v1/models" else 404, f"method {method} is not allowed on {path}")
    if not path.startswith("/"):  # "*" (OPTIONS *) or a bare word
        return RequestError(404, f"no such endpoint: {method} {path}")
    return None


def _proxied(path: str) -> bool:
    return path.startswith("/v1/") and path != "/v1/models"


class RouterApp:
    """ASGI callable with granian RSGI entry points; attributes for in-process tests."""

    def __init__(self, starlette: Any, forwarder: Forwarder, router_config_reloader: Any, router_config: Any,
                 identity: Any) -> None:
        self.starlette = starlette
        self.forwarder = forwarder
        self.router_config_reloader = router_config_reloader  # .scheduler: the live one
        self.router_config = router_config
        self.identity = identity
        self._lifespan: Any = None
        self._starting: asyncio.Task[None] | None = None
        self.rsgi_stopped: asyncio.Task[None] | None = None

    # --- ASGI ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if _proxied(path):
                await self.forwarder(scope, receive, send)
                return
            err = _refusal(scope["method"], path)
            if err is not None:
                await send_error(send, err)
                return
        await self.starlette(scope, receive, send)

    # --- granian RSGI ----------------------------------------------------------------

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """granian calls this before serving, with the worker's loop not yet running; an
        embedded server (tests) calls it from inside its running loop: then the start-up
        runs as a task that the first requests wait for."""
        from granian.asgi import LifespanProtocol

        lifespan = self._lifespan = LifespanProtocol(self.starlette)
        if loop.is_running():
            self._starting = loop.create_task(self._startup(lifespan))
            return
        loop.run_until_complete(self._startup(lifespan))

    async def _startup(self, lifespan: Any) -> None:
        await lifespan.startup()
        self._starting = None
        if lifespan.interrupt:  # as granian's ASGI worker does
            log.error("router start-up failed", exc_info=lifespan.exc)
            sys.exit(1)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._lifespan is None:
            return
        if loop.is_running():  # embedded: the caller may await app.rsgi_stopped
            self.rsgi_stopped = loop.create_task(self._lifespan.shutdown())
        else:
            loop.run_until_complete(self._lifespan.shutdown())

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":  # websockets are off in the server
            return
        if self._starting is not None:
            await asyncio.shield(self._starting)
        path = scope.path
        if _proxied(path):
            await self.forwarder.rsgi(scope, proto)
            return
        err = _refusal(scope.method, path)
        if err is not None:
            await RsgiDownstream(proto).error(err)
            return
        await self.starlette(_asgi_scope(scope), _Bridge(proto).receive, _Bridge.sender(proto))


def _addr(value: str) -> tuple[str, int] | None:
    host, _, port = value.rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None


def _asgi_scope(scope: Any) -> dict[str, Any]:
    query = scope.query_string
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": scope.http_version,
        "method": scope.method, "scheme": scope.scheme, "path": scope.path, "raw_path": scope.path.encode(),
        "query_string": query.encode("latin-1") if query else b"", "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()],
        "client": _addr(scope.client), "server": _addr(scope.server),
    }


class _Bridge:
    """receive() for the non-proxied paths: the body once, then wait for the disconnect."""

    __slots__ = ("proto", "read")

    def __init__(self, proto: Any) -> None:
        self.proto = proto
        self.read = False

    async def receive(self) -> Message:
        if not self.read:
            self.read = True
            try:
                body = await self.proto()
            except RuntimeError:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}
        await self.proto.client_disconnect()
        return {"type": "http.disconnect"}

    @staticmethod
    def sender(proto: Any) -> Send:
        """send(): starlette's plain responses, gathered into one response_bytes."""
        start: list[Message] = []
        parts: list[bytes] = []

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.append(message)
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    head = start[0]  # its Content-Length stays: a HEAD answer's is the GET body's
                    proto.response_bytes(head["status"], str_headers(list(head.get("headers", ()))),
                                         b"".join(parts))

        return send
