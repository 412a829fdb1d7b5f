"""Endpoint health: outlier detection on attempt outcomes, re-admission by an active probe.

State machine per endpoint (per worker process):
- healthy: candidates include it (unless its in-flight attempts make no progress, below).
- ejected: excluded until `ejected_until`; after that, the next successful active probe
  re-admits it. The backoff (baseEjectionTime) doubles with each ejection not separated
  by a successful request (a flapping endpoint stays out longer), capped at
  maxEjectionTime. Failed probes of an ejected endpoint keep it out without growing the
  backoff: it returns one probe interval after it recovers.
- on trial (just re-admitted, or an attempt of it was judged stalled with no first byte
  since it was sent): one attempt at a time until a first byte arrives (a half-open circuit), so an engine that answers
  /health but never answers requests gets one request at a time, not a share of the
  traffic, until consecutive failures eject it.
Ejection (Envoy-style, traffic.outlierDetection): `consecutiveFailures` failed attempts in
a row, or a failure share of at least `failureRatePercent` among the attempts of the last
`interval` once there were `failureRateMinRequests` of them. Every failure kind counts
(connection errors, timeouts, stalls, 5xx, invalid output, a stream that broke); any
success resets the run. So one request that makes every engine fail (a "poison" request)
adds one failure per engine and cannot eject the fleet while consecutiveFailures >= 2;
and if most of a server's endpoints are out anyway, the panic threshold
(endpoints/selection.py) routes to all of them rather than answer 503.
A failed active probe ejects at once (an engine that is down is found without traffic).

Stalls: every attempt is tracked from sending until its outcome (begin / first_byte /
finish or abandon); see endpoints/outlier.py. An attempt judged stalled counts as one
failure right then, and its later outcome is not counted again; an attempt the client
gave up on after waiting past that threshold counts the same way. The first byte is the
upstream's response head.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from enum import Enum
from typing import TYPE_CHECKING

import aiohttp

from kthena_router.config.traffic import OutlierDetection
from kthena_router.endpoints.outlier import WAITING, FailureWindow, Pending, StallTracker

if TYPE_CHECKING:
    from kthena_router.endpoints.registry import EndpointState

log = logging.getLogger(__name__)

DEFAULT_OUTLIER = OutlierDetection()


class Failure(str, Enum):
    CONNECT = "connect_error"
    TIMEOUT = "timeout"
    STALLED = "stalled"  # waited far longer for the first byte than the endpoint's recent TTFT
    HTTP_5XX = "http_5xx"
    INVALID = "invalid_output"
    DIED = "died"  # connection lost after the first byte


class EndpointHealth:
    __slots__ = ("healthy", "ejected_until", "ejections", "consecutive", "window", "stall", "on_change",
                 "policy", "on_stalled", "trial")

    def __init__(self, on_change: Callable[[bool], None] | None = None,
                 policy: OutlierDetection = DEFAULT_OUTLIER) -> None:
        self.policy = policy
        self.healthy = True  # optimistic: the first request need not wait for a probe
        self.ejected_until = 0.0
        self.ejections = 0  # consecutive ejections, drives the backoff
        self.consecutive = 0  # failed attempts in a row
        self.window = FailureWindow(policy.interval_s)
        self.stall = StallTracker()
        self.on_change = on_change
        self.on_stalled: Callable[[int], None] | None = None  # attempts newly judged stalled (metric)
        self.trial = False  # re-admitted, no first byte since: one attempt at a time

    def set_policy(self, policy: OutlierDetection) -> None:
        if policy != self.policy:
            if policy.interval_s != self.policy.interval_s:
                self.window = FailureWindow(policy.interval_s)
            self.policy = policy

    def _set(self, healthy: bool) -> None:
        if healthy != self.healthy:
            self.healthy = healthy
            if self.on_change is not None:
                self.on_change(healthy)

    # --- attempt outcomes -----------------------------------------------------------------

    def record_success(self, now: float | None = None) -> None:
        self.consecutive = 0
        self.window.record(time.monotonic() if now is None else now, False)
        if self.healthy:
            self.ejections = 0

    def record_failure(self, kind: Failure, now: float | None = None) -> bool:
        """Passive observation; returns True if the endpoint got ejected by it."""
        now = time.monotonic() if now is None else now
        self.consecutive += 1
        self.window.record(now, True)
        if not self.healthy:
            return False
        od = self.policy
        if self.consecutive < od.consecutive_failures:
            if od.failure_rate_percent is None:
                return False
            total, failed = self.window.counts(now)
            if total < od.failure_rate_min_requests or failed * 100 < od.failure_rate_percent * total:
                return False
        self.eject(now)
        return True

    def eject(self, now: float) -> None:
        self.consecutive = 0
        self.window.clear()  # re-admitted endpoints start with a clean record
        if self.healthy or now >= self.ejected_until:
            od = self.policy
            backoff = min(od.base_ejection_s * (2 ** min(self.ejections, 30)), od.max_ejection_s)
            self.ejections += 1
            self.ejected_until = now + backoff
        self._set(False)

    # --- attempts in flight (stall tracking) ----------------------------------------------

    def begin(self, now: float | None = None) -> Pending:
        """An attempt is sent now; pair with first_byte, then finish or abandon."""
        return self.stall.begin(time.monotonic() if now is None else now)

    def first_byte(self, p: Pending, now: float | None = None) -> None:
        self.trial = False
        self.stall.first_byte(p, time.monotonic() if now is None else now)

    def finish(self, p: Pending, failure: Failure | None = None, now: float | None = None) -> None:
        """The attempt's outcome (None: success), counted unless a stall already counted it."""
        if self.stall.end(p) is False:
            if failure is None:
                self.record_success(now)
            else:
                self.record_failure(failure, now)

    def abandon(self, p: Pending, now: float | None = None) -> None:
        """The attempt ended without an outcome (the client left; no-op once finished).
        Waiting past the stall threshold still counts as a stall."""
        if p.state == WAITING:
            now = time.monotonic() if now is None else now
            od = self.policy
            if now - p.start > self.stall.threshold(od.stall_factor, od.stall_min_s):
                self.stall.end(p)
                self._stalled(1, now, p.start > self.stall.last_progress)
                return
        self.stall.end(p)

    def _stalled(self, n: int, now: float, no_progress: bool) -> None:
        if no_progress:  # a slow attempt on an engine that answers others is not a reason
            self.trial = True
        if self.on_stalled is not None:
            self.on_stalled(n)
        for _ in range(n):
            self.record_failure(Failure.STALLED, now)

    def usable(self, now: float) -> bool:
        """A candidate: not ejected, its in-flight attempts make progress, and not on trial
        with an attempt out. Judges attempts that now count as stalled (each once)."""
        stall = self.stall
        if stall.waiting:
            od = self.policy
            n = stall.judge(now, od.stall_factor, od.stall_min_s)
            if n:
                progressing = stall.progressing()
                self._stalled(n, now, not progressing)
                if not progressing:
                    return False
        return self.healthy and stall.progressing() and not (self.trial and stall.waiting)

    # --- active probe ---------------------------------------------------------------------

    def probe_result(self, ok: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if ok:
            if not self.healthy and now >= self.ejected_until:
                self.trial = True
                self._set(True)
        elif self.healthy:
            self.eject(now)

    def probe_due(self, now: float) -> bool:
        """Ejected endpoints are worth probing only once their backoff has passed."""
        return self.healthy or now >= self.ejected_until


class HealthProber:
    """Active probing: GET /health of every endpoint every `interval_s` (per worker;
    idle while `remote`: the pod-state hub probes for every worker, podstate/link.py)."""

    def __init__(self, session_getter: Callable[[], aiohttp.ClientSession],
                 endpoints: Callable[[], Iterable["EndpointState"]],
                 interval_s: float, timeout_s: float) -> None:
        self._session = session_getter
        self._endpoints = endpoints
        self._interval = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[str] = set()
        self._bg: set[asyncio.Task[None]] = set()
        self.remote = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in [self._task, *self._bg]:
            if task is not None:
                task.cancel()
        for task in [self._task, *self._bg]:
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if self.remote:
                continue
            try:
                await self.probe_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # a probe round must never kill the loop
                log.exception("health probe round failed")

    async def probe_all(self) -> None:
        now = time.monotonic()
        due = [ep for ep in self._endpoints() if ep.health.probe_due(now)]
        if due:
            await asyncio.gather(*(self.probe(ep) for ep in due))

    def probe_soon(self, eps: Iterable["EndpointState"]) -> None:
        """On-demand probes (e.g. when every endpoint of a server is ejected)."""
        now = time.monotonic()
        for ep in eps:
            if ep.key not in self._inflight and ep.health.probe_due(now):
                task = asyncio.get_running_loop().create_task(self.probe(ep))
                self._bg.add(task)
                task.add_done_callback(self._bg.discard)

    async def probe(self, ep: "EndpointState") -> None:
        if ep.key in self._inflight:
            return
        self._inflight.add(ep.key)
        try:
            ok = False
            try:
                async with self._session().get(ep.base_url + "/health", timeout=self._timeout,
                                               headers=ep.probe_headers, ssl=ep.ssl) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                ok = False
            ep.health.probe_result(ok)
        finally:
            self._inflight.discard(ep.key)
