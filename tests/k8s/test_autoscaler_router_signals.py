"""The autoscaler reading the router's own signals, end to end on the real apiserver: a real
router in Kubernetes mode (scaleFromZero hold on), simulated vLLM engines on 127.0.0.x (the
"pod IPs" the test writes into the pods' status), the controller as a process with
--router-metrics-url of that router, and the openai SDK as the client.

- Scale from zero and back: a ModelServing at 0 replicas (minReplicas 0); a request is held
  by the router (kthena_router_pending_requests), the autoscaler's wake signal scales the
  ModelServing to 1, the test brings the new pod up at the simulator's address, the held
  request completes; with no load the target goes back to 0 after the scale-down window.
- A router-signal target: router:tokens_per_second (tokens through the router per pod)
  above its target scales the ModelServing up.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
from controller_support import modelserving, start_controller, template
from kube_router_env import Cluster, metric, route, server, start_engine, start_kube_router
from autoscaler_support import API, MERGE, ScalerApi, ready_message

IPS = ["127.0.0.41", "127.0.0.42"]
ROUTER_CONFIG = "scaleFromZero:\n  holdTimeout: 90s\n"
Obj = dict[str, Any]


def policy(name: str, ns: str, target: str, lo: int, hi: int, target_value: str, down_window: str) -> Obj:
    return {"apiVersion": API, "kind": "AutoscalingPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"metrics": [{"name": "router:tokens_per_second", "targetValue": target_value}],
                     "behavior": {
                         "scaleUp": {"stablePolicy": {"instances": 10, "percent": 1000, "period": "1s",
                                                      "stabilizationWindow": "0s"}},
                         "scaleDown": {"instances": 10, "percent": 100, "period": "1s",
                                       "stabilizationWindow": down_window}},
                     "homogeneousTarget": {"minReplicas": lo, "maxReplicas": hi, "target": {
                         "targetRef": {"kind": "ModelServing", "name": target}}}}}


def roles() -> list[Obj]:
    return [{"name": "worker", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("engine:1")}]


@pytest.fixture(scope="module")
def env(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Obj]:
    tmp = tmp_path_factory.mktemp("autoscaler-router")
    ns = f"autoscaler-router-{secrets.token_hex(3)}"
    cluster = Cluster(control_plane, ns)
    cluster.create_namespace()
    port = harness.free_port()
    sims: list[harness.Simulator] = []
    procs: list[Any] = []
    api = ScalerApi(control_plane, ns)
    try:
        sims += [start_engine(ip, port, tmp) for ip in IPS]
        rc = tmp / "router-config.yaml"
        rc.write_text(ROUTER_CONFIG)
        router = start_kube_router(tmp, control_plane.kubeconfig, namespace=ns,
                                   extra_args=["--router-config", str(rc), "--scrape-interval-s", "0.5"])
        procs.append(router)
        ctl = start_controller(control_plane, ns, tmp, "autoscaler-router", extra=[
            "--autoscaler-period", "0.3", "--router-metrics-url", f"{router.admin_url}/metrics"])
        procs.append(ctl)
        yield {"cluster": cluster, "api": api, "router": router, "ns": ns, "port": port, "ctl": ctl}
        assert ctl.alive(), ctl.tail()
    finally:
        for p in reversed(procs):
            p.stop()
        for s in sims:
            s.stop()
        api.close()
        cluster.delete_namespace()
        cluster.close()


def _create(api: ScalerApi, path: str, doc: Obj) -> None:
    r = api.http.post(f"/apis/{API}/namespaces/{api.ns}/{path}", json=doc)
    assert r.status_code == 201, r.text


def _pod_up(api: ScalerApi, ms: str, ip: str) -> str:
    """The one entry pod of `ms`: Running, Ready, at `ip`."""
    def one() -> str | None:
        names = [n for n, p in api.pods(ms).items() if not p["metadata"].get("deletionTimestamp")]
        return names[0] if len(names) == 1 else None
    name = harness.wait_until(one, 30, interval=0.1, what=f"the pod of {ms}")
    api.set_ready(name)
    r = api.http.patch(f"/api/v1/namespaces/{api.ns}/pods/{name}/status",
                       json={"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}, headers=MERGE)
    assert r.status_code == 200, r.text
    return name


def _served(env: Obj, name: str, replicas: int) -> tuple[ScalerApi, harness.Router, str]:
    """A ModelServer selecting ModelServing `name`'s pods, a route for model `<name>-model`, the
    ModelServing at `replicas`."""
    api: ScalerApi = env["api"]
    c: Cluster = env["cluster"]
    ns = env["ns"]
    c.create(server(name, {"modelserving.volcano.sh/name": name}, env["port"], ns))
    c.create(route(name, f"{name}-model", [(name, None)], ns))
    _create(api, "modelservings", modelserving(name, ns, replicas, roles()))
    return api, env["router"], ns


def test_scale_from_zero_on_a_held_request_and_back_to_zero(env: Obj) -> None:
    api, router, ns = _served(env, "zero", 0)
    _create(api, "autoscalingpolicies", policy("zero", ns, "zero", 0, 2, "100000", "2s"))
    # at zero nothing reports and nothing is pending: rounds run and change nothing
    api.wait_policy("zero", lambda p: "no scaling this round" in ready_message(p), "a round at zero")
    assert api.ms("zero")["spec"]["replicas"] == 0  # type: ignore[index]

    harness.wait_until(lambda: "zero-model" in {m.id for m in router.openai().models.list()}, 30, interval=0.1,
                       what="the router serving the route")
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            client = router.openai(timeout=120.0)
            r = client.chat.completions.create(model="zero-model", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5)
            result["content"] = r.choices[0].message.content
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    try:
        # (or the call ended: then its error, not a timeout, is the failure)
        harness.wait_until(lambda: metric(router, "kthena_router_pending_requests", model_server=f"{ns}/zero") >= 1
                           or not t.is_alive(), 30, interval=0.1, what="the request held by the router")
        assert t.is_alive(), result
        api.wait_replicas("zero", 1)
        p = api.wait_policy("zero", lambda p: "wake signal router:pending_requests" in ready_message(p),
                            "the wake signal named")
        assert "scaled ModelServing zero 0 -> 1" in ready_message(p)
        _pod_up(api, "zero", IPS[0])
    finally:
        t.join(60)
    assert "error" not in result, result.get("error")
    assert result.get("content")
    assert metric(router, "kthena_router_pending_requests", model_server=f"{ns}/zero") == 0
    # idle: 0 tokens/s wanted 0, nothing pending: back to zero after the 2 s window
    api.wait_replicas("zero", 0, timeout=60)
    harness.wait_until(lambda: not api.pods("zero"), 30, interval=0.1, what="the pod removed")


def test_router_tokens_per_second_scales_up(env: Obj) -> None:
    api, router, ns = _served(env, "busy", 1)
    _pod_up(api, "busy", IPS[1])
    _create(api, "autoscalingpolicies", policy("busy", ns, "busy", 1, 3, "20", "300s"))
    # idle: 0 tokens/s on the one pod, kept at minReplicas
    api.wait_policy("busy", lambda p: "ModelServing busy: 1 replicas kept" in ready_message(p), "an idle round")
    stop = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        client = router.openai(timeout=60.0)
        while not stop.is_set():
            try:
                stream = client.chat.completions.create(
                    model="busy-model", messages=[{"role": "user", "content": "a prompt of some tokens " * 20}],
                    max_tokens=50, stream=True)
                for _ in stream:
                    pass
            except BaseException as exc:  # noqa: BLE001 - every failure counts
                errors.append(exc)
                return

    threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for th in threads:
        th.start()
    try:
        harness.wait_until(lambda: (api.ms("busy") or {}).get("spec", {}).get("replicas", 0) >= 2, 60,
                           interval=0.1, what="busy scaled up on router:tokens_per_second")
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert not errors, errors
    api.wait_policy("busy", lambda p: (p["status"].get("homogeneousStatus") or {}).get("lastScaleTime"),
                    "the scale recorded in the status")


def test_router_metric_errors_are_reported(env: Obj) -> None:
    api: ScalerApi = env["api"]
    ns = env["ns"]
    _create(api, "modelservings", modelserving("bad", ns, 1, roles()))
    doc = policy("bad", ns, "bad", 1, 2, "10", "0s")
    doc["spec"]["homogeneousTarget"]["target"]["metricSources"] = {"router:tokens_per_second": {"pod": {}}}
    _create(api, "autoscalingpolicies", doc)
    p = api.wait_policy("bad", lambda p: "InvalidPolicy" in str(p["status"]), "the bad metricSources entry")
    assert "metricSources['router:tokens_per_second']" in ready_message(p)
