"""Watch-driven helpers of the rollout tests on the real apiserver: a recorder that replays
every event of a watch (from a resourceVersion, so no transition is missed) into a local
state and calls a check on each observed state, and a stand-in kubelet that marks every new
pod Running and Ready (a little later, so that not-ready moments are observable)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

import k8s_harness

Obj = dict[str, Any]


class Recorder:
    """Follows `path` (a collection) from `resource_version`, keeping {name: object}; calls
    `on_state(state, event_type, obj)` after every event, in the apiserver's order."""

    def __init__(self, cp: k8s_harness.ControlPlane, path: str, params: dict[str, str],
                 on_state: Callable[[dict[str, Obj], str, Obj], None]) -> None:
        self.http = cp.client()
        self.path, self.params, self.on_state = path, params, on_state
        self.state: dict[str, Obj] = {}
        self.events = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._rv = ""

    def start(self) -> Recorder:
        r = self.http.get(self.path, params=self.params)
        r.raise_for_status()
        body = r.json()
        self.state = {o["metadata"]["name"]: o for o in body["items"]}
        self._rv = body["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            params = {**self.params, "watch": "1", "resourceVersion": self._rv, "timeoutSeconds": "2"}
            try:
                with self.http.stream("GET", self.path, params=params, timeout=httpx.Timeout(10.0)) as resp:
                    if resp.status_code != 200:
                        self.errors.append(f"watch {resp.status_code}")
                        return
                    for line in resp.iter_lines():
                        if not line:
                            continue
                        ev = json.loads(line)
                        obj = ev["object"]
                        if ev["type"] == "ERROR":
                            self.errors.append(str(obj))
                            return
                        if ev["type"] == "BOOKMARK":
                            self._rv = obj["metadata"]["resourceVersion"]
                            continue
                        name = obj["metadata"]["name"]
                        if ev["type"] == "DELETED":
                            self.state.pop(name, None)
                        else:
                            self.state[name] = obj
                        self._rv = obj["metadata"]["resourceVersion"]
                        self.events += 1
                        try:
                            self.on_state(self.state, ev["type"], obj)
                        except AssertionError as exc:  # kept and raised by stop()
                            self.errors.append(str(exc))
            except httpx.HTTPError:
                time.sleep(0.1)  # a dropped watch resumes from the last resourceVersion

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.http.close()
        assert not self.errors, self.errors[:5]


def is_ready(pod: Obj) -> bool:
    st = pod.get("status") or {}
    return st.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


class Kubelet:
    """Marks each pod of the namespace (label selector) Running and Ready `delay` seconds after
    it is seen not ready; deleted pods are simply gone (no nodeName: the apiserver deletes them
    at once)."""

    def __init__(self, cp: k8s_harness.ControlPlane, ns: str, selector: str, delay: float = 0.3) -> None:
        self.http = cp.client()
        self.ns, self.delay = ns, delay
        self._due: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.recorder = Recorder(cp, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": selector}, self._seen)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _seen(self, state: dict[str, Obj], kind: str, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        with self._lock:
            if kind == "DELETED" or pod["metadata"].get("deletionTimestamp") or is_ready(pod):
                self._due.pop(name, None)
            elif name not in self._due or self._due[name][1] != pod["metadata"]["uid"]:
                self._due[name] = (time.monotonic() + self.delay, pod["metadata"]["uid"])

    def start(self) -> Kubelet:
        self.recorder.start()
        for pod in list(self.recorder.state.values()):
            self._seen(self.recorder.state, "ADDED", pod)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [(name, uid) for name, (t, uid) in self._due.items() if t <= now]
                for name, _ in due:
                    del self._due[name]
            for name, uid in due:
                status = {"metadata": {"uid": uid}, "status": {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
                # the uid guard: never mark a later pod of the same name
                self.http.patch(f"/api/v1/namespaces/{self.ns}/pods/{name}/status", json=status,
                                headers={"Content-Type": "application/merge-patch+json"})
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.recorder.stop()
        self.http.close()
