"""Helpers of the autoscaler's tests on the real apiserver: the controller with the
autoscaler in its own namespace, AutoscalingPolicy documents, policy and replica waits,
pods brought up Ready (podIP 127.0.0.1 unless given)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import harness
import k8s_harness
from controller_support import Api, controller_namespace, template

API = "workload.serving.volcano.sh/v1alpha1"
MERGE = {"Content-Type": "application/merge-patch+json"}
Obj = dict[str, Any]

FAST = {"scaleUp": {"stablePolicy": {"instances": 10, "percent": 1000, "period": "1s", "stabilizationWindow": "0s"}},
        "scaleDown": {"instances": 10, "percent": 100, "period": "1s", "stabilizationWindow": "0s"}}


class ScalerApi(Api):
    def policy(self, name: str) -> Obj | None:
        r = self.http.get(f"/apis/{API}/namespaces/{self.ns}/autoscalingpolicies/{name}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def pod_up(self, pod: str) -> None:
        """Running, Ready, and reachable at 127.0.0.1 (where the test serves the metrics)."""
        self.set_ready(pod)
        r = self.http.patch(f"/api/v1/namespaces/{self.ns}/pods/{pod}/status",
                            json={"status": {"podIP": harness.HOST, "podIPs": [{"ip": harness.HOST}]}}, headers=MERGE)
        assert r.status_code == 200, r.text

    def pods_up(self, ms: str, count: int) -> None:
        """Wait for `count` entry pods of that ModelServing and bring them all up."""
        def entries() -> list[str] | None:
            names = [n for n, p in self.pods(ms).items()
                     if p["metadata"]["labels"].get("modelserving.volcano.sh/entry") == "true"]
            return sorted(names) if len(names) == count else None
        for name in harness.wait_until(entries, 30, interval=0.1, what=f"{count} entry pods of {ms}"):
            self.pod_up(name)

    def wait_policy(self, name: str, ok: Any, what: str, timeout: float = 30) -> Obj:
        def check() -> Obj | None:
            p = self.policy(name)
            if p is None or not p.get("status"):
                return None  # no status written yet: the predicates read into it
            return p if ok(p) else None
        try:
            return harness.wait_until(check, timeout, interval=0.1, what=f"policy {name}: {what}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: status {(self.policy(name) or {}).get('status')}") from None

    def wait_replicas(self, ms: str, n: int, timeout: float = 30) -> Obj:
        def check() -> Obj | None:
            o = self.ms(ms)
            return o if o is not None and o["spec"].get("replicas") == n else None
        try:
            return harness.wait_until(check, timeout, interval=0.1, what=f"{ms} spec.replicas == {n}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: spec {(self.ms(ms) or {}).get('spec')}") from None


def homogeneous(name: str, ns: str, target: str, port: int, path: str, lo: int = 1, hi: int = 5) -> Obj:
    return {"apiVersion": API, "kind": "AutoscalingPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"metrics": [{"name": "load", "targetValue": "1"}], "behavior": FAST,
                     "homogeneousTarget": {"minReplicas": lo, "maxReplicas": hi, "target": {
                         "targetRef": {"kind": "ModelServing", "name": target},
                         "metricSources": {"load": {"pod": {"port": port, "uri": path}}}}}}}


def single_role() -> list[Obj]:
    return [{"name": "worker", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("engine:1")}]


def ready_message(p: Obj) -> str:
    for c in (p.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return str(c.get("message") or "")
    return ""


def ready_reason(p: Obj) -> str:
    for c in (p.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return str(c.get("reason") or "")
    return ""


def scaler_namespace(cp: k8s_harness.ControlPlane, tmp: Any, tag: str, extra: list[str],
                     period: str = "0.3") -> Iterator[ScalerApi]:
    ns = f"autoscaler-{tag}-{secrets.token_hex(3)}"
    with controller_namespace(cp, ns, tmp, f"autoscaler-{tag}", ScalerApi,
                              extra=["--autoscaler-period", period, *extra]) as a:
        yield a
