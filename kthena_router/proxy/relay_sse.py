"""Streaming relay: engine SSE bytes to the client, event by event, as they come.

The status line goes out only when the engine's first complete event is in hand, so an
engine that dies, stalls or sends garbage before it is retried elsewhere. After that a
failure ends the stream with an SSE error event and no [DONE].
"""

from __future__ import annotations

import time

from kthena_router.endpoints.health import Failure
from kthena_router.errors import sse_error_event
from kthena_router.proxy.relay import AttemptFailure, Exchange, int_or_none
from kthena_router.proxy.sse import InvalidStream, SseRelay
from kthena_router.proxy.upstream import Response, UpstreamError, UpstreamTimeout


class SseStreamRelay:
    """Stateless; one per worker (per-stream state lives in sse.SseRelay)."""

    async def relay(self, x: Exchange, resp: Response) -> AttemptFailure | None:
        relay = SseRelay(hide_usage=x.inject)
        # Before the commit: wait for the first complete event; failures here are retried.
        first = b""
        try:
            while not first:
                chunk = await resp.read_some()
                if not chunk:
                    return AttemptFailure(Failure.DIED, "upstream closed the stream before the first event")
                first = relay.feed(chunk)
        except InvalidStream as exc:
            return AttemptFailure(Failure.INVALID, f"invalid stream from upstream: {exc}")
        except UpstreamTimeout:
            return AttemptFailure(Failure.TIMEOUT, "no first event")
        except (UpstreamError, OSError):
            return AttemptFailure(Failure.DIED, "upstream stream broke before the first event")
        send = x.send
        x.commit(200)
        await send({"type": "http.response.start", "status": 200, "headers": x.start_headers(resp, None)})
        t_first = time.perf_counter()
        x.att_ttft = t_first - x.att_t0
        # When the engine's body has ended with [DONE] in the bytes at hand, the data goes
        # out as the final body message (one ASGI send less per request).
        ended = resp.done and relay.saw_done
        if relay.saw_done:
            x.last_send()
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
                            x.last_send()
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
        if failure is not None:
            # Bytes reached the client: no retry; end with an error event and no [DONE].
            x.status, x.error_type = 502, "upstream_error_after_first_byte"
            x.last_send()
            await send({"type": "http.response.body", "more_body": False,
                        "body": sse_error_event("upstream failed during the stream "
                                                f"({failure.value}); the response is incomplete")})
        elif not ended:
            x.last_send()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        metrics = x.metrics
        metrics.observe_ttft(x.model_label, x.path_label, t_first - x.t0)
        usage = relay.usage
        if usage is not None:
            completion = int_or_none(usage.get("completion_tokens"))
            x.att_prompt_tokens = int_or_none(usage.get("prompt_tokens"))
            metrics.observe_tokens(x.model_label, x.path_label, x.att_prompt_tokens, completion)
            if completion is not None and completion > 1 and failure is None:
                x.att_tpot = (t_last - t_first) / (completion - 1)
                metrics.observe_tpot(x.model_label, x.path_label, x.att_tpot)
        return None if failure is None else AttemptFailure(failure, "after the first event")
