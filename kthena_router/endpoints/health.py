"""Endpoint health: passive ejection on failures, re-admission by an active /health probe.

State machine per endpoint (per worker process):
- healthy: candidates include it.
- ejected: excluded until `ejected_until`; after that, the next successful active probe
  re-admits it. The backoff doubles with each ejection not separated by a successful
  request (a flapping endpoint stays out longer), capped. Failed probes of an ejected
  endpoint keep it out without growing the backoff: it returns one probe interval after
  it recovers.
Connection errors, first-byte timeouts, stalls and invalid output eject at once. HTTP 5xx
ejects after `FIVE_XX_THRESHOLD` in a row, so that one request that makes every engine
fail (a "poison" request) cannot eject the whole fleet. Any success resets the counts.
A failed active probe ejects as well (an engine that is down is found without traffic).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterable
from enum import Enum
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from kthena_router.endpoints.registry import EndpointState

log = logging.getLogger(__name__)

BASE_EJECT_S = 1.0
MAX_EJECT_S = 30.0
FIVE_XX_THRESHOLD = 3


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    """Passive ejection: backoff doubles per consecutive ejection, capped."""

    base_s: float = BASE_EJECT_S
    max_s: float = MAX_EJECT_S
    five_xx_threshold: int = FIVE_XX_THRESHOLD  # one bad request must not eject every engine


DEFAULT_POLICY = EjectionPolicy()


class Failure(str, Enum):
    CONNECT = "connect_error"
    TIMEOUT = "timeout"
    HTTP_5XX = "http_5xx"
    INVALID = "invalid_output"
    DIED = "died"  # connection lost after the first byte


class EndpointHealth:
    __slots__ = ("healthy", "ejected_until", "ejections", "consecutive_5xx", "on_change", "policy")

    def __init__(self, on_change: Callable[[bool], None] | None = None,
                 policy: EjectionPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.healthy = True  # optimistic: the first request need not wait for a probe
        self.ejected_until = 0.0
        self.ejections = 0  # consecutive ejections, drives the backoff
        self.consecutive_5xx = 0
        self.on_change = on_change

    def _set(self, healthy: bool) -> None:
        if healthy != self.healthy:
            self.healthy = healthy
            if self.on_change is not None:
                self.on_change(healthy)

    def record_success(self) -> None:
        self.consecutive_5xx = 0
        if self.healthy:
            self.ejections = 0

    def record_failure(self, kind: Failure, now: float | None = None) -> bool:
        """Passive observation; returns True if the endpoint got ejected by it."""
        if kind is Failure.HTTP_5XX:
            self.consecutive_5xx += 1
            if self.consecutive_5xx < self.policy.five_xx_threshold:
                return False
        self.eject(time.monotonic() if now is None else now)
        return True

    def eject(self, now: float) -> None:
        self.consecutive_5xx = 0
        if self.healthy or now >= self.ejected_until:
            backoff = min(self.policy.base_s * (2 ** self.ejections), self.policy.max_s)
            self.ejections += 1
            self.ejected_until = now + backoff
        self._set(False)

    def probe_result(self, ok: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if ok:
            if not self.healthy and now >= self.ejected_until:
                self._set(True)
        elif self.healthy:
            self.eject(now)

    def probe_due(self, now: float) -> bool:
        """Ejected endpoints are worth probing only once their backoff has passed."""
        return self.healthy or now >= self.ejected_until


class HealthProber:
    """Active probing: GET /health of every endpoint every `interval_s` (per worker)."""

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
