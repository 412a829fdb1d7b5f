"""controller/metrics.py and the Writer's resource labels: reconcile results and durations,
the probe server's answers (a real aiohttp server on a loopback port)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import harness
from controller.kubeapi import _resource
from controller.metrics import ControllerMetrics, ProbeServer


def test_write_resource_labels() -> None:
    assert _resource("/api/v1/namespaces/a/pods") == "pods"
    assert _resource("/api/v1/namespaces/a/services/x") == "services"
    assert _resource("/apis/workload.serving.volcano.sh/v1alpha1/namespaces/a/modelservings/m/status") == \
        "modelservings/status"
    assert _resource("/apis/apps/v1/namespaces/a/controllerrevisions") == "controllerrevisions"


def _value(m: ControllerMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_wrap_counts_results_and_durations() -> None:
    m = ControllerMetrics()

    async def handler(key: str) -> float | None:
        if key == "boom":
            raise ValueError("x")
        return 1.0 if key == "later" else None

    h = m.wrap(handler)

    async def run() -> None:
        assert await h("ok") is None
        assert await h("later") == 1.0
        with pytest.raises(ValueError):
            await h("boom")
    asyncio.run(run())
    assert _value(m, "kthena_controller_reconcile_total", result="success") == 1
    assert _value(m, "kthena_controller_reconcile_total", result="requeue") == 1
    assert _value(m, "kthena_controller_reconcile_total", result="error") == 1
    assert _value(m, "kthena_controller_reconcile_errors_total", type="ValueError") == 1
    assert _value(m, "kthena_controller_reconcile_duration_seconds_count") == 3
    m.write("create", "pods", 201)
    assert _value(m, "kthena_controller_api_writes_total", verb="create", resource="pods", code="201") == 1


@pytest.mark.parametrize("same_port", [True, False])
def test_probe_server(same_port: bool) -> None:
    m = ControllerMetrics()
    state = {"ready": False, "alive": True}
    hp, mp = harness.free_ports(2)
    if same_port:
        mp = hp
    server = ProbeServer(m, harness.HOST, hp, mp, lambda: (state["ready"], "leader" if state["ready"] else "not synced"),
                         lambda: state["alive"], lambda: m.leader.set(7))

    base = f"http://{harness.HOST}"

    async def run() -> None:
        await server.start()
        try:
            async with httpx.AsyncClient() as c:
                assert (await c.get(f"{base}:{hp}/healthz")).status_code == 200
                r = await c.get(f"{base}:{hp}/readyz")
                assert (r.status_code, r.text) == (503, "not synced")
                state["ready"], state["alive"] = True, False
                r = await c.get(f"{base}:{hp}/readyz")
                assert (r.status_code, r.text) == (200, "leader")
                assert (await c.get(f"{base}:{hp}/healthz")).status_code == 503
                text = (await c.get(f"{base}:{mp}/metrics")).text
                assert "kthena_controller_leader 7.0" in text  # refreshed per scrape
                if not same_port:
                    assert (await c.get(f"{base}:{mp}/healthz")).status_code == 404
                    assert (await c.get(f"{base}:{hp}/metrics")).status_code == 404
        finally:
            await server.stop()
    asyncio.run(run())
