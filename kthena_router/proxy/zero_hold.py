"""Holding requests for a ModelServer with zero endpoints (scale from zero).

Settings: the router configuration's `scaleFromZero` (config/scale_from_zero.py). A request
whose route resolves to a ModelServer without a single endpoint waits here (per worker)
until a routing-state install (config reload, DNS refresh, Kubernetes pods' view) or its
hold timeout, then forward.py matches it again against the new state. No polling: every
install sets one asyncio.Event that all held requests wait on, and a new one replaces it.
Held requests are counted in kthena_router_pending_requests{model,model_server} (livesum
over workers) from the start of the hold to its end, whatever the end (endpoint, timeout,
client disconnect: the disconnect watch cancels the waiting task).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from kthena_router.config.model import ModelServer
from kthena_router.config.scale_from_zero import DEFAULT_SCALE_FROM_ZERO, HoldSettings, ScaleFromZeroSettings
from kthena_router.errors import RequestError
from kthena_router.metrics import RouterMetrics

__all__ = ["Hold", "ZeroHold"]


class ZeroHold:
    """Per worker: the held requests and the event that releases them."""

    def __init__(self, metrics: RouterMetrics, workers: int = 1,
                 settings: Callable[[], ScaleFromZeroSettings] = lambda: DEFAULT_SCALE_FROM_ZERO) -> None:
        self.metrics = metrics
        self.workers = max(1, workers)
        self.settings = settings  # the installed router configuration's section, read per use
        self.held = 0  # requests held in this worker (the admission limit does not count them)
        self._by_server: dict[tuple[str, str], int] = {}
        self._changed: asyncio.Event | None = None

    def settings_for(self, server: ModelServer) -> HoldSettings:
        return self.settings().for_server(server.namespace, server.name)

    def on_state(self, state: Any) -> None:
        """After every routing-state install (and router-configuration install): wake every
        held request to look again; publish the pending series that may be used."""
        ev = self._changed
        if ev is not None:
            self._changed = None
            ev.set()
        if state is not None:
            self._publish_zeros(state)

    def _publish_zeros(self, state: Any) -> None:
        """A series (0 until something is held) for every (model, ModelServer) that holding is
        on for, so that a reader sees "nothing pending" rather than "no data". Creating the
        label child writes its 0 (multiprocess mode); the children are cached, bounded by
        the config."""
        settings = self.settings()
        servers = state.config.servers
        for route in state.config.routes:
            models = ((route.model_name,) if route.model_name else ()) + tuple(route.lora_adapters)
            for rule in route.rules:
                for target in rule.targets:
                    server = servers.get((route.namespace, target.model_server_name))
                    if server is None or not settings.for_server(server.namespace, server.name).enabled:
                        continue
                    for model in models:
                        self.metrics.pending(model, f"{server.namespace}/{server.name}")

    def hold(self, server: ModelServer, server_label: str, model: str, hs: HoldSettings) -> Hold:
        """Start holding (raises 503 at once when this worker's share of maxPending is taken)."""
        cap = math.ceil(hs.max_pending / self.workers)
        key = server.key
        n = self._by_server.get(key, 0)
        if n >= cap:
            raise RequestError(
                503, f"model `{model}` has no replicas (ModelServer {server_label} has no endpoint) and "
                     f"{hs.max_pending} requests are already waiting for it to scale from zero "
                     "(scaleFromZero.maxPending); retry later", code="too_many_pending",
                headers=[(b"retry-after", b"1")])
        self._by_server[key] = n + 1
        self.held += 1
        return Hold(self, key, self.metrics.pending(model, server_label))

    def _release(self, key: tuple[str, str]) -> None:
        self.held -= 1
        n = self._by_server[key] - 1
        if n:
            self._by_server[key] = n
        else:
            del self._by_server[key]

    def _event(self) -> asyncio.Event:
        ev = self._changed
        if ev is None:
            ev = self._changed = asyncio.Event()
        return ev


class Hold:
    """One held request (a context manager: counted while inside)."""

    __slots__ = ("owner", "key", "gauge")

    def __init__(self, owner: ZeroHold, key: tuple[str, str], gauge: Any) -> None:
        self.owner = owner
        self.key = key
        self.gauge = gauge

    def __enter__(self) -> Hold:
        self.gauge.inc()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gauge.dec()
        self.owner._release(self.key)

    async def next_change(self, deadline: float) -> bool:
        """Wait for the next state install; False when `deadline` (loop time) came first."""
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        try:
            async with asyncio.timeout(left):
                await self.owner._event().wait()
        except TimeoutError:
            return False
        return True
