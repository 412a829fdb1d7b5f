"""The contract between the attempt executor and the response relays.

The executor (executor.py) picks an endpoint, sends the request and reads the response
head; a `Relay` then carries the response body to the client: relay_sse.py for event
streams, relay_json.py for everything buffered. A faster relay (e.g. in Rust) replaces
one of them by implementing `Relay` and nothing else.

Rules a relay follows:
- Before anything reached the client (`x.committed` False) a failure is returned as an
  `AttemptFailure`; the executor then retries on another endpoint or answers an error.
- It commits with `x.commit(status)` right before sending the status line; after that a
  failure ends the response in the relay's own protocol (SSE error event, no [DONE]) and
  the failure is still returned, so that the executor records it (no retry then).
- It never records endpoint health: the executor does, from the returned value (None =
  the upstream delivered a complete response).
- It may raise `RequestError` before the commit for an answer that is final and not the
  endpoint's fault (e.g. a reply over the buffered-size cap): no retry, no health record.
- Timeouts (config/traffic.py): the executor has bounded the response head; before its
  first event a stream waits until `x.first_token_at`, after it each read waits at most
  `x.timeouts.idle_s` (`Response.set_timeouts`); `x.deadline` (total) bounds everything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from kthena_router.config.traffic import ServerTraffic, Timeouts
from kthena_router.endpoints.health import Failure
from kthena_router.proxy.downstream import Downstream
from kthena_router.proxy.sse import StreamEnd

if TYPE_CHECKING:
    from kthena_router.ratelimit.limiter import Ticket
    from kthena_router.metrics import RouterMetrics
    from kthena_router.proxy.upstream import Response, UpstreamTimeout

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


DEFAULT_TIMEOUTS = Timeouts()
_DEFAULT_CAP = ServerTraffic().max_buffered_response_bytes


def earliest(*times: float | None) -> float | None:
    """The earliest of some optional deadlines (None: no bound)."""
    out = None
    for t in times:
        if t is not None and (out is None or t < out):
            out = t
    return out


def timeout_detail(x: Exchange, exc: UpstreamTimeout, phase_at: float | None, phase: str) -> str:
    """What an UpstreamTimeout means: the total timeout, or the phase's own bound
    (`phase_at` its deadline, None for an idle bound; `phase` describes it)."""
    if exc.at_deadline and x.deadline is not None and (phase_at is None or x.deadline <= phase_at):
        return f"the request's total timeout ({x.timeouts.total_s:g}s) passed"
    return phase


class AttemptFailure:
    """Why an attempt did not deliver a complete response."""

    __slots__ = ("failure", "detail")

    def __init__(self, failure: Failure, detail: str) -> None:
        self.failure = failure
        self.detail = detail

    def __repr__(self) -> str:
        return f"AttemptFailure({self.failure.value}, {self.detail!r})"


class Exchange:
    """One client request as the executor and the relays see it.

    forward.py's request object derives from it and fills in the routing labels and
    `start_headers` (response header filtering lives there)."""

    __slots__ = ("down", "metrics", "t0", "path", "path_label", "request_id", "model_label", "route_label",
                 "server_label", "endpoint_label", "status", "error_type", "committed", "stream", "inject",
                 "timeouts", "deadline", "first_token_at", "max_buffered", "att_t0", "att_ttft", "att_tpot",
                 "att_prompt_tokens", "on_first_token", "stream_end", "attempts", "ttft", "completion_tokens",
                 "response_id", "rl", "input_endpoint")

    def __init__(self, metrics: RouterMetrics, t0: float, path: str, path_label: str) -> None:
        self.down: Downstream = _NO_DOWNSTREAM  # the client side (downstream.py)
        self.metrics = metrics
        self.t0 = t0
        self.path = path
        self.path_label = path_label  # bounded "path" metric label
        self.request_id = ""
        self.model_label = ""
        self.route_label = ""
        self.server_label = ""
        self.endpoint_label = ""
        self.status = 0
        self.error_type = ""
        self.committed = False  # the status line went to the client: no retry from here
        self.stream = False  # the client asked for a stream
        self.inject = False  # the router added stream_options.include_usage (hide that chunk)
        self.timeouts: Timeouts = DEFAULT_TIMEOUTS  # the ModelServer's effective timeouts
        self.deadline: float | None = None  # loop time at which the whole request gives up (total)
        self.first_token_at: float | None = None  # loop time: this attempt's first-token deadline
        self.max_buffered = _DEFAULT_CAP  # cap of a buffered reply (maxBufferedResponseBytes)
        # the current attempt's start and what it measured (fed back to the scheduler)
        self.att_t0 = 0.0
        self.att_ttft: float | None = None
        self.att_tpot: float | None = None
        self.att_prompt_tokens: int | None = None  # the engine's usage.prompt_tokens
        # called once at the attempt's first streamed event (prefill-cost's pending work)
        self.on_first_token: Callable[[], None] | None = None
        self.stream_end = StreamEnd.DONE  # how this API's streams end (paths.py)
        self.attempts = 0
        self.ttft: float | None = None  # request start to the first body byte sent to the client
        self.completion_tokens: int | None = None
        self.response_id: str | None = None  # Responses API: the id the engine stored the answer under
        self.rl: Ticket | None = None  # rate limits: what admission took; output charged as it streams
        # where the prompt was computed when not at endpoint_label (a PD pair's prefill), else ""
        self.input_endpoint = ""

    def apply_limits(self, timeouts: Timeouts, max_buffered: int, now: float) -> None:
        """The target's timeouts and buffered-reply cap; the total timeout's clock starts `now`
        (loop time)."""
        self.timeouts = timeouts
        self.max_buffered = max_buffered
        if timeouts.total_s is not None:
            self.deadline = now + timeouts.total_s

    def start_headers(self, resp: Response) -> list[tuple[bytes, bytes]]:
        """Response headers for the client: the upstream's, filtered, plus ours (the
        Downstream adds Content-Length to a complete response)."""
        raise NotImplementedError

    def last_send(self) -> None:
        """From here on the response completes: a client disconnect must not cancel it."""

    def commit(self, status: int) -> None:
        self.committed = True
        self.status = status

    def begin_attempt(self, t: float) -> None:
        self.att_t0 = t
        self.att_ttft = self.att_tpot = self.att_prompt_tokens = None
        self.on_first_token = None
        self.attempts += 1


class Relay(Protocol):
    async def relay(self, x: Exchange, resp: Response) -> AttemptFailure | None:
        """Carry `resp` (head read, status < 500) to the client; see the module rules."""
        ...


_NO_DOWNSTREAM = Downstream()  # every method raises NotImplementedError until set


def int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


def usage_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A body's usage as prompt/completion tokens (the Responses API says input/output)."""
    usage = obj.get("usage")
    if type(usage) is not dict:
        return None
    if "input_tokens" in usage and "prompt_tokens" not in usage:
        return {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens")}
    return usage
