"""What the fault knobs do to a request in flight (mixin of server.EngineServer, which has
`faults` and `requests`): per-token delays and stalls, dying mid-answer, garbage output."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from .http_errors import JSON, SSE_HEADERS


class FaultActions:
    faults: Any
    requests: Any

    async def _token_faults(self, entry: dict[str, Any]) -> None:
        """Before a token: token_delay_s, and the stall of stall_after_tokens (until the
        client goes away, which cancels the handler)."""
        f = self.faults
        if f.token_delay_s > 0:
            await asyncio.sleep(f.token_delay_s)
        if f.stall_after_tokens is not None and entry["tokens_out"] >= f.stall_after_tokens:
            entry["fault"] = "stall_after_tokens"
            self.requests.set_status(entry, "stalled")
            await asyncio.Event().wait()

    async def _die(self, request: web.Request, entry: dict[str, Any]) -> web.StreamResponse:
        entry["fault"] = "die"
        self.requests.set_status(entry, "died")
        if request.transport is not None:
            request.transport.abort()
        await asyncio.sleep(3600)  # the connection loss cancels this handler
        raise ConnectionResetError("died")

    async def _garbage(self, request: web.Request, stream: bool) -> web.StreamResponse:
        if not stream:
            return web.Response(status=200, body=b'{"id": "cmpl-garbage", "choices": [{"te',
                                content_type=JSON)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(b'data: {"id": "chatcmpl-garbage", "choices": [{"delta": {"con\n\n'
                         b"data: this is not json\n\n"
                         b"\x00\xffgarbage without an SSE field\n\n")
        await resp.write_eof()
        return resp
