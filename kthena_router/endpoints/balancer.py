"""Endpoint choice: round-robin among usable endpoints, as an ordered candidate list.

Usable (endpoints/selection.py): not ejected and not stalled, or every endpoint of the
server when too few are usable (panic threshold).

The proxy tries candidates in order (retry before the first byte moves to the next one),
so the scheduler can replace this by returning a differently ordered list.
Counters are per worker process; the Rust front's own decisions advance the same one
(`Rotation`, shared at each table install), so the rotation is exact whichever decides.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from kthena_router._core import Rotation
from kthena_router.endpoints.selection import EndpointSelector, T


class Balancer(Protocol):
    """What the proxy calls: RoundRobinBalancer, or scheduling.scheduler.Scheduler.
    `info` is a scheduling.request.RequestInfo, built only if `needs_request_info`."""

    needs_request_info: bool

    async def prepare(self, info: Any) -> None: ...

    def candidates(self, key: Any, endpoints: Any, info: Any = None) -> list[Any]: ...

    def dispatched(self, ep: Any, info: Any) -> None: ...

    def finished(self, ep: Any, ttft_s: float | None = None, tpot_s: float | None = None,
                 info: Any = None) -> None: ...

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        """The engine reported the request's prompt size (usage.prompt_tokens)."""


class NoFeedback:
    """The executor's balancer hooks for a picker that learns nothing from outcomes."""

    needs_request_info = False

    async def prepare(self, info: Any) -> None:
        pass

    def dispatched(self, ep: Any, info: Any) -> None:
        pass

    def finished(self, ep: Any, ttft_s: float | None = None, tpot_s: float | None = None,
                 info: Any = None) -> None:
        pass

    def observe_prompt_tokens(self, info: Any, prompt_tokens: int) -> None:
        pass


class RoundRobinBalancer(NoFeedback):
    def __init__(self, selector: EndpointSelector | None = None) -> None:
        self.selector = selector if selector is not None else EndpointSelector()
        self._rotations: dict[Hashable, Rotation] = {}

    def rotation(self, key: Hashable) -> Rotation:
        r = self._rotations.get(key)
        if r is None:
            r = self._rotations[key] = Rotation()
        return r

    def candidates(self, key: Hashable, endpoints: Sequence[T], info: Any = None) -> list[T]:
        """Usable endpoints, rotated by one position per call for this key."""
        healthy, _ = self.selector.usable(key, endpoints)
        n = len(healthy)
        if n <= 1:
            return healthy
        start = self.rotation(key).start(n)
        return healthy[start:] + healthy[:start]
