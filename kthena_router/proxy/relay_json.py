"""Buffered relay: non-streamed answers (and every non-200 below 500).

The whole body is read and checked before the status line goes out, so an engine that
breaks off or returns invalid JSON is retried elsewhere. The body is then passed on
unchanged, with its usage counted. The body is held in memory, so it is capped
(maxBufferedResponseBytes: over it 502, the connection dropped). A body the engine
compressed although we asked for identity (headers.py) cannot be checked and passes as
is, Content-Encoding included.
"""

from __future__ import annotations

import time

import orjson

from kthena_router.endpoints.health import Failure
from kthena_router.errors import RequestError
from kthena_router.proxy.headers import content_encoded
from kthena_router.proxy.relay import AttemptFailure, Exchange, int_or_none, timeout_detail, usage_of
from kthena_router.proxy.sse import StreamEnd
from kthena_router.proxy.upstream import BodyTooLarge, Response, UpstreamError, UpstreamTimeout

# Paths whose 200 answer is JSON whatever content-type the engine claims.
_JSON_PATHS = ("/v1/chat/completions", "/v1/completions")


class JsonRelay:
    """Stateless; one per worker."""

    async def relay(self, x: Exchange, resp: Response) -> AttemptFailure | None:
        # The executor has set the idle bound between body reads and the total deadline.
        try:
            data = await resp.read_all(x.max_buffered)
        except UpstreamTimeout as exc:
            return AttemptFailure(Failure.TIMEOUT, timeout_detail(
                x, exc, None, f"response body stalled beyond the idle timeout ({x.timeouts.idle_s or 0:g}s)"))
        except (UpstreamError, OSError):
            return AttemptFailure(Failure.DIED, "response body incomplete")
        except BodyTooLarge:
            # The engine did its job; the reply is too big for this router to buffer. Not
            # retried (another engine would answer the same) and not an endpoint failure.
            x.metrics.upstream_error(x.server_label, x.endpoint_label, "response_too_large")
            raise RequestError(502, f"the upstream reply exceeds the router's buffered-reply limit "
                                    f"(maxBufferedResponseBytes: {x.max_buffered} bytes); ask for a smaller "
                                    f"reply or stream it", code="response_too_large") from None
        status = resp.status
        usage = None
        if status == 200 and not content_encoded(resp.raw_headers):
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                if resp.content_type.startswith("application/json") or x.path in _JSON_PATHS:
                    return AttemptFailure(Failure.INVALID, "invalid JSON from upstream")
                obj = None
            if type(obj) is dict:
                usage = usage_of(obj)
                if x.stream_end is StreamEnd.RESPONSES and type(obj.get("id")) is str:
                    x.response_id = obj["id"]
        x.commit(status)
        if status >= 400:
            x.error_type = "upstream_4xx"
        x.last_send()
        await x.down.respond(status, x.start_headers(resp), data)
        x.ttft = time.perf_counter() - x.t0
        if status == 200:
            metrics = x.metrics
            metrics.observe_ttft(x.model_label, x.path_label, x.ttft)
            if type(usage) is dict:
                x.att_prompt_tokens = int_or_none(usage.get("prompt_tokens"))
                x.completion_tokens = int_or_none(usage.get("completion_tokens"))
                metrics.observe_tokens(x.model_label, x.path_label, x.att_prompt_tokens, x.completion_tokens)
                metrics.observe_endpoint_tokens(x.server_label, x.endpoint_label, x.input_endpoint,
                                                x.att_prompt_tokens, x.completion_tokens)
        return None
