"""SessionAffinity with the memory store: outcomes, moves, and a reloaded store section."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from kthena_router.config.model import ModelRoute, SessionKeySource, SessionSticky
from kthena_router.metrics import RouterMetrics
from kthena_router.session import SessionAffinity, StickySettings
from kthena_router.session.stores import MemoryStore


class Ep:
    def __init__(self, key: str) -> None:
        self.key = key


ROUTE = ModelRoute("default", "r", "m", (), (), None, None, 0, (),
                   SessionSticky((SessionKeySource("Header", "x-session"),), 60))
TARGETS = [Ep("10.0.0.1:8000"), Ep("10.0.0.2:8000"), Ep("10.0.0.3:8000")]


def _count(metrics: RouterMetrics, result: str) -> float:
    return metrics.registry.get_sample_value("kthena_router_session_sticky_total",
                                             {"model_route": "default/r", "result": result}) or 0.0


def test_outcomes_and_moves(tmp_path: Path) -> None:
    async def run() -> None:
        metrics = RouterMetrics(CollectorRegistry())
        aff = SessionAffinity(str(tmp_path), metrics, lambda: None)
        lookup = lambda key: aff.lookup(ROUTE, {"x-session": key} if key else {}, [], b"", {}, TARGETS)  # noqa: E731
        pin = await lookup("k")
        assert pin is not None and pin.preferred is None and pin.token is None
        aff.record(pin, TARGETS[1].key)
        pin = await lookup("k")
        assert pin.preferred is TARGETS[1]
        aff.record(pin, TARGETS[1].key)
        aff.record(pin, TARGETS[1].key)  # one outcome per request
        pin = await lookup("k")
        aff.record(pin, TARGETS[2].key)  # served elsewhere (the pinned one was ejected): moved
        assert (await lookup("k")).preferred is TARGETS[2]
        assert (await lookup("")) is None
        gone = await aff.lookup(ROUTE, {"x-session": "k"}, [], b"", {}, TARGETS[:2])  # left the route
        assert gone.preferred is None and gone.token is not None
        assert [_count(metrics, r) for r in ("miss", "hit", "moved", "no_key")] == [1, 1, 1, 1]
        assert list(tmp_path.glob("session-sticky-100000.tbl"))
        await aff.close()

    asyncio.run(run())


def test_changed_store_section_replaces_the_store(tmp_path: Path) -> None:
    async def run() -> None:
        current = [StickySettings("memory", 1000)]
        aff = SessionAffinity(str(tmp_path), RouterMetrics(CollectorRegistry()), lambda: current[0])
        first = aff.store()
        current[0] = StickySettings("memory", 1000)  # equal section (a reload of another part)
        assert aff.store() is first
        current[0] = StickySettings("memory", 2000)
        second = aff.store()
        assert second is not first and isinstance(second, MemoryStore) and second.table.capacity == 2000
        await asyncio.sleep(0)  # the old store closes in the background
        await aff.close()

    asyncio.run(run())


def test_router_configuration_route_override(tmp_path: Path) -> None:
    """sessionSticky.routes: a route without its own setting becomes sticky, one with it uses the
    override's sources; changing only the overrides keeps the store (and its pins)."""
    async def run() -> None:
        plain = ModelRoute("default", "plain", "m", (), (), None, None, 0)
        by_cookie = SessionSticky((SessionKeySource("Cookie", "sid"),), 30)
        current = [StickySettings("memory", 1000, None, {"plain": by_cookie, "default/r": by_cookie})]
        aff = SessionAffinity(str(tmp_path), RouterMetrics(CollectorRegistry()), lambda: current[0])
        assert aff.for_route(plain) is by_cookie and aff.for_route(ROUTE) is by_cookie
        store = aff.store()
        pin = await aff.lookup(plain, {"cookie": "sid=abc"}, [(b"cookie", b"sid=abc")], b"", {}, TARGETS)
        assert pin is not None and pin.ttl_s == 30
        aff.record(pin, TARGETS[2].key)
        # the route's own header source is overridden: the header alone gives no key
        assert await aff.lookup(ROUTE, {"x-session": "k"}, [], b"", {}, TARGETS) is None
        current[0] = StickySettings("memory", 1000, None, {"plain": by_cookie})
        assert aff.for_route(ROUTE) is ROUTE.session_sticky
        assert aff.store() is store
        again = await aff.lookup(plain, {"cookie": "sid=abc"}, [(b"cookie", b"sid=abc")], b"", {}, TARGETS)
        assert again.preferred is TARGETS[2]  # the pin survived the change of overrides
        await aff.close()

    asyncio.run(run())
