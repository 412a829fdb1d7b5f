"""kthena_router_endpoint_kv_cache_usage{model_server,endpoint}: the engines' KV-cache usage
as the router's own scrape sees it, published for the autoscaler (`router:kv_cache_usage`).

Fed by the EngineStateScraper's snapshots (so only with --router-config, which runs the
scraper) and by every routing-state install (which endpoints belong to which ModelServer).
Every worker scrapes every endpoint, so each writes the same value: the gauge is `livemax`
(metrics.py), never summed. Unknown (never scraped, stale, the engine exports no usage) and
series whose endpoint left a ModelServer are written as metrics.KV_UNKNOWN, which the admin
server leaves out of /metrics: absent, never 0. Endpoints that leave the config altogether
are marked by RouterMetrics.prune_endpoints (registry.on_gone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kthena_router.engine_state.snapshot import EndpointSnapshot
from kthena_router.metrics import RouterMetrics

if TYPE_CHECKING:
    from kthena_router.state import RouterState

__all__ = ["KvUsagePublisher"]


class KvUsagePublisher:
    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        self._servers: dict[str, tuple[str, ...]] = {}  # endpoint key -> ModelServer labels
        self._last: dict[str, float | None] = {}  # endpoint key -> usage at its last snapshot

    def on_state(self, state: RouterState) -> None:
        """After a state install: follow the endpoint -> ModelServer membership."""
        new: dict[str, list[str]] = {}
        for eps in state.targets.values():
            for ep in eps:
                new.setdefault(ep.key, []).append(ep.server_label)
        for key, labels in self._servers.items():
            now = new.get(key)
            if now is None:  # left the config: pruned (and marked unknown) by registry.on_gone
                self._last.pop(key, None)
                continue
            for label in labels:
                if label not in now:  # still routed to, but no longer by this ModelServer
                    self.metrics.set_kv_usage(label, key, None)
        old = self._servers
        self._servers = {k: tuple(v) for k, v in new.items()}
        for key, labels in self._servers.items():  # a server that gained a known endpoint
            usage = self._last.get(key)
            if usage is not None:
                for label in labels:
                    if label not in old.get(key, ()):
                        self.metrics.set_kv_usage(label, key, usage)

    def on_snapshot(self, snap: EndpointSnapshot) -> None:
        """EngineStateScraper callback (after every scrape, good or failed)."""
        labels = self._servers.get(snap.key)
        if not labels:
            return
        usage = snap.kv_usage  # None: stale or not exported
        if usage is not None:
            usage = min(1.0, max(0.0, usage))
        if usage == self._last.get(snap.key, -2.0):
            return  # unchanged: nothing to write
        self._last[snap.key] = usage
        for label in labels:
            self.metrics.set_kv_usage(label, snap.key, usage)
