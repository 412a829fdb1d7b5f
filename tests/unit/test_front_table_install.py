"""What kthena_router/front/table.py installs in the Rust front (which models the front may
decide alone, their targets and rewrites) and when it tells the front a server is calm.
The front is a recording stand-in: the install's inputs are the logic under test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from config_fixtures import endpoints, load, route, server
from prometheus_client import CollectorRegistry

from kthena_router._core import PrefixIndex, Scorer
from kthena_router.endpoints.balancer import RoundRobinBalancer
from kthena_router.endpoints.registry import EndpointRegistry
from kthena_router.front.plan_cache import PlanCache
from kthena_router.front.table import FrontTable
from kthena_router.metrics import RouterMetrics
from kthena_router.router_config_reload import SwitchingBalancer
from kthena_router.routing.table import RouteTable
from kthena_router.scheduling.config import load_router_configuration_bytes
from kthena_router.scheduling.scheduler import Scheduler
from kthena_router.state import RouterState, StateHolder, build_state


class Core:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def install(self, version: int, models: list[Any], servers: list[Any], prefix: Any = None) -> None:
        self.calls.append(("install", version, models, servers, prefix))

    def calm(self, version: int, flags: list[bool]) -> None:
        self.calls.append(("calm", version, flags))

    def uninstall(self) -> None:
        self.calls.append(("uninstall",))

    def admission(self, limit: int, others: int) -> None:
        self.calls.append(("admission", limit, others))


def _eps(app: str, *ports: int) -> list[dict[str, Any]]:
    return [{"address": "127.0.0.1", "port": p, "labels": {"app": app}} for p in ports]


def _state(tmp_path: Path) -> RouterState:
    tmp_path.mkdir(parents=True, exist_ok=True)
    docs = [
        route("plain", "plain-m", server="s"),
        route("guarded", "guarded-m", rules=[{"modelMatch": {"headers": {"x-tier": {"exact": "gold"}}},
                                              "targetModels": [{"modelServerName": "s"}]}]),
        route("split", "split-m", rules=[{"targetModels": [{"modelServerName": "s", "weight": 3},
                                                           {"modelServerName": "t", "weight": 1}]}]),
        route("lora", "base-m", lora=["adapter-a"], server="t"),
        route("empty", "empty-m", server="u"),
        server("s", "upstream-m"),
        server("t", "upstream-m"),
        server("u", "upstream-m"),
        endpoints("es", _eps("s", 9001, 9002)),
        endpoints("et", _eps("t", 9003)),
    ]
    cfg = load(tmp_path, docs)
    registry = EndpointRegistry()
    asyncio.run(registry.resolve_names(cfg))
    return build_state(cfg, RouteTable.build(cfg), registry.build(cfg))


def _table(state: RouterState, core: Core, balancer: Any = None) -> tuple[FrontTable, SimpleNamespace]:
    holder = StateHolder()
    holder.install(state, 0)
    fw = SimpleNamespace(
        holder=holder, settings=SimpleNamespace(front_table=True, default_retry_endpoints=2),
        executor=SimpleNamespace(balancer=balancer or RoundRobinBalancer()), auth=None, fairness=None,
        limiter=None, sticky=SimpleNamespace(for_route=lambda route: None), in_flight=0,
        zero_hold=SimpleNamespace(held=0))
    return FrontTable(fw, core, PlanCache()), fw  # type: ignore[arg-type]


def test_only_plain_routes_are_installed(tmp_path: Path) -> None:
    core = Core()
    table, _ = _table(_state(tmp_path), core)
    table.sync(0)
    install = next(c for c in core.calls if c[0] == "install")
    models = {m[0]: m for m in install[2]}
    # a header predicate, and a server without endpoints, keep their models with Python
    assert set(models) == {"plain-m", "split-m", "adapter-a", "base-m"}
    servers = install[3]
    assert sorted(len(s[0]) for s in servers) == [1, 2]
    _, targets, total, rewrite, seeds = models["split-m"]
    assert [cum for cum, _ in targets] == [3, 4] and total == 4
    assert rewrite == b'"upstream-m"'  # the client's name is replaced by the server's model
    assert models["adapter-a"][3] is None  # an adapter keeps its name upstream
    assert seeds == [0, 0] and install[4] is None and all(s[7] is None for s in servers)  # the rotation
    # fresh endpoints are usable and not on trial: every installed server is calm
    calm = next(c for c in core.calls if c[0] == "calm")
    assert calm[1] == install[1] and calm[2] == [True, True]


def test_an_endpoint_in_trouble_takes_its_server_back_to_python(tmp_path: Path) -> None:
    core = Core()
    state = _state(tmp_path)
    table, _ = _table(state, core)
    table.sync(0)
    s_eps = next(eps for key, eps in state.targets.items() if key[1] == "s")
    s_eps[0].health.eject(0.0)  # as after consecutive failures
    table.sync(0)  # not dirty: nothing pushed until a failure or the tick
    assert [c[0] for c in core.calls].count("calm") == 1
    table.dirty = True
    table.sync(0)
    flags = [c for c in core.calls if c[0] == "calm"][-1][2]
    index = table.current.servers.index(s_eps) if table.current else -1
    assert flags[index] is False and flags.count(True) == 1


def test_nothing_is_installed_without_round_robin(tmp_path: Path) -> None:
    core = Core()
    table, fw = _table(_state(tmp_path), core, balancer=SimpleNamespace(needs_request_info=True))
    table.sync(0)
    assert not any(c[0] == "install" for c in core.calls)
    fw.executor.balancer = RoundRobinBalancer()
    table.sync(0)
    fw.settings.front_table = False  # switched off: the front forgets its table
    table.sync(0)
    assert [c[0] for c in core.calls if c[0] in ("install", "uninstall")] == ["install", "uninstall"]


def test_admission_figures_follow_the_worker(tmp_path: Path) -> None:
    core = Core()
    table, fw = _table(_state(tmp_path), core)
    table.sync(0)
    fw.in_flight = 5
    table.sync(2)  # 2 of the 5 are fast-path requests Python accounts for
    assert [c for c in core.calls if c[0] == "admission"][-1] == ("admission", 1024, 3)


def test_a_new_state_reaches_the_front_at_its_install(tmp_path: Path) -> None:
    """Not at the next wake-up: a request in between would go to a pod that is gone."""
    core = Core()
    first = _state(tmp_path / "a")
    table, fw = _table(first, core)
    table.sync(0)
    installs = [c for c in core.calls if c[0] == "install"]
    second = _state(tmp_path / "b")
    assert fw.holder.install(second, fw.holder.generation)
    now = [c for c in core.calls if c[0] == "install"]
    assert len(now) == len(installs) + 1 and table.state is second
    assert [c for c in core.calls if c[0] == "calm"][-1][1] == now[-1][1]  # its servers are calm at once


def _scheduler(plugins: str) -> SwitchingBalancer:
    text = "scheduler:\n  plugins:\n" + plugins
    cfg = load_router_configuration_bytes(text.encode(), source="t.yaml").scheduler
    return SwitchingBalancer(Scheduler(cfg, RouterMetrics(CollectorRegistry())))


PREFIX = "    Score: {enabled: [{name: prefix-cache, weight: 1}, {name: least-request, weight: 1}]}\n"


def test_a_prefix_cache_scheduler_is_installed_with_its_scorers_and_index(tmp_path: Path) -> None:
    core = Core()
    balancer = _scheduler(PREFIX)
    sched = balancer.inner
    table, _ = _table(_state(tmp_path), core, balancer=balancer)
    table.sync(0)
    install = next(c for c in core.calls if c[0] == "install")
    models = {m[0]: m for m in install[2]}
    assert set(models) == {"plain-m", "split-m", "base-m"}  # not the adapter: its id and seed are Python's
    assert models["split-m"][4] == [sched.front_seed("upstream-m")] * 2
    index, block, blocks, misses, pending = install[4]
    assert index is sched.index and block == sched.prefix_args.block_size_to_hash and blocks > 0
    assert misses is sched.balance_misses and pending is False
    for s in install[3]:
        scorer, ids = s[7]
        assert isinstance(scorer, Scorer) and len(ids) == len(s[0])
        assert sorted(scorer.endpoints()) == sorted(ids)  # the very scorer Python ranks with
    assert isinstance(index, PrefixIndex)
    # a reload's new scheduler is installed at the next sync
    balancer.swap(_scheduler(PREFIX).inner)
    table.sync(0)
    assert [c for c in core.calls if c[0] == "install"][-1][4][0] is balancer.inner.index


def test_prefill_cost_is_installed_with_its_pending_work(tmp_path: Path) -> None:
    core = Core()
    table, _ = _table(_state(tmp_path), core, balancer=_scheduler(
        "    Score: {enabled: [{name: prefix-cache, weight: 1}, {name: prefill-cost, weight: 1}]}\n"))
    table.sync(0)
    install = next(c for c in core.calls if c[0] == "install")
    assert install[4][4] is True  # the front adds and reports the pending prefill work


def test_pipelines_with_python_work_per_request_are_not_installed(tmp_path: Path) -> None:
    for plugins in ("    Score: {enabled: [{name: prefix-hash-bounded, weight: 1}]}\n",):
        core = Core()
        table, _ = _table(_state(tmp_path), core, balancer=_scheduler(plugins))
        table.sync(0)
        assert not any(c[0] == "install" for c in core.calls), plugins
