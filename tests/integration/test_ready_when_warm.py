"""/readyz of a starting router waits, within a bound, until the worker knows what it routes
on: every engine scraped once and every answering engine's KV-event stream up (warmup.py).
A replica that took traffic before that would route its first burst with unknown loads and
approximate matches (the kvcache-aware fallbacks seen when three replicas start behind one
balancer)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

import harness
import kv_support as kvs
from loadtest.ports import free_port_block
from .test_kvcache_aware import KV_CONFIG, fallbacks

ENGINES = 2


def start(tmp_path: Path, kv_base: int, config_kv_base: int, timeout_s: float,
          workers: int = 1) -> tuple[harness.Simulator, harness.Router]:
    sim = harness.start_simulator(tmp_path, ENGINES,  # physics engines: they publish KV events
                                  extra_args=["--kv-events-port-base", str(kv_base)])
    try:
        config = harness.write_config(tmp_path / "router.yaml", kvs.labelled_config_docs(sim.ports, config_kv_base))
        sched = tmp_path / "scheduler.yaml"
        sched.write_text(KV_CONFIG)
        router = harness.start_router(config, tmp_path, workers=workers, wait=False, extra_args=[
            "--router-config", str(sched), "--warmup-timeout-s", str(timeout_s)])
    except BaseException:
        sim.stop()
        raise
    return sim, router


def readyz(router: harness.Router) -> tuple[int, str]:
    try:
        r = router.readyz()
    except httpx.HTTPError:
        return 0, ""
    return r.status_code, r.json().get("reason", "")


def test_ready_only_once_every_engine_is_scraped_and_its_stream_up(tmp_path: Path) -> None:
    kv_base = free_port_block(2 * ENGINES)
    sim, router = start(tmp_path, kv_base, kv_base, timeout_s=60)
    with sim, router:
        # the first 200 of /readyz: by then every stream is up and every engine scraped
        harness.wait_until(lambda: readyz(router)[0] == 200, 60, interval=0.01, what="/readyz 200")
        keys = [f"{harness.HOST}:{p}" for p in sim.ports]
        assert all(kvs.ownership(router)[k]["state"] == "up" for k in keys), kvs.ownership(router)
        assert all(sim.state(i)["polls"]["metrics"] >= 1 for i in range(ENGINES))
        f0 = fallbacks(router)
        client = router.openai()
        for i in range(4):
            client.chat.completions.create(model="demo", max_tokens=2,
                                           messages=[{"role": "user", "content": f"hello {i}"}])
        assert fallbacks(router) == f0, "no request may fall back: every stream was up when ready"


def test_an_engine_without_event_stream_delays_readiness_only_up_to_the_bound(tmp_path: Path) -> None:
    kv_base = free_port_block(2 * ENGINES)
    nowhere = free_port_block(2 * ENGINES)  # the config names ports where nothing publishes
    bound_s = 4.0
    t0 = time.monotonic()
    sim, router = start(tmp_path, kv_base, nowhere, timeout_s=bound_s, workers=2)
    with sim, router:
        # first the scrapes, then the streams of the engines that answered
        harness.wait_until(lambda: "KV-event stream of" in readyz(router)[1], 60, interval=0.02,
                           what="/readyz reporting the warm-up on the KV-event streams")
        code, reason = readyz(router)
        assert code == 503 and "warming up" in reason, reason
        assert f"{harness.HOST}:{sim.ports[0]}" in reason
        warming_seen = time.monotonic()
        harness.wait_until(lambda: readyz(router)[0] == 200, 60, interval=0.05, what="/readyz 200 after the bound")
        # it waited for the streams (not for ever), and it is ready although they stay down
        assert time.monotonic() - t0 >= bound_s
        assert time.monotonic() > warming_seen
        keys = [f"{harness.HOST}:{p}" for p in sim.ports]
        worker_views = router.admin_get("/debug/kv_ownership").json()["workers"]
        assert worker_views and all(v["endpoints"][k]["state"] != "up" for v in worker_views for k in keys)
        r = router.openai().chat.completions.create(model="demo", max_tokens=2,
                                                    messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content is not None
