"""The router in Kubernetes mode with exactly the RBAC the deploy manifests ship
(configs/deploy/router, namespaced variant, rendered by the built kubectl kustomize), through a
ServiceAccount token: denied before the RoleBindings exist (not ready, the reason and a metric
say forbidden), serving and writing status (holding the Lease) once bound, and serving its last
state when the binding is removed again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness
import k8s_harness
from kube_crds import install_crds
from kube_router_env import Cluster, conditions, deploy_rbac, eventually, lease_holder, metric, models, route, \
    server, start_engine, start_kube_router, status_of, wait_model

NS = "kube-router-rbac"
IP = "127.0.0.5"
NET = "networking.serving.volcano.sh"


def _by_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_deploy_role_grants_exactly_what_the_router_uses(control_plane: k8s_harness.ControlPlane,
                                                         tmp_path: Path) -> None:
    docs = _by_name(deploy_rbac(control_plane, NS, tmp_path))
    rules = {(g, r): set(rule["verbs"]) for rule in docs[("Role", "kthena-router")]["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules == {
        **{(NET, r): {"list", "watch"} for r in ("modelroutes", "modelservers", "externalmodelproviders")},
        **{(NET, f"{r}/status"): {"get", "update"}
           for r in ("modelroutes", "modelservers", "externalmodelproviders")},
        ("", "pods"): {"list", "watch"}, ("", "secrets"): {"list", "watch"}}
    lease = docs[("Role", "kthena-router-leader-election")]["rules"]
    assert lease == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "verbs": ["get", "create", "update"]}]
    assert {k for k in docs} == {("ServiceAccount", "kthena-router"), ("Role", "kthena-router"),
                                 ("RoleBinding", "kthena-router"), ("Role", "kthena-router-leader-election"),
                                 ("RoleBinding", "kthena-router-leader-election")}


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
    docs = _by_name(deploy_rbac(control_plane, NS, env["log_dir"] / "rbac"))
    bindings = [d for k, d in docs.items() if k[0] == "RoleBinding"]
    control_plane.apply([d for k, d in docs.items() if k[0] != "RoleBinding"])  # no RoleBindings yet
    kubeconfig = c.service_account_kubeconfig("kthena-router", env["log_dir"] / "sa-kubeconfig")
    # as in the Deployment: the Lease's namespace and holder from the downward API's variables
    router = start_kube_router(env["log_dir"], kubeconfig, namespace=NS, watch_timeout_s=3, wait=False,
                               env={"POD_NAMESPACE": NS, "POD_NAME": "kthena-router-rbac-0"})
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

        control_plane.apply(bindings)
        router.wait_ready(120)
        c.create(server("rbac", {"app": "rbac"}, env["port"], NS))
        c.create(route("rbac", "rbac-model", [("rbac", None)], NS))
        c.pod("rbac-0", IP, {"app": "rbac"})
        wait_model(router, "rbac-model")
        client = router.openai()
        eventually(lambda: _ok(client), what="served with the reduced RBAC")

        # status: the Lease (in the pod's namespace, held by the pod's name) and the writes work
        eventually(lambda: lease_holder(control_plane, NS) == "kthena-router-rbac-0", 30, what="the Lease held")
        eventually(lambda: conditions(status_of(control_plane, "ModelRoute", NS, "rbac")).get("Accepted")
                   == ("True", "Accepted"), 30, what="route status written with the reduced RBAC")
        eventually(lambda: status_of(control_plane, "ModelServer", NS, "rbac").get("readyEndpoints") == 1
                   and conditions(status_of(control_plane, "ModelServer", NS, "rbac"))["Ready"][0] == "True",
                   30, what="server status written with the reduced RBAC")
        assert metric(router, "kthena_router_kube_status_leader") == 1
        assert metric(router, "kthena_router_kube_status_writes_total", result="error") == 0

        # the permission goes: watches fail (every 3 s they reconnect), the last state keeps serving
        before = metric(router, "kthena_router_kube_watch_errors_total", reason="forbidden")
        control_plane.kubectl("delete", "rolebinding", "-n", NS, "kthena-router")
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
