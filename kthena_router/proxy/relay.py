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
- It never records endpoint health or upstream-error metrics: the executor does, from
  the returned value (None = the upstream delivered a complete response).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from kthena_router.endpoints.health import Failure

if TYPE_CHECKING:
    from kthena_router.config.traffic import Timeouts
    from kthena_router.metrics import RouterMetrics
    from kthena_router.proxy.upstream import Response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


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

    __slots__ = ("send", "metrics", "t0", "path", "path_label", "request_id", "model_label", "route_label",
                 "server_label", "endpoint_label", "status", "error_type", "committed", "stream", "inject",
                 "timeouts", "deadline", "att_t0", "att_ttft", "att_tpot", "att_prompt_tokens")

    def __init__(self, metrics: RouterMetrics, t0: float, path: str, path_label: str) -> None:
        self.send: Send = _no_send
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
        self.timeouts: Timeouts | None = None  # the ModelServer's effective timeouts
        self.deadline: float | None = None  # loop time at which the whole request gives up
        # the current attempt's start and what it measured (fed back to the scheduler)
        self.att_t0 = 0.0
        self.att_ttft: float | None = None
        self.att_tpot: float | None = None
        self.att_prompt_tokens: int | None = None  # the engine's usage.prompt_tokens

    def start_headers(self, resp: Response, body_len: int | None) -> list[tuple[bytes, bytes]]:
        """Response headers for the client: the upstream's, filtered, plus ours."""
        raise NotImplementedError

    def last_send(self) -> None:
        """From here on the response completes: a client disconnect must not cancel it."""

    def commit(self, status: int) -> None:
        self.committed = True
        self.status = status

    def begin_attempt(self, t: float) -> None:
        self.att_t0 = t
        self.att_ttft = self.att_tpot = self.att_prompt_tokens = None


class Relay(Protocol):
    async def relay(self, x: Exchange, resp: Response) -> AttemptFailure | None:
        """Carry `resp` (head read, status < 500) to the client; see the module rules."""
        ...


async def _no_send(message: Message) -> None:
    raise RuntimeError("Exchange.send used before it was set")


def int_or_none(value: object) -> int | None:
    return value if type(value) is int else None
