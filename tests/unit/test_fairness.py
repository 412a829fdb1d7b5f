"""The `fairness` section parser and the gate's saturation logic (pure logic, in-process)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kthena_router.config.errors import ConfigError
from kthena_router.errors import RequestError
from kthena_router.fairness.config import FairnessSettings, PriorityClass, Saturation
from kthena_router.fairness.gate import FairnessGate
from kthena_router.fairness.metrics import FairnessMetrics
from kthena_router.scheduling.config import load_router_configuration_bytes


def _load(text: str) -> Any:
    return load_router_configuration_bytes(text.encode(), source="router.yaml")


def test_section_parses_with_defaults_and_route_keys() -> None:
    rc = _load("""
fairness:
  priorityClasses: [{name: high, order: 0, maxQueueLength: 5, maxWaitSeconds: 2.5, weight: 2}, {name: default, order: 1}]
  routes: {chat: {defaultPriority: high}, ns1/batch: {defaultPriority: default}}
  saturation: {maxInFlightPerEndpoint: 3, maxInFlight: 10, maxWaitingPerEndpoint: 2}
  cost: {inputTokenWeight: 0.5, requestWeight: 10}
  tenants: {acme: {weight: 3}}
  tenantIdleSeconds: 60
""")
    f = rc.fairness
    assert f.classes[0] == PriorityClass("high", 0, 5, 2.5, 2.0)
    assert f.classes[1] == PriorityClass("default", 1, 1000, 60.0, 1.0)
    assert dict(f.route_priority) == {"default/chat": "high", "ns1/batch": "default"}
    assert f.saturation == Saturation(3, False, 10, 2)
    assert (f.input_weight, f.output_weight, f.request_weight) == (0.5, 2.0, 10.0)
    assert dict(f.tenant_weights) == {"acme": 3.0} and f.tenant_idle_s == 60.0
    assert _load("scheduler: {}\n").fairness is None
    assert _load("fairness: {enabled: false}\n").fairness.enabled is False


def test_bad_section_names_file_and_fields() -> None:
    with pytest.raises(ConfigError) as ei:
        _load("""
fairness:
  priorityClasses: [{name: a, maxWaitSeconds: 0}, {name: a}]
  routes: {chat: {defaultPriority: nope}}
  saturation: {maxInFlightPerEndpoint: many}
  tenants: {x: {weight: -1}}
  bogus: 1
""")
    fields = {p.field for p in ei.value.problems}
    assert {"fairness.priorityClasses[0].maxWaitSeconds", "fairness.priorityClasses[1].name",
            "fairness.routes.chat.defaultPriority", "fairness.saturation.maxInFlightPerEndpoint",
            "fairness.tenants.x.weight", "fairness.bogus", "fairness.defaultPriority"} <= fields
    assert all(p.file == "router.yaml" for p in ei.value.problems)


@dataclass
class _Health:
    healthy: bool = True


@dataclass
class _Ep:
    key: str
    health: _Health = field(default_factory=_Health)


@dataclass
class _Snap:
    key: str
    running: int | None
    waiting: int | None


def _gate(**kw: Any) -> FairnessGate:
    s = FairnessSettings(classes=(PriorityClass("high", 0), PriorityClass("default", 1, max_queue_length=2)), **kw)
    return FairnessGate(FairnessMetrics(CollectorRegistry()), s)


KEY = ("default", "demo")
EPS = (_Ep("10.0.0.1:8000"), _Ep("10.0.0.2:8000"))


def _acquire(gate: FairnessGate, tenant: str = "t", priority: str = "") -> Any:
    return gate.acquire(KEY, "default/demo", "default/demo", EPS, tenant, priority, 400)


def test_configured_limit_queues_and_release_admits_in_priority_order() -> None:
    async def run() -> list[str]:
        gate = _gate(saturation=Saturation(max_in_flight_per_endpoint=1, learn=False))
        slots = [await _acquire(gate), await _acquire(gate)]  # 2 endpoints x 1
        order: list[str] = []

        async def wait(name: str, prio: str) -> None:
            slot = await _acquire(gate, name, prio)
            order.append(name)
            gate.release(slot, 100, 10)

        tasks = [asyncio.ensure_future(wait("low", "")), asyncio.ensure_future(wait("high", "high"))]
        await asyncio.sleep(0)
        assert gate.waiters == 2
        gate.release(slots[0], 100, 10)
        gate.release(slots[1], 100, 10)
        await asyncio.gather(*tasks)
        assert gate.waiters == 0 and gate.queues[KEY].in_flight == 0
        return order

    assert asyncio.run(run()) == ["high", "low"]


def test_learned_capacity_and_waiting_threshold() -> None:
    gate = _gate(saturation=Saturation(max_waiting_per_endpoint=3))
    q_slots: list[Any] = []

    async def fill(n: int) -> None:
        for _ in range(n):
            q_slots.append(await asyncio.wait_for(_acquire(gate), 0.1))

    asyncio.run(fill(5))  # nothing learned, no waiting seen: not saturated
    q = gate.queues[KEY]
    assert not q.saturated()
    gate.on_snapshot(_Snap(EPS[0].key, running=2, waiting=1))
    assert not q.saturated()  # the second endpoint is not learned yet: no limit
    gate.on_snapshot(_Snap(EPS[1].key, running=3, waiting=4))
    assert gate.learned_capacity(list(EPS)) == 3 + 4 and not q.saturated()  # 5 in flight < 7
    gate.on_snapshot(_Snap(EPS[0].key, running=2, waiting=5))  # both >= 3 waiting, nothing finished since
    assert q.saturated()
    q.in_flight -= 1  # one finished: dispatch follows completions
    assert not q.saturated()
    EPS[0].health.healthy = EPS[1].health.healthy = False
    try:
        assert not q.saturated()  # no healthy endpoint: let the executor answer
    finally:
        EPS[0].health.healthy = EPS[1].health.healthy = True


def test_queue_full_refusal_and_disabled_gate_releases_waiters() -> None:
    async def run() -> None:
        gate = _gate(saturation=Saturation(max_in_flight=1))
        await _acquire(gate)
        waiting = [asyncio.ensure_future(_acquire(gate)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(RequestError) as ei:
            await _acquire(gate)
        assert ei.value.status == 429 and (b"retry-after", b"1") in ei.value.headers
        assert gate.install(None) is None  # fair queuing switched off by a reload
        await asyncio.wait_for(asyncio.gather(*waiting), 1)
        assert gate.waiters == 0

    asyncio.run(run())


def test_unknown_priority_falls_back_to_the_route_default_and_cancel_leaves_queue() -> None:
    async def run() -> None:
        gate = _gate(saturation=Saturation(max_in_flight=1), route_priority={"default/demo": "high"})
        assert gate._class_id("gold", "default/demo") == 0
        assert gate._class_id("", "default/demo") == 0  # naming none: the route's default class
        assert gate._class_id("default", "default/demo") == 1  # a named class (key or claim) wins
        assert gate._class_id("", "other/route") == 1  # no route default: fairness.defaultPriority
        await _acquire(gate)
        task = asyncio.ensure_future(_acquire(gate))
        await asyncio.sleep(0)
        assert len(gate.queues[KEY].rq) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(gate.queues[KEY].rq) == 0 and gate.waiters == 0

    asyncio.run(run())
