"""Per request: the session key's pinned endpoint (a soft preference), and the new pin.

`lookup` runs after the route match: it reads the key's pin (refreshing its expiry) and
finds the pinned endpoint among the matched server's targets. The executor tries it first
only while it is a usable candidate (prefer_first: the balancer's list already left out
ejected, stalled and filtered endpoints); otherwise normal scheduling runs. `record` runs
when the response starts (after any retry, before the client has the answer, so the next
request of the session finds the pin): the endpoint that answered becomes the pin.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.model import ModelRoute, SessionSticky
from ..metrics import RouterMetrics
from .config import DEFAULT_STICKY, StickySettings
from .keys import session_key
from .stores import MemoryStore, RedisStore, Store, StoreUnavailable

__all__ = ["Pin", "SessionAffinity", "prefer_first"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Pin:
    route: str  # namespace/name (metric label)
    digest: bytes  # hash of (route, session key): the store's key
    ttl_s: int
    store: Store
    token: Any  # the stored endpoint token; None for a new key
    preferred: Any  # the pinned EndpointState among the targets, or None
    recorded: bool = False


def prefer_first(candidates: list[Any], preferred: Any) -> list[Any]:
    """The candidates with `preferred` first, if it is one of them (else unchanged)."""
    if not candidates or candidates[0] is preferred or preferred not in candidates:
        return candidates
    return [preferred, *(c for c in candidates if c is not preferred)]


class SessionAffinity:
    """Per worker. `settings()` returns the installed router configuration's sessionSticky
    section (None: the defaults); a reload that changes it replaces the store."""

    def __init__(self, runtime_dir: str, metrics: RouterMetrics,
                 settings: Callable[[], StickySettings | None]) -> None:
        self.runtime_dir = runtime_dir
        self.metrics = metrics
        self._settings = settings
        self._cfg: StickySettings | None = None
        self._store: Store | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def store(self) -> Store:
        cfg = self._settings() or DEFAULT_STICKY
        if cfg is not self._cfg or self._store is None:
            if self._cfg is None or cfg.store_key != self._cfg.store_key or self._store is None:
                old, self._store = self._store, self._build(cfg)
                if old is not None:
                    self._spawn(old.close())
            self._cfg = cfg
        assert self._store is not None
        return self._store

    def _build(self, cfg: StickySettings) -> Store:
        if cfg.backend == "redis" and cfg.redis is not None:
            log.info("session stickiness: redis store at %s (db %d)", cfg.redis.address, cfg.redis.db)
            store = RedisStore(cfg.redis)
            store.on_error = self.metrics.session_store_error
            return store
        return MemoryStore(cfg.max_entries, self.runtime_dir)

    def for_route(self, route: ModelRoute) -> SessionSticky | None:
        """The route's sessionSticky: the router configuration's override, else its own."""
        cfg = self._settings()
        return route.session_sticky if cfg is None else cfg.for_route(route)

    async def lookup(self, route: ModelRoute, headers: Mapping[str, str], raw_headers: Sequence[tuple[bytes, bytes]],
                     query_string: bytes, claims: Mapping[str, Any], targets: Sequence[Any],
                     sticky: SessionSticky | None = None) -> Pin | None:
        sticky = sticky or self.for_route(route)
        assert sticky is not None
        label = f"{route.namespace}/{route.name}"
        key = session_key(sticky.sources, headers, raw_headers, query_string, claims)
        if not key:
            self.metrics.session_sticky(label, "no_key")
            return None
        digest = hashlib.blake2b(f"{label}\0{key}".encode(), digest_size=16).digest()
        store = self.store()
        try:
            token = await store.get(digest, sticky.affinity_seconds)
        except StoreUnavailable:
            self.metrics.session_sticky(label, "unavailable")
            return None
        preferred = None
        if token is not None:
            for ep in targets:
                if store.token(ep.key) == token:
                    preferred = ep
                    break
        return Pin(label, digest, sticky.affinity_seconds, store, token, preferred)

    def record(self, pin: Pin, endpoint_key: str) -> None:
        """The response starts from `endpoint_key`: count the outcome, pin it if it moved."""
        if pin.recorded or not endpoint_key:
            return
        pin.recorded = True
        if pin.preferred is not None and pin.preferred.key == endpoint_key:
            self.metrics.session_sticky(pin.route, "hit")  # expiry already refreshed by the read
            return
        self.metrics.session_sticky(pin.route, "miss" if pin.token is None else "moved")
        store = pin.store
        token = store.token(endpoint_key)
        if isinstance(store, MemoryStore):
            store.put_now(pin.digest, token, pin.ttl_s)
        else:  # off the response path; the write goes out before the client has the answer
            self._spawn(self._put(store, pin.digest, token, pin.ttl_s))

    @staticmethod
    async def _put(store: Store, digest: bytes, token: Any, ttl_s: int) -> None:
        try:
            await store.put(digest, token, ttl_s)
        except StoreUnavailable:
            pass  # counted by the store; the next request of the session is a miss

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a test, shutdown): nothing to write to
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._store is not None:
            await self._store.close()
            self._store = None
