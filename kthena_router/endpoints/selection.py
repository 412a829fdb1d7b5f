"""Which of a ModelServer's endpoints may take a request, with Envoy's panic threshold.

Usable: not ejected and making progress (EndpointHealth.usable). When fewer than
panicThresholdPercent of the server's endpoints are usable, every endpoint is a candidate
again ("panic"): after an overload that ejected the whole set, a try beats a certain 503,
and the engines that recovered answer at once instead of after their ejection backoff.
A threshold of 0 switches panic off (no usable endpoint: 503).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, TypeVar

from kthena_router.config.traffic import DEFAULT_TRAFFIC, TrafficSettings


class _Usable(Protocol):
    def usable(self, now: float) -> bool: ...


class HasHealth(Protocol):
    @property
    def health(self) -> _Usable: ...


T = TypeVar("T", bound=HasHealth)


class EndpointSelector:
    """Shared by the round-robin balancer and the scheduler (per worker)."""

    def __init__(self, traffic: TrafficSettings | Callable[[], TrafficSettings] = DEFAULT_TRAFFIC,
                 on_panic: Callable[[Any, Sequence[Any]], None] | None = None) -> None:
        # the installed settings (a callable follows router-configuration reloads)
        self._source = traffic if callable(traffic) else (lambda: traffic)
        self.traffic = self._source()
        self.on_panic = on_panic  # (server key, endpoints): metric, on-demand probes
        self._thresholds: dict[Hashable, float] = {}

    def threshold(self, key: Hashable) -> float:
        traffic = self._source()
        if traffic is not self.traffic:  # reloaded: thresholds are looked up afresh
            self.traffic, self._thresholds = traffic, {}
        pct = self._thresholds.get(key)
        if pct is None:
            ns, name = key if isinstance(key, tuple) and len(key) == 2 else ("", str(key))
            pct = self._thresholds[key] = self.traffic.for_server(ns, name, None).outlier.panic_threshold_percent
        return pct

    def usable(self, key: Hashable, endpoints: Sequence[T], now: float | None = None) -> tuple[list[T], bool]:
        """(candidates in the given order, whether that is every endpoint by panic)."""
        now = time.monotonic() if now is None else now
        ok = [ep for ep in endpoints if ep.health.usable(now)]
        n = len(endpoints)
        if len(ok) < n and len(ok) * 100 < self.threshold(key) * n:
            if self.on_panic is not None:
                self.on_panic(key, endpoints)
            return list(endpoints), True
        return ok, False
