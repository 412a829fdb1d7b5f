"""End to end on the real apiserver: a load ramp through the router (Kubernetes mode) builds
the engines' waiting queue; the autoscaler (inside python -m controller, with the
ModelServing controller) scales the ModelServing; the new pods, patched Running and Ready
with the next free 127.0.0.x address where a simulator already listens, join the router's
endpoints and take requests. Every request through the router succeeds throughout.

Engines: one vLLM simulator per pod IP (127.0.0.2..5, one workloadPort), the simulator's
engine model running one sequence at a time (`--max-num-seqs 1`), so concurrent requests
queue (`vllm:num_requests_waiting`). The policy reads `num_requests_waiting` from the pods
(the engine default name, on the workloadPort) with a target of 2 per replica; scale-up
is immediate (1 s period, no window) and scale-down keeps the webhook default (a 5 min
window), so the count does not fall back while the load spreads over the new pods.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import engine_load
import harness
import k8s_harness
from autoscaler_support import API, FAST, ScalerApi, scaler_namespace, single_role
from controller_support import Watch, modelserving
from kube_router_env import Cluster, endpoints, eventually, metric, route, server, start_engine, start_kube_router, \
    wait_model

IPS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
MS = "llm"
MODEL = "scaled-model"
THREADS = 8


class PodIPs:
    """Brings every entry pod of the ModelServing up as it appears: Running, Ready, the next
    free address of IPS (a background thread, as a kubelet would; stopped and joined)."""

    def __init__(self, api: ScalerApi, cluster: Cluster) -> None:
        self.api, self.cluster = api, cluster
        self.assigned: dict[str, str] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-ips", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                for name, pod in sorted(self.api.pods(MS).items()):
                    entry = pod["metadata"]["labels"].get("modelserving.volcano.sh/entry") == "true"
                    if name in self.assigned or not entry:
                        continue
                    if len(self.assigned) == len(IPS):
                        raise AssertionError(f"pod {name}: no free address left ({self.assigned})")
                    ip = IPS[len(self.assigned)]
                    self.cluster.pod_status(name, ip, True)
                    self.assigned[name] = ip
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


@pytest.fixture(scope="module")
def env(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    log_dir = tmp_path_factory.mktemp("autoscaler-e2e")
    port = harness.free_port()
    with ThreadPoolExecutor(len(IPS)) as pool:
        sims = list(pool.map(lambda ip: start_engine(ip, port, log_dir, physics=["--max-num-seqs", "1"]), IPS))
    router = None
    try:
        for api in scaler_namespace(control_plane, log_dir, "e2e", [], period="1"):
            cluster = Cluster(control_plane, api.ns)
            try:
                cluster.create_namespace()  # exists already: this adds the test node
                router = start_kube_router(log_dir, control_plane.kubeconfig, namespace=api.ns)
                yield {"api": api, "cluster": cluster, "router": router, "sims": sims, "port": port}
            finally:
                cluster.close()
    finally:
        if router is not None:
            router.stop()
        for s in sims:
            s.stop()


def test_load_through_the_router_scales_up_and_new_pods_take_requests(env: dict[str, Any]) -> None:
    api: ScalerApi = env["api"]
    cluster: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    sims: list[harness.Simulator] = env["sims"]
    port: int = env["port"]
    ns = api.ns

    cluster.create(server(MS, {"modelserving.volcano.sh/name": MS, "modelserving.volcano.sh/entry": "true"}, port, ns))
    cluster.create(route(MS, MODEL, [(MS, None)], ns))
    api.cp.apply([modelserving(MS, ns, 1, single_role())])
    ips = PodIPs(api, cluster)
    watch = Watch(api.cp, f"/apis/{API}/namespaces/{ns}/autoscalingpolicies")
    loads: list[engine_load.Load] = []
    try:
        eventually(lambda: endpoints(router, MS) == {IPS[0]}, what="the first pod in the router")
        wait_model(router, MODEL)
        api.cp.apply([{"apiVersion": API, "kind": "AutoscalingPolicy", "metadata": {"name": MS, "namespace": ns},
                       "spec": {"metrics": [{"name": "num_requests_waiting", "targetValue": "2"}],
                                "behavior": {"scaleUp": FAST["scaleUp"]},
                                "homogeneousTarget": {"minReplicas": 1, "maxReplicas": len(IPS), "target": {
                                    "targetRef": {"kind": "ModelServing", "name": MS},
                                    "metricSources": {"num_requests_waiting": {"pod": {"port": port}}}}}}}])
        api.wait_policy(MS, lambda p: "1 replicas kept" in str(p["status"]), "kept at 1 while idle")
        for s in sims:
            s.reset_requests()

        client = router.openai(max_retries=0)

        def chat() -> None:
            r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=32)
            assert r.choices[0].message.content

        # the ramp, first two clients: at most one waiting, half the target: kept at 1
        light = engine_load.Load(chat, 2).start()
        loads.append(light)
        eventually(lambda: light.ok >= 10, what="light load served")
        assert api.ms(MS)["spec"]["replicas"] == 1  # type: ignore[index]
        # then eight in all on the one engine running one sequence at a time: about seven waiting
        load = engine_load.Load(chat, THREADS - 2).start()
        loads.append(load)
        ms = harness.wait_until(lambda: (o := api.ms(MS)) and o["spec"]["replicas"] > 1 and o, 60, interval=0.2,
                                what=f"{MS} scaled beyond 1 replica")

        # why: the status the round that scaled wrote (every version of the policy is watched)
        def scaled_messages() -> list[str]:
            return [c.get("message", "") for t, _, o in watch.events if t == "MODIFIED"
                    for c in (o.get("status") or {}).get("conditions") or []
                    if c["type"] == "Ready" and c.get("message", "").startswith(f"scaled ModelServing {MS} 1 -> ")]
        msg = eventually(lambda: scaled_messages() and scaled_messages()[0], what="the scale-up in the policy status")
        assert "(metric num_requests_waiting wants " in msg, msg
        p = api.policy(MS)
        assert p is not None and p["status"]["homogeneousStatus"].get("lastScaleTime"), p

        # the new pods come up at the next addresses and join the router's endpoints
        n = ms["spec"]["replicas"]
        eventually(lambda: len(ips.assigned) >= n, what=f"{n} pods up")
        new = [ip for ip in ips.assigned.values() if ip != IPS[0]]
        server_label = f"{ns}/{MS}"
        for ip in new:
            eventually(lambda ip=ip: metric(router, "kthena_router_endpoint_healthy", model_server=server_label,
                                            endpoint=f"{ip}:{port}") == 1, what=f"endpoint {ip} healthy in the router")
        assert set(ips.assigned.values()) <= endpoints(router, MS)
        # and take requests (the simulators' own counts)
        for ip in new:
            sim = sims[IPS.index(ip)]
            eventually(lambda sim=sim: sim.received()[0] > 0, what=f"requests on the engine at {ip}")
        ok = load.ok
        eventually(lambda: load.ok >= ok + THREADS, what="more requests after the scale-up")
    finally:
        for each in loads:
            each.stop()
        ips.close()
        watch.close()
    assert not ips.errors, ips.errors
    for each in loads:
        assert not each.errors and each.ok > 0, each.errors[:3]
