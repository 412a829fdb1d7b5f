"""StateHolder compare-and-swap: a DNS refresh or a slow reload never installs an older
config over a newer one. The interleavings are forced with events, not timing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from config_fixtures import endpoints, load, route, server
from prometheus_client import CollectorRegistry

from kthena_router.config.model import RouterConfig
from kthena_router.config_applier import ConfigApplier
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.metrics import RouterMetrics
from kthena_router.routing.table import RouteTable
from kthena_router.settings import RouterSettings
from kthena_router.state import StateHolder, build_state


class GatedRegistry(EndpointRegistry):
    """Resolves every name to `answers[name]`, but only once the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[str, list[str]] = {}
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.blocked = 0  # resolutions waiting at the gate

    async def _resolve(self, name: str) -> None:
        self.waiting.set()
        self.blocked += 1
        await self.gate.wait()
        self.blocked -= 1
        self._dns[name] = list(self.answers[name])

    async def until_blocked(self, n: int) -> None:
        while self.blocked < n:
            await asyncio.sleep(0)


def _config(tmp_path: Path, name: str, address: str) -> RouterConfig:
    eps = endpoints(eps=[{"address": address, "port": 9001, "labels": {"app": "s"}}])
    (tmp_path / name).mkdir(exist_ok=True)
    return load(tmp_path / name, [route(model=name), server(), eps])


def _applier() -> tuple[ConfigApplier, GatedRegistry, StateHolder]:
    registry = GatedRegistry()
    holder = StateHolder()
    applier = ConfigApplier(RouterSettings(config_path="unused"), holder, registry,
                            RouterMetrics(CollectorRegistry()))
    return applier, registry, holder


def _model(holder: StateHolder) -> str:
    assert holder.current is not None
    return holder.current.config.routes[0].model_name or ""


def test_install_is_compare_and_swap(tmp_path: Path) -> None:
    holder = StateHolder()
    cfg = _config(tmp_path, "a", "127.0.0.1")
    state = build_state(cfg, RouteTable.build(cfg), {})
    assert holder.install(state, 0) and holder.generation == 1
    assert not holder.install(state, 0)  # based on a generation that is gone
    assert holder.generation == 1 and holder.current is state


def test_dns_refresh_of_old_config_does_not_undo_a_reload(tmp_path: Path) -> None:
    async def run() -> None:
        applier, registry, holder = _applier()
        registry.answers["engine.internal"] = ["10.0.0.1"]
        registry.gate.set()
        await applier.apply(_config(tmp_path, "old", "engine.internal"))
        assert _model(holder) == "old"

        # A refresh awaits DNS (a new answer is coming) ...
        registry.gate.clear()
        registry.waiting.clear()
        registry.answers["engine.internal"] = ["10.0.0.2"]
        refresh = asyncio.create_task(applier.refresh_dns_once())
        await registry.waiting.wait()
        # ... while a reload with IP endpoints installs at once.
        applier.on_config(_config(tmp_path, "new", "127.0.0.1"))
        assert _model(holder) == "new"
        registry.gate.set()
        assert await refresh is False  # its basis is gone: nothing installed
        assert _model(holder) == "new"
        assert holder.generation == 2

    asyncio.run(run())


def test_slow_reload_does_not_overwrite_a_newer_one(tmp_path: Path) -> None:
    async def run() -> None:
        applier, registry, holder = _applier()
        await applier.apply(_config(tmp_path, "first", "127.0.0.1"))
        registry.answers["slow.internal"] = ["10.0.0.9"]
        applier.on_config(_config(tmp_path, "slow", "slow.internal"))  # waits for DNS
        await registry.waiting.wait()
        applier.on_config(_config(tmp_path, "newest", "127.0.0.2"))  # no names: installs now
        assert _model(holder) == "newest"
        registry.gate.set()
        await asyncio.gather(*applier._tasks)
        assert _model(holder) == "newest"
        assert holder.generation == 2

    asyncio.run(run())


def test_reload_lands_on_top_of_a_refresh_that_finished_first(tmp_path: Path) -> None:
    async def run() -> None:
        applier, registry, holder = _applier()
        registry.answers["engine.internal"] = ["10.0.0.1"]
        registry.gate.set()
        await applier.apply(_config(tmp_path, "old", "engine.internal"))
        registry.gate.clear()
        registry.waiting.clear()
        registry.answers["engine.internal"] = ["10.0.0.2"]
        # A refresh and then a reload both await DNS; the refresh of the old config resumes first.
        refresh = asyncio.create_task(applier.refresh_dns_once())
        await registry.waiting.wait()
        applier.on_config(_config(tmp_path, "new", "engine.internal"))
        await registry.until_blocked(2)  # the reload waits at the gate too, behind the refresh
        registry.gate.set()
        results = await asyncio.gather(refresh, *applier._tasks)
        assert results[0] is True  # the refresh installed first (generation 2) ...
        assert _model(holder) == "new"  # ... and the reload installed over it
        assert holder.generation == 3
        assert [ep.ip for eps in holder.current.targets.values() for ep in eps] == ["10.0.0.2"]

    asyncio.run(run())
