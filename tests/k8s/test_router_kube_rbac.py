"""The router in Kubernetes mode with exactly the RBAC of configs/kubernetes/rbac-namespace.yaml,
through a ServiceAccount token: denied before the RoleBinding exists (not ready, the reason
and a metric say forbidden), serving once bound, and serving its last state when the binding
is removed again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import harness
import k8s_harness
from kube_crds import install_crds
from kube_router_env import Cluster, eventually, metric, models, route, server, start_engine, start_kube_router, \
    wait_model

NS = "kube-router-rbac"
IP = "127.0.0.5"
RBAC = Path(__file__).resolve().parents[2] / "configs" / "kubernetes" / "rbac-namespace.yaml"


def _rbac_docs(ns: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(RBAC.read_text().replace("kthena-system", ns)))
    return {d["kind"]: d for d in docs}


def test_rbac_file_grants_only_list_and_watch() -> None:
    role = _rbac_docs(NS)["Role"]
    assert {v for rule in role["rules"] for v in rule["verbs"]} == {"list", "watch"}
    assert {r for rule in role["rules"] for r in rule["resources"]} == {
        "modelroutes", "modelservers", "externalmodelproviders", "pods", "secrets"}


@pytest.fixture(scope="module")
def env(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    install_crds(control_plane)
    log_dir = tmp_path_factory.mktemp("kube-rbac")
    cluster = Cluster(control_plane, NS)
    cluster.create_namespace()
    port = harness.free_port()
    sim = start_engine(IP, port, log_dir)
    try:
        yield {"cluster": cluster, "sim": sim, "port": port, "log_dir": log_dir}
    finally:
        sim.stop()
        cluster.delete_namespace()
        cluster.close()


def test_reduced_rbac_service_account(env: dict[str, Any], control_plane: k8s_harness.ControlPlane) -> None:
    c: Cluster = env["cluster"]
    docs = _rbac_docs(NS)
    control_plane.apply([docs["ServiceAccount"], docs["Role"]])  # no RoleBinding yet
    kubeconfig = c.service_account_kubeconfig("kthena-router", env["log_dir"] / "sa-kubeconfig")
    router = start_kube_router(env["log_dir"], kubeconfig, namespace=NS, watch_timeout_s=3, wait=False)
    try:
        def denied() -> bool:
            try:
                r = router.readyz()
            except Exception:
                return False
            return r.status_code == 503 and "forbidden" in r.json()["reason"].lower()
        eventually(denied, 60, what="not ready: forbidden")
        assert metric(router, "kthena_router_kube_watch_errors_total", reason="forbidden") > 0
        assert "RBAC must allow list and watch" in router.process.stderr()

        control_plane.apply([docs["RoleBinding"]])
        router.wait_ready(120)
        c.create(server("rbac", {"app": "rbac"}, env["port"], NS))
        c.create(route("rbac", "rbac-model", [("rbac", None)], NS))
        c.pod("rbac-0", IP, {"app": "rbac"})
        wait_model(router, "rbac-model")
        client = router.openai()
        eventually(lambda: _ok(client), what="served with the reduced RBAC")

        # the permission goes: watches fail (every 3 s they reconnect), the last state keeps serving
        before = metric(router, "kthena_router_kube_watch_errors_total", reason="forbidden")
        control_plane.kubectl("delete", "rolebinding", "-n", NS, "kthena-router-watch")
        eventually(lambda: metric(router, "kthena_router_kube_watch_errors_total", reason="forbidden") > before
                   and metric(router, "kthena_router_kube_watch_up", resource="modelroutes") == 0,
                   60, what="the ModelRoute watch forbidden after the binding is gone")
        c.create(route("unseen", "unseen", [("rbac", None)], NS))
        for _ in range(3):
            assert _ok(client)
        assert "unseen" not in models(router)
        assert router.readyz().status_code == 200
    finally:
        router.stop()


def _ok(client: Any) -> bool:
    try:
        r = client.chat.completions.create(model="rbac-model", messages=[{"role": "user", "content": "x"}],
                                           max_tokens=2)
        return bool(r.choices[0].message.content)
    except Exception:
        return False
