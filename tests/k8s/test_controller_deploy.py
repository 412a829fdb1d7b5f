"""configs/deploy/controller: the kustomize base renders with the built kubectl, every object
passes the real API server's server-side dry run (the pod under the restricted Pod Security
Standard), the RBAC grants exactly what the controller uses (SubjectAccessReviews against the
real authorizer), and the controller process, run with that ServiceAccount's token, takes the
Lease, reconciles a ModelServing and serves its probes and metrics without a refused write."""

from __future__ import annotations

import os
import secrets
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import harness
import k8s_harness
from controller.cli import build_parser
from controller_support import Api, controller_metric, modelserving, start_controller, template
from kube_router_env import Cluster

DEPLOY = harness.REPO / "configs" / "deploy" / "controller"
ROUTER_BASE = harness.REPO / "configs" / "deploy" / "router" / "base"
SA = "kthena-controller"
W = "workload.serving.volcano.sh"
ROLES = [{"name": "llm", "replicas": 1, "workerReplicas": 1, "entryTemplate": template("e:1"),
          "workerTemplate": template("w:1")}]

# (group, resource) -> verbs; everything the controller may do, and so everything granted
GRANTED = {
    (W, "modelservings"): {"get", "list", "watch", "create", "patch", "delete"},
    (W, "autoscalingpolicies"): {"get", "list", "watch", "create", "patch", "delete"},
    (W, "modelboosters"): {"get", "list", "watch"},
    (W, "modelservings/status"): {"patch"},
    (W, "modelboosters/status"): {"patch"},
    (W, "autoscalingpolicies/status"): {"patch"},
    (W, "modelservings/scale"): {"patch"},
    ("networking.serving.volcano.sh", "modelservers"): {"get", "list", "watch", "create", "patch", "delete"},
    ("networking.serving.volcano.sh", "modelroutes"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch", "create", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "delete"},
    ("apps", "controllerrevisions"): {"get", "list", "watch", "create", "delete"},
    ("", "events"): {"create", "patch"},
    ("scheduling.volcano.sh", "podgroups"): {"get", "list", "watch", "create", "patch", "delete"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
}
LEASES = {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def _render(cp: k8s_harness.ControlPlane, path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(path)).stdout) if d]


def _wrap(tmp: Path, namespace: str, suffix: str) -> Path:
    """The shipped overlay moved to a test namespace, every name suffixed (cluster-scoped
    objects cannot collide)."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(DEPLOY / "overlays" / "default", tmp)  # kustomize refuses absolute paths
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "nameSuffix": suffix, "resources": [rel]}))
    return tmp


def _one(docs: list[dict[str, Any]], kind: str, prefix: str = "kthena-controller") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, (kind, [d["metadata"]["name"] for d in found])
    return found[0]


def _args(c: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) if "=" in a else (a, "") for a in c["args"])


@pytest.fixture(scope="module")
def shipped(control_plane: k8s_harness.ControlPlane) -> list[dict[str, Any]]:
    return _render(control_plane, DEPLOY / "overlays" / "default")


@pytest.fixture(scope="module")
def namespaces(control_plane: k8s_harness.ControlPlane) -> Iterator[dict[str, str]]:
    tag = secrets.token_hex(3)
    names = {"dry": f"ctl-deploy-dry-{tag}", "run": f"ctl-deploy-run-{tag}", "other": f"ctl-deploy-other-{tag}"}
    for ns in names.values():
        control_plane.kubectl("create", "namespace", ns)
    control_plane.kubectl("label", "namespace", names["dry"], "pod-security.kubernetes.io/enforce=restricted",
                          "pod-security.kubernetes.io/warn=restricted")
    try:
        yield names
    finally:
        for ns in names.values():
            control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# --- what the manifests say ----------------------------------------------------------------


def test_deployment_runs_the_controller_from_the_router_image(shipped: list[dict[str, Any]],
                                                              control_plane: k8s_harness.ControlPlane) -> None:
    dep = _one(shipped, "Deployment")
    assert dep["metadata"]["namespace"] == "kthena-system" and dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == _one(shipped, "ServiceAccount")["metadata"]["name"]
    (c,) = pod["containers"]
    # the image the router's base ships, running the console script pyproject declares
    router_image = _one(_render(control_plane, ROUTER_BASE), "Deployment", "kthena-router")
    assert c["image"] == router_image["spec"]["template"]["spec"]["containers"][0]["image"]
    scripts = tomllib.loads((harness.REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert c["command"] == ["kthena-controller"] and scripts["kthena-controller"] == "controller.cli:main"
    known = {o for a in build_parser()._actions for o in a.option_strings}
    args = _args(c)
    assert set(args) <= known, sorted(set(args) - known)
    assert args["--leader-elect"] == "true" and args["--bind-address"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(args["--health-port"]) == ports["health"] and int(args["--metrics-port"]) == ports["metrics"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "health"}, probe
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert int(ann["prometheus.io/port"]) == ports["metrics"] and ann["prometheus.io/path"] == "/metrics"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # hardened as the router
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = _one(shipped, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    for d in shipped:
        for s in d.get("subjects", []):
            assert (s["name"], s["namespace"]) == (SA, "kthena-system")


def test_rbac_rules_are_exactly_the_controllers(shipped: list[dict[str, Any]]) -> None:
    def rules(doc: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for rule in doc["rules"]:
            assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    out.setdefault((g, r), set()).update(rule["verbs"])
        return out
    assert rules(_one(shipped, "ClusterRole")) == GRANTED
    assert rules(_one(shipped, "Role")) == LEASES
    assert {(d["kind"], d["metadata"]["name"]) for d in shipped} == {
        ("ServiceAccount", SA), ("ClusterRole", SA), ("ClusterRoleBinding", SA), ("Deployment", SA),
        ("PodDisruptionBudget", SA), ("Role", f"{SA}-leader-election"), ("RoleBinding", f"{SA}-leader-election")}


# --- against the real API server ----------------------------------------------------------


def test_every_object_passes_server_dry_run(control_plane: k8s_harness.ControlPlane, namespaces: dict[str, str],
                                            tmp_path: Path) -> None:
    docs = _render(control_plane, _wrap(tmp_path / "w", namespaces["dry"], "-dry"))
    proc = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs), proc.stdout
    template_ = _one(docs, "Deployment")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": template_["spec"],
           "metadata": {**template_["metadata"], "name": "controller-psa", "namespace": namespaces["dry"]}}
    proc = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert proc.returncode == 0 and "PodSecurity" not in proc.stderr, proc.stderr


def _allowed(cp: k8s_harness.ControlPlane, user: str, namespace: str | None, verb: str, group: str,
             resource: str) -> bool:
    res, _, sub = resource.partition("/")
    attrs: dict[str, Any] = {"verb": verb, "group": group, "resource": res}
    if sub:
        attrs["subresource"] = sub
    if namespace is not None:
        attrs["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                       "resourceAttributes": attrs}}
    with cp.client() as api:
        r = api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
        assert r.status_code == 201, r.text
        return bool(r.json()["status"].get("allowed"))


@pytest.fixture(scope="module")
def rbac(control_plane: k8s_harness.ControlPlane, namespaces: dict[str, str],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The shipped ServiceAccount and RBAC applied in the run namespace: (namespace, SA name)."""
    ns, suffix = namespaces["run"], f"-{secrets.token_hex(3)}"
    docs = _render(control_plane, _wrap(tmp_path_factory.mktemp("ctl-rbac"), ns, suffix))
    objs = [d for d in docs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                             "ClusterRoleBinding")]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))
    try:
        yield ns, SA + suffix
    finally:
        for d in objs:
            if d["kind"].startswith("Cluster"):
                control_plane.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], "--wait=false", check=False)


def test_service_account_may_do_what_the_controller_needs_and_nothing_more(
        control_plane: k8s_harness.ControlPlane, namespaces: dict[str, str], rbac: tuple[str, str]) -> None:
    ns, sa = rbac
    user = f"system:serviceaccount:{ns}:{sa}"
    extra = [("", "configmaps"), ("", "secrets"), ("", "pods/status"), ("", "pods/exec"), ("", "nodes"),
             ("", "serviceaccounts"), ("apps", "deployments"), ("apps", "statefulsets"),
             ("events.k8s.io", "events"), ("rbac.authorization.k8s.io", "roles"),
             ("networking.serving.volcano.sh", "externalmodelproviders"), (W, "autoscalingpolicies/scale"),
             ("scheduling.volcano.sh", "queues")]
    for (group, res), granted in {**GRANTED, **LEASES}.items():
        for verb in VERBS:
            # cluster-wide grants hold in any namespace and across all namespaces; the Lease only here
            wheres = [ns] if (group, res) in LEASES else [ns, namespaces["other"], None]
            for where in wheres:
                assert _allowed(control_plane, user, where, verb, group, res) is (verb in granted), \
                    (verb, group, res, where)
    for group, res in extra:
        for verb in VERBS:
            assert not _allowed(control_plane, user, ns, verb, group, res), (verb, group, res)
    for verb in VERBS:
        assert not _allowed(control_plane, user, namespaces["other"], verb, "coordination.k8s.io", "leases")


def test_controller_runs_with_the_service_account_token(control_plane: k8s_harness.ControlPlane,
                                                        rbac: tuple[str, str],
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    ns, sa = rbac
    logs = tmp_path_factory.mktemp("ctl-sa")
    cluster = Cluster(control_plane, ns)
    kubeconfig = cluster.service_account_kubeconfig(sa, logs / "sa-kubeconfig")
    cluster.close()
    port = harness.free_port()
    ctl = start_controller(control_plane, ns, logs, "ctl-sa", kubeconfig=kubeconfig, port=port)
    api = Api(control_plane, ns)
    try:
        control_plane.apply([modelserving("llm", ns, 2, ROLES)])
        want = {f"llm-{g}-llm-0-{k}" for g in (0, 1) for k in (0, 1)}
        pods = api.wait_pods("llm", want, timeout=60)
        harness.wait_until(lambda: set(api.services("llm")) == {"llm-0-llm-0-0", "llm-1-llm-0-0"}, 30,
                           what="Services")
        for p in pods.values():
            api.set_ready(p["metadata"]["name"])
        api.wait_status("llm", replicas=2, availableReplicas=2, timeout=60)
        # scale down: deletes with the token too
        control_plane.kubectl("scale", "-n", ns, "modelserving/llm", "--replicas=1")
        api.wait_pods("llm", {"llm-0-llm-0-0", "llm-0-llm-0-1"}, timeout=60)
        api.wait_status("llm", replicas=1)

        assert httpx.get(f"http://{harness.HOST}:{port}/healthz", timeout=5).status_code == 200
        ready = httpx.get(f"http://{harness.HOST}:{port}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.text == "leader"
        assert controller_metric(port, "kthena_controller_leader") == 1
        assert controller_metric(port, "kthena_controller_api_writes_total", verb="create", resource="pods",
                                 code="201") == 4
        assert controller_metric(port, "kthena_controller_api_writes_total", verb="create", resource="services",
                                 code="201") == 2
        assert controller_metric(port, "kthena_controller_api_writes_total", verb="delete", resource="pods") == 2
        harness.wait_until(lambda: controller_metric(port, "kthena_controller_api_writes_total", verb="create",
                                                     resource="events", code="201") > 0, 30, what="an Event")
        assert controller_metric(port, "kthena_controller_api_writes_total", code="403") == 0
        assert controller_metric(port, "kthena_controller_reconcile_total", result="success") > 0
        assert controller_metric(port, "kthena_controller_reconcile_duration_seconds_count") > 0
        lease = api.http.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/lease.kthena.controller-manager")
        assert lease.status_code == 200 and lease.json()["spec"]["holderIdentity"] == "ctl-sa"
        assert "forbidden" not in ctl.stderr().lower(), ctl.tail()
        assert ctl.alive(), ctl.tail()
    finally:
        api.close()
        ctl.stop()
