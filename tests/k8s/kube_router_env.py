"""Helpers of the router's Kubernetes-mode tests: engines on 127.0.0.x loopback addresses
(one simulator per "pod IP", all on the same workloadPort), pods whose status the test
writes, the router started with --kubernetes, service-account kubeconfigs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

import harness
import k8s_harness

API = "networking.serving.volcano.sh/v1alpha1"
GROUP_PATH = "/apis/networking.serving.volcano.sh/v1alpha1"
NODE = "kube-router-node"
DEPLOY = harness.REPO / "configs" / "deploy" / "router"


def start_engine(ip: str, port: int, log_dir: Path, *, itl_ms: int = 5,
                 physics: list[str] | None = None) -> harness.Simulator:
    """One simulated vLLM engine on ip:port (Linux routes all of 127/8 to lo). `physics`:
    the simulator's engine model with these flags (e.g. --max-num-seqs, which builds a
    waiting queue) instead of --fast's fixed latencies."""
    admin = harness.free_port()
    argv = [harness.PYTHON, "-m", "loadtest.simulator", "--engines", "1", "--host", ip, "--ports", str(port),
            "--admin-port", str(admin), "--model", "demo", "--flavour", "vllm"]
    argv += ["--fast", "--fast-ttft-ms", "5", "--fast-itl-ms", str(itl_ms)] if physics is None else physics
    proc = harness.ManagedProcess(f"sim-{ip}", argv, log_dir)

    def ready() -> bool:
        if not proc.alive():
            raise RuntimeError(f"simulator on {ip} exited\n{proc.tail()}")
        return any(line.startswith("{") and json.loads(line).get("ready") for line in proc.stdout().splitlines())

    harness.wait_until(ready, 60, what=f"simulator on {ip}")
    sim = harness.Simulator(proc, [port], admin)
    sim.admin_url = f"http://{ip}:{admin}"
    sim.urls = [f"http://{ip}:{port}"]
    return sim


def route(name: str, model: str, targets: list[tuple[str, int | None]], ns: str) -> dict[str, Any]:
    tms = [{"modelServerName": s, **({"weight": w} if w is not None else {})} for s, w in targets]
    return {"apiVersion": API, "kind": "ModelRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"modelName": model, "rules": [{"name": "default", "targetModels": tms}]}}


def server(name: str, labels: dict[str, str], port: int, ns: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ModelServer", "metadata": {"name": name, "namespace": ns},
            "spec": {"model": "demo", "inferenceEngine": "vLLM", "workloadSelector": {"matchLabels": labels},
                     "workloadPort": {"port": port}}}


class Cluster:
    """Namespaced object helpers over the admin client."""

    def __init__(self, cp: k8s_harness.ControlPlane, ns: str) -> None:
        self.cp = cp
        self.ns = ns
        self.api = cp.client()

    def close(self) -> None:
        self.api.close()

    def create_namespace(self) -> None:
        r = self.api.post("/api/v1/namespaces", json={"metadata": {"name": self.ns}})
        assert r.status_code in (201, 409), r.text
        r = self.api.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        assert r.status_code in (201, 409), r.text

    def delete_namespace(self) -> None:
        with httpx.Client(base_url=self.cp.url, headers=self.cp.auth_headers, verify=self.cp.ssl_context(),
                          timeout=30) as api:
            for p in api.get(f"/api/v1/namespaces/{self.ns}/pods").json().get("items", []):
                api.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{p['metadata']['name']}",
                            json={"gracePeriodSeconds": 0})
            api.delete(f"/api/v1/namespaces/{self.ns}")

    def _plural(self, kind: str) -> str:
        return {"ModelRoute": "modelroutes", "ModelServer": "modelservers",
                "ExternalModelProvider": "externalmodelproviders"}[kind]

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        r = self.api.post(f"{GROUP_PATH}/namespaces/{self.ns}/{self._plural(doc['kind'])}", json=doc)
        assert r.status_code == 201, r.text
        return r.json()

    def patch(self, kind: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        r = self.api.patch(f"{GROUP_PATH}/namespaces/{self.ns}/{self._plural(kind)}/{name}", json=patch,
                           headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text
        return r.json()

    def delete(self, kind: str, name: str) -> None:
        r = self.api.delete(f"{GROUP_PATH}/namespaces/{self.ns}/{self._plural(kind)}/{name}")
        assert r.status_code == 200, r.text

    def pod(self, name: str, ip: str, labels: dict[str, str], *, ready: bool = True) -> None:
        """A pod bound to the test's node (graceful deletion leaves it Terminating), status written here."""
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": NODE, "containers": [{"name": "engine", "image": "example.invalid/engine:1"}]}}
        r = self.api.post(f"/api/v1/namespaces/{self.ns}/pods", json=body)
        assert r.status_code == 201, r.text
        self.pod_status(name, ip, ready)

    def pod_status(self, name: str, ip: str, ready: bool) -> None:
        status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                             "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        r = self.api.patch(f"/api/v1/namespaces/{self.ns}/pods/{name}/status", json=status,
                           headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    def delete_pod(self, name: str, grace: int) -> None:
        r = self.api.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}", json={"gracePeriodSeconds": grace})
        assert r.status_code == 200, r.text

    def service_account_kubeconfig(self, sa: str, path: Path) -> Path:
        """A kubeconfig holding a TokenRequest token of the ServiceAccount `sa`."""
        r = self.api.post(f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                          json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": 3600}})
        assert r.status_code == 201, r.text
        token = r.json()["status"]["token"]
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sa",
               "clusters": [{"name": "test", "cluster": {"server": self.cp.url, "certificate-authority":
                                                         str(self.cp.cert_dir / "apiserver.crt")}}],
               "users": [{"name": sa, "user": {"token": token}}],
               "contexts": [{"name": "sa", "context": {"cluster": "test", "user": sa, "namespace": self.ns}}]}
        path.write_text(yaml.safe_dump(cfg))
        return path


def start_kube_router(log_dir: Path, kubeconfig: Path, *, namespace: str = "", workers: int = 1,
                      watch_timeout_s: float = 300, wait: bool = True, extra_args: list[str] | None = None,
                      name: str = "router", env: dict[str, str] | None = None) -> harness.Router:
    args = ["--kubernetes", "--kubeconfig", str(kubeconfig), "--kube-watch-timeout-s", str(watch_timeout_s),
            *(extra_args or [])]
    if namespace:
        args += ["--namespace", namespace]
    port, admin_port = harness.free_ports(2)
    runtime = log_dir / f"router-runtime-{port}"
    argv = harness.router_argv(Path("unused"), port, admin_port, workers, runtime, log_level="info")
    i = argv.index("--config")
    argv[i:i + 2] = args  # Kubernetes mode instead of a config file
    proc = harness.ManagedProcess(name, argv, log_dir, env=env)
    router = harness.Router(proc, port, admin_port, runtime / "kubernetes-config.yaml", runtime, workers)
    if wait:
        try:
            router.wait_ready()
        except BaseException:
            proc.kill_group()
            raise
    return router


def deploy_rbac(cp: k8s_harness.ControlPlane, namespace: str, tmp: Path, variant: str = "namespaced") -> \
        list[dict[str, Any]]:
    """The RBAC objects (ServiceAccount, Roles, bindings) of configs/deploy/router as rendered by
    the built kubectl kustomize, moved to `namespace` (the project's only RBAC source)."""
    tmp.mkdir(parents=True, exist_ok=True)
    overlay = os.path.relpath(DEPLOY / "overlays" / variant, tmp)  # kustomize refuses absolute paths
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "resources": [overlay]}))
    docs = [d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(tmp)).stdout) if d]
    return [d for d in docs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                             "ClusterRoleBinding")]


def status_of(cp: k8s_harness.ControlPlane, kind: str, ns: str, name: str) -> dict[str, Any]:
    plural = {"ModelRoute": "modelroutes", "ModelServer": "modelservers",
              "ExternalModelProvider": "externalmodelproviders"}[kind]
    with cp.client() as api:
        r = api.get(f"{GROUP_PATH}/namespaces/{ns}/{plural}/{name}")
        r.raise_for_status()
        return r.json().get("status") or {}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """type -> (status, reason)."""
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions") or []}


def lease_holder(cp: k8s_harness.ControlPlane, ns: str, name: str = "kthena-router") -> str:
    with cp.client() as api:
        r = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}")
        if r.status_code == 404:
            return ""
        r.raise_for_status()
        return str(r.json()["spec"].get("holderIdentity") or "")


def models(router: harness.Router) -> set[str]:
    r = httpx.get(f"{router.openai_url}/models", timeout=10)
    return {m["id"] for m in r.json().get("data", [])} if r.status_code == 200 else set()


def wait_model(router: harness.Router, model: str, present: bool = True, timeout: float = 30) -> None:
    harness.wait_until(lambda: (model in models(router)) == present, timeout, interval=0.1,
                       what=f"model {model} {'listed' if present else 'gone'}")


def endpoints(router: harness.Router, server: str) -> set[str]:
    """Addresses of a ModelServer's endpoints in the config the workers apply."""
    body = router.admin_get("/debug/config_dump").json()
    return {e["address"] for s in body["servers"] if s["name"] == server for e in s["endpoints"]}


def metric(router: harness.Router, name: str, **labels: str) -> float:
    fams = harness.parse_metrics(router.metrics_text())
    try:
        return harness.metric_value(fams, name, **labels)
    except (KeyError, ValueError, AssertionError):
        return 0.0


def eventually(pred: Any, timeout: float = 30, what: str = "condition") -> Any:
    return harness.wait_until(pred, timeout, interval=0.1, what=what)


def now() -> float:
    return time.monotonic()
