"""Volcano gang scheduling by the ModelServing controller (a real process) on the real
apiserver, with the project's Volcano CRDs (configs/crds/volcano, structural: a misspelled
field would be pruned and missed here):

- without the CRDs the controller works (plain pods) and says why in GangScheduling; once
  the CRDs are installed it creates the PodGroups of the existing groups, no restart;
- the PodGroup read back for several role mixes (single role; prefill/decode with workers,
  minRoleReplicas, queue annotation, network topology); pods annotated for Volcano;
- kept in sync: role scaling patches minMember/subGroupPolicy, the queue annotation, a
  foreign edit is undone, a deleted PodGroup is recreated, a removed group's PodGroup goes;
- a scheduler other than volcano: no PodGroups;
- a PodGroup CRD without subGroupPolicy: the field is never sent;
- the garbage collector removes the PodGroups with their ModelServing;
- the CRD removed while running: back to plain pods, the condition says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
import volcano_crds
from controller_support import Api, controller_namespace, modelserving

NS = "controller-gang"
PG = f"/apis/{volcano_crds.GROUP_VERSION}/namespaces/{NS}/podgroups"
GANG = "GangScheduling"
MERGE = {"Content-Type": "application/merge-patch+json"}


def tpl(image: str, **requests: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "engine", "image": image}
    if requests:
        c["resources"] = {"requests": requests, "limits": dict(requests)}  # extended resources need limits
    return {"spec": {"containers": [c]}}


PD = [
    {"name": "prefill", "replicas": 2, "workerReplicas": 1, "entryTemplate": tpl("p:1", cpu="2", memory="4Gi"),
     "workerTemplate": tpl("pw:1", cpu="1", memory="512Mi")},
    {"name": "decode", "replicas": 2, "workerReplicas": 2, "entryTemplate": tpl("d:1", cpu="500m"),
     "workerTemplate": tpl("dw:1", cpu="1", **{"nvidia.com/gpu": "1"})},
]


class GangApi(Api):
    def podgroups(self, ms: str) -> dict[str, dict[str, Any]]:
        r = self.http.get(PG, params={"labelSelector": f"modelserving.volcano.sh/name={ms}"})
        r.raise_for_status()
        return {o["metadata"]["name"]: o for o in r.json()["items"]}

    def wait_podgroups(self, ms: str, check: Any, what: str, timeout: float = 30) -> dict[str, dict[str, Any]]:
        def got() -> list[dict[str, dict[str, Any]]] | None:
            pgs = self.podgroups(ms)
            try:
                return [pgs] if check(pgs) else None  # (a list: {} may be the answer)
            except KeyError:  # not there yet
                return None
        try:
            return harness.wait_until(got, timeout, interval=0.1, what=what)[0]
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: have {self.podgroups(ms)}") from None

    def gang(self, ms: str) -> dict[str, Any] | None:
        obj = self.ms(ms) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == GANG), None)

    def wait_gang(self, ms: str, reason: str, text: str = "", timeout: float = 30) -> dict[str, Any]:
        def ok() -> dict[str, Any] | None:
            c = self.gang(ms)
            return c if c and c["reason"] == reason and text in c["message"] else None
        try:
            return harness.wait_until(ok, timeout, interval=0.1, what=f"{GANG} of {ms}: {reason} {text!r}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: have {self.gang(ms)}") from None

    def patch_ms(self, name: str, body: dict[str, Any]) -> None:
        r = self.http.patch(f"/apis/workload.serving.volcano.sh/v1alpha1/namespaces/{NS}/modelservings/{name}",
                            json=body, headers=MERGE)
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GangApi]:
    volcano_crds.uninstall(control_plane)  # start without Volcano (the session never installs it)
    try:
        with controller_namespace(control_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-gang",
                                  GangApi) as a:
            yield a
    finally:
        volcano_crds.uninstall(control_plane)  # later modules expect plain pods


def _gang_annotations(pod: dict[str, Any]) -> dict[str, str]:
    ann = pod["metadata"].get("annotations") or {}
    return {k: v for k, v in ann.items() if k in ("scheduling.k8s.io/group-name", "volcano.sh/task-spec")}


def test_without_crds_then_installed_later(api: GangApi) -> None:
    api.cp.apply([modelserving("late", NS, 1, [{"name": "web", "replicas": 1, "workerReplicas": 0,
                                                  "entryTemplate": tpl("w:1", cpu="1")}])])
    pods = api.wait_pods("late", {"late-0-web-0-0"})
    assert _gang_annotations(pods["late-0-web-0-0"]) == {}
    cond = api.wait_gang("late", "PodGroupCRDNotInstalled")
    assert cond["status"] == "False" and "podgroups.scheduling.volcano.sh is not installed" in cond["message"]
    api.set_ready("late-0-web-0-0")
    api.wait_status("late", availableReplicas=1)

    volcano_crds.install(api.cp)  # the controller watches the CRD: no restart
    pgs = api.wait_podgroups("late", lambda p: "late-0" in p, "PodGroup late-0")
    assert pgs["late-0"]["spec"] == {"minMember": 1, "minResources": {"cpu": "1"}, "queue": "default",
                                     "subGroupPolicy": [{
                                         "name": "web", "labelSelector": {"matchLabels": {
                                             "modelserving.volcano.sh/name": "late",
                                             "modelserving.volcano.sh/role": "web"}},
                                         "matchLabelKeys": ["modelserving.volcano.sh/role-id"],
                                         "subGroupSize": 1, "minSubGroups": 1}]}
    cond = api.wait_gang("late", "PodGroupsInUse")
    assert cond["status"] == "True"

    api.patch_ms("late", {"spec": {"replicas": 2}})
    pods = api.wait_pods("late", {"late-0-web-0-0", "late-1-web-0-0"})
    assert _gang_annotations(pods["late-1-web-0-0"]) == {"scheduling.k8s.io/group-name": "late-1",
                                                         "volcano.sh/task-spec": "web-0"}
    assert _gang_annotations(pods["late-0-web-0-0"]) == {}  # existing pods are not rewritten (as Kthena)
    pgs = api.wait_podgroups("late", lambda p: set(p) == {"late-0", "late-1"}, "PodGroups late-0, late-1")
    # created before the group's pods
    assert pgs["late-1"]["metadata"]["creationTimestamp"] <= pods["late-1-web-0-0"]["metadata"]["creationTimestamp"]


def test_podgroups_for_role_mixes(api: GangApi) -> None:
    pd = modelserving("pd", NS, 1, PD, )
    pd["metadata"]["annotations"] = {"scheduling.volcano.sh/queue-name": "gpu-q"}
    pd["spec"]["template"]["gangPolicy"] = {"minRoleReplicas": {"decode": 1}}
    pd["spec"]["template"]["networkTopology"] = {"groupPolicy": {"mode": "soft", "highestTierAllowed": 2},
                                                 "rolePolicy": {"highestTierName": "rack"}}
    one = modelserving("one", NS, 2, [{"name": "llm", "replicas": 3, "workerReplicas": 0,
                                          "entryTemplate": tpl("l:1", memory="1.5Gi")}])
    api.cp.apply([pd, one])

    pgs = api.wait_podgroups("pd", lambda p: "pd-0" in p, "PodGroup pd-0")
    ms = api.ms("pd")
    assert ms is not None
    pg = pgs["pd-0"]
    assert pg["metadata"]["labels"] == {"modelserving.volcano.sh/name": "pd", "modelserving.volcano.sh/group-name": "pd-0"}
    assert pg["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "pd-0"}
    assert pg["metadata"]["ownerReferences"] == [{"apiVersion": "workload.serving.volcano.sh/v1alpha1",
                                                  "kind": "ModelServing", "name": "pd",
                                                  "uid": ms["metadata"]["uid"], "controller": True}]
    sel = {"modelserving.volcano.sh/name": "pd"}
    assert pg["spec"] == {
        # prefill 2 x (1 + 1) + decode min(1, 2) x (1 + 2)
        "minMember": 7,
        # cpu 2x2 + 2x1 + 1x500m + 1x2x1 = 8.5; memory 2x4Gi + 2x512Mi = 9Gi; gpu 1x2x1
        "minResources": {"cpu": "8500m", "memory": "9Gi", "nvidia.com/gpu": "2"},
        "queue": "gpu-q",
        "networkTopology": {"mode": "soft", "highestTierAllowed": 2},
        "subGroupPolicy": [
            {"name": "prefill", "labelSelector": {"matchLabels": {**sel, "modelserving.volcano.sh/role": "prefill"}},
             "matchLabelKeys": ["modelserving.volcano.sh/role-id"], "subGroupSize": 2, "minSubGroups": 2,
             "networkTopology": {"mode": "hard", "highestTierName": "rack"}},
            {"name": "decode", "labelSelector": {"matchLabels": {**sel, "modelserving.volcano.sh/role": "decode"}},
             "matchLabelKeys": ["modelserving.volcano.sh/role-id"], "subGroupSize": 3, "minSubGroups": 1,
             "networkTopology": {"mode": "hard", "highestTierName": "rack"}},
        ],
    }
    want = {f"pd-0-prefill-{r}-{k}" for r in range(2) for k in range(2)} | {
        f"pd-0-decode-{r}-{k}" for r in range(2) for k in range(3)}
    pods = api.wait_pods("pd", want)
    for name, pod in pods.items():
        role_id = "-".join(name.split("-")[2:4])
        assert _gang_annotations(pod) == {"scheduling.k8s.io/group-name": "pd-0", "volcano.sh/task-spec": role_id}
        assert pod["spec"]["schedulerName"] == "volcano"

    pgs = api.wait_podgroups("one", lambda p: set(p) == {"one-0", "one-1"}, "PodGroups one-0, one-1")
    for g in ("one-0", "one-1"):
        spec = pgs[g]["spec"]
        assert spec["minMember"] == 3 and spec["minResources"] == {"memory": "4608Mi"} and spec["queue"] == "default"
        assert "networkTopology" not in spec and spec["subGroupPolicy"][0]["minSubGroups"] == 3
    api.wait_gang("pd", "PodGroupsInUse")


def test_kept_in_sync(api: GangApi) -> None:
    before = api.podgroups("pd")["pd-0"]
    # decode 2 -> 3 replicas: minMember stays (minRoleReplicas decode=1); prefill 2 -> 3 changes it
    api.patch_ms("pd", {"spec": {"template": {"roles": [{**PD[0], "replicas": 3}, {**PD[1], "replicas": 3}]}}})
    pgs = api.wait_podgroups("pd", lambda p: p["pd-0"]["spec"]["minMember"] == 9, "minMember 9")
    spec = pgs["pd-0"]["spec"]
    assert spec["minResources"] == {"cpu": "11500m", "memory": "13824Mi", "nvidia.com/gpu": "2"}
    assert [s["minSubGroups"] for s in spec["subGroupPolicy"]] == [3, 1]
    assert pgs["pd-0"]["metadata"]["uid"] == before["metadata"]["uid"]  # patched, not recreated
    assert spec["queue"] == "gpu-q" and spec["networkTopology"] == {"mode": "soft", "highestTierAllowed": 2}

    api.patch_ms("pd", {"metadata": {"annotations": {"scheduling.volcano.sh/queue-name": None}}})
    api.wait_podgroups("pd", lambda p: p["pd-0"]["spec"]["queue"] == "default", "queue back to default")

    # someone else edits the PodGroup: the controller puts it back
    r = api.http.patch(f"{PG}/pd-0", json={"spec": {"minMember": 1, "minResources": {"cpu": "1"}}}, headers=MERGE)
    assert r.status_code == 200, r.text
    api.wait_podgroups("pd", lambda p: p["pd-0"]["spec"]["minMember"] == 9 and
                       p["pd-0"]["spec"]["minResources"]["cpu"] == "11500m", "foreign edit undone")

    # a deleted PodGroup is recreated
    r = api.http.delete(f"{PG}/pd-0")
    assert r.status_code == 200, r.text
    api.wait_podgroups("pd", lambda p: "pd-0" in p and p["pd-0"]["metadata"]["uid"] != before["metadata"]["uid"],
                       "pd-0 recreated")

    # groups: 1 -> 2 -> 1; the removed group's PodGroup goes with it
    api.patch_ms("pd", {"spec": {"replicas": 2}})
    api.wait_podgroups("pd", lambda p: set(p) == {"pd-0", "pd-1"}, "PodGroups pd-0, pd-1")
    api.patch_ms("pd", {"spec": {"replicas": 1}})
    api.wait_podgroups("pd", lambda p: set(p) == {"pd-0"}, "PodGroup pd-1 deleted")


def test_other_scheduler_gets_no_podgroups(api: GangApi) -> None:
    api.cp.apply([modelserving("plain", NS, 1, [{"name": "web", "replicas": 1, "workerReplicas": 0,
                                                    "entryTemplate": tpl("w:1")}],
                               schedulerName="default-scheduler")])
    pods = api.wait_pods("plain", {"plain-0-web-0-0"})
    assert pods["plain-0-web-0-0"]["spec"]["schedulerName"] == "default-scheduler"
    assert _gang_annotations(pods["plain-0-web-0-0"]) == {}
    cond = api.wait_gang("plain", "SchedulerNotVolcano")
    assert cond["status"] == "False"
    assert api.podgroups("plain") == {}


def test_queue_crd_is_structural(api: GangApi) -> None:
    q = {"apiVersion": volcano_crds.GROUP_VERSION, "kind": "Queue", "metadata": {"name": "gpu-q"},
         "spec": {"weight": 4, "capability": {"cpu": "64", "nvidia.com/gpu": 8}, "reclaimable": False,
                  "priority": 2, "guarantee": {"resource": {"cpu": "8"}}, "misspelledField": 1}}
    r = api.http.post(f"/apis/{volcano_crds.GROUP_VERSION}/queues", json=q)
    assert r.status_code == 201, r.text
    spec = api.http.get(f"/apis/{volcano_crds.GROUP_VERSION}/queues/gpu-q").json()["spec"]
    assert spec == {"weight": 4, "capability": {"cpu": "64", "nvidia.com/gpu": 8}, "reclaimable": False,
                    "priority": 2, "guarantee": {"resource": {"cpu": "8"}}, "dequeueStrategy": "traverse"}
    r = api.http.post(f"/apis/{volcano_crds.GROUP_VERSION}/queues",
                      json={**q, "metadata": {"name": "bad"}, "spec": {"weight": 0}})
    assert r.status_code == 422, r.text


def test_crd_without_subgroup_policy(api: GangApi) -> None:
    volcano_crds.install(api.cp, subgroups=False)
    api.wait_gang("pd", "PodGroupsInUse", "no subGroupPolicy")  # the controller saw the new schema
    api.cp.apply([modelserving("old", NS, 1, PD)])
    pgs = api.wait_podgroups("old", lambda p: "old-0" in p, "PodGroup old-0")
    # the variant keeps unknown spec fields: a subGroupPolicy sent would be here
    assert pgs["old-0"]["spec"] == {"minMember": 10, "queue": "default",
                                    "minResources": {"cpu": "11", "memory": "9Gi", "nvidia.com/gpu": "4"}}
    api.wait_pods("old", {f"old-0-prefill-{r}-{k}" for r in range(2) for k in range(2)} | {
        f"old-0-decode-{r}-{k}" for r in range(2) for k in range(3)})
    volcano_crds.install(api.cp, subgroups=True)
    api.wait_gang("old", "PodGroupsInUse", "with subGroupPolicy")
    api.wait_podgroups("old", lambda p: len(p["old-0"]["spec"].get("subGroupPolicy") or []) == 2,
                       "subGroupPolicy added once the CRD has it")


def test_garbage_collector_removes_podgroups(api: GangApi) -> None:
    r = api.http.request("DELETE", f"/apis/workload.serving.volcano.sh/v1alpha1/namespaces/{NS}/modelservings/one",
                         json={"propagationPolicy": "Foreground"})
    assert r.status_code == 200, r.text
    api.wait_podgroups("one", lambda p: p == {}, "PodGroups of one deleted", timeout=60)


def test_crd_removed_while_running(api: GangApi) -> None:
    volcano_crds.uninstall(api.cp)
    cond = api.wait_gang("pd", "PodGroupCRDNotInstalled")
    assert cond["status"] == "False"
    api.patch_ms("pd", {"spec": {"replicas": 2}})
    pods = api.wait_pods("pd", set(api.pods("pd")) | {f"pd-1-prefill-{r}-{k}" for r in range(3) for k in range(2)} | {
        f"pd-1-decode-{r}-{k}" for r in range(3) for k in range(3)})
    assert all(_gang_annotations(p) == {} for name, p in pods.items() if name.startswith("pd-1-"))
