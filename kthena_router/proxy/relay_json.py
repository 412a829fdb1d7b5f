"""Buffered relay: non-streamed answers (and every non-200 below 500).

The whole body is read and checked before the status line goes out, so an engine that
breaks off or returns invalid JSON is retried elsewhere. The body is then passed on
unchanged, with its usage counted.
"""

from __future__ import annotations

import time

import orjson

from kthena_router.endpoints.health import Failure
from kthena_router.proxy.relay import AttemptFailure, Exchange, int_or_none
from kthena_router.proxy.upstream import Response, UpstreamError, UpstreamTimeout

# Paths whose 200 answer is JSON whatever content-type the engine claims.
_JSON_PATHS = ("/v1/chat/completions", "/v1/completions")


class JsonRelay:
    """Stateless; one per worker."""

    async def relay(self, x: Exchange, resp: Response) -> AttemptFailure | None:
        try:
            data = await resp.read_all()
        except (UpstreamError, OSError) as exc:
            kind = Failure.TIMEOUT if isinstance(exc, UpstreamTimeout) else Failure.DIED
            return AttemptFailure(kind, "response body incomplete")
        status = resp.status
        usage = None
        if status == 200:
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                if resp.content_type.startswith("application/json") or x.path in _JSON_PATHS:
                    return AttemptFailure(Failure.INVALID, "invalid JSON from upstream")
                obj = None
            if type(obj) is dict:
                usage = obj.get("usage")
        x.commit(status)
        if status >= 400:
            x.error_type = "upstream_4xx"
        x.last_send()
        await x.send({"type": "http.response.start", "status": status,
                      "headers": x.start_headers(resp, len(data))})
        await x.send({"type": "http.response.body", "body": data, "more_body": False})
        if status == 200:
            metrics = x.metrics
            metrics.observe_ttft(x.model_label, x.path_label, time.perf_counter() - x.t0)
            if type(usage) is dict:
                x.att_prompt_tokens = int_or_none(usage.get("prompt_tokens"))
                metrics.observe_tokens(x.model_label, x.path_label, x.att_prompt_tokens,
                                       int_or_none(usage.get("completion_tokens")))
        return None
