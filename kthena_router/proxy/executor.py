"""Attempt/retry executor: candidates, one upstream attempt after another, health feedback.

Retry rule: an attempt may fail and move to the next candidate only while nothing has
been sent to the client (`Exchange.committed`), and while the total timeout leaves time. Connect errors, timeouts before the
response head and 5xx answers are decided here; everything after the head is the
relay's (relay.py), chosen by the response: an event stream for a streamed request goes
to the SSE relay, anything else to the buffered JSON relay.

Timeouts (semantics in config/traffic.py): connect within `connect`, a pool slot within
`poolWait` (else 503, not the endpoint's fault), the response head within `response`
from the attempt's start, and for streams also within `firstToken` from the send; the
relays bound the first event and the gaps between reads. `total` caps all of it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

from kthena_router.endpoints.balancer import Balancer
from kthena_router.endpoints.health import Failure, HealthProber
from kthena_router.endpoints.outlier import Pending
from kthena_router.endpoints.registry import EndpointState
from kthena_router.errors import RequestError
from kthena_router.metrics import RouterMetrics
from kthena_router.config.traffic import ServerTraffic
from kthena_router.proxy.headers import content_encoded
from kthena_router.proxy.relay import AttemptFailure, Exchange, Relay, earliest, timeout_detail
from kthena_router.proxy.relay_json import JsonRelay
from kthena_router.proxy.relay_sse import SseStreamRelay
from kthena_router.proxy.upstream import BodyTooLarge, H1Conn, PoolExhausted, Response, UpstreamConnectError, \
    UpstreamError, UpstreamPool, UpstreamTimeout
from kthena_router.routing.table import RouteMatch
from kthena_router.scheduling.request import RequestInfo
from kthena_router.session import prefer_first
from kthena_router.settings import RouterSettings


_MAX_ERROR_BODY = 1 << 16  # a larger 5xx body is not worth keeping the connection for


class Executor:
    """Per worker: runs the attempts of one request against a route match's endpoints."""

    def __init__(self, settings: RouterSettings, pool: UpstreamPool, balancer: Balancer,
                 metrics: RouterMetrics, prober: HealthProber, *, stream_relay: Relay | None = None,
                 buffered_relay: Relay | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.balancer = balancer
        self.metrics = metrics
        self.prober = prober
        self.stream_relay: Relay = stream_relay or SseStreamRelay()
        self.buffered_relay: Relay = buffered_relay or JsonRelay()

    async def run(self, x: Exchange, match: RouteMatch, targets: tuple[EndpointState, ...],
                  info: RequestInfo | None, head: bytes, tail: bytes, payload: bytes,
                  traffic: ServerTraffic, pinned: EndpointState | None = None,
                  preferred: EndpointState | None = None) -> None:
        """Deliver a response to the client, or raise RequestError (nothing sent yet).

        `head` is the request line, `tail` the headers after Host (CRLF-terminated, with
        the final empty line), `payload` the body; `traffic` the server's resolved settings.
        `pinned`: only this endpoint may answer (it holds the stored response the request
        refers to); the balancer is bypassed. `preferred`: tried first while it is one of the
        balancer's candidates (session stickiness)."""
        server = match.server
        balancer = self.balancer
        loop = asyncio.get_running_loop()
        x.apply_limits(traffic.timeouts, traffic.max_buffered_response_bytes, loop.time())
        if pinned is not None:
            candidates = [pinned] if pinned.health.healthy else []
        else:
            if info is not None:
                await balancer.prepare(info)
            candidates = balancer.candidates(server.key, targets, info)
            if preferred is not None:
                candidates = prefer_first(candidates, preferred)
        if not candidates:
            self.prober.probe_soon(targets)
            raise RequestError(503, f"no healthy endpoint for model `{x.model_label}`")
        if server.retry_attempts is not None:  # explicit policy, 0 = no retry
            attempts = 1 + server.retry_attempts
            if pinned is None and attempts > len(candidates):
                candidates = with_fallbacks(candidates, targets)
        else:  # no retry policy: each candidate at most once, up to the default count
            attempts = min(self.settings.default_retry_endpoints, len(candidates))
        last: AttemptFailure | None = None
        idx = 0
        tried = 0
        for attempt in range(attempts):
            ep = _next_candidate(candidates, idx)
            if ep is None:
                break
            idx = candidates.index(ep) + 1
            if attempt:
                if x.deadline is not None and loop.time() + server.retry_interval_s >= x.deadline:
                    break  # no time left for another attempt
                self.metrics.retry(x.server_label)
                if server.retry_interval_s > 0:
                    await asyncio.sleep(server.retry_interval_s)
            x.endpoint_label = ep.key
            tried += 1
            last = await self.tracked_attempt(x, ep, head, tail, payload, info)
            if last is None:
                return
            if x.committed:  # the relay has ended the response
                return
        if last is None:
            raise RequestError(503, f"no healthy endpoint for model `{x.model_label}`")
        if last.failure is Failure.TIMEOUT:
            raise RequestError(504, f"upstream timed out: {last.detail} ({tried} attempt(s))", code=504)
        raise RequestError(502, f"upstream request failed ({last.detail}; {tried} attempt(s))", code=502)

    async def tracked_attempt(self, x: Exchange, ep: EndpointState, head: bytes, tail: bytes, payload: bytes,
                              info: Any) -> AttemptFailure | None:
        """One attempt with the endpoint's health feedback (stall tracking, outlier detection)
        and the upstream-error metric; None when a complete response went to the client."""
        pending = ep.health.begin()  # stall tracking until the outcome is known
        try:
            last = await self.attempt(x, ep, head, tail, payload, info, pending)
        except BaseException:
            ep.health.abandon(pending)
            raise
        ep.health.finish(pending, None if last is None else last.failure)
        if last is not None:
            self.metrics.upstream_error(x.server_label, ep.key, last.failure.value)
        return last

    async def attempt(self, x: Exchange, ep: EndpointState, head: bytes, tail: bytes, payload: bytes,
                      info: Any, pending: Pending, feedback: Any = None,
                      stream_relay: Relay | None = None) -> AttemptFailure | None:
        """One upstream attempt; None when a complete response went to the client.
        `feedback` receives dispatched/finished/observe_prompt_tokens (default: the balancer;
        the PD dispatcher passes its pairer's decode side), `stream_relay` replaces the SSE relay."""
        balancer = self.balancer if feedback is None else feedback
        gauge = self.metrics.upstream(x.route_label, x.server_label, ep.key)
        gauge.inc()
        conn: H1Conn | None = None
        resp: Response | None = None
        x.begin_attempt(time.perf_counter())
        balancer.dispatched(ep, info)
        if info is not None and info.pending is not None:
            x.on_first_token = info.prefilled
        t = x.timeouts
        loop = asyncio.get_running_loop()
        start = loop.time()
        response_at = start + t.response_s if t.response_s is not None else None
        head_at = first_at = None
        try:
            pool = self.pool.h1
            dest = pool.dest(ep.ip, ep.port, ep.ssl, ep.server_hostname, ep.host)
            try:
                total_left = x.deadline - start if x.deadline is not None else math.inf
                connect_s = min(t.connect_s, total_left)
                if t.response_s is not None:
                    connect_s = min(connect_s, t.response_s)
                conn = await pool.acquire(dest, connect_s, min(t.pool_wait_s, total_left))
                conn.send(head + dest.host_line + tail, payload)
                if x.stream and t.first_token_s is not None:
                    first_at = loop.time() + t.first_token_s
                x.first_token_at = first_at
                conn.timeout_s = None
                conn.deadline = head_at = earliest(response_at, first_at, x.deadline)
                resp = await conn.read_head()
            except UpstreamTimeout as exc:
                if first_at is not None and (response_at is None or first_at < response_at):
                    phase = f"no first token within firstToken ({t.first_token_s:g}s)"
                else:  # response_at set, or only the total deadline (phase unused then)
                    phase = f"no response headers within the response timeout ({t.response_s or 0:g}s)"
                return AttemptFailure(Failure.TIMEOUT, timeout_detail(x, exc, head_at, phase))
            except UpstreamConnectError as exc:
                return AttemptFailure(Failure.CONNECT, str(exc))
            except PoolExhausted as exc:
                raise RequestError(503, f"the router is overloaded: {exc}; retry later",
                                   code="pool_exhausted") from None
            except (UpstreamError, OSError) as exc:
                return AttemptFailure(Failure.DIED, f"connection lost before the response ({type(exc).__name__})")
            ep.health.first_byte(pending)
            status = resp.status
            if status >= 500:
                try:
                    resp.set_timeouts(t.idle_s, x.deadline)
                    await resp.read_all(_MAX_ERROR_BODY)  # keeps the connection when small
                except (UpstreamError, OSError, BodyTooLarge):
                    pass
                return AttemptFailure(Failure.HTTP_5XX, f"upstream HTTP {status}")
            if status == 200 and x.stream and resp.content_type.startswith("text/event-stream") \
                    and not content_encoded(resp.raw_headers):  # compressed anyway: relayed as is
                return await (stream_relay or self.stream_relay).relay(x, resp)
            resp.set_timeouts(t.idle_s, x.deadline)
            return await self.buffered_relay.relay(x, resp)
        finally:
            gauge.dec()
            balancer.finished(ep, x.att_ttft, x.att_tpot, info)
            if info is not None and x.att_prompt_tokens:
                balancer.observe_prompt_tokens(info, x.att_prompt_tokens)
            # A fully read response has already gone back to the pool (close is a no-op
            # then); otherwise this drops the connection and the engine aborts.
            if resp is not None:
                resp.close()
            elif conn is not None:
                conn.close()


def with_fallbacks(candidates: list[EndpointState], targets: Sequence[EndpointState]) -> list[EndpointState]:
    """The ranked candidates, then the other usable endpoints: when the scheduler's filter kept
    fewer endpoints than there are retries, a retry goes to an endpoint not yet tried rather
    than back to the one that just failed."""
    now = time.monotonic()
    ranked = set(map(id, candidates))
    return candidates + [ep for ep in targets if id(ep) not in ranked and ep.health.usable(now)]


def _next_candidate(candidates: list[EndpointState], start: int) -> EndpointState | None:
    """The next candidate in cyclic order from `start` that is still usable; if none is
    (panic, or they all failed meanwhile), the next one anyway: a try beats a 503."""
    n = len(candidates)
    now = time.monotonic()
    for i in range(n):
        ep = candidates[(start + i) % n]
        if ep.health.usable(now):
            return ep
    return candidates[start % n] if n else None
