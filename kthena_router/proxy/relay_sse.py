"""Streaming relay: engine SSE bytes to the client, event by event, as they come.

The status line goes out only when the engine's first complete event is in hand, so an
engine that dies, stalls or sends garbage before it is retried elsewhere. After that a
failure ends the stream with an SSE error event and no [DONE]. The end of a complete
stream depends on the API (sse.StreamEnd): [DONE], a terminal Responses event, or EOF.
"""

from __future__ import annotations

import time

import orjson

from kthena_router.endpoints.health import Failure
from kthena_router.errors import messages_error_event, sse_error_event
from kthena_router.proxy.relay import AttemptFailure, Exchange, earliest, int_or_none, timeout_detail
from kthena_router.proxy.sse import InvalidStream, SseRelay, StreamEnd
from kthena_router.proxy.upstream import Response, UpstreamError, UpstreamTimeout


COUNT_INTERVAL_S = 1.0  # how often a running stream's output tokens are counted


class SseStreamRelay:
    """Stateless; one per worker (per-stream state lives in sse.SseRelay).

    `error_first_fails`: a stream whose first event is an error event (vLLM opens a decode
    hop's stream before it loads the KV, and reports a failed load that way) is a failed
    attempt, retried like a 5xx, instead of an error relayed to the client (PD decode hops)."""

    __slots__ = ("error_first_fails",)

    def __init__(self, error_first_fails: bool = False) -> None:
        self.error_first_fails = error_first_fails

    async def relay(self, x: Exchange, resp: Response) -> AttemptFailure | None:
        relay = SseRelay(hide_usage=x.inject, end=x.stream_end)
        t = x.timeouts
        # Before the commit: wait for the first complete event; failures here are retried.
        first_at = x.first_token_at
        resp.set_timeouts(None, earliest(first_at, x.deadline))
        first = b""
        try:
            while not first:
                chunk = await resp.read_some()
                if not chunk:
                    return AttemptFailure(Failure.DIED, "upstream closed the stream before the first event")
                first = relay.feed(chunk)
        except InvalidStream as exc:
            return AttemptFailure(Failure.INVALID, f"invalid stream from upstream: {exc}")
        except UpstreamTimeout as exc:
            return AttemptFailure(Failure.TIMEOUT, timeout_detail(
                x, exc, first_at, f"no first token within firstToken ({t.first_token_s or 0:g}s)"))
        except (UpstreamError, OSError):
            return AttemptFailure(Failure.DIED, "upstream stream broke before the first event")
        if self.error_first_fails and (reason := first_event_error(first)) is not None:
            return AttemptFailure(Failure.HTTP_5XX, f"the stream began with an error event ({reason})")
        down = x.down
        resp.set_timeouts(t.idle_s, x.deadline)
        x.commit(200)
        await down.begin(200, x.start_headers(resp))
        t_first = time.perf_counter()
        x.att_ttft = t_first - x.att_t0
        if (first_token := x.on_first_token) is not None:
            x.on_first_token = None
            first_token()
        x.ttft = t_first - x.t0
        # When the engine's body has ended with its terminator in the bytes at hand, the data goes
        # out as the final body message (one send less per request).
        ended = resp.done and relay.ended
        rl = x.rl
        if rl is not None:
            rl.streamed(first)
        if relay.ended:
            x.last_send()
        await (down.end(first) if ended else down.send(first))
        t_last = t_first
        # Output tokens count toward the endpoint's token rate while a long stream runs (one
        # event ~ one token; the final usage settles the rest), so the autoscaler's
        # router:tokens_per_second does not jump when a long generation ends. The first
        # chunk (the role) and the end (usage, terminator) are not counted as tokens.
        counted = pending = 0
        count_at = t_first + COUNT_INTERVAL_S
        failure: Failure | None = None
        detail = ""
        if not ended:
            try:
                while True:
                    chunk = await resp.read_some()
                    if not chunk:
                        break
                    out = relay.feed(chunk)
                    if out:
                        if rl is not None:
                            rl.streamed(out)
                        if relay.ended:
                            # The client has everything it needs and may hang up now; that
                            # is a completed request, not a cancellation.
                            x.last_send()
                            ended = resp.done
                        await (down.end(out) if ended else down.send(out))
                        t_last = time.perf_counter()
                        if ended:
                            break
                        pending += out.count(b"\n\n")
                        if t_last >= count_at:
                            counted += pending
                            x.metrics.observe_endpoint_tokens(x.server_label, x.endpoint_label, "", None, pending)
                            pending, count_at = 0, t_last + COUNT_INTERVAL_S
            except InvalidStream:
                failure = Failure.INVALID
            except UpstreamTimeout as exc:
                failure = Failure.TIMEOUT
                detail = timeout_detail(x, exc, None, f"no event within the idle timeout ({t.idle_s or 0:g}s)")
            except (UpstreamError, OSError):
                failure = Failure.DIED
            if failure is None and not relay.clean_eof():
                failure = Failure.DIED
        if failure is not None:
            # Bytes reached the client: no retry; end with an error event and no [DONE].
            x.status, x.error_type = 502, "upstream_error_after_first_byte"
            x.last_send()
            msg = f"upstream failed during the stream ({detail or failure.value}); the response is incomplete"
            await down.end(messages_error_event(msg) if x.stream_end is StreamEnd.MESSAGES
                           else sse_error_event(msg))
        else:
            x.response_id = relay.response_id
            if not ended:
                x.last_send()
                await down.end()
        metrics = x.metrics
        metrics.observe_ttft(x.model_label, x.path_label, t_first - x.t0)
        usage = relay.usage
        if usage is not None:
            completion = x.completion_tokens = int_or_none(usage.get("completion_tokens"))
            x.att_prompt_tokens = int_or_none(usage.get("prompt_tokens"))
            metrics.observe_tokens(x.model_label, x.path_label, x.att_prompt_tokens, completion)
            metrics.observe_endpoint_tokens(x.server_label, x.endpoint_label, x.input_endpoint, x.att_prompt_tokens,
                                            None if completion is None else max(0, completion - counted))
            if completion is not None and completion > 1 and failure is None:
                x.att_tpot = (t_last - t_first) / (completion - 1)
                metrics.observe_tpot(x.model_label, x.path_label, x.att_tpot)
        elif counted:  # no usage: the events stand for the tokens
            metrics.observe_endpoint_tokens(x.server_label, x.endpoint_label, "", None, pending)
        return None if failure is None else AttemptFailure(failure, detail or "after the first event")


def first_event_error(events: bytes) -> str | None:
    """The message of an error event at the start of `events` (complete events), else None."""
    line = events.lstrip(b"\r\n").split(b"\n", 1)[0].rstrip(b"\r")
    if not line.startswith(b"data:") or b'"error"' not in line:
        return None
    try:
        obj = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict or "error" not in obj or "choices" in obj:
        return None
    err = obj["error"]
    msg = err.get("message") if type(err) is dict else err
    return str(msg)[:200] if msg is not None else "no message"
