"""configs/deploy/router: the kustomize overlays render with the built kubectl, every rendered
object passes the real API server's server-side dry run, and the RBAC they grant is what the
router needs and no more (SubjectAccessReviews against the real authorizer).

Own namespaces per variant (created and deleted here); cluster-scoped objects get a suffix.
"""

from __future__ import annotations

import os
import secrets
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import harness
import k8s_harness
from kthena_router.cli import build_parser
from kthena_router.scheduling.config import CONFIGMAP_KEY, load_router_configuration_bytes
from kthena_router.settings import PROMETHEUS_SUBDIR

DEPLOY = harness.REPO / "configs" / "deploy" / "router"
VARIANTS = ("namespaced", "cluster-wide")
SA_NAME = "kthena-router"
NET = "networking.serving.volcano.sh"


def _render(cp: k8s_harness.ControlPlane, path: Path) -> list[dict[str, Any]]:
    out = cp.kubectl("kustomize", str(path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _wrap(tmp: Path, variant: str, namespace: str, suffix: str) -> Path:
    """A kustomization on top of an overlay that moves it to a test namespace (and suffixes
    every name, so cluster-scoped objects cannot collide with anything else)."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(DEPLOY / "overlays" / variant, tmp)  # kustomize refuses absolute paths
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "nameSuffix": suffix, "resources": [rel]}))
    return tmp


def _one(docs: list[dict[str, Any]], kind: str, name_prefix: str = "kthena-router") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name_prefix)]
    assert len(found) == 1, f"expected one {kind} {name_prefix}*, got {[d['metadata']['name'] for d in found]}"
    return found[0]


@pytest.fixture(scope="module")
def rendered(control_plane: k8s_harness.ControlPlane) -> dict[str, list[dict[str, Any]]]:
    return {v: _render(control_plane, DEPLOY / "overlays" / v) for v in VARIANTS}


# --- what the manifests say ----------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_deployment_is_hardened_and_probed(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = rendered[variant]
    dep = _one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in c["args"])
    assert "--kubernetes" in args and "--config" not in args
    assert int(args["--port"]) == ports["http"] and int(args["--admin-port"]) == ports["admin"]
    assert args["--host"] == args["--admin-host"] == "0.0.0.0"  # probes and the Service reach the pod IP
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "admin"}, probe
    # the drain (--drain-grace-s) plus preStop fits in the termination grace period
    assert pod["terminationGracePeriodSeconds"] > float(args["--drain-grace-s"]) + \
        c["lifecycle"]["preStop"]["sleep"]["seconds"]
    # writable paths of a read-only root filesystem are emptyDirs
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    assert "emptyDir" in mounts[args["--runtime-dir"]], "runtime dir (prometheus multiprocess files) not writable"
    assert "emptyDir" in mounts["/tmp"]
    assert Path(args["--runtime-dir"], PROMETHEUS_SUBDIR).parent == Path(args["--runtime-dir"])
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    if variant == "namespaced":
        assert args["--namespace"] == "$(POD_NAMESPACE)"
    else:
        assert "--namespace" not in args


@pytest.mark.parametrize("variant", VARIANTS)
def test_router_config_is_mounted_where_the_flag_points_and_loads(
        rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = rendered[variant]
    cm = _one(docs, "ConfigMap")
    c = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    flag = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--router-config="))
    mount = next(m for m in c["volumeMounts"] if flag.startswith(m["mountPath"].rstrip("/") + "/"))
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    item = next(i for i in vol["configMap"]["items"] if i["key"] == CONFIGMAP_KEY)
    assert Path(mount["mountPath"], item["path"]) == Path(flag)
    # the file the pod sees (the key's value) and the manifest itself both load
    rc = load_router_configuration_bytes(cm["data"][CONFIGMAP_KEY], source="configmap key")
    assert [p.name for p in rc.scheduler.scores] and rc.session_sticky is not None
    load_router_configuration_bytes(yaml.safe_dump(cm), source="configmap manifest")


def test_container_flags_exist_in_the_cli(rendered: dict[str, list[dict[str, Any]]]) -> None:
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    for variant in VARIANTS:
        c = _one(rendered[variant], "Deployment")["spec"]["template"]["spec"]["containers"][0]
        flags = {a.split("=", 1)[0] for a in c["args"]}
        unknown = flags - known
        assert not unknown, f"{variant}: flags kthena-router does not have: {sorted(unknown)}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_service_and_pdb_select_the_router_pods(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = rendered[variant]
    dep = _one(docs, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    svc = _one(docs, "Service")
    assert svc["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]  # the admin port is not exposed
    assert "admin" in port_names
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]  # a drain can proceed


# --- against the real API server ----------------------------------------------------------


def _dry_run(cp: k8s_harness.ControlPlane, docs: list[dict[str, Any]]) -> str:
    proc = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert proc.returncode == 0, f"server dry run refused:\n{proc.stderr}"
    assert "PodSecurity" not in proc.stderr, proc.stderr  # the warn=restricted label's warnings
    return proc.stdout


def _allowed(cp: k8s_harness.ControlPlane, user: str, namespace: str | None, verb: str, resource: str,
             group: str = "", subresource: str = "", name: str = "") -> bool:
    attrs: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
    if namespace is not None:
        attrs["namespace"] = namespace
    if subresource:
        attrs["subresource"] = subresource
    if name:
        attrs["name"] = name
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                       "resourceAttributes": attrs}}
    with cp.client() as api:
        r = api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
        assert r.status_code == 201, r.text
        return bool(r.json()["status"].get("allowed"))


@pytest.fixture(scope="module")
def namespaces(control_plane: k8s_harness.ControlPlane) -> Iterator[dict[str, str]]:
    tag = secrets.token_hex(3)
    names = {v: f"deploy-{v}-{tag}" for v in VARIANTS} | {"other": f"deploy-other-{tag}"}
    for ns in names.values():
        control_plane.kubectl("create", "namespace", ns)
        # the restricted Pod Security Standard, enforced by the API server's PodSecurity admission
        control_plane.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                              "pod-security.kubernetes.io/warn=restricted")
    try:
        yield names
    finally:
        for ns in names.values():
            control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_passes_server_dry_run(control_plane: k8s_harness.ControlPlane,
                                                     namespaces: dict[str, str], tmp_path: Path,
                                                     variant: str) -> None:
    # the overlay as shipped, moved to an existing test namespace (a dry run creates nothing)
    docs = _render(control_plane, _wrap(tmp_path / "w", variant, namespaces[variant], "-dry"))
    out = _dry_run(control_plane, docs)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "ConfigMap", "PodDisruptionBudget", "Role",
            "RoleBinding"} <= kinds
    assert ("ClusterRole" in kinds) == (variant == "cluster-wide")
    assert out.count("(server dry run)") == len(docs), out
    # the pod the Deployment would create passes the restricted Pod Security Standard
    template = _one(docs, "Deployment")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {**template["metadata"], "name": "router-psa", "namespace": namespaces[variant]},
           "spec": template["spec"]}
    _dry_run(control_plane, [pod])


@pytest.mark.parametrize("variant", VARIANTS)
def test_rbac_grants_what_the_router_needs_and_no_more(control_plane: k8s_harness.ControlPlane,
                                                       namespaces: dict[str, str], tmp_path: Path,
                                                       variant: str) -> None:
    ns, other = namespaces[variant], namespaces["other"]
    # a letter first: "-1e5"-like hex is a string to PyYAML but a number to kustomize
    suffix = f"-t{secrets.token_hex(3)}"
    docs = _render(control_plane, _wrap(tmp_path / "w", variant, ns, suffix))
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                              "ClusterRoleBinding")]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    try:
        user = f"system:serviceaccount:{ns}:{SA_NAME}{suffix}"

        def can(verb: str, resource: str, group: str = "", namespace: str | None = ns, sub: str = "") -> bool:
            return _allowed(control_plane, user, namespace, verb, resource, group, sub)

        # exactly what the router uses: list+watch; status get+update (PUT); the Lease
        for res in ("modelroutes", "modelservers", "externalmodelproviders"):
            for verb in ("list", "watch"):
                assert can(verb, res, NET), (verb, res)
            for verb in ("get", "update"):
                assert can(verb, res, NET, sub="status"), (verb, res, "status")
            assert not can("patch", res, NET, sub="status"), f"patch {res}/status is never used"
            for verb in ("get", "create", "update", "patch", "delete"):
                assert not can(verb, res, NET), f"{verb} {res} must not be granted"
        for res in ("pods", "secrets"):
            for verb in ("list", "watch"):
                assert can(verb, res), (verb, res)
            for verb in ("get", "delete", "create", "update"):
                assert not can(verb, res), f"{verb} {res} must not be granted"
        assert not can("update", "pods", sub="status")
        for verb in ("get", "create", "update"):
            assert can(verb, "leases", "coordination.k8s.io"), verb
        assert not can("delete", "leases", "coordination.k8s.io")
        assert not can("create", "events") and not can("create", "events", "events.k8s.io")  # none emitted
        for res, group in (("configmaps", ""), ("services", ""), ("deployments", "apps"),
                           ("serviceaccounts", ""), ("roles", "rbac.authorization.k8s.io")):
            assert not can("list", res, group), res
        # scope: the namespaced variant sees nothing of other namespaces; leases stay local
        elsewhere = variant == "cluster-wide"
        assert can("list", "modelroutes", NET, namespace=other) is elsewhere
        assert can("watch", "pods", namespace=other) is elsewhere
        assert can("list", "modelservers", NET, namespace=None) is elsewhere  # all namespaces at once
        assert not can("create", "leases", "coordination.k8s.io", namespace=other)
    finally:
        cluster_scoped = [d for d in rbac if d["kind"].startswith("Cluster")]
        for d in cluster_scoped:
            control_plane.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], "--wait=false", check=False)


def test_shipped_overlays_name_their_namespace(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Every namespaced object of a shipped overlay lands in one namespace, and the bindings'
    subjects are the ServiceAccount of that namespace (kustomize rewrote them)."""
    for variant, docs in rendered.items():
        sa = _one(docs, "ServiceAccount")["metadata"]
        namespaced = [d for d in docs if not d["kind"].startswith("Cluster")]
        assert {d["metadata"].get("namespace") for d in namespaced} == {sa["namespace"]}, variant
        for d in docs:
            for s in d.get("subjects", []):
                assert (s["kind"], s["name"], s["namespace"]) == ("ServiceAccount", sa["name"], sa["namespace"]), \
                    (variant, shlex.quote(d["metadata"]["name"]))
