"""Rolling updates (pure): maxUnavailable and partition as numbers and percentages, the budget
(unavailable groups count whatever their revision), ServingGroupRollingUpdate and
RoleRollingUpdate over several role mixes, partition-protected replicas rebuilt at the old
revision from the stored template, status and the UpdateInProgress condition, the status
merge patch and the ControllerRevision helpers."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

import pytest

from controller import history, mergepatch, rollout
from controller import naming as n
from controller.planner import Plan, is_ready, plan
from controller.revision import role_template_hash, serving_revision
from controller.rollout import Unit, pick, resolve
from controller.status import desired_status

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
Obj = dict[str, Any]


def tmpl(image: str) -> Obj:
    return {"spec": {"containers": [{"name": "engine", "image": image}]}}


def ms(replicas: int, roles: list[Obj], strategy: Obj | None = None) -> Obj:
    spec: Obj = {"replicas": replicas, "template": {"roles": roles}}
    if strategy is not None:
        spec["rolloutStrategy"] = strategy
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing",
            "metadata": {"name": "llm", "namespace": "ns1", "uid": "u-1", "generation": 2}, "spec": spec}


def single(image: str) -> list[Obj]:
    return [{"name": "server", "replicas": 1, "workerReplicas": 0, "entryTemplate": tmpl(image)}]


def pd(prefill: str, decode: str, prefill_replicas: int = 2, **prefill_extra: Any) -> list[Obj]:
    return [{"name": "prefill", "replicas": prefill_replicas, "workerReplicas": 1, "entryTemplate": tmpl(prefill),
             "workerTemplate": tmpl(prefill + "-w"), **prefill_extra},
            {"name": "decode", "replicas": 1, "workerReplicas": 0, "entryTemplate": tmpl(decode)}]


def observed(pod: Obj, ready: bool) -> Obj:
    p = copy.deepcopy(pod)
    p["metadata"]["uid"] = "uid-" + p["metadata"]["name"] + "-" + p["spec"]["containers"][0]["image"]
    p["status"] = ({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]} if ready
                   else {"phase": "Pending"})
    return p


def image(pod: Obj) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def label(pod: Obj, key: str) -> str:
    return str(pod["metadata"]["labels"].get(key, ""))


def names(objs: list[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def converge(m: Obj, pods: list[Obj] | None = None, hist: dict[str, list[Obj]] | None = None) -> list[Obj]:
    """Plan and apply (everything ready at once) until nothing changes."""
    pods = list(pods or [])
    for _ in range(50):
        p = plan(m, pods, [], hist)
        if not p.create_pods and not p.delete_pods:
            return pods
        gone = {x["metadata"]["uid"] for x in p.delete_pods}
        pods = [x for x in pods if x["metadata"]["uid"] not in gone] + [observed(x, True) for x in p.create_pods]
    raise AssertionError("no convergence")


def unavailable_groups(m: Obj, pods: list[Obj], expected_per_group: int) -> int:
    by: dict[str, list[Obj]] = {}
    for x in pods:
        by.setdefault(label(x, n.LABEL_GROUP), []).append(x)
    want = [n.group_name("llm", g) for g in range(m["spec"]["replicas"])]
    return sum(1 for g in want if len(by.get(g, [])) < expected_per_group or not all(is_ready(x) for x in by[g]))


def roll(m: Obj, pods: list[Obj], hist: dict[str, list[Obj]], check: Any, ready_each_step: bool = True
         ) -> tuple[list[Obj], list[Plan], int]:
    """Drive the rollout: each step applies the plan's deletes (check), then its creates as
    Pending pods (check), then the kubelet marks every pod Ready (check). Returns the pods, the
    plans and the most units deleted by one plan."""
    plans: list[Plan] = []
    most = 0
    status: Obj = {}
    for _ in range(60):
        m = dict(m, status=status)
        p = plan(m, pods, [], hist)
        status = desired_status(m, p, NOW)
        plans.append(p)
        if not p.create_pods and not p.delete_pods:
            return pods, plans, most
        most = max(most, len(p.updating))
        gone = {x["metadata"]["uid"] for x in p.delete_pods}
        pods = [x for x in pods if x["metadata"]["uid"] not in gone]
        check(pods)
        pods += [observed(x, False) for x in p.create_pods]
        check(pods)
        if ready_each_step:
            pods = [observed(x, True) for x in pods]
            check(pods)
    raise AssertionError("the rollout did not finish")


# -- settings and the budget --------------------------------------------------------------------

def test_int_or_percent_rounding_as_kubernetes() -> None:
    assert resolve(2, 10, False) == 2 and resolve("50%", 3, False) == 1 and resolve("50%", 3, True) == 2
    assert resolve("10%", 3, False) == 0 and resolve("34%", 3, True) == 2 and resolve("100%", 4, False) == 4
    for bad in ("2", "x%", True, 1.5):
        with pytest.raises(ValueError):
            resolve(bad, 3, False)
    s = rollout.settings(ms(4, single("a"), {"type": "ServingGroupRollingUpdate",
                                              "rollingUpdateConfiguration": {"maxUnavailable": "50%",
                                                                             "partition": "30%"}}))
    assert (s.strategy, s.max_unavailable, s.partition) == ("ServingGroupRollingUpdate", 2, 2)
    # defaults: ServingGroupRollingUpdate, 1, 0; a maxUnavailable that resolves to 0 acts as 1
    assert rollout.settings(ms(3, single("a"))) == rollout.Settings("ServingGroupRollingUpdate", 1, 0)
    s = rollout.settings(ms(3, single("a"), {"type": "ServingGroupRollingUpdate",
                                              "rollingUpdateConfiguration": {"maxUnavailable": "10%"}}))
    assert s.max_unavailable == 1
    assert rollout.role_settings({"name": "p", "replicas": 4, "maxUnavailable": "50%", "partition": "25%"}) == (2, 1)
    assert rollout.role_settings({"name": "p", "replicas": 4}) == (1, 0)


def test_budget_counts_every_unavailable_unit() -> None:
    ready_old = [Unit(o, True, True) for o in range(4)]
    assert pick(ready_old, 1) == [3] and pick(ready_old, 2) == [3, 2] and pick(ready_old, 9) == [3, 2, 1, 0]
    # a protected group that is not ready uses up the budget: nothing available is taken down
    assert pick([Unit(0, False, True, protected=True)] + ready_old[1:], 1) == []
    # an updated group coming up (not ready) uses the budget too
    assert pick([Unit(0, True, True), Unit(1, True, True), Unit(2, False, False)], 1) == []
    assert pick([Unit(0, True, True), Unit(1, True, True), Unit(2, False, False)], 2) == [1]
    # already-unavailable outdated units go first (nothing lost), then the highest ordinal
    assert pick([Unit(0, False, True), Unit(1, True, True), Unit(2, True, True)], 1) == [0]
    assert pick([Unit(0, False, True), Unit(1, True, True), Unit(2, True, True)], 2) == [0, 2]
    assert pick([Unit(0, True, False), Unit(1, True, True, protected=True)], 1) == []
    # paced as Kthena's maxScaleDown: while an updated unit comes up, even an unavailable
    # outdated one waits (maxUnavailable - units coming up = 0)
    assert pick([Unit(0, False, False), Unit(1, False, True), Unit(2, True, True)], 1) == []
    assert pick([Unit(0, False, False), Unit(1, False, True), Unit(2, True, True)], 2) == [1]


# -- ServingGroupRollingUpdate ------------------------------------------------------------------

@pytest.mark.parametrize("roles_v1,roles_v2,per_group", [
    (single("a:1"), single("a:2"), 1),
    (pd("p:1", "d:1"), pd("p:2", "d:1"), 5),
])
@pytest.mark.parametrize("replicas,max_unavailable,budget", [(3, None, 1), (4, 2, 2), (4, "50%", 2), (5, "30%", 1)])
def test_serving_group_rolling_update_keeps_the_budget(roles_v1: list[Obj], roles_v2: list[Obj], per_group: int,
                                                       replicas: int, max_unavailable: Any, budget: int) -> None:
    strategy = None if max_unavailable is None else {
        "type": "ServingGroupRollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": max_unavailable}}
    old = ms(replicas, roles_v1, strategy)
    pods = converge(old)
    v1, v2 = serving_revision(roles_v1), serving_revision(roles_v2)
    hist = {v1: roles_v1}
    new = ms(replicas, roles_v2, strategy)

    def check(now: list[Obj]) -> None:
        assert unavailable_groups(new, now, per_group) <= budget

    pods, plans, most = roll(new, pods, hist, check)
    assert most == budget, "the budget is used, not more"
    assert {label(x, n.LABEL_REVISION) for x in pods} == {v2} and len(pods) == replicas * per_group
    # whole groups, highest ordinal first
    assert plans[0].updating == [f"llm-{replicas - 1 - i}" for i in range(budget)]
    assert all(not x["metadata"]["name"].startswith(tuple(plans[0].updating)) for x in plans[0].create_pods)
    final = plans[-1]
    st = desired_status(dict(new, status={}), final, NOW)
    assert st["currentRevision"] == st["updateRevision"] == v2 and st["updatedReplicas"] == replicas
    cond = {c["type"]: c for c in st["conditions"]}["UpdateInProgress"]
    assert cond["status"] == "False" and cond["reason"] == "AllGroupsUpdated"


def test_no_progress_while_groups_are_not_ready() -> None:
    old = ms(3, single("a:1"))
    pods = converge(old)
    new = ms(3, single("a:2"))
    hist = {serving_revision(single("a:1")): single("a:1")}
    p = plan(new, pods, [], hist)
    assert p.updating == ["llm-2"] and names(p.delete_pods) == ["llm-2-server-0-0"] and not p.create_pods
    pods = [x for x in pods if x["metadata"]["name"] != "llm-2-server-0-0"]
    p = plan(new, pods, [], hist)
    assert names(p.create_pods) == ["llm-2-server-0-0"] and image(p.create_pods[0]) == "a:2" and not p.delete_pods
    pods += [observed(x, False) for x in p.create_pods]
    for _ in range(2):  # the new group is not ready: nothing else is taken down
        p = plan(new, pods, [], hist)
        assert not p.delete_pods and not p.create_pods and p.updating == []
        st = desired_status(dict(new, status={}), p, NOW)
        cond = {c["type"]: c for c in st["conditions"]}["UpdateInProgress"]
        assert cond["status"] == "True" and cond["reason"] == "GroupsUpdating"
        assert cond["message"] == "Some groups is progressing: [2], Updated Groups are: [2]"
        assert st["updatedReplicas"] == 1 and st["currentReplicas"] == 2
        assert st["currentRevision"] == serving_revision(single("a:1"))


def test_outdated_pods_are_replaced_not_kept() -> None:
    """A group whose pods carry an older revision is not left as it is (the former behaviour)."""
    pods = converge(ms(1, single("a:1")))
    p = plan(ms(1, single("a:2")), pods, [], {})
    assert names(p.delete_pods) == ["llm-0-server-0-0"] and p.updating == ["llm-0"]


@pytest.mark.parametrize("partition,protected", [(1, 1), ("34%", 2), (3, 3)])
def test_partition_keeps_the_first_groups_at_the_old_revision(partition: Any, protected: int) -> None:
    strategy = {"type": "ServingGroupRollingUpdate", "rollingUpdateConfiguration": {"partition": partition}}
    roles_v1, roles_v2 = pd("p:1", "d:1"), pd("p:2", "d:2")
    v1, v2 = serving_revision(roles_v1), serving_revision(roles_v2)
    pods = converge(ms(3, roles_v1, strategy))
    new = ms(3, roles_v2, strategy)
    hist = {v1: roles_v1}
    pods, plans, _ = roll(new, pods, hist, lambda now: None)
    for x in pods:
        g = int(label(x, n.LABEL_GROUP).rsplit("-", 1)[1])
        assert label(x, n.LABEL_REVISION) == (v1 if g < protected else v2), x["metadata"]["name"]
    st = desired_status(dict(new, status={"currentRevision": v1}), plans[-1], NOW)
    assert st["updatedReplicas"] == 3 - protected and st["updateRevision"] == v2
    assert st["currentRevision"] == v1 and st["currentReplicas"] == protected
    cond = {c["type"]: c for c in st["conditions"]}["UpdateInProgress"]
    assert cond["status"] == "False" and cond["message"].endswith(f"(partition {protected})")

    # a deleted pod, and a whole deleted group, below the partition come back at the old
    # revision, rendered from the stored template (not the spec's)
    m = dict(new, status={"currentRevision": v1, "updateRevision": v2})
    lost = [x for x in pods if label(x, n.LABEL_GROUP) == "llm-0" and (
        protected == 1 or x["metadata"]["name"] == "llm-0-prefill-1-1")]
    rest = [x for x in pods if x not in lost]
    p = plan(m, rest, [], hist)
    assert names(p.create_pods) == names(lost) and not p.delete_pods
    assert {image(x) for x in p.create_pods} <= {"p:1", "p:1-w", "d:1"}
    assert {label(x, n.LABEL_REVISION) for x in p.create_pods} == {v1}
    # the hash label is the old role's
    for x in p.create_pods:
        role = next(r for r in roles_v1 if r["name"] == label(x, n.LABEL_ROLE))
        assert label(x, n.LABEL_ROLE_TEMPLATE_HASH) == role_template_hash(role)
    # without the stored template a missing group is created from the spec at the update revision
    p = plan(dict(new, status={"currentRevision": v1}), [x for x in pods if label(x, n.LABEL_GROUP) != "llm-0"], [], {})
    assert {label(x, n.LABEL_REVISION) for x in p.create_pods} == {v2}


def test_partition_protected_group_keeps_its_old_roles_with_the_current_replicas() -> None:
    strategy = {"type": "ServingGroupRollingUpdate", "rollingUpdateConfiguration": {"partition": 1}}
    v1_roles = pd("p:1", "d:1", prefill_replicas=1)
    pods = converge(ms(2, v1_roles, strategy))
    # the update removes decode and scales prefill to 2: group 0 keeps decode, gets 2 prefill
    v2_roles = [dict(pd("p:2", "x", prefill_replicas=2)[0])]
    new = ms(2, v2_roles, strategy)
    pods, _, _ = roll(new, pods, {serving_revision(v1_roles): v1_roles}, lambda now: None)
    g0 = sorted(x["metadata"]["name"] for x in pods if label(x, n.LABEL_GROUP) == "llm-0")
    assert g0 == ["llm-0-decode-0-0", "llm-0-prefill-0-0", "llm-0-prefill-0-1", "llm-0-prefill-1-0",
                  "llm-0-prefill-1-1"]
    assert {image(x) for x in pods if label(x, n.LABEL_GROUP) == "llm-0"} == {"p:1", "p:1-w", "d:1"}
    assert sorted(x["metadata"]["name"] for x in pods if label(x, n.LABEL_GROUP) == "llm-1") == [
        "llm-1-prefill-0-0", "llm-1-prefill-0-1", "llm-1-prefill-1-0", "llm-1-prefill-1-1"]


# -- RoleRollingUpdate --------------------------------------------------------------------------

def role_unavailable(pods: list[Obj], group: str, role: str, replicas: int, size: int) -> int:
    out = 0
    for r in range(replicas):
        have = [x for x in pods if label(x, n.LABEL_GROUP) == group and label(x, n.LABEL_ROLE_ID) == f"{role}-{r}"]
        if len(have) < size or not all(is_ready(x) for x in have):
            out += 1
    return out


@pytest.mark.parametrize("max_unavailable,budget", [(None, 1), (2, 2), ("50%", 2), ("25%", 1)])
def test_role_rolling_update_replaces_only_changed_roles(max_unavailable: Any, budget: int) -> None:
    extra = {} if max_unavailable is None else {"maxUnavailable": max_unavailable}
    strategy = {"type": "RoleRollingUpdate"}
    v1_roles, v2_roles = pd("p:1", "d:1", 4, **extra), pd("p:2", "d:1", 4, **extra)
    pods = converge(ms(2, v1_roles, strategy))
    decode_before = {x["metadata"]["uid"] for x in pods if label(x, n.LABEL_ROLE) == "decode"}
    new = ms(2, v2_roles, strategy)

    def check(now: list[Obj]) -> None:
        for g in ("llm-0", "llm-1"):
            assert role_unavailable(now, g, "prefill", 4, 2) <= budget
            assert role_unavailable(now, g, "decode", 1, 1) == 0, "decode is not touched"

    pods, plans, most = roll(new, pods, {serving_revision(v1_roles): v1_roles}, check)
    assert most == 2 * budget, "each group has its own budget; all groups at once (as Kthena)"
    assert all("/prefill-" in u for p in plans for u in p.updating)
    assert plans[0].updating == [f"llm-{g}/prefill-{3 - i}" for g in range(2) for i in range(budget)]
    assert {x["metadata"]["uid"] for x in pods if label(x, n.LABEL_ROLE) == "decode"} == decode_before
    h2 = role_template_hash(v2_roles[0])
    assert {label(x, n.LABEL_ROLE_TEMPLATE_HASH) for x in pods if label(x, n.LABEL_ROLE) == "prefill"} == {h2}
    st = desired_status(dict(new, status={}), plans[-1], NOW)
    assert st["updatedReplicas"] == 2 and st["currentRevision"] == st["updateRevision"] == serving_revision(v2_roles)
    assert {c["type"]: c["status"] for c in st["conditions"]}["UpdateInProgress"] == "False"


def test_role_partition_protects_the_first_role_replicas() -> None:
    strategy = {"type": "RoleRollingUpdate"}
    v1_roles = pd("p:1", "d:1", 3, partition=1)
    v2_roles = pd("p:2", "d:2", 3, partition=1)
    v1 = serving_revision(v1_roles)
    hist = {v1: v1_roles}
    pods = converge(ms(1, v1_roles, strategy))
    new = ms(1, v2_roles, strategy)
    pods, plans, _ = roll(new, pods, hist, lambda now: None)
    by_rid = {label(x, n.LABEL_ROLE_ID): image(x) for x in pods if label(x, n.LABEL_ENTRY)}
    assert by_rid == {"prefill-0": "p:1", "prefill-1": "p:2", "prefill-2": "p:2", "decode-0": "d:2"}
    st = desired_status(dict(new, status={}), plans[-1], NOW)
    assert st["updatedReplicas"] == 0 and st["currentRevision"] == v1, "a protected role replica is outdated"
    assert {c["type"]: c["status"] for c in st["conditions"]}["UpdateInProgress"] == "False"
    # a lost pod of the protected role replica comes back from the stored template
    lost = next(x for x in pods if x["metadata"]["name"] == "llm-0-prefill-0-1")
    p = plan(dict(new, status={"currentRevision": v1}), [x for x in pods if x is not lost], [], hist)
    assert names(p.create_pods) == ["llm-0-prefill-0-1"] and image(p.create_pods[0]) == "p:1-w"
    assert label(p.create_pods[0], n.LABEL_REVISION) == v1 and not p.delete_pods


def test_role_rolling_update_waits_for_unready_role_replicas() -> None:
    strategy = {"type": "RoleRollingUpdate"}
    v1_roles, v2_roles = pd("p:1", "d:1", 2), pd("p:2", "d:1", 2)
    pods = converge(ms(1, v1_roles, strategy))
    # prefill-0 is not ready (outdated): it goes first, and takes the whole budget
    pods = [observed(x, False) if label(x, n.LABEL_ROLE_ID) == "prefill-0" else x for x in pods]
    p = plan(ms(1, v2_roles, strategy), pods, [], {})
    assert p.updating == ["llm-0/prefill-0"]


# -- status patch and ControllerRevisions -------------------------------------------------------

def test_merge_patch_carries_only_changes() -> None:
    old = {"replicas": 2, "currentRevision": "a", "conditions": [{"type": "Available"}], "gone": 1,
           "nested": {"x": 1, "y": 2}}
    new = {"replicas": 2, "currentRevision": "b", "conditions": [{"type": "Available"}, {"type": "X"}],
           "nested": {"x": 1, "y": 3}}
    assert mergepatch.diff(old, new) == {"currentRevision": "b", "gone": None, "nested": {"y": 3},
                                         "conditions": [{"type": "Available"}, {"type": "X"}]}
    assert mergepatch.diff(new, copy.deepcopy(new)) == {}


def test_controller_revisions_named_labelled_and_pruned() -> None:
    m = ms(2, single("a:1"))
    rev = serving_revision(single("a:1"))
    cr = history.render(m, rev, single("a:1"))
    assert cr["metadata"]["name"] == f"llm-{rev}" and cr["revision"] == 1
    assert cr["metadata"]["labels"] == {n.LABEL_NAME: "llm", n.LABEL_REVISION: rev}
    assert cr["metadata"]["ownerReferences"][0]["uid"] == "u-1" and cr["metadata"]["ownerReferences"][0]["controller"]
    assert cr["data"] == {"data": single("a:1")}
    assert history.templates([cr, {"metadata": {"labels": {n.LABEL_REVISION: "x"}}, "data": single("b")}]) == {
        rev: single("a:1"), "x": single("b")}
    crs = [history.render(m, r, single(r)) for r in ("r1", "r2", "r3", "r4")]
    pods = [{"metadata": {"labels": {n.LABEL_REVISION: "r2"}}}]
    keep = history.in_use({"currentRevision": "r1", "updateRevision": "r4"}, pods)
    assert keep == {"r1", "r2", "r4"}
    assert [c["metadata"]["name"] for c in history.prunable(crs, keep)] == ["llm-r3"]
