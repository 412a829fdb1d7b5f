"""Rolling updates of the ModelServing controller (python -m controller, a real process) on
the real apiserver. The test is the kubelet (marks every new pod Running and Ready a little
later); a recorder replays every pod event of a watch (from a resourceVersion, no polling) and
checks maxUnavailable at every observed state: ServingGroupRollingUpdate and
RoleRollingUpdate, with a number and a percentage; partition keeps the first groups at the
old revision and a lost pod of a protected group is rebuilt at it from the
ControllerRevision; old ControllerRevisions are pruned; status and conditions at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness
import k8s_harness
from controller_support import LABEL_GROUP, Api, condition, modelserving, start_controller, template
from k8s_crds import install_crds
from pod_watch import Kubelet, Recorder, is_ready

NS = "controller-rollout"


@pytest.fixture(scope="module")
def control_plane(controller_cluster: k8s_harness.ControlPlane) -> k8s_harness.ControlPlane:
    """This module runs on both clusters: without and with Volcano's CRDs (conftest.py)."""
    return controller_cluster
LABEL_REVISION = "modelserving.volcano.sh/revision"
LABEL_ROLE_ID = "modelserving.volcano.sh/role-id"
LABEL_NAME = "modelserving.volcano.sh/name"


@pytest.fixture(scope="module")
def api(control_plane: k8s_harness.ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    install_crds(control_plane)
    control_plane.kubectl("create", "namespace", NS)
    ctl = start_controller(control_plane, NS, tmp_path_factory.mktemp("controller"), "ctl-rollout")
    kubelet = Kubelet(control_plane, NS, LABEL_GROUP).start()
    a = Api(control_plane, NS)
    try:
        yield a
        assert ctl.alive(), ctl.tail()
    finally:
        a.close()
        kubelet.stop()
        ctl.stop()
        control_plane.kubectl("delete", "namespace", NS, "--wait=false")


def pd_roles(version: int, prefill: int = 1, **prefill_extra: Any) -> list[dict[str, Any]]:
    return [{"name": "prefill", "replicas": prefill, "workerReplicas": 1, "entryTemplate": template(f"p:{version}"),
             "workerTemplate": template(f"pw:{version}"), **prefill_extra},
            {"name": "decode", "replicas": 1, "workerReplicas": 0, "entryTemplate": template(f"d:{version}")}]


def group_strategy(**cfg: Any) -> dict[str, Any]:
    return {"rolloutStrategy": {"type": "ServingGroupRollingUpdate", "rollingUpdateConfiguration": cfg}}


def _group(pod: dict[str, Any]) -> str:
    return pod["metadata"]["labels"][LABEL_GROUP]


def unavailable_groups(state: dict[str, dict[str, Any]], ms: str, replicas: int, per_group: int) -> list[str]:
    by: dict[str, list[dict[str, Any]]] = {}
    for p in state.values():
        if not p["metadata"].get("deletionTimestamp"):
            by.setdefault(_group(p), []).append(p)
    return [g for g in (f"{ms}-{i}" for i in range(replicas))
            if len(by.get(g, [])) < per_group or not all(is_ready(p) for p in by[g])]


def converged(api: Api, ms: str, replicas: int) -> dict[str, Any]:
    """Wait until every group is available and at the update revision."""
    def done() -> dict[str, Any] | None:
        obj = api.ms(ms)
        st = (obj or {}).get("status") or {}
        ok = (st.get("observedGeneration") == (obj or {}).get("metadata", {}).get("generation")
              and st.get("availableReplicas") == replicas == st.get("replicas"))
        return obj if ok else None
    return harness.wait_until(done, 120, interval=0.1, what=f"{ms} available")


def revision_of(pods: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in pods.values():
        out.setdefault(_group(p), set()).add(p["metadata"]["labels"][LABEL_REVISION])
    return out


def controller_revisions(api: Api, ms: str) -> dict[str, dict[str, Any]]:
    r = api.http.get(f"/apis/apps/v1/namespaces/{NS}/controllerrevisions",
                     params={"labelSelector": f"{LABEL_NAME}={ms}"})
    r.raise_for_status()
    return {o["metadata"]["name"]: o for o in r.json()["items"]}


class ModelServingConditions:
    """Every status the ModelServing had during the update (a watch of it)."""

    def __init__(self, api: Api, ms: str) -> None:
        self.seen: list[dict[str, Any]] = []
        self.rec = Recorder(api.cp, f"/apis/workload.serving.volcano.sh/v1alpha1/namespaces/{NS}/modelservings",
                            {"fieldSelector": f"metadata.name={ms}"},
                            lambda state, kind, obj: self.seen.append(obj))

    def start(self) -> ModelServingConditions:
        self.rec.start()
        return self

    def values(self, ctype: str) -> list[str | None]:
        return [condition(o, ctype) for o in self.seen]


@pytest.mark.parametrize("name,replicas,max_unavailable,budget", [
    ("sg-int", 3, 1, 1),
    ("sg-pct", 4, "50%", 2),
])
def test_serving_group_rolling_update_keeps_max_unavailable(api: Api, name: str, replicas: int,
                                                            max_unavailable: Any, budget: int) -> None:
    per_group = 3  # prefill entry + worker, decode entry
    api.cp.apply([modelserving(name, NS, replicas, pd_roles(1), **group_strategy(maxUnavailable=max_unavailable))])
    old = converged(api, name, replicas)
    before = api.pods(name)
    assert len(before) == replicas * per_group
    old_rev = old["status"]["updateRevision"]
    assert old["status"]["currentRevision"] == old_rev and condition(old, "UpdateInProgress") == "False"

    worst: list[int] = [0]

    def check(state: dict[str, dict[str, Any]], kind: str, pod: dict[str, Any]) -> None:
        down = unavailable_groups(state, name, replicas, per_group)
        worst[0] = max(worst[0], len(down))
        assert len(down) <= budget, f"{kind} {pod['metadata']['name']}: unavailable {down} > {budget}"

    pods_rec = Recorder(api.cp, f"/api/v1/namespaces/{NS}/pods", {"labelSelector": f"{LABEL_NAME}={name}"},
                        check).start()
    ms_rec = ModelServingConditions(api, name).start()
    try:
        api.cp.apply([modelserving(name, NS, replicas, pd_roles(2), **group_strategy(maxUnavailable=max_unavailable))])
        harness.wait_until(lambda: (o := api.ms(name)) and o["status"].get("updateRevision") != old_rev
                           and o["status"].get("currentRevision") == o["status"]["updateRevision"]
                           and o["status"].get("availableReplicas") == replicas, 180, interval=0.1,
                           what=f"{name} rolled to the new revision")
    finally:
        pods_rec.stop()
        ms_rec.rec.stop()
    assert pods_rec.events > 0 and worst[0] == budget, f"at most {worst[0]} groups were down (budget {budget})"

    after = api.pods(name)
    assert set(after) == set(before)
    assert not {p["metadata"]["uid"] for p in after.values()} & {p["metadata"]["uid"] for p in before.values()}
    assert {p["spec"]["containers"][0]["image"] for p in after.values()} == {"p:2", "pw:2", "d:2"}
    obj = api.ms(name)
    assert obj is not None
    st = obj["status"]
    assert st["updatedReplicas"] == st["currentReplicas"] == st["availableReplicas"] == replicas
    assert condition(obj, "UpdateInProgress") == "False" and condition(obj, "Available") == "True"
    assert "True" in ms_rec.values("UpdateInProgress"), "UpdateInProgress was True during the update"
    progressing = next(c for o in ms_rec.seen for c in o["status"].get("conditions", [])
                       if c["type"] == "UpdateInProgress" and c["status"] == "True")
    assert progressing["reason"] == "GroupsUpdating"
    assert progressing["message"].startswith("Some groups is progressing: [")
    # the new revision is recorded, the old one pruned (no pod carries it any more)
    new_rev = st["updateRevision"]
    crs = harness.wait_until(lambda: (c := controller_revisions(api, name)) and set(c) == {f"{name}-{new_rev}"} and c,
                             30, what="only the new ControllerRevision left")
    cr = crs[f"{name}-{new_rev}"]
    assert cr["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert cr["data"]["data"][0]["entryTemplate"]["spec"]["containers"][0]["image"] == "p:2"


def test_role_rolling_update_keeps_max_unavailable_per_role(api: Api) -> None:
    name = "roles"
    strategy = {"rolloutStrategy": {"type": "RoleRollingUpdate"}}
    roles_v1 = pd_roles(1, prefill=4, maxUnavailable="50%")
    roles_v1[1].update(replicas=2)  # decode: maxUnavailable defaults to 1
    api.cp.apply([modelserving(name, NS, 1, roles_v1, **strategy)])
    converged(api, name, 1)
    before = api.pods(name)
    decode_before = {n: p["metadata"]["uid"] for n, p in before.items() if "-decode-" in n}
    worst = {"prefill": 0, "decode": 0}
    budgets = {"prefill": 2, "decode": 1}
    sizes = {"prefill": (4, 2), "decode": (2, 1)}

    def check(state: dict[str, dict[str, Any]], kind: str, pod: dict[str, Any]) -> None:
        for role, (replicas, size) in sizes.items():
            down = 0
            for r in range(replicas):
                have = [p for p in state.values() if p["metadata"]["labels"][LABEL_ROLE_ID] == f"{role}-{r}"]
                down += len(have) < size or not all(is_ready(p) for p in have)
            worst[role] = max(worst[role], down)
            assert down <= budgets[role], f"{kind} {pod['metadata']['name']}: {down} {role} replicas down"

    rec = Recorder(api.cp, f"/api/v1/namespaces/{NS}/pods", {"labelSelector": f"{LABEL_NAME}={name}"}, check).start()
    try:
        # only prefill changes: decode replicas are left alone
        roles_v2 = pd_roles(2, prefill=4, maxUnavailable="50%")
        roles_v2[1] = roles_v1[1]
        api.cp.apply([modelserving(name, NS, 1, roles_v2, **strategy)])
        harness.wait_until(lambda: {p["spec"]["containers"][0]["image"] for p in api.pods(name).values()
                                    if "-prefill-" in p["metadata"]["name"]} == {"p:2", "pw:2"}, 180, interval=0.1,
                           what="prefill updated")
        obj = converged(api, name, 1)
        assert {n: p["metadata"]["uid"] for n, p in api.pods(name).items() if "-decode-" in n} == decode_before
        # then decode (budget 1)
        roles_v3 = pd_roles(2, prefill=4, maxUnavailable="50%")
        roles_v3[1].update(replicas=2)
        api.cp.apply([modelserving(name, NS, 1, roles_v3, **strategy)])
        harness.wait_until(lambda: {p["spec"]["containers"][0]["image"] for p in api.pods(name).values()
                                    if "-decode-" in p["metadata"]["name"]} == {"d:2"}, 180, interval=0.1,
                           what="decode updated")
        obj = api.wait_status(name, 60, updatedReplicas=1, availableReplicas=1)
    finally:
        rec.stop()
    assert worst == budgets, f"most role replicas down at once: {worst}"
    st = obj["status"]
    assert st["currentRevision"] == st["updateRevision"]
    assert condition(obj, "UpdateInProgress") == "False"


def test_partition_keeps_old_groups_and_rebuilds_them_from_the_controller_revision(api: Api) -> None:
    name = "part"
    replicas, per_group = 3, 3
    api.cp.apply([modelserving(name, NS, replicas, pd_roles(1), **group_strategy(partition=1))])
    v1 = converged(api, name, replicas)["status"]["updateRevision"]
    worst = [0]

    def check(state: dict[str, dict[str, Any]], kind: str, pod: dict[str, Any]) -> None:
        down = unavailable_groups(state, name, replicas, per_group)
        worst[0] = max(worst[0], len(down))
        assert len(down) <= 1, f"{kind} {pod['metadata']['name']}: unavailable {down}"

    rec = Recorder(api.cp, f"/api/v1/namespaces/{NS}/pods", {"labelSelector": f"{LABEL_NAME}={name}"}, check).start()
    try:
        api.cp.apply([modelserving(name, NS, replicas, pd_roles(2), **group_strategy(partition=1))])
        harness.wait_until(lambda: revision_of(api.pods(name)).get(f"{name}-2", {v1}) != {v1}
                           and revision_of(api.pods(name)).get(f"{name}-1", {v1}) != {v1}, 120, interval=0.1,
                           what="groups 1 and 2 updated")
        obj = api.wait_status(name, 60, updatedReplicas=2, availableReplicas=3, currentReplicas=1, currentRevision=v1)
    finally:
        rec.stop()
    assert worst[0] == 1
    v2 = obj["status"]["updateRevision"]
    assert v2 != v1 and condition(obj, "UpdateInProgress") == "False" and condition(obj, "Available") == "True"
    revs = revision_of(api.pods(name))
    assert revs == {f"{name}-0": {v1}, f"{name}-1": {v2}, f"{name}-2": {v2}}
    assert set(controller_revisions(api, name)) == {f"{name}-{v1}", f"{name}-{v2}"}

    # a lost pod of the protected group comes back at the old revision, from the ControllerRevision
    for pod in ("part-0-prefill-0-1", "part-0-decode-0-0"):
        uid = api.pods(name)[pod]["metadata"]["uid"]
        api.delete("pods", pod)
        back = harness.wait_until(lambda: (p := api.pods(name).get(pod)) and p["metadata"]["uid"] != uid and p, 30,
                                  what=f"{pod} recreated")
        assert back["metadata"]["labels"][LABEL_REVISION] == v1
        assert back["spec"]["containers"][0]["image"] == ("pw:1" if "prefill" in pod else "d:1")
    converged(api, name, replicas)

    # a second update: groups 1 and 2 move on, group 0 stays; the middle revision is pruned
    api.cp.apply([modelserving(name, NS, replicas, pd_roles(3), **group_strategy(partition=1))])
    harness.wait_until(lambda: {p["spec"]["containers"][0]["image"] for n, p in api.pods(name).items()
                                if not n.startswith("part-0-")} == {"p:3", "pw:3", "d:3"}, 120, interval=0.1,
                       what="groups 1 and 2 at the third revision")
    obj = api.wait_status(name, 60, updatedReplicas=2, availableReplicas=3, currentRevision=v1)
    v3 = obj["status"]["updateRevision"]
    harness.wait_until(lambda: set(controller_revisions(api, name)) == {f"{name}-{v1}", f"{name}-{v3}"}, 30,
                       what="the middle ControllerRevision pruned")
    assert {p["spec"]["containers"][0]["image"] for n, p in api.pods(name).items() if n.startswith("part-0-")} == {
        "p:1", "pw:1", "d:1"}
    # lowering the partition to 0 finishes the update
    api.cp.apply([modelserving(name, NS, replicas, pd_roles(3), **group_strategy(partition=0))])
    obj = api.wait_status(name, 120, updatedReplicas=3, availableReplicas=3, currentRevision=v3)
    harness.wait_until(lambda: set(controller_revisions(api, name)) == {f"{name}-{v3}"}, 30,
                       what="only the last ControllerRevision left")
