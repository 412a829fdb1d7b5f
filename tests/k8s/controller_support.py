"""Helpers of the ModelServing controller's tests on the real apiserver: the controller as a
real process (python -m controller), ModelServing documents, pod/Service reads, pod status."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

import harness
import k8s_harness

API = "workload.serving.volcano.sh/v1alpha1"
LABEL_GROUP = "modelserving.volcano.sh/group-name"


def start_controller(cp: k8s_harness.ControlPlane, ns: str, log_dir: Path, identity: str,
                     lease: tuple[float, float, float] = (3.0, 2.0, 0.3), *, kubeconfig: Path | None = None,
                     port: int = 0, extra: list[str] | None = None) -> harness.ManagedProcess:
    """`port`: serve /healthz, /readyz and /metrics there (127.0.0.1); `extra`: more flags."""
    duration, deadline, retry = lease
    serve = ["--health-port", str(port), "--metrics-port", str(port)] if port else []
    return harness.ManagedProcess(f"controller-{identity}", [
        harness.PYTHON, "-m", "controller", "--kubeconfig", str(kubeconfig or cp.kubeconfig), "--namespace", ns,
        "--leader-elect-namespace", ns, "--leader-elect-identity", identity, "--workers", "2",
        "--leader-elect-lease-duration", str(duration), "--leader-elect-renew-deadline", str(deadline),
        "--leader-elect-retry-period", str(retry), *serve, *(extra or [])], log_dir)


@contextlib.contextmanager
def controller_namespace(cp: k8s_harness.ControlPlane, ns: str, log_dir: Path, identity: str,
                         make_api: Callable[[k8s_harness.ControlPlane, str], Any] | None = None,
                         extra: list[str] | None = None) -> Iterator[Any]:
    """A test module's namespace with a controller process watching it: yields the module's
    Api (`make_api(cp, ns)`, default Api); at the end the controller must still be alive,
    then the controller stops and the namespace goes."""
    cp.kubectl("create", "namespace", ns)
    ctl = start_controller(cp, ns, log_dir, identity, extra=extra)
    a = (make_api or Api)(cp, ns)
    try:
        yield a
        assert ctl.alive(), ctl.tail()
    finally:
        a.close()
        ctl.stop()
        cp.kubectl("delete", "namespace", ns, "--wait=false")


def controller_metric(port: int, name: str, **labels: str) -> float:
    """A sample of the controller's /metrics (summed over matching label sets; 0 if absent)."""
    r = httpx.get(f"http://{harness.HOST}:{port}/metrics", timeout=5)
    r.raise_for_status()
    return harness.metric_value(harness.parse_metrics(r.text), name, **labels)


def template(image: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": meta, "spec": {"containers": [{"name": "engine", "image": image,
                                                       "env": [{"name": "MODEL", "value": "m"}]}]}}


def modelserving(name: str, ns: str, replicas: int, roles: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ModelServing", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "template": {"roles": roles}, **spec}}


class Api:
    def __init__(self, cp: k8s_harness.ControlPlane, ns: str) -> None:
        self.cp, self.ns = cp, ns
        self.http = cp.client()

    def close(self) -> None:
        self.http.close()

    def ms(self, name: str) -> dict[str, Any] | None:
        r = self.http.get(f"/apis/{API}/namespaces/{self.ns}/modelservings/{name}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def owned(self, kind: str, ms: str) -> dict[str, dict[str, Any]]:
        """Live pods or Services of that ModelServing, by name."""
        r = self.http.get(f"/api/v1/namespaces/{self.ns}/{kind}",
                          params={"labelSelector": f"modelserving.volcano.sh/name={ms}"})
        r.raise_for_status()
        return {o["metadata"]["name"]: o for o in r.json()["items"]}

    def pods(self, ms: str) -> dict[str, dict[str, Any]]:
        return self.owned("pods", ms)

    def services(self, ms: str) -> dict[str, dict[str, Any]]:
        return self.owned("services", ms)

    def set_ready(self, pod: str, ready: bool = True) -> None:
        status = {"status": {"phase": "Running",
                             "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        r = self.http.patch(f"/api/v1/namespaces/{self.ns}/pods/{pod}/status", json=status,
                            headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    def annotate(self, pod: str, annotations: dict[str, str]) -> None:
        r = self.http.patch(f"/api/v1/namespaces/{self.ns}/pods/{pod}", json={"metadata": {"annotations": annotations}},
                            headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 200, r.text

    def delete(self, kind: str, name: str) -> None:
        r = self.http.delete(f"/api/v1/namespaces/{self.ns}/{kind}/{name}")
        assert r.status_code == 200, r.text

    def wait_pods(self, ms: str, names: set[str], timeout: float = 30) -> dict[str, dict[str, Any]]:
        def exact() -> dict[str, dict[str, Any]] | None:
            pods = self.pods(ms)
            return pods if set(pods) == names else None
        try:
            return harness.wait_until(exact, timeout, interval=0.1, what=f"pods of {ms} == {sorted(names)}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: have {sorted(self.pods(ms))}") from None

    def wait_status(self, ms: str, timeout: float = 30, **want: Any) -> dict[str, Any]:
        def match() -> dict[str, Any] | None:
            obj = self.ms(ms)
            st = (obj or {}).get("status") or {}
            return obj if all(st.get(k) == v for k, v in want.items()) else None
        try:
            return harness.wait_until(match, timeout, interval=0.1, what=f"status of {ms} has {want}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: status {(self.ms(ms) or {}).get('status')}") from None


def condition(obj: dict[str, Any], ctype: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c["status"]
    return None


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


class Watch:
    """A background watch of one collection from a resourceVersion taken before the test
    acts: every ADDED/MODIFIED/DELETED event, in the apiserver's order, as (type, rv, object).
    Resumed from the last resourceVersion after an ERROR event (a watch cache still behind a
    fresh list says "Too large resource version") or a closed stream (the server ends each
    watch after 2 s, so close() can wait for the thread: its socket is never closed under a
    blocked read, whose file descriptor another connection could already reuse).

    The resourceVersions are etcd revisions of the one etcd of the test control plane, so
    events of different collections can be ordered by them (Kubernetes calls them opaque;
    within one etcd they are the store's global revision)."""

    def __init__(self, cp: k8s_harness.ControlPlane, path: str) -> None:
        self.path = path
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=cp.url, headers=cp.auth_headers, verify=cp.ssl_context(),
                                    timeout=httpx.Timeout(10, read=30))
        rv = self._client.get(path).json()["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self._thread.start()

    def _run(self, rv: str) -> None:
        try:
            while not self._stop.is_set():
                params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "2"}
                try:
                    with self._client.stream("GET", self.path, params=params) as resp:
                        for line in resp.iter_lines():
                            if not line:
                                continue
                            ev = json.loads(line)
                            if ev["type"] == "ERROR":
                                self._stop.wait(0.2)
                                break
                            obj = ev["object"]
                            rv = obj["metadata"].get("resourceVersion", rv)
                            if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                                self.events.append((ev["type"], int(rv), obj))
                except httpx.HTTPError:
                    self._stop.wait(0.2)
        finally:
            self._client.close()

    def names(self, etype: str) -> list[str]:
        return [obj["metadata"]["name"] for t, _, obj in self.events if t == etype]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(40)
