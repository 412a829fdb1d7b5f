"""The ModelServing planner and status: Kthena's names, labels, env and Services for several
role mixes; scale up fills missing ordinals; scale down removes not-ready groups first, then
the lowest pod-deletion-cost, then the highest ordinal; status and conditions."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

from controller import naming as n
from controller.planner import plan
from controller.revision import role_template_hash, serving_revision
from controller.status import desired_status

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def tmpl(image: str = "engine:1", env: list[dict[str, str]] | None = None, **meta: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "engine", "image": image}
    if env:
        c["env"] = env
    return {"metadata": meta, "spec": {"containers": [c]}}


def ms(replicas: int = 1, roles: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    roles = roles or [{"name": "server", "replicas": 1, "workerReplicas": 0, "entryTemplate": tmpl()}]
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing",
            "metadata": {"name": "llm", "namespace": "ns1", "uid": "u-1", "generation": 3},
            "spec": {"replicas": replicas, "template": {"roles": roles}, **spec}}


def created(p: Any, ready: bool = False, cost: int | None = None) -> dict[str, Any]:
    """An observed copy of a planned pod."""
    pod = copy.deepcopy(p)
    pod["metadata"]["uid"] = "uid-" + pod["metadata"]["name"]
    if cost is not None:
        pod["metadata"].setdefault("annotations", {})[n.ANNOTATION_DELETION_COST] = str(cost)
    if ready:
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    else:
        pod["status"] = {"phase": "Pending"}
    return pod


def env_of(pod: dict[str, Any], container: int = 0, key: str = "containers") -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"][key][container]["env"]}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


PD = [
    {"name": "prefill", "replicas": 2, "workerReplicas": 1, "entryTemplate": tmpl("p:1", [{"name": "X", "value": "1"}]),
     "workerTemplate": tmpl("pw:1", [{"name": "WORKER_INDEX", "value": "stale"}], labels={"tier": "w"})},
    {"name": "decode", "replicas": 1, "workerReplicas": 2, "entryTemplate": tmpl("d:1", labels={"app": "dec"},
                                                                                  annotations={"a": "b"}),
     "workerTemplate": tmpl("dw:1")},
]


def test_single_role_without_workers() -> None:
    p = plan(ms(2), [], [])
    assert names(p.create_pods) == ["llm-0-server-0-0", "llm-1-server-0-0"]
    assert p.create_services == [] and p.delete_pods == []
    pod = p.create_pods[0]
    labels = pod["metadata"]["labels"]
    assert labels == {n.LABEL_NAME: "llm", n.LABEL_GROUP: "llm-0", n.LABEL_ROLE: "server",
                      n.LABEL_ROLE_ID: "server-0", n.LABEL_ENTRY: "true", n.LABEL_REVISION: p.revision,
                      n.LABEL_ROLE_TEMPLATE_HASH: role_template_hash(ms()["spec"]["template"]["roles"][0])}
    assert env_of(pod) == {"GROUP_SIZE": "1", "ENTRY_ADDRESS": "llm-0-server-0-0.ns1", "WORKER_INDEX": "0"}
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "workload.serving.volcano.sh/v1alpha1",
                                                   "kind": "ModelServing", "name": "llm", "uid": "u-1",
                                                   "controller": True, "blockOwnerDeletion": True}]


def test_prefill_decode_with_workers() -> None:
    m = ms(1, PD, schedulerName="my-sched")
    p = plan(m, [], [])
    assert names(p.create_pods) == sorted([
        "llm-0-prefill-0-0", "llm-0-prefill-0-1", "llm-0-prefill-1-0", "llm-0-prefill-1-1",
        "llm-0-decode-0-0", "llm-0-decode-0-1", "llm-0-decode-0-2"])
    pods = {x["metadata"]["name"]: x for x in p.create_pods}
    w = pods["llm-0-decode-0-2"]
    assert env_of(w) == {"GROUP_SIZE": "3", "ENTRY_ADDRESS": "llm-0-decode-0-0.ns1", "WORKER_INDEX": "2"}
    assert n.LABEL_ENTRY not in w["metadata"]["labels"]
    assert w["spec"]["containers"][0]["image"] == "dw:1" and w["spec"]["schedulerName"] == "my-sched"
    # the entry template's own env is kept, ours appended; a stale WORKER_INDEX is replaced
    assert [e["name"] for e in pods["llm-0-prefill-1-0"]["spec"]["containers"][0]["env"]] == [
        "X", "GROUP_SIZE", "ENTRY_ADDRESS", "WORKER_INDEX"]
    assert env_of(pods["llm-0-prefill-1-1"]) == {"GROUP_SIZE": "2", "ENTRY_ADDRESS": "llm-0-prefill-1-0.ns1",
                                                "WORKER_INDEX": "1"}
    assert pods["llm-0-prefill-1-1"]["metadata"]["labels"]["tier"] == "w"
    d = pods["llm-0-decode-0-0"]["metadata"]
    assert d["labels"]["app"] == "dec" and d["annotations"] == {"a": "b"}
    # one headless Service per role replica, named like its entry pod, selecting it
    assert names(p.create_services) == ["llm-0-decode-0-0", "llm-0-prefill-0-0", "llm-0-prefill-1-0"]
    svc = next(s for s in p.create_services if s["metadata"]["name"] == "llm-0-prefill-1-0")
    assert svc["spec"] == {"clusterIP": "None", "publishNotReadyAddresses": True,
                           "selector": {n.LABEL_GROUP: "llm-0", n.LABEL_ROLE: "prefill",
                                        n.LABEL_ROLE_ID: "prefill-1", n.LABEL_ENTRY: "true"}}
    assert svc["metadata"]["labels"] == {n.LABEL_NAME: "llm", n.LABEL_GROUP: "llm-0", n.LABEL_ROLE: "prefill",
                                         n.LABEL_ROLE_ID: "prefill-1"}
    # env also goes to init containers
    m2 = copy.deepcopy(m)
    m2["spec"]["template"]["roles"][0]["entryTemplate"]["spec"]["initContainers"] = [{"name": "init", "image": "i"}]
    pi = next(x for x in plan(m2, [], []).create_pods if x["metadata"]["name"] == "llm-0-prefill-0-0")
    assert env_of(pi, key="initContainers")["WORKER_INDEX"] == "0"


def test_converged_plan_is_empty_and_idempotent() -> None:
    m = ms(2, PD)
    first = plan(m, [], [])
    pods = [created(x) for x in first.create_pods]
    svcs = [created(x) for x in first.create_services]
    again = plan(m, pods, svcs)
    assert again.changes == 0 and again.revision == first.revision
    assert [g.name for g in again.groups] == ["llm-0", "llm-1"]


def test_missing_pod_and_service_are_recreated_and_strays_deleted() -> None:
    m = ms(1, PD)
    first = plan(m, [], [])
    pods = [created(x) for x in first.create_pods if x["metadata"]["name"] != "llm-0-decode-0-1"]
    svcs = [created(x) for x in first.create_services if x["metadata"]["name"] != "llm-0-decode-0-0"]
    # a worker beyond workerReplicas, a pod of a role no longer in the spec
    extra = created(first.create_pods[0])
    extra["metadata"]["name"] = "llm-0-prefill-0-5"
    gone_role = created(first.create_pods[0])
    gone_role["metadata"]["name"] = "llm-0-old-0-0"
    gone_role["metadata"]["labels"].update({n.LABEL_ROLE: "old", n.LABEL_ROLE_ID: "old-0"})
    p = plan(m, pods + [extra, gone_role], svcs)
    assert names(p.create_pods) == ["llm-0-decode-0-1"]
    assert names(p.create_services) == ["llm-0-decode-0-0"]
    assert names(p.delete_pods) == ["llm-0-old-0-0", "llm-0-prefill-0-5"]


def _groups(m: dict[str, Any], spec: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Observed pods of groups 0..: {ordinal: {"ready": bool, "cost": int}}."""
    full = ms(max(spec) + 1, m["spec"]["template"]["roles"])
    out = []
    for x in plan(full, [], []).create_pods:
        _, o = n.parent_and_ordinal(x["metadata"]["labels"][n.LABEL_GROUP])
        if o in spec:
            out.append(created(x, ready=spec[o].get("ready", True), cost=spec[o].get("cost")))
    return out


def test_scale_down_order_not_ready_then_cost_then_highest_ordinal() -> None:
    m = ms(1, PD)
    # 4 groups; 1 not ready -> goes first; then the lowest cost (3: -5 < 0); then the highest (2)
    pods = _groups(m, {0: {}, 1: {"ready": False, "cost": 100}, 2: {}, 3: {"cost": -5}})
    assert plan(ms(3, PD), pods, []).surplus_groups == ["llm-1"]
    assert plan(ms(2, PD), pods, []).surplus_groups == ["llm-1", "llm-3"]
    p = plan(ms(1, PD), pods, [])
    assert p.surplus_groups == ["llm-1", "llm-2", "llm-3"]
    assert {x["metadata"]["labels"][n.LABEL_GROUP] for x in p.delete_pods} == {"llm-1", "llm-2", "llm-3"}
    assert [g.name for g in p.groups] == ["llm-0"]
    # an incomplete group counts as not ready even if its pods are ready
    partial = [x for x in _groups(m, {0: {}, 1: {}}) if x["metadata"]["name"] != "llm-0-decode-0-2"]
    assert plan(ms(1, PD), partial, []).surplus_groups == ["llm-0"]


def test_scale_up_fills_gaps_from_zero() -> None:
    m = ms(1)
    pods = _groups(m, {1: {}, 4: {}})
    p = plan(ms(4), pods, [])
    assert [g.name for g in p.groups] == ["llm-0", "llm-1", "llm-2", "llm-4"]
    assert names(p.create_pods) == ["llm-0-server-0-0", "llm-2-server-0-0"]


def test_role_replicas_scale_down_and_up_inside_groups() -> None:
    roles = copy.deepcopy(PD)
    pods = [created(x, ready=x["metadata"]["name"] != "llm-0-prefill-0-1") for x in plan(ms(1, roles), [], []).create_pods]
    roles[0]["replicas"] = 1
    p = plan(ms(1, roles), pods, [])
    assert names(p.delete_pods) == ["llm-0-prefill-0-0", "llm-0-prefill-0-1"]  # replica 0 is not ready
    assert p.create_pods == []
    roles[0]["replicas"] = 3
    p = plan(ms(1, roles), pods, [])
    assert names(p.create_pods) == ["llm-0-prefill-2-0", "llm-0-prefill-2-1"]
    assert serving_revision(roles) == p.revision == plan(ms(1, PD), [], []).revision, "replicas are not a revision"


def test_revision_changes_with_the_template_only() -> None:
    r1 = serving_revision(PD)
    changed = copy.deepcopy(PD)
    changed[1]["workerTemplate"]["spec"]["containers"][0]["image"] = "dw:2"
    assert serving_revision(changed) != r1
    assert role_template_hash(changed[0]) == role_template_hash(PD[0])
    assert role_template_hash(changed[1]) != role_template_hash(PD[1])
    assert set(r1) <= set("bcdfghjklmnpqrstvwxz2456789")


def test_status_counts_conditions_and_selector() -> None:
    m = ms(2, PD)
    first = plan(m, [], [])
    st = desired_status(m, first, NOW)
    assert st["replicas"] == 2 and st["availableReplicas"] == 0 and st["updatedReplicas"] == 2
    assert st["currentRevision"] == st["updateRevision"] == first.revision and st["currentReplicas"] == 2
    assert st["observedGeneration"] == 3
    assert st["labelSelector"] == ("modelserving.volcano.sh/entry=true,modelserving.volcano.sh/name=llm,"
                                   "modelserving.volcano.sh/role=prefill,modelserving.volcano.sh/role-id=prefill-0")
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Available"]["status"] == "False" and conds["Progressing"]["status"] == "True"
    assert conds["Progressing"]["message"] == "Some groups is progressing: [0 1]"

    ready = [created(x, ready=True) for x in first.create_pods]
    later = datetime(2026, 12, 1, 12, 5, tzinfo=timezone.utc)
    m2 = copy.deepcopy(m)
    m2["status"] = st
    st2 = desired_status(m2, plan(m2, ready, []), later)
    conds2 = {c["type"]: c for c in st2["conditions"]}
    assert st2["availableReplicas"] == 2 and conds2["Available"]["status"] == "True"
    assert conds2["Available"]["lastTransitionTime"] == "2026-12-01T12:05:00Z"
    # nothing changed: the same status (the reconciler then writes nothing)
    m3 = copy.deepcopy(m2)
    m3["status"] = st2
    assert desired_status(m3, plan(m3, ready, []), datetime(2026, 12, 2, tzinfo=timezone.utc)) == st2


def test_status_with_an_outdated_group() -> None:
    old = ms(2, PD)
    pods = [created(x, ready=True) for x in plan(old, [], []).create_pods]
    new_roles = copy.deepcopy(PD)
    new_roles[0]["entryTemplate"]["spec"]["containers"][0]["image"] = "p:2"
    new = ms(3, new_roles)
    p = plan(new, pods, [])
    st = desired_status(new, p, NOW)
    assert st["replicas"] == 3 and st["updatedReplicas"] == 1 and st["currentReplicas"] == 2
    assert st["currentRevision"] == serving_revision(PD) != st["updateRevision"]
    assert st["availableReplicas"] == 2
