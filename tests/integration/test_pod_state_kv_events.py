"""KV events through the pod-state hub: with 2 workers the hub follows each engine's event
stream once, and every worker's ownership table equals the engine's true cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import harness
import kv_support as kvs
from loadtest.ports import free_port_block

from .test_kvcache_aware import KV_CONFIG, engine_cache

ENGINES = 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Simulator, harness.Router, list[str]]]:
    tmp = tmp_path_factory.mktemp("podstate-kv")
    kv_base = free_port_block(2 * ENGINES)
    sim = harness.start_simulator(tmp, ENGINES, extra_args=["--kv-blocks", "512", "--kv-events-port-base", str(kv_base)])
    router = None
    try:
        config = harness.write_config(tmp / "router.yaml", kvs.labelled_config_docs(sim.ports, kv_base))
        sched = tmp / "scheduler.yaml"
        sched.write_text(KV_CONFIG)
        router = harness.start_router(config, tmp, workers=2, extra_args=[
            "--router-config", str(sched), "--scrape-interval-s", "0.5"])
        keys = [f"{harness.HOST}:{p}" for p in sim.ports]
        harness.wait_until(lambda: all(len(w["endpoints"]) == ENGINES and all(
            e["state"] == "up" for e in w["endpoints"].values()) for w in ownership(router)) and len(
            ownership(router)) == 2, 60, interval=0.2, what="KV-event streams up in both workers")
        yield sim, router, keys
    finally:
        if router is not None:
            router.stop()
        sim.stop()


def ownership(router: harness.Router) -> list[dict[str, Any]]:
    r = router.admin_get("/debug/kv_ownership")
    r.raise_for_status()
    return list(r.json()["workers"])


def test_every_worker_table_equals_the_engine_cache_via_the_hub(setup: Any) -> None:
    sim, router, keys = setup
    prompt = "A shared system prompt about routers and caches. " * 60
    for i in range(8):
        with httpx.Client(timeout=60) as c:  # new connections: both workers serve
            r = c.post(router.base_url + "/v1/chat/completions", json={
                "model": "demo", "max_tokens": 2, "messages": [
                    {"role": "system", "content": prompt}, {"role": "user", "content": f"question {i}"}]})
        assert r.status_code == 200, r.text
    for i, key in enumerate(keys):
        truth = engine_cache(sim, i)
        if truth["num_blocks"] == 0:
            continue
        harness.wait_until(lambda: all(w["endpoints"][key]["blocks"] == truth["blocks"] for w in ownership(router)),
                           30, interval=0.1, what=f"both workers' tables equal engine {i}'s cache")
    assert sum(engine_cache(sim, i)["num_blocks"] for i in range(ENGINES)) > 0
    views = router.admin_get("/debug/pod_state").json()["workers"]
    assert [v["kv_local_streams"] for v in views] == [0, 0], views  # the hub subscribes, not the workers
