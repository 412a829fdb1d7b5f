"""The client side of one proxied request, behind one small interface (`Downstream`), so
that the executor and the relays do not know which server interface carries it.

Two implementations:
- `AsgiDownstream`: ASGI receive/send (any ASGI server; granian's ASGI bridge).
- `RsgiDownstream`: granian's RSGI protocol (what our CLI serves by default): no message
  dicts, the body read by granian in one call, response chunks into an unbounded channel
  (`send_bytes` returns an already completed awaitable), headers as str pairs.

Client disconnect, both: a `Watch` keeps a pending native awaitable (ASGI: receive(),
RSGI: client_disconnect()) and cancels the request task when it reports that the client
is gone. granian's awaitables keep their done callback after completion or cancellation,
and the GC cannot see a reference held by a native object, so `Watch.close()` removes
the callback and drops its references (else each request leaks; tests/integration/
test_proxy_gc.py). RSGI also reports a gone client as an error of `send_bytes`: that
fires the watch at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from kthena_router.errors import RequestError, error_body
from kthena_router.proxy.body import DRAIN_BYTES, ClientDisconnected, read_body

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]


class Watch:
    """Cancels the request task when `fut` completes with a disconnect (see module doc)."""

    __slots__ = ("task", "fut", "fired", "finished", "is_gone")

    def __init__(self, fut: Awaitable[Any], is_gone: Callable[[Any], bool] | None) -> None:
        self.task = asyncio.current_task()
        self.fired = False
        self.finished = False  # the response is complete: a disconnect now cancels nothing
        self.is_gone = is_gone  # result -> gone? (None: any completion is a disconnect)
        self.fut: asyncio.Future[Any] | None = asyncio.ensure_future(fut)
        self.fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        if self.finished or fut.cancelled():
            return
        exc = fut.exception()
        if exc is None and self.is_gone is not None and not self.is_gone(fut.result()):
            return
        self.fire()

    def fire(self) -> None:
        if self.finished or self.fired:
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
        fut.remove_done_callback(self._done)  # break awaitable -> callback -> self -> awaitable
        self.fut = None
        self.task = None


def _asgi_gone(msg: Message) -> bool:
    return msg.get("type") == "http.disconnect"


class Downstream:
    """What the proxy needs of the client connection. A response is either `respond`
    (complete, with its length) or `begin` + `send`* + `end`."""

    __slots__ = ("watch",)

    def __init__(self) -> None:
        self.watch: Watch | None = None

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        """The whole request body; 413 over `limit`; ClientDisconnected if it breaks off."""
        raise NotImplementedError

    def arm(self) -> Watch:
        """Start watching for a client disconnect (cancels the current task)."""
        raise NotImplementedError

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        raise NotImplementedError

    async def begin(self, status: int, headers: Headers) -> None:
        raise NotImplementedError

    async def send(self, data: bytes) -> None:
        raise NotImplementedError

    async def end(self, data: bytes = b"") -> None:
        raise NotImplementedError

    async def error(self, err: RequestError, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """A complete JSON error response."""
        body = error_body(err.status, err.message, err.type, err.param, err.code)
        headers = [(b"content-type", b"application/json")]
        headers.extend(err.headers)
        headers.extend(extra)
        await self.respond(err.status, headers, body)


class AsgiDownstream(Downstream):
    __slots__ = ("receive", "_send")

    def __init__(self, receive: Receive, send: Send) -> None:
        super().__init__()
        self.receive = receive
        self._send = send

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        return await read_body(self.receive, declared, limit)

    def arm(self) -> Watch:
        self.watch = Watch(self.receive(), _asgi_gone)
        return self.watch

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def begin(self, status: int, headers: Headers) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def send(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": False})


def str_headers(headers: Headers) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


class RsgiDownstream(Downstream):
    """granian RSGI. The stream ends when the transport is released (`end`): granian closes
    the body when the last reference to it goes."""

    __slots__ = ("proto", "transport")

    def __init__(self, proto: Any) -> None:
        super().__init__()
        self.proto = proto
        self.transport: Any = None

    async def read_body(self, declared: int | None, limit: int) -> bytes:
        proto = self.proto
        try:
            if declared is not None and declared <= limit:  # hyper enforces the declared length
                return await proto()  # type: ignore[no-any-return]
            return await _read_limited(proto, declared, limit)
        except (RuntimeError, OSError):  # RSGIProtocolClosed / RSGIProtocolError: body broke off
            raise ClientDisconnected() from None

    def arm(self) -> Watch:
        self.watch = Watch(self.proto.client_disconnect(), None)
        return self.watch

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        self.proto.response_bytes(status, str_headers(headers), body)  # granian adds content-length

    async def begin(self, status: int, headers: Headers) -> None:
        self.transport = self.proto.response_stream(status, str_headers(headers))

    async def send(self, data: bytes) -> None:
        try:
            await self.transport.send_bytes(data)
        except RuntimeError:  # RSGIProtocolClosed: the client is gone
            self._gone()

    async def end(self, data: bytes = b"") -> None:
        transport, self.transport = self.transport, None
        if data and transport is not None:
            try:
                await transport.send_bytes(data)
            except RuntimeError:
                self._gone()

    def _gone(self) -> None:
        watch = self.watch
        if watch is not None:
            watch.fire()


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"request body exceeds the limit of {limit} bytes")


async def _read_limited(proto: Any, declared: int | None, limit: int) -> bytes:
    """Chunked (or oversized) body: read chunk by chunk, 413 past `limit` after draining
    up to DRAIN_BYTES more (as body.read_body does for ASGI)."""
    parts: list[bytes] = []
    size = 0
    budget = limit + DRAIN_BYTES
    if declared is not None and declared - limit > DRAIN_BYTES:
        raise _too_large(limit)
    async for chunk in proto:
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            if size > budget:
                break
            continue
        parts.append(chunk)
    if size > limit:
        raise _too_large(limit)
    return b"".join(parts)
