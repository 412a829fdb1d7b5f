"""Crash convergence: the controller is SIGKILLed right after its k-th API write (the hidden
--exit-after-writes k; k drawn per seed over the writes a reconcile needs), once while
creating a ModelServing with workers (pods and headless Services) and once while scaling it
down; a fresh controller then converges to exactly the planned pods and Services: nothing
missing, no orphans (nothing outside the plan, nothing without the ModelServing's controller
ownerReference) and no duplicate work (a watch from the start shows each object created once,
except a ServingGroup that was rightly deleted by the scale-down and is back in the plan)."""

from __future__ import annotations

import json
import random
import secrets
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import harness
import k8s_harness
from controller_support import Api, modelserving, start_controller, template

ROLES = [{"name": "llm", "replicas": 1, "workerReplicas": 1, "entryTemplate": template("e:1"),
          "workerTemplate": template("w:1")}]
SEEDS = [1, 2, 3, 4]
CREATE_WRITES = 3 * 3  # replicas 3: per group an entry pod, a worker pod, a Service
DELETE_WRITES = 2 * 3  # 3 -> 1: two groups' pods and Services


def _pods(group: int) -> set[str]:
    return {f"crash-{group}-llm-0-0", f"crash-{group}-llm-0-1"}


def _service(group: int) -> str:
    return f"crash-{group}-llm-0-0"


class Recorder:
    """Watches pods and Services of a namespace from a resourceVersion before anything
    exists; keeps (type, name, uid) in the apiserver's order."""

    def __init__(self, cp: k8s_harness.ControlPlane, ns: str) -> None:
        self.events: dict[str, list[tuple[str, str, str]]] = {"pods": [], "services": []}
        self._stop = threading.Event()
        self._clients: list[httpx.Client] = []
        self._threads: list[threading.Thread] = []
        for kind in self.events:
            client = httpx.Client(base_url=cp.url, headers=cp.auth_headers, verify=cp.ssl_context(),
                                  timeout=httpx.Timeout(10, read=None))
            rv = client.get(f"/api/v1/namespaces/{ns}/{kind}").json()["metadata"]["resourceVersion"]
            t = threading.Thread(target=self._watch, args=(client, ns, kind, rv), daemon=True)
            self._clients.append(client)
            self._threads.append(t)
            t.start()

    def _watch(self, client: httpx.Client, ns: str, kind: str, rv: str) -> None:
        """From `rv` on, resumed after an ERROR event (a watch cache still behind a fresh
        list's resourceVersion says "Too large resource version") or a closed stream."""
        while not self._stop.is_set():
            params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "900"}
            try:
                with client.stream("GET", f"/api/v1/namespaces/{ns}/{kind}", params=params) as resp:
                    for line in resp.iter_lines():
                        if self._stop.is_set():
                            return
                        if not line:
                            continue
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            break
                        meta = ev["object"].get("metadata") or {}
                        rv = meta.get("resourceVersion", rv)
                        if ev["type"] in ("ADDED", "DELETED"):
                            self.events[kind].append((ev["type"], meta.get("name", ""), meta.get("uid", "")))
            except httpx.HTTPError:
                if self._stop.is_set():
                    return
            self._stop.wait(0.2)

    def count(self, kind: str, etype: str) -> Counter[str]:
        return Counter(name for t, name, _ in self.events[kind] if t == etype)

    def close(self) -> None:
        self._stop.set()
        for c in self._clients:
            c.close()


@pytest.fixture
def ns(control_plane: k8s_harness.ControlPlane) -> Iterator[str]:
    name = f"controller-crash-{secrets.token_hex(3)}"
    control_plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false")


def _crash(cp: k8s_harness.ControlPlane, ns: str, logs: Path, identity: str, k: int) -> None:
    """A controller that must die by SIGKILL right after its k-th write."""
    ctl = start_controller(cp, ns, logs, identity, extra=["--exit-after-writes", str(k)])
    try:
        rc = ctl.wait(90)
    finally:
        ctl.stop()
    assert rc == -signal.SIGKILL, f"expected a SIGKILL after write {k}, got {rc}:\n{ctl.tail()}"
    assert f"--exit-after-writes {k} reached" in ctl.stderr()


def _groups(api: Api) -> set[int] | None:
    """The groups of the pod set when it is exactly `replicas` complete groups (pods and
    Service), else None."""
    pods, svcs = set(api.pods("crash")), set(api.services("crash"))
    groups = {int(n.split("-")[1]) for n in pods | svcs}
    complete = set().union(*(_pods(g) for g in groups)) == pods and {_service(g) for g in groups} == svcs
    return groups if complete else None


def _converged(api: Api, replicas: int) -> set[int]:
    """Waits for exactly `replicas` complete ServingGroups (group 0 among them, as Kthena's
    scale-down removes the highest ordinals of equally unready groups) and the status; checks
    that nothing else exists in the namespace and everything is owned. Returns the groups."""
    groups: set[int] = harness.wait_until(lambda: (g := _groups(api)) is not None and len(g) == replicas and g,
                                          60, interval=0.1, what=f"{replicas} complete groups")
    assert 0 in groups, groups
    ms = api.wait_status("crash", timeout=60, replicas=replicas)
    harness.wait_until(lambda: ((api.ms("crash") or {}).get("status") or {}).get("observedGeneration")
                       == (api.ms("crash") or {})["metadata"]["generation"], 30, what="status observed")
    assert _groups(api) == groups  # still the same set once the status caught up
    uid = ms["metadata"]["uid"]
    # no orphans: everything in the namespace (not only what carries our labels) is planned and owned
    for kind, want in (("pods", set().union(*(_pods(g) for g in groups))), ("services", {_service(g) for g in groups})):
        items = api.http.get(f"/api/v1/namespaces/{api.ns}/{kind}").json()["items"]
        items = [o for o in items if o["metadata"]["name"] != "kubernetes"]
        assert sorted(o["metadata"]["name"] for o in items) == sorted(want), kind
        for o in items:
            refs = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("controller")]
            assert [(r["kind"], r["name"], r["uid"]) for r in refs] == [("ModelServing", "crash", uid)], \
                o["metadata"]["name"]
    return groups


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_after_kth_write_converges_without_orphans_or_duplicates(
        control_plane: k8s_harness.ControlPlane, ns: str, tmp_path_factory: pytest.TempPathFactory,
        seed: int) -> None:
    rng = random.Random(seed)
    k_create, k_delete = rng.randint(1, CREATE_WRITES), rng.randint(1, DELETE_WRITES)
    logs = tmp_path_factory.mktemp(f"crash-{seed}")
    api = Api(control_plane, ns)
    rec = Recorder(control_plane, ns)
    try:
        # 1. create: killed after the k-th write, a fresh controller completes the work
        control_plane.apply([modelserving("crash", ns, 3, ROLES)])
        _crash(control_plane, ns, logs, "ctl-create", k_create)
        ctl = start_controller(control_plane, ns, logs, "ctl-fresh-1")
        try:
            assert _converged(api, 3) == {0, 1, 2}
        finally:
            ctl.stop()
        # 2. scale down 3 -> 1: killed after the k-th delete; then back up to 2 before a fresh
        # controller converges (the group deleted meanwhile, or not yet, is in the plan again)
        control_plane.kubectl("scale", "-n", ns, "modelserving/crash", "--replicas=1")
        _crash(control_plane, ns, logs, "ctl-scale", k_delete)
        control_plane.kubectl("scale", "-n", ns, "modelserving/crash", "--replicas=2")
        ctl = start_controller(control_plane, ns, logs, "ctl-fresh-2")
        try:
            final = _converged(api, 2)
            assert ctl.alive(), ctl.tail()
        finally:
            ctl.stop()
    finally:
        rec.close()
        api.close()

    for kind, objects in (("pods", {g: _pods(g) for g in range(3)}),
                          ("services", {g: {_service(g)} for g in range(3)})):
        added, deleted = rec.count(kind, "ADDED"), rec.count(kind, "DELETED")
        assert set(added) == set().union(*objects.values()), (kind, added)
        for g, names in objects.items():
            for name in names:
                if g == 0:  # always planned: created once, never touched again
                    assert (added[name], deleted[name]) == (1, 0), (kind, name, rec.events[kind])
                elif g in final:  # maybe deleted by the scale-down, then planned again
                    assert deleted[name] <= 1 and added[name] == 1 + deleted[name], (kind, name, rec.events[kind])
                else:  # scaled away for good: created once, deleted once
                    assert (added[name], deleted[name]) == (1, 1), (kind, name, rec.events[kind])
        uids = [uid for t, _, uid in rec.events[kind] if t == "ADDED"]
        assert len(uids) == len(set(uids))
