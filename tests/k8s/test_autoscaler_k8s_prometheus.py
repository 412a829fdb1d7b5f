"""An AutoscalingPolicy whose metric comes from a `prometheus` metricSource: the controller
(python -m controller, a real process) on the real apiserver queries Debian's real
`prometheus` server, which scrapes two engine simulators (one sequence at a time each)
every second. Load on the engines builds their waiting queues;
`sum(vllm:num_requests_waiting)` is one external value for the target, which scales the
ModelServing up, and back down when the load stops. A query that returns one sample per
engine reads as no metric data: the round is skipped and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import engine_load
import harness
import k8s_harness
import prometheus_harness
from autoscaler_support import API, FAST, Obj, ScalerApi, ready_message, scaler_namespace, single_role
from controller_support import condition, modelserving

WAITING = "sum(vllm:num_requests_waiting)"


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerApi]:
    yield from scaler_namespace(control_plane, tmp_path_factory.mktemp("autoscaler-prom"), "prom", [], period="0.5")


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with prometheus_harness.scraped_simulator(tmp_path_factory.mktemp("prom-engines"), 2,
                                              ["--max-num-seqs", "1"]) as (sim, prom):
        yield {"sim": sim, "prom": prom}


def prom_policy(name: str, ns: str, target: str, server_url: str, query: str) -> Obj:
    return {"apiVersion": API, "kind": "AutoscalingPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"metrics": [{"name": "queue", "targetValue": "2"}], "behavior": FAST,
                     "homogeneousTarget": {"minReplicas": 1, "maxReplicas": 4, "target": {
                         "targetRef": {"kind": "ModelServing", "name": target},
                         "metricSources": {"queue": {"prometheus": {"serverURL": server_url, "query": query}}}}}}}


def test_prometheus_queue_scales_the_modelserving_up_and_down(api: ScalerApi, engines: dict[str, Any]) -> None:
    sim: harness.Simulator = engines["sim"]
    prom: prometheus_harness.PrometheusServer = engines["prom"]
    api.cp.apply([modelserving("pq", api.ns, 1, single_role())])
    api.pods_up("pq", 1)
    api.cp.apply([prom_policy("pq-policy", api.ns, "pq", prom.url, WAITING)])
    p = api.wait_policy("pq-policy", lambda p: "1 replicas kept" in ready_message(p), "kept at 1 while idle")
    assert condition(p, "Ready") == "True" and p["status"]["homogeneousStatus"]["desiredReplicas"] == 1

    # four at a time on each engine, one running each: five or six waiting in all,
    # / 2 per replica = 3 replicas (an external value: the new pods' readiness does not matter)
    loads = [engine_load.Load(engine_load.completions(url, max_tokens=48), threads=4) for url in sim.urls]
    try:
        for load in loads:
            load.start()
        api.wait_replicas("pq", 3, timeout=60)
        # a round's status under the load (a scrape may fall between two requests of a client)
        api.wait_policy("pq-policy", lambda p: p["status"]["homogeneousStatus"].get("lastScaleTime")
                        and p["status"]["homogeneousStatus"]["desiredReplicas"] == 3
                        and "metric queue wants 3" in ready_message(p), "scaled, the queue wants 3")
    finally:
        for load in loads:
            load.stop()
    for load in loads:
        assert not load.errors and load.ok > 0, load.errors[:3]

    # drained: the queue is 0, back to minReplicas
    api.wait_replicas("pq", 1, timeout=60)
    api.wait_policy("pq-policy", lambda p: p["status"]["homogeneousStatus"]["currentReplicas"] == 1, "back to 1")


def test_ambiguous_query_skips_the_round(api: ScalerApi, engines: dict[str, Any]) -> None:
    prom: prometheus_harness.PrometheusServer = engines["prom"]
    harness.wait_until(lambda: len(prom.query("vllm:num_requests_waiting")["data"]["result"]) == 2, 30,
                       interval=0.2, what="one series per engine")
    api.cp.apply([modelserving("pa", api.ns, 2, single_role())])
    api.pods_up("pa", 2)
    # one sample per engine: not one value for the target, the metric is missing
    api.cp.apply([prom_policy("pa-policy", api.ns, "pa", prom.url, "vllm:num_requests_waiting")])
    p = api.wait_policy("pa-policy", lambda p: "no metric data" in ready_message(p), "round skipped")
    assert "queue" in ready_message(p)
    ms = api.ms("pa")
    assert ms is not None and ms["spec"]["replicas"] == 2  # missing data never scales (here: down to 1)
