"""The relays' timeout phases against a scripted upstream (no router process)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry
from test_proxy_upstream import Server, _request

from kthena_router.config.traffic import Timeouts
from kthena_router.endpoints.health import Failure
from kthena_router.metrics import RouterMetrics
from kthena_router.proxy.downstream import AsgiDownstream
from kthena_router.proxy.relay import Exchange
from kthena_router.proxy.relay_json import JsonRelay
from kthena_router.proxy.relay_sse import SseStreamRelay
from kthena_router.proxy.upstream import H1Pool

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class _X(Exchange):
    __slots__ = ("sent",)

    def __init__(self, timeouts: Timeouts) -> None:
        super().__init__(RouterMetrics(CollectorRegistry()), 0.0, "/v1/chat/completions", "/v1/chat/completions")
        self.sent: list[dict[str, Any]] = []
        self.down = AsgiDownstream(_never, self._send)
        self.stream = True
        self.timeouts = timeouts
        loop = asyncio.get_running_loop()
        if timeouts.total_s is not None:
            self.deadline = loop.time() + timeouts.total_s
        if timeouts.first_token_s is not None:
            self.first_token_at = loop.time() + timeouts.first_token_s

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def start_headers(self, resp: Any) -> list[tuple[bytes, bytes]]:
        return []


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _run(reply: bytes, relay: Any, timeouts: Timeouts) -> tuple[Any, _X]:
    async def main() -> tuple[Any, _X]:
        srv = Server([reply])  # then the connection stays silent
        await srv.start()
        pool = H1Pool(4)
        x = _X(timeouts)
        _, resp = await _request(pool, srv.port)
        resp.set_timeouts(timeouts.idle_s, x.deadline)
        out = await relay.relay(x, resp)
        resp.close()
        await pool.close()
        await srv.stop()
        return out, x

    return asyncio.run(main())


def test_stream_without_a_first_event_fails_at_first_token_uncommitted() -> None:
    out, x = _run(SSE_HEAD, SseStreamRelay(), Timeouts(first_token_s=0.1, idle_s=None))
    assert out.failure is Failure.TIMEOUT and "firstToken" in out.detail
    assert not x.committed and not x.sent


def test_stream_gap_after_the_first_event_ends_with_an_error_event() -> None:
    reply = SSE_HEAD + _chunk(b'data: {"choices": []}\n\n')
    out, x = _run(reply, SseStreamRelay(), Timeouts(first_token_s=5.0, idle_s=0.1))
    assert out.failure is Failure.TIMEOUT and "idle timeout" in out.detail
    assert x.committed and x.status == 502
    last = x.sent[-1]
    assert last["more_body"] is False and b'"error"' in last["body"] and b"[DONE]" not in last["body"]


def test_only_a_total_timeout_is_named_as_such() -> None:
    # every other bound off (0s in the configuration): the total deadline still ends it
    off = Timeouts(response_s=None, first_token_s=None, idle_s=None, total_s=0.1)
    out, x = _run(SSE_HEAD, SseStreamRelay(), off)
    assert out.failure is Failure.TIMEOUT and "total timeout" in out.detail and not x.committed
    partial = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"
    out, x = _run(partial, JsonRelay(), off)
    assert out.failure is Failure.TIMEOUT and "total timeout" in out.detail and not x.committed
