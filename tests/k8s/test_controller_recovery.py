"""Recovery policies on the real apiserver, the controller a real process: a failed pod
(status phase Failed), a restarted container (containerStatuses restartCount bump) or a
pod deleted by someone else makes RoleRecreate recreate that role replica only,
ServingGroupRecreate the whole group, None the errored pod alone (as Kthena's code; a
deleted pod is recreated alone too); restartGracePeriodSeconds lets a pod that recovers in time keep running; a
flapping pod costs one recovery per incarnation. Deletions are counted from a watch (pod
uids), never from timing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest

import harness
import k8s_harness
from controller_support import Api, controller_namespace, modelserving, template
from k8s_crds import install_crds

NS = "controller-recovery"


@pytest.fixture(scope="module")
def control_plane(controller_cluster: k8s_harness.ControlPlane) -> k8s_harness.ControlPlane:
    """This module runs on both clusters: without and with Volcano's CRDs (conftest.py)."""
    return controller_cluster


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    install_crds(control_plane)
    with controller_namespace(control_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-rec") as a:
        yield a


class Deletions:
    """Uids of the ModelServing's pods deleted since creation, from a watch. The watch ends
    every 2 s and resumes from the last resourceVersion, so stop() can join the thread before
    its client closes (closing a socket under another thread's blocked read would free a file
    descriptor that a later test's connection may reuse)."""

    def __init__(self, cp: k8s_harness.ControlPlane, ms: str) -> None:
        self.uids: list[str] = []
        self.names: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._http = httpx.Client(base_url=cp.url, headers=cp.auth_headers, verify=cp.ssl_context(),
                                  timeout=httpx.Timeout(10, read=30))
        self._params = {"labelSelector": f"modelserving.volcano.sh/name={ms}"}
        listed = self._http.get(f"/api/v1/namespaces/{NS}/pods", params=self._params)
        listed.raise_for_status()
        self._rv = listed.json()["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                params = {**self._params, "watch": "true", "resourceVersion": self._rv, "timeoutSeconds": "2"}
                try:
                    with self._http.stream("GET", f"/api/v1/namespaces/{NS}/pods", params=params) as r:
                        for line in r.iter_lines():
                            if not line:
                                continue
                            ev = json.loads(line)
                            if ev.get("type") == "ERROR":
                                raise AssertionError(f"watch error: {ev.get('object')}")
                            self._rv = ev["object"]["metadata"].get("resourceVersion", self._rv)
                            if ev.get("type") == "DELETED":
                                with self._lock:
                                    self.uids.append(ev["object"]["metadata"]["uid"])
                                    self.names.append(ev["object"]["metadata"]["name"])
                except httpx.HTTPError:
                    self._stop.wait(0.2)  # resumes from the last resourceVersion
        finally:
            self._http.close()

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.uids)

    def settle(self, want: list[str]) -> list[str]:
        """The deleted uids once at least as many as `want` arrived (the watch may lag)."""
        harness.wait_until(lambda: len(self.seen()) >= len(want), 20, what=f"{len(want)} deletions watched")
        return self.seen()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(40)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_status(api: Api, pod: str, *, phase: str = "Running", ready: bool = True, restarts: int = 0,
               uid: str | None = None) -> int:
    """Patch a pod's status as a kubelet would (one container `engine`); `uid` makes it a
    precondition (a recreated pod of the same name is not touched). Returns the HTTP status."""
    t = now()
    image = api.pods(pod.split("-")[0]).get(pod, {}).get("spec", {}).get("containers", [{}])[0].get("image", "x")
    cs: dict[str, Any] = {"name": "engine", "image": image, "imageID": "", "ready": ready, "started": ready,
                          "restartCount": restarts, "state": {"running": {"startedAt": t}}}
    if restarts:
        cs["lastState"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": t, "finishedAt": t}}
    if phase == "Failed":
        cs["state"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": t, "finishedAt": t}}
    body: dict[str, Any] = {"status": {
        "phase": phase, "containerStatuses": [cs],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": t}]}}
    if uid is not None:
        body["metadata"] = {"uid": uid}
    r = api.http.patch(f"/api/v1/namespaces/{NS}/pods/{pod}/status", json=body,
                       headers={"Content-Type": "application/merge-patch+json"})
    # a uid that no longer matches (the pod was recreated) is refused: 422 (immutable) or 404
    assert r.status_code in ((200, 404, 409, 422) if uid is not None else (200,)), r.text
    return r.status_code


def uids(api: Api, ms: str) -> dict[str, str]:
    return {name: p["metadata"]["uid"] for name, p in api.pods(ms).items()}


def all_ready(api: Api, ms: str, names: set[str], groups: int) -> dict[str, str]:
    api.wait_pods(ms, names)
    for name in names:
        set_status(api, name)
    api.wait_status(ms, availableReplicas=groups)
    return uids(api, ms)


def renewed(api: Api, ms: str, before: dict[str, str], names: set[str], timeout: float = 30) -> dict[str, str]:
    """Wait until every pod in `names` exists with a new uid; returns all uids then."""
    def done() -> dict[str, str] | None:
        now_uids = uids(api, ms)
        return now_uids if all(n in now_uids and now_uids[n] != before[n] for n in names) else None
    return harness.wait_until(done, timeout, interval=0.1, what=f"{sorted(names)} recreated")


ROLES = [{"name": "prefill", "replicas": 2, "workerReplicas": 1, "entryTemplate": template("p:1"),
          "workerTemplate": template("pw:1")},
         {"name": "decode", "replicas": 1, "workerReplicas": 0, "entryTemplate": template("d:1")}]


def pod_names(ms: str, groups: int) -> set[str]:
    return {f"{ms}-{g}-prefill-{r}-{k}" for g in range(groups) for r in range(2) for k in range(2)} | {
        f"{ms}-{g}-decode-0-0" for g in range(groups)}


def test_role_recreate_recreates_only_that_role_replica(api: Api) -> None:
    api.cp.apply([modelserving("rr", NS, 1, ROLES)])  # recoveryPolicy defaults to RoleRecreate
    names = pod_names("rr", 1)
    before = all_ready(api, "rr", names, 1)
    svc_before = {n: s["metadata"]["uid"] for n, s in api.services("rr").items()}
    watch = Deletions(api.cp, "rr")
    try:
        set_status(api, "rr-0-prefill-1-1", phase="Failed", ready=False)  # a worker fails
        role = {"rr-0-prefill-1-0", "rr-0-prefill-1-1"}
        after = renewed(api, "rr", before, role)
        assert {n: u for n, u in after.items() if n not in role} == {n: u for n, u in before.items() if n not in role}
        # the role replica's headless Service is recreated too (Kthena's DeleteRole)
        harness.wait_until(lambda: (s := api.services("rr").get("rr-0-prefill-1-0")) and
                           s["metadata"]["uid"] != svc_before["rr-0-prefill-1-0"], 20, what="service recreated")
        assert api.services("rr")["rr-0-prefill-0-0"]["metadata"]["uid"] == svc_before["rr-0-prefill-0-0"]

        # a restarted container (Running, restartCount 1) of the decode entry: only it goes
        set_status(api, "rr-0-decode-0-0", ready=True, restarts=1)
        after2 = renewed(api, "rr", after, {"rr-0-decode-0-0"})
        assert {n: u for n, u in after2.items() if n != "rr-0-decode-0-0"} == {
            n: u for n, u in after.items() if n != "rr-0-decode-0-0"}
        # a pod deleted by someone else takes its role replica along
        api.delete("pods", "rr-0-prefill-0-0")
        role0 = {"rr-0-prefill-0-0", "rr-0-prefill-0-1"}
        after3 = renewed(api, "rr", after2, role0)
        assert {n: u for n, u in after3.items() if n not in role0} == {
            n: u for n, u in after2.items() if n not in role0}
        for name in names:
            set_status(api, name)
        api.wait_status("rr", availableReplicas=1)
        want = [before[n] for n in role] + [after["rr-0-decode-0-0"]] + [after2[n] for n in role0]
        assert sorted(watch.settle(want)) == sorted(want)
    finally:
        watch.stop()


def test_serving_group_recreate_recreates_the_whole_group(api: Api) -> None:
    api.cp.apply([modelserving("sg", NS, 2, ROLES, recoveryPolicy="ServingGroupRecreate")])
    names = pod_names("sg", 2)
    before = all_ready(api, "sg", names, 2)
    watch = Deletions(api.cp, "sg")
    try:
        set_status(api, "sg-1-decode-0-0", ready=False, restarts=1)
        group1 = {n for n in names if n.startswith("sg-1-")}
        after = renewed(api, "sg", before, group1)
        assert {n: after[n] for n in names - group1} == {n: before[n] for n in names - group1}
        for name in group1:
            set_status(api, name)
        api.wait_status("sg", availableReplicas=2)
        want = [before[n] for n in group1]
        assert sorted(watch.settle(want)) == sorted(want)
    finally:
        watch.stop()


def test_none_recreates_the_errored_pod_alone(api: Api) -> None:
    """Kthena's code under None: a failed or restarted pod is deleted and recreated by itself;
    its role replica's other pods and Service, and the rest of the group, stay."""
    api.cp.apply([modelserving("none", NS, 1, ROLES, recoveryPolicy="None")])
    names = pod_names("none", 1)
    before = all_ready(api, "none", names, 1)
    svc_before = {n: s["metadata"]["uid"] for n, s in api.services("none").items()}
    watch = Deletions(api.cp, "none")
    try:
        set_status(api, "none-0-prefill-0-1", phase="Failed", ready=False)
        after = renewed(api, "none", before, {"none-0-prefill-0-1"})
        assert {n: after[n] for n in names if n != "none-0-prefill-0-1"} == {
            n: before[n] for n in names if n != "none-0-prefill-0-1"}
        set_status(api, "none-0-decode-0-0", ready=False, restarts=3)
        after2 = renewed(api, "none", after, {"none-0-decode-0-0"})
        assert {n: after2[n] for n in names if n != "none-0-decode-0-0"} == {
            n: after[n] for n in names if n != "none-0-decode-0-0"}
        # a pod deleted by someone else is recreated alone, nothing else is deleted
        api.delete("pods", "none-0-prefill-1-0")
        after3 = renewed(api, "none", after2, {"none-0-prefill-1-0"})
        assert {n: after3[n] for n in names if n != "none-0-prefill-1-0"} == {
            n: after2[n] for n in names if n != "none-0-prefill-1-0"}
        assert {n: s["metadata"]["uid"] for n, s in api.services("none").items()} == svc_before
        for name in names:
            set_status(api, name)
        api.wait_status("none", availableReplicas=1, replicas=1)
        want = [before["none-0-prefill-0-1"], after["none-0-decode-0-0"], after2["none-0-prefill-1-0"]]
        assert sorted(watch.settle(want)) == sorted(want)
    finally:
        watch.stop()


def test_grace_period_keeps_a_pod_that_recovers_in_time(api: Api) -> None:
    roles = [{"name": "decode", "replicas": 2, "workerReplicas": 0, "entryTemplate": template("d:1")}]
    doc = modelserving("grace", NS, 1, roles)
    doc["spec"]["template"]["restartGracePeriodSeconds"] = 8
    api.cp.apply([doc])
    names = {"grace-0-decode-0-0", "grace-0-decode-1-0"}
    before = all_ready(api, "grace", names, 1)
    watch = Deletions(api.cp, "grace")
    try:
        a, b = "grace-0-decode-0-0", "grace-0-decode-1-0"
        # a flaps (restart, Ready again) a few times within the grace period and ends Ready
        for restarts in (1, 2, 3):
            set_status(api, a, ready=False, restarts=restarts, uid=before[a])
            set_status(api, a, ready=True, restarts=restarts, uid=before[a])
        # b restarts after a and does not recover: recreated once its grace period is over,
        # which also ends a's (b's trouble began later)
        set_status(api, b, ready=False, restarts=1, uid=before[b])
        after = renewed(api, "grace", before, {b}, timeout=60)
        assert after[a] == before[a]
        set_status(api, b)
        api.wait_status("grace", availableReplicas=1)
        assert watch.settle([before[b]]) == [before[b]]
    finally:
        watch.stop()


def test_flapping_pod_costs_one_recovery_per_incarnation(api: Api) -> None:
    roles = [{"name": "web", "replicas": 1, "workerReplicas": 1, "entryTemplate": template("w:1"),
              "workerTemplate": template("ww:1")}]
    api.cp.apply([modelserving("flap", NS, 1, roles)])
    names = {"flap-0-web-0-0", "flap-0-web-0-1"}
    before = all_ready(api, "flap", names, 1)
    watch = Deletions(api.cp, "flap")
    try:
        # the worker's container restarts over and over (the same pod uid): one recovery
        for restarts in range(1, 6):
            set_status(api, "flap-0-web-0-1", ready=restarts % 2 == 0, restarts=restarts, uid=before["flap-0-web-0-1"])
        first = renewed(api, "flap", before, names)
        for name in names:
            set_status(api, name, uid=first[name])
        api.wait_status("flap", availableReplicas=1)
        assert sorted(watch.settle(list(before.values()))) == sorted(before.values())
        # the new incarnation crashes too: recovered again (after the backoff, by a requeue
        # with no event to wake the controller), once
        set_status(api, "flap-0-web-0-0", ready=False, restarts=1, uid=first["flap-0-web-0-0"])
        second = renewed(api, "flap", first, names, timeout=60)
        for name in names:
            set_status(api, name, uid=second[name])
        api.wait_status("flap", availableReplicas=1)
        want = list(before.values()) + list(first.values())
        assert sorted(watch.settle(want)) == sorted(want)
    finally:
        watch.stop()
