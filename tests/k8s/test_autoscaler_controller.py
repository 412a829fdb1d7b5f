"""The autoscaler controller (inside python -m controller, a real process) on the real
apiserver, reading real HTTP metrics pages.

The test apiserver has no kubelet, so pods have no IP: the test patches each entry pod's
status Ready with podIP 127.0.0.1 and serves the metrics itself from a small HTTP server
on 127.0.0.1 (one port; one page per path, the value under the test's control). The
policies point their metricSources at that port and path. All pods of a target then share
one page, i.e. report the same value: that is enough to drive the algorithm's per-pod
mean. Covered: homogeneous up/down through the scale subresource, dry run, disaggregated
roles (merge patch of the roles list), heterogeneous spreading, a real vLLM simulator
page, a missing target and an invalid policy. No wall-clock assertion: policy periods of 1 s, windows of 0 s, a 0.3 s round
period, and waits on conditions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

import harness
import k8s_harness
from autoscaler_support import API, FAST, Obj, ScalerApi, homogeneous, ready_message, ready_reason, scaler_namespace, \
    single_role
from controller_support import condition, modelserving, template


class MetricsServer:
    """/metrics pages by path, set by the test."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        self.hits: dict[str, int] = {}
        pages, hits = self.pages, self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = pages.get(self.path)
                hits[self.path] = hits.get(self.path, 0) + 1
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((harness.HOST, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def metrics() -> Iterator[MetricsServer]:
    m = MetricsServer()
    try:
        yield m
    finally:
        m.close()


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerApi]:
    yield from scaler_namespace(control_plane, tmp_path_factory.mktemp("autoscaler"), "run", [])


@pytest.fixture(scope="module")
def dry(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerApi]:
    yield from scaler_namespace(control_plane, tmp_path_factory.mktemp("autoscaler-dry"), "dry", ["--autoscaler-dry-run"])


def test_homogeneous_scales_up_and_down_through_the_scale_subresource(api: ScalerApi,
                                                                       metrics: MetricsServer) -> None:
    metrics.pages["/hs"] = "# TYPE load gauge\nload 1\n"
    api.cp.apply([modelserving("hs", api.ns, 1, single_role())])
    api.pods_up("hs", 1)
    api.cp.apply([homogeneous("hs-policy", api.ns, "hs", metrics.port, "/hs")])
    # on target: kept at 1, status written with the decision
    p = api.wait_policy("hs-policy", lambda p: (p.get("status") or {}).get("homogeneousStatus", {}).get(
        "desiredReplicas") == 1 and "kept" in ready_message(p), "1 replica kept")
    assert p["status"]["observedGeneration"] == p["metadata"]["generation"]
    assert condition(p, "Ready") == "True" and condition(p, "TargetFound") == "True"
    assert p["status"]["homogeneousStatus"]["currentReplicas"] == 1
    assert "lastScaleTime" not in p["status"]["homogeneousStatus"]
    assert metrics.hits.get("/hs", 0) > 0

    # three times the target per pod: 3 replicas
    metrics.pages["/hs"] = "load 3\n"
    ms = api.wait_replicas("hs", 3)
    assert any(f.get("manager") == "kthena-controller" and f.get("subresource") == "scale"
               for f in ms["metadata"].get("managedFields") or []), ms["metadata"].get("managedFields")
    p = api.wait_policy("hs-policy", lambda p: p["status"]["homogeneousStatus"].get("lastScaleTime")
                        and p["status"]["homogeneousStatus"]["currentReplicas"] == 3, "scaled to 3")
    assert condition(p, "Ready") == "True"
    # the new pods start unready: they damp the scale-up (HPA's rule), the count holds at 3
    metrics.pages["/hs"] = "load 1\n"
    api.pods_up("hs", 3)
    api.wait_policy("hs-policy", lambda p: "3 replicas kept" in ready_message(p), "3 kept")
    assert api.ms("hs")["spec"]["replicas"] == 3  # type: ignore[index]

    # no load: down to minReplicas
    metrics.pages["/hs"] = "load 0\n"
    api.wait_replicas("hs", 1)
    api.wait_policy("hs-policy", lambda p: p["status"]["homogeneousStatus"]["currentReplicas"] == 1, "back to 1")


def test_dry_run_reports_and_does_not_scale(dry: ScalerApi, metrics: MetricsServer) -> None:
    metrics.pages["/dry"] = "load 4\n"
    dry.cp.apply([modelserving("dr", dry.ns, 1, single_role())])
    dry.pods_up("dr", 1)
    dry.cp.apply([homogeneous("dr-policy", dry.ns, "dr", metrics.port, "/dry")])
    p = dry.wait_policy("dr-policy", lambda p: ready_reason(p) == "DryRun", "a dry-run decision")
    assert "dry run: would scale ModelServing dr 1 -> 4" in ready_message(p)
    st = p["status"]["homogeneousStatus"]
    assert st["currentReplicas"] == 1 and st["desiredReplicas"] == 4 and "lastScaleTime" not in st
    # the decision was taken (and is taken again every round); the ModelServing is untouched
    hits = metrics.hits["/dry"]
    harness.wait_until(lambda: metrics.hits["/dry"] >= hits + 3, 20, what="three more rounds")
    ms = dry.ms("dr")
    assert ms is not None and ms["spec"]["replicas"] == 1
    assert not any(f.get("manager") == "kthena-controller" and f.get("subresource") == "scale"
                   for f in ms["metadata"].get("managedFields") or [])
    assert ready_reason(dry.policy("dr-policy") or {}) == "DryRun"


def test_disaggregated_roles_patch_keeps_the_rest_of_the_template(api: ScalerApi, metrics: MetricsServer) -> None:
    metrics.pages["/prefill"] = "load 2\n"
    # the engine default: num_requests_waiting read as vLLM's vllm:num_requests_waiting
    metrics.pages["/decode"] = 'vllm:num_requests_waiting{engine="0",model_name="m"} 1\n'
    roles = [{"name": "prefill", "replicas": 1, "workerReplicas": 0,
              "entryTemplate": template("p:1", labels={"app": "p"})},
             {"name": "decode", "workerReplicas": 0, "entryTemplate": template("d:1")}]
    api.cp.apply([modelserving("pd", api.ns, 1, roles)])
    api.pods_up("pd", 2)
    before = api.ms("pd")
    assert before is not None
    policy = {"apiVersion": API, "kind": "AutoscalingPolicy", "metadata": {"name": "pd-policy", "namespace": api.ns},
              "spec": {"behavior": FAST, "disaggregatedTarget": {
                  "targetRef": {"kind": "ModelServing", "name": "pd"},
                  "roles": {
                      "prefill": {"minReplicas": 1, "maxReplicas": 4, "metrics": [{"name": "load", "targetValue": "1"}],
                                  "metricSources": {"load": {"pod": {"port": metrics.port, "uri": "/prefill"}}}},
                      "decode": {"minReplicas": 1, "maxReplicas": 4,
                                 "metrics": [{"name": "num_requests_waiting", "targetValue": "1"}],
                                 "metricSources": {"num_requests_waiting": {"pod": {"port": metrics.port,
                                                                                     "uri": "/decode"}}}}},
                  "ratioConstraint": {"numeratorRole": "prefill", "denominatorRole": "decode",
                                      "minRatio": "1", "maxRatio": "2"}}}}
    api.cp.apply([policy])

    def roles_of(o: Obj) -> dict[str, Obj]:
        return {r["name"]: r for r in o["spec"]["template"]["roles"]}
    ms = harness.wait_until(lambda: (o := api.ms("pd")) and roles_of(o)["prefill"].get("replicas") == 2 and o,
                            30, interval=0.1, what="prefill scaled to 2")
    r = roles_of(ms)
    assert r["decode"].get("replicas") == 1  # unset before: 1, written explicitly with the list
    assert r["prefill"]["entryTemplate"] == roles_of(before)["prefill"]["entryTemplate"]
    assert r["decode"]["entryTemplate"] == roles_of(before)["decode"]["entryTemplate"]
    assert ms["spec"]["replicas"] == 1
    p = api.wait_policy("pd-policy", lambda p: [x.get("currentReplicas") for x in
                                                ((p.get("status") or {}).get("disaggregatedStatus") or {}).get("roles", [])]
                        == [1, 2], "roles status decode 1, prefill 2")
    d = p["status"]["disaggregatedStatus"]
    assert [x["name"] for x in d["roles"]] == ["decode", "prefill"]
    assert d["roles"][1]["lastScaleTime"] and d["ratioStatus"]["numeratorRole"] == "prefill"
    assert condition(p, "RatioConstraintViolated") == "False" and condition(p, "TargetFound") == "True"


def test_missing_target_and_invalid_policy_are_reported(api: ScalerApi, metrics: MetricsServer) -> None:
    api.cp.apply([homogeneous("lost", api.ns, "nope", metrics.port, "/none")])
    p = api.wait_policy("lost", lambda p: condition(p, "TargetFound") == "False", "TargetFound False")
    assert condition(p, "Ready") == "False" and "ModelServing" in ready_message(p) and "nope" in ready_message(p)
    # accepted by the CRD, refused by the autoscaler's checks (Kthena's webhook): min > max
    api.cp.apply([homogeneous("bad", api.ns, "hs", metrics.port, "/none", lo=4, hi=2)])
    p = api.wait_policy("bad", lambda p: ready_reason(p) == "InvalidPolicy", "InvalidPolicy")
    assert "minReplicas 4 is greater than maxReplicas 2" in ready_message(p)


def test_vllm_simulator_queue_scales_up_with_engine_defaults(api: ScalerApi, tmp_path_factory: pytest.TempPathFactory
                                                            ) -> None:
    """A real engine page: the simulator (one vLLM engine, one sequence at a time, slowed)
    queues requests; `num_requests_waiting` without a pod.name reads vllm:num_requests_waiting."""
    sim = harness.start_simulator(tmp_path_factory.mktemp("sim"), engines=1,
                                  extra_args=["--max-num-seqs", "1", "--time-scale", "5"])
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        api.cp.apply([modelserving("sim", api.ns, 1, single_role())])
        api.pods_up("sim", 1)
        policy = homogeneous("sim-policy", api.ns, "sim", sim.ports[0], "/metrics", hi=4)
        policy["spec"]["metrics"] = [{"name": "num_requests_waiting", "targetValue": "2"}]
        policy["spec"]["homogeneousTarget"]["target"]["metricSources"] = {
            "num_requests_waiting": {"pod": {"port": sim.ports[0]}}}
        api.cp.apply([policy])
        api.wait_policy("sim-policy", lambda p: "1 replicas kept" in ready_message(p), "kept at 1 while idle")

        def generate() -> None:
            try:
                with httpx.Client(timeout=httpx.Timeout(10, read=120)) as c, c.stream(
                        "POST", f"{sim.urls[0]}/v1/completions",
                        json={"model": "demo", "prompt": "hello", "max_tokens": 4000, "stream": True}) as r:
                    for _ in r.iter_lines():
                        if stop.is_set():
                            return
            except httpx.HTTPError:
                pass  # the simulator stopped under the stream (end of the test)
        threads = [threading.Thread(target=generate, daemon=True) for _ in range(7)]
        for t in threads:
            t.start()
        # one running, six waiting: 6 / 2 per replica = 3 replicas
        api.wait_replicas("sim", 3, timeout=60)
        p = api.wait_policy("sim-policy", lambda p: p["status"]["homogeneousStatus"].get("lastScaleTime"), "scaled")
        assert p["status"]["homogeneousStatus"]["desiredReplicas"] >= 3
    finally:
        stop.set()
        sim.stop()
        for t in threads:
            t.join(10)


def test_heterogeneous_spreads_cheapest_first(api: ScalerApi, metrics: MetricsServer) -> None:
    metrics.pages["/het"] = "load 3\n"
    api.cp.apply([modelserving("ha", api.ns, 1, single_role()), modelserving("hb", api.ns, 0, single_role())])
    api.pods_up("ha", 1)

    def member(name: str, cost: int, lo: int) -> Obj:
        return {"cost": cost, "minReplicas": lo, "maxReplicas": 3, "target": {
            "targetRef": {"kind": "ModelServing", "name": name},
            "metricSources": {"load": {"pod": {"port": metrics.port, "uri": "/het"}}}}}
    api.cp.apply([{"apiVersion": API, "kind": "AutoscalingPolicy",
                   "metadata": {"name": "het-policy", "namespace": api.ns},
                   "spec": {"metrics": [{"name": "load", "targetValue": "1"}], "behavior": FAST,
                            "heterogeneousTarget": {"costExpansionRatePercent": 200,
                                                    "params": [member("ha", 100, 1), member("hb", 60, 0)]}}}])
    # one pod at 3 x its target: 3 replicas in all; blocks B1(60) A1(100): ha 1 -> 2, hb 0 -> 1
    api.wait_replicas("ha", 2)
    api.wait_replicas("hb", 1)
    p = api.wait_policy("het-policy", lambda p: [(e["name"], e["currentReplicas"]) for e in
                                                 p["status"].get("heterogeneousStatus") or []]
                        == [("ha", 2), ("hb", 1)], "members at 2 and 1")
    assert all(e.get("lastScaleTime") for e in p["status"]["heterogeneousStatus"])
    assert condition(p, "Ready") == "True"
