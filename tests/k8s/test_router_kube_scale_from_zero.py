"""Scale from zero in Kubernetes mode: a ModelServer whose pods are all gone holds its
requests (kthena_router_pending_requests), and a Ready pod appearing releases them; the
per-endpoint signals carry the pod IP as the endpoint label."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
from kube_crds import install_crds
from kube_router_env import Cluster, endpoints, eventually, metric, route, server, start_engine, start_kube_router, \
    wait_model

NS = "kube-router-sfz"
IP = "127.0.0.31"
ROUTER_CONFIG = "scaleFromZero: {holdTimeout: 120s}\n"


@pytest.fixture(scope="module")
def env(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    install_crds(control_plane)
    log_dir = tmp_path_factory.mktemp("kube-router-sfz")
    cluster = Cluster(control_plane, NS)
    cluster.create_namespace()
    port = harness.free_port()
    sim = start_engine(IP, port, log_dir)
    rc = log_dir / "router-config.yaml"
    rc.write_text(ROUTER_CONFIG)
    router = None
    try:
        router = start_kube_router(log_dir, control_plane.kubeconfig, namespace=NS,
                                   extra_args=["--router-config", str(rc)])
        yield {"cluster": cluster, "router": router, "sim": sim, "port": port}
    finally:
        if router is not None:
            router.stop()
        sim.stop()
        cluster.delete_namespace()
        cluster.close()


def test_pods_gone_hold_requests_until_a_ready_pod_appears(env: dict[str, Any]) -> None:
    c: Cluster = env["cluster"]
    router: harness.Router = env["router"]
    c.create(server("zero", {"app": "zero"}, env["port"], NS))
    c.create(route("zero", "zero-model", [("zero", None)], NS))
    c.pod("zero-0", IP, {"app": "zero"})
    wait_model(router, "zero-model")
    eventually(lambda: endpoints(router, "zero") == {IP}, what="the pod as an endpoint")
    client = router.openai(timeout=120.0)
    r = client.chat.completions.create(model="zero-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.usage is not None
    eventually(lambda: metric(router, "kthena_router_endpoint_tokens_total", model_server=f"{NS}/zero",
                              endpoint=f"{IP}:{env['port']}", token_type="output") == r.usage.completion_tokens,
               what="per-endpoint tokens labelled with the pod IP")
    # scaled to zero: the pod is gone
    c.delete_pod("zero-0", grace=0)
    eventually(lambda: endpoints(router, "zero") == set(), what="no endpoint left")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(lambda: client.chat.completions.create(
            model="zero-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True))
        eventually(lambda: metric(router, "kthena_router_pending_requests", model="zero-model",
                                  model_server=f"{NS}/zero") == 1, what="the request held")
        assert not fut.done()
        c.pod("zero-1", IP, {"app": "zero"}, ready=False)  # created, not Ready yet: still held
        eventually(lambda: c.api.get(f"/api/v1/namespaces/{NS}/pods/zero-1").status_code == 200, what="pod")
        assert not fut.done()
        c.pod_status("zero-1", IP, ready=True)
        stream = fut.result(timeout=60)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert metric(router, "kthena_router_pending_requests", model="zero-model", model_server=f"{NS}/zero") == 0
