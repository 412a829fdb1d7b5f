"""The pod-state hub's own metrics (podstate/hub_metrics.py) on the router's /metrics
(admin port, aggregated over the pod's processes): they appear, move with the hub's work,
and a restarted hub replaces the dead one's gauges (its counters stay summed).

A real router of 2 workers with automatic exact matching (kvEvents, prefix-cache +
least-request + kvcache-aware's tokenizers) in front of 2 simulator engines publishing KV
events, both labelled with their ports: the hub follows both streams for the workers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import harness
from loadtest.ports import free_port_block

TOKENIZER = harness.REPO / "loadtest" / "simulator" / "tokenizer" / "tokenizer.json"
ENGINES = 2
INTERVAL_S = 0.25
RC = f"""\
scheduler:
  pluginConfig:
  - name: kvcache-aware
    args: {{tokenizers: {{demo: {TOKENIZER}}}, hashSeed: "0"}}
  plugins:
    Score:
      enabled:
      - {{name: prefix-cache, weight: 1}}
      - {{name: least-request, weight: 1}}
"""
H = "kthena_router_pod_state_hub_"


def sample(router: harness.Router, name: str, **labels: str) -> float | None:
    """The sample's value, None if /metrics has no such sample."""
    for fam in harness.parse_metrics(router.metrics_text()).values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def value(router: harness.Router, name: str, **labels: str) -> float:
    v = sample(router, name, **labels)
    assert v is not None, f"{name} {labels} missing from /metrics"
    return v


def hub_pid(router: harness.Router) -> int:
    return int((router.runtime_dir / "pod-state-hub.pid").read_text())


def chat(router: harness.Router, i: int) -> None:
    with httpx.Client(timeout=60) as c:  # a new connection each: the workers take turns
        r = c.post(router.base_url + "/v1/chat/completions", json={
            "model": "demo", "max_tokens": 2,
            "messages": [{"role": "user", "content": "a shared prompt about hub metrics. " * 30 + str(i)}]})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[harness.Simulator, harness.Router]]:
    tmp = tmp_path_factory.mktemp("hubm")
    kv_base = free_port_block(2 * ENGINES)
    sim = harness.start_simulator(tmp, ENGINES, extra_args=["--kv-events-port-base", str(kv_base)])
    try:
        eps = [{"address": harness.HOST, "port": p,
                "labels": {"app": "demo", "kthena.io/kv-events-port": str(kv_base + 2 * i),
                           "kthena.io/kv-events-replay-port": str(kv_base + 2 * i + 1)}}
               for i, p in enumerate(sim.ports)]
        config = harness.write_config(tmp / "routes.yaml", [
            harness.route_doc("demo", "demo", "demo"), harness.server_doc("demo", "demo", {"app": "demo"}),
            {"apiVersion": harness.ENDPOINTS_API, "kind": "Endpoints", "metadata": {"name": "e"},
             "spec": {"endpoints": eps}}])
        rc = harness.write_config(tmp / "rc.yaml", RC)
        router = harness.start_router(config, tmp, workers=2, extra_args=[
            "--router-config", str(rc), "--scrape-interval-s", str(INTERVAL_S),
            "--health-probe-interval-s", str(INTERVAL_S)])
        try:
            yield sim, router
        finally:
            router.stop()
    finally:
        sim.stop()


def test_hub_metrics_appear_and_move(setup: Any) -> None:
    _, router = setup
    harness.wait_until(lambda: sample(router, H + "workers") == 2 and sample(router, H + "kv_streams_up") == ENGINES,
                       60, interval=0.2, what="2 workers connected, both KV streams up in the hub")
    # the workers' automatic matchers follow the streams through the hub (neither subscribes)
    def followed() -> bool:
        r = router.admin_get("/debug/kv_ownership")
        ws = r.json().get("workers", []) if r.status_code == 200 else []
        return len(ws) == 2 and all(len(w["endpoints"]) == ENGINES and
                                    all(e["state"] == "up" for e in w["endpoints"].values()) for w in ws)

    harness.wait_until(followed, 30, interval=0.2, what="both workers' matchers see both streams up")
    pods = router.admin_get("/debug/pod_state").json()["workers"]
    assert [w["kv_local_streams"] for w in pods] == [0, 0], pods
    for role in ("probe", "scrape", "kv_events"):
        assert value(router, H + "engines", role=role) == ENGINES, role
    assert value(router, H + "restarts_total") == 0
    probes, scrapes = value(router, H + "probes_total", result="ok"), value(router, H + "scrapes_total", result="ok")
    snaps = value(router, H + "frames_sent_total", type="snapshot")
    inserts = sample(router, H + "relayed_inserts_total") or 0.0
    for i in range(6):
        chat(router, i)
    harness.wait_until(lambda: value(router, H + "relayed_inserts_total") >= inserts + 6, 30,
                       what="the hub counted every worker's inserts")
    harness.wait_until(lambda: value(router, H + "probes_total", result="ok") > probes
                       and value(router, H + "scrapes_total", result="ok") > scrapes
                       and value(router, H + "frames_sent_total", type="snapshot") > snaps, 30,
                       what="probes, scrapes and snapshot frames counted")
    assert value(router, H + "replay_log_bytes") > 0
    assert value(router, H + "frames_sent_total", type="inserts") > 0  # relayed to the other worker
    assert value(router, H + "frames_sent_total", type="kv") > 0  # the engines' KV events, to both
    assert value(router, H + "probes_total", result="failed") == 0


def test_restarted_hub_counts_a_restart_and_replaces_the_gauges(setup: Any) -> None:
    _, router = setup
    probes = value(router, H + "probes_total", result="ok")
    assert value(router, H + "replay_log_bytes") > 0  # the first test's inserts
    old = hub_pid(router)
    os.kill(old, signal.SIGKILL)
    harness.wait_until(lambda: hub_pid(router) != old, 30, what="the supervisor restarted the hub")
    harness.wait_until(lambda: sample(router, H + "restarts_total") == 1, 30, what="one restart counted")
    # the dead hub's gauges are gone (not summed with the new one's), its counters stay
    harness.wait_until(lambda: sample(router, H + "workers") == 2 and sample(router, H + "kv_streams_up") == ENGINES,
                       60, interval=0.2, what="the new hub: 2 workers, 2 streams (not 4)")
    assert value(router, H + "replay_log_bytes") == 0  # a new hub starts with an empty replay log
    assert value(router, H + "engines", role="probe") == ENGINES
    assert value(router, H + "probes_total", result="ok") >= probes
