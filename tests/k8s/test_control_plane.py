"""The test control plane behaves as the Kubernetes tests rely on: pods whose status a test
writes, graceful deletion of a bound pod (Terminating until grace 0), and cascade deletion
through owner references (kube-controller-manager's garbage collector)."""

from __future__ import annotations

import httpx

import harness
import k8s_harness


def _pod(name: str, node: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "engine", "image": "example.invalid/engine:1"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "demo"}}, "spec": spec}


def test_pod_status_written_by_the_test_and_graceful_deletion(control_plane: k8s_harness.ControlPlane) -> None:
    with control_plane.client() as api:
        r = api.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        assert r.status_code in (201, 409), r.text
        r = api.post("/api/v1/namespaces/default/pods", json=_pod("engine-0", node="node-a"))
        assert r.status_code == 201, r.text
        status = {"status": {"phase": "Running", "podIP": "127.0.0.2",
                             "conditions": [{"type": "Ready", "status": "True"}]}}
        r = api.patch("/api/v1/namespaces/default/pods/engine-0/status", json=status,
                      headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        pod = api.get("/api/v1/namespaces/default/pods/engine-0").json()
        assert pod["status"]["podIP"] == "127.0.0.2" and pod["status"]["phase"] == "Running"
        # bound to a node, deleted with a grace period: Terminating until deleted with grace 0
        r = api.request("DELETE", "/api/v1/namespaces/default/pods/engine-0", json={"gracePeriodSeconds": 30})
        assert r.status_code == 200, r.text
        pod = api.get("/api/v1/namespaces/default/pods/engine-0").json()
        assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]
        r = api.request("DELETE", "/api/v1/namespaces/default/pods/engine-0", json={"gracePeriodSeconds": 0})
        assert r.status_code == 200, r.text
        harness.wait_until(lambda: api.get("/api/v1/namespaces/default/pods/engine-0").status_code == 404, 30,
                           what="pod gone after grace 0")


def test_owner_references_cascade(control_plane: k8s_harness.ControlPlane) -> None:
    with control_plane.client() as api:
        owner = api.post("/api/v1/namespaces/default/configmaps",
                         json={"metadata": {"name": "owner"}, "data": {"a": "1"}}).json()
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
        r = api.post("/api/v1/namespaces/default/configmaps",
                     json={"metadata": {"name": "owned", "ownerReferences": [ref]}, "data": {"b": "2"}})
        assert r.status_code == 201, r.text
        r = api.request("DELETE", "/api/v1/namespaces/default/configmaps/owner",
                        json={"propagationPolicy": "Background"})
        assert r.status_code == 200, r.text
        harness.wait_until(lambda: api.get("/api/v1/namespaces/default/configmaps/owned").status_code == 404, 60,
                           interval=0.5, what="owned object garbage-collected")


def test_kubeconfig_works_for_kubectl_and_rejects_a_bad_token(control_plane: k8s_harness.ControlPlane) -> None:
    out = control_plane.kubectl("get", "namespaces", "-o", "name").stdout
    assert "namespace/default" in out
    r = httpx.get(f"{control_plane.url}/api/v1/namespaces", headers={"Authorization": "Bearer wrong"},
                  verify=control_plane.ssl_context(), timeout=10)
    assert r.status_code == 401
