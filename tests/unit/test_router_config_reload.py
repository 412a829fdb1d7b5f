"""RouterConfigReloader: an unchanged scheduler section keeps the live scheduler, a changed
one installs a new scheduler synced with the live endpoints; SwitchingBalancer keeps the
in-flight counts of the new scheduler balanced across the swap."""

from __future__ import annotations

import asyncio
from pathlib import Path

from config_fixtures import endpoints as endpoint_doc
from config_fixtures import load, route, server
from prometheus_client import CollectorRegistry
from test_scheduling_scheduler import KEY, cfg, chat, endpoints, sched

from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.metrics import RouterMetrics
from kthena_router.router_config_reload import RouterConfigReloader, SwitchingBalancer
from kthena_router.routing.table import RouteTable
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.settings import RouterSettings
from kthena_router.state import StateHolder, build_state

PLAIN = cfg("least-request")
PREFIX = cfg("least-request", "prefix-cache")


def _rc(text: str, tag: str = ""):
    return load_router_configuration_bytes((text + tag).encode(), source="rc.yaml")


def _reloader(tmp_path: Path, text: str) -> tuple[RouterConfigReloader, StateHolder]:
    docs = [route(model="demo", server="demo"), server("demo", labels={"app": "demo"}),
            endpoint_doc(eps=[{"address": "127.0.0.1", "port": 9000 + i, "labels": {"app": "demo"}} for i in range(2)])]
    config = load(tmp_path, docs)
    holder = StateHolder()
    holder.install(build_state(config, RouteTable.build(config), EndpointRegistry().build(config)), 0)
    reloader = RouterConfigReloader(RouterSettings(config_path="unused"), RouterMetrics(CollectorRegistry()),
                                    _rc(text), holder)
    reloader.on_state(holder.current)
    return reloader, holder


def test_unchanged_scheduler_section_keeps_the_live_scheduler(tmp_path: Path) -> None:
    reloader, _ = _reloader(tmp_path, PLAIN)
    live = reloader.scheduler
    newer = _rc(PLAIN, "# a comment changes the digest only\n")
    reloader.on_config(newer)
    assert reloader.holder.current is newer
    assert reloader.scheduler is live and reloader.balancer.inner is live


def test_changed_scheduler_section_installs_a_synced_scheduler(tmp_path: Path) -> None:
    async def run() -> None:
        reloader, holder = _reloader(tmp_path, PLAIN)
        old = reloader.scheduler
        assert not old.use_prefix
        newer = _rc(PREFIX)
        reloader.on_config(newer)
        assert reloader.holder.current is not newer  # built off the request path first
        await asyncio.gather(*reloader._tasks)
        assert reloader.holder.current is newer
        new = reloader.scheduler
        assert new is not old and new.use_prefix and reloader.balancer.inner is new
        targets = holder.current.targets[KEY]
        picked = reloader.balancer.candidates(KEY, targets, chat("r1", "hello"))
        assert sorted(ep.key for ep in picked) == sorted(ep.key for ep in targets)

    asyncio.run(run())


def test_newer_config_wins_over_a_rebuild_in_progress(tmp_path: Path) -> None:
    async def run() -> None:
        reloader, _ = _reloader(tmp_path, PLAIN)
        live = reloader.scheduler
        reloader.on_config(_rc(PREFIX))  # rebuild scheduled ...
        newest = _rc(PLAIN, "# back\n")
        reloader.on_config(newest)  # ... then the original pipeline comes back
        await asyncio.gather(*reloader._tasks)
        assert reloader.holder.current is newest and reloader.scheduler is live

    asyncio.run(run())


def test_attempts_from_before_a_swap_do_not_touch_the_new_scheduler() -> None:
    old, _ = sched(PLAIN)
    new, _ = sched(PLAIN)
    eps = endpoints(2)
    old.sync({KEY: eps})
    new.sync({KEY: eps})
    balancer = SwitchingBalancer(old)
    balancer.dispatched(eps[0], chat("a", "q"))
    balancer.dispatched(eps[0], chat("b", "q"))
    balancer.swap(new)
    balancer.dispatched(eps[0], chat("c", "q"))
    assert new.signals(KEY, eps[0].key)["in_flight"] == 1
    balancer.finished(eps[0])  # the two earlier attempts end: the new scheduler is not decremented
    balancer.finished(eps[0])
    assert new.signals(KEY, eps[0].key)["in_flight"] == 1
    balancer.finished(eps[0])
    assert new.signals(KEY, eps[0].key)["in_flight"] == 0
