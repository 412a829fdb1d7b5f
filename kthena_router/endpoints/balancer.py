"""Endpoint choice: round-robin among healthy endpoints, as an ordered candidate list.

The proxy tries candidates in order (retry before the first byte moves to the next one),
so a scheduling plugin (step 2) can replace this by returning a differently ordered list.
Counters are per worker process.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, TypeVar


class HasHealth(Protocol):
    @property
    def health(self) -> "_Healthy": ...


class _Healthy(Protocol):
    healthy: bool


T = TypeVar("T", bound=HasHealth)


class Balancer(Protocol):
    """What the proxy calls: RoundRobinBalancer, or scheduling.scheduler.Scheduler.
    `info` is a scheduling.request.RequestInfo, built only if `needs_request_info`."""

    needs_request_info: bool

    async def prepare(self, info: Any) -> None: ...

    def candidates(self, key: Any, endpoints: Any, info: Any = None) -> list[Any]: ...

    def dispatched(self, ep: Any, info: Any) -> None: ...

    def finished(self, ep: Any, ttft_s: float | None = None, tpot_s: float | None = None) -> None: ...

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        """The engine reported the request's prompt size (usage.prompt_tokens)."""


class RoundRobinBalancer:
    needs_request_info = False

    def __init__(self) -> None:
        self._counters: dict[Hashable, itertools.count[int]] = {}

    async def prepare(self, info: Any) -> None:
        pass

    def dispatched(self, ep: Any, info: Any) -> None:
        pass

    def finished(self, ep: Any, ttft_s: float | None = None, tpot_s: float | None = None) -> None:
        pass

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        pass

    def candidates(self, key: Hashable, endpoints: Sequence[T], info: Any = None) -> list[T]:
        """Healthy endpoints, rotated by one position per call for this key."""
        healthy = [ep for ep in endpoints if ep.health.healthy]
        n = len(healthy)
        if n <= 1:
            return healthy
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = itertools.count()
        start = next(counter) % n
        return healthy[start:] + healthy[:start]
