"""Recovery decisions (pure): which role replicas / ServingGroups are recreated for failed,
restarted and lost pods under each recoveryPolicy; restartGracePeriodSeconds as a
requeue-after judged from the pod's status; exactly-once on re-runs and after a restart;
backoff against flapping; the informer trim keeps what recovery reads."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

from controller import naming as n
from controller.informers import _trim_pod
from controller.planner import plan
from controller.recovery import (Backoff, Recovery, Unit, backoff_delay, decide, is_errored, record,
                                 trouble_since)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def tmpl(image: str = "engine:1") -> dict[str, Any]:
    return {"metadata": {}, "spec": {"containers": [{"name": "engine", "image": image}]}}


PD = [{"name": "prefill", "replicas": 2, "workerReplicas": 1, "entryTemplate": tmpl("p"), "workerTemplate": tmpl("pw")},
      {"name": "decode", "replicas": 1, "workerReplicas": 0, "entryTemplate": tmpl("d")}]


def ms(policy: str | None = None, grace: int | None = None, replicas: int = 2, uid: str = "u-1") -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": replicas, "template": {"roles": copy.deepcopy(PD)}}
    if policy is not None:
        spec["recoveryPolicy"] = policy
    if grace is not None:
        spec["template"]["restartGracePeriodSeconds"] = grace
    return {"apiVersion": "workload.serving.volcano.sh/v1alpha1", "kind": "ModelServing",
            "metadata": {"name": "llm", "namespace": "ns1", "uid": uid, "generation": 1}, "spec": spec}


def world(m: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Every planned pod, running and ready, by name; the Services."""
    p = plan(m, [], [])
    pods = {}
    for pod in p.create_pods:
        pod = copy.deepcopy(pod)
        pod["metadata"]["uid"] = "uid-" + pod["metadata"]["name"]
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                         "containerStatuses": [{"name": "engine", "restartCount": 0, "ready": True,
                                                "state": {"running": {"startedAt": iso(T0 - timedelta(hours=1))}}}]}
        pods[pod["metadata"]["name"]] = pod
    svcs = []
    for s in p.create_services:
        s = copy.deepcopy(s)
        s["metadata"]["uid"] = "uid-" + s["metadata"]["name"]
        svcs.append(s)
    return pods, svcs


def fail(pod: dict[str, Any], at: datetime | None = None) -> None:
    st = pod["status"]
    st["phase"] = "Failed"
    st["conditions"] = [{"type": "Ready", "status": "False"}]
    term: dict[str, Any] = {"exitCode": 1}
    if at is not None:
        term["finishedAt"] = iso(at)
    st["containerStatuses"] = [{"name": "engine", "restartCount": 0, "ready": False, "state": {"terminated": term}}]


def restart(pod: dict[str, Any], at: datetime, ready: bool = False, count: int = 1) -> None:
    st = pod["status"]
    st["phase"] = "Running"
    st["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    st["containerStatuses"] = [{"name": "engine", "restartCount": count, "ready": ready,
                                "state": {"running": {"startedAt": iso(at)}},
                                "lastState": {"terminated": {"exitCode": 137, "finishedAt": iso(at)}}}]


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def test_errored_predicates_match_kthena() -> None:
    pods, _ = world(ms())
    pod = pods["llm-0-decode-0-0"]
    assert not is_errored(pod)
    restart(pod, T0)
    assert is_errored(pod)
    pod["status"]["phase"] = "Pending"
    assert is_errored(pod)  # init or main container restarts while Pending count too
    pod["status"]["phase"] = "Succeeded"
    assert not is_errored(pod)
    fail(pod)
    assert is_errored(pod)
    init = {"status": {"phase": "Pending", "initContainerStatuses": [{"name": "i", "restartCount": 2}]}}
    assert is_errored(init)


def test_role_recreate_deletes_only_that_role_replica_errored_pod_last() -> None:
    m = ms()
    pods, svcs = world(m)
    fail(pods["llm-1-prefill-1-0"])
    d = decide(m, list(pods.values()), svcs, T0)
    assert d.recreate and d.recreate[0][0] == Unit("llm-1", "prefill", "prefill-1")
    assert names(d.delete_pods) == ["llm-1-prefill-1-1", "llm-1-prefill-1-0"]  # siblings first
    assert names(d.delete_services) == ["llm-1-prefill-1-0"]
    assert d.requeue_after is None


def test_role_recreate_is_the_default_and_group_recreate_takes_the_group() -> None:
    pods, svcs = world(ms())
    restart(pods["llm-0-decode-0-0"], T0, ready=True)  # grace 0: deleted even though Ready (Kthena)
    d = decide(ms(), list(pods.values()), svcs, T0)
    assert names(d.delete_pods) == ["llm-0-decode-0-0"] and d.delete_services == []
    d = decide(ms("ServingGroupRecreate"), list(pods.values()), svcs, T0)
    assert d.recreate[0][0] == Unit("llm-0")
    assert sorted(names(d.delete_pods)) == sorted(p for p in pods if p.startswith("llm-0-"))
    assert names(d.delete_pods)[-1] == "llm-0-decode-0-0"
    assert sorted(names(d.delete_services)) == ["llm-0-prefill-0-0", "llm-0-prefill-1-0"]


def test_none_deletes_only_the_errored_pod_and_never_for_lost_pods() -> None:
    """Kthena's code under None: the failed or restarted pod alone is deleted (the planner
    recreates it); its role replica, its Service and a lost sibling's unit are left alone."""
    pods, svcs = world(ms())
    fail(pods["llm-0-decode-0-0"])
    lost = pods.pop("llm-0-prefill-0-1")
    d = decide(ms("None"), list(pods.values()), svcs, T0, lost=[lost])
    assert names(d.delete_pods) == ["llm-0-decode-0-0"] and d.delete_services == []
    assert [str(u) for u, _ in d.recreate] == ["llm-0-decode-0-0"]
    restart(pods["llm-1-prefill-1-1"], T0)
    d = decide(ms("None"), list(pods.values()), svcs, T0)
    assert sorted(names(d.delete_pods)) == ["llm-0-decode-0-0", "llm-1-prefill-1-1"]
    assert d.delete_services == []


def test_grace_period_waits_then_recreates_unless_recovered() -> None:
    m = ms(grace=30)
    pods, svcs = world(m)
    pod = pods["llm-0-prefill-0-1"]
    restart(pod, T0)
    assert trouble_since(pod) == T0
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=10))
    assert d.delete_pods == [] and d.requeue_after is not None and 19.9 < d.requeue_after < 20.2
    # recovered (Running and Ready again): kept, nothing to wait for
    restart(pod, T0, ready=True)
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=40))
    assert d.delete_pods == [] and d.requeue_after is None
    # not recovered at the deadline: the role replica goes
    restart(pod, T0, ready=False)
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=30))
    assert names(d.delete_pods) == ["llm-0-prefill-0-0", "llm-0-prefill-0-1"]


def test_a_later_not_ready_transition_restarts_the_window() -> None:
    m = ms(grace=30)
    pods, svcs = world(m)
    pod = pods["llm-0-decode-0-0"]
    restart(pod, T0 - timedelta(hours=1))  # restarted long ago ...
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": iso(T0)}]
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=5))  # ... unready only since T0
    assert d.delete_pods == [] and 24.9 < (d.requeue_after or 0) < 25.2


def test_failed_pod_without_times_waits_from_first_seen() -> None:
    m = ms(grace=30)
    pods, svcs = world(m)
    fail(pods["llm-0-decode-0-0"])
    uid = "uid-llm-0-decode-0-0"
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=20), first_seen={uid: T0})
    assert d.delete_pods == [] and 9.9 < (d.requeue_after or 0) < 10.2
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=31), first_seen={uid: T0})
    assert names(d.delete_pods) == ["llm-0-decode-0-0"]


def test_rerun_and_restart_do_not_delete_twice() -> None:
    m = ms()
    pods, svcs = world(m)
    fail(pods["llm-0-prefill-0-0"])
    rec = Recovery()
    key = ("ns1", "llm")
    rec.step(key, m, list(pods.values()), svcs, set(), T0)  # seen before the failure matters not
    d = rec.step(key, m, list(pods.values()), svcs, set(), T0)
    assert names(d.delete_pods) == ["llm-0-prefill-0-1", "llm-0-prefill-0-0"]
    gone = {p["metadata"]["uid"] for p in d.delete_pods}
    # the next reconcile: the expectations overlay hides the deleted pods; they are ours
    left = [p for p in pods.values() if p["metadata"]["uid"] not in gone]
    d2 = rec.step(key, m, left, [s for s in svcs if s["metadata"]["name"] != "llm-0-prefill-0-0"], gone, T0)
    assert d2.delete_pods == [] and d2.recreate == []
    # a crash after the sibling was deleted but before the failed pod: a new process finishes
    # the same unit (the failed pod is still there) and deletes nothing else
    half = [p for p in pods.values() if p["metadata"]["name"] != "llm-0-prefill-0-1"]
    d3 = Recovery().step(key, m, half, svcs, set(), T0 + timedelta(seconds=1))
    assert names(d3.delete_pods) == ["llm-0-prefill-0-0"]


def test_lost_pod_recreates_its_unit_once() -> None:
    m = ms()
    pods, svcs = world(m)
    rec = Recovery()
    key = ("ns1", "llm")
    assert rec.step(key, m, list(pods.values()), svcs, set(), T0).delete_pods == []
    # a pod the controller deleted itself (scale-down, recovery) is not lost
    ours = pods.pop("llm-1-decode-0-0")
    assert rec.step(key, m, list(pods.values()), svcs, {ours["metadata"]["uid"]}, T0).delete_pods == []
    # one deleted by someone else: its role replica is recreated, once
    pods.pop("llm-0-prefill-1-1")
    d = rec.step(key, m, list(pods.values()), svcs, set(), T0)
    assert names(d.delete_pods) == ["llm-0-prefill-1-0"] and names(d.delete_services) == ["llm-0-prefill-1-0"]
    # the deletes failed (the reconcile raised before applied()): the retry does the same, at once
    d = rec.step(key, m, list(pods.values()), svcs, set(), T0 + timedelta(seconds=1))
    assert names(d.delete_pods) == ["llm-0-prefill-1-0"] and not d.postponed
    rec.applied(key, d)
    pods.pop("llm-0-prefill-1-0")
    left = [s for s in svcs if s["metadata"]["name"] != "llm-0-prefill-1-0"]
    assert rec.step(key, m, list(pods.values()), left, {"uid-llm-0-prefill-1-0"}, T0).delete_pods == []
    # a first reconcile (new process) knows no previous pods: nothing is lost
    assert Recovery().step(key, m, list(pods.values()), left, set(), T0).delete_pods == []


def test_a_new_modelserving_of_the_same_name_loses_nothing() -> None:
    pods, svcs = world(ms())
    rec = Recovery()
    key = ("ns1", "llm")
    rec.step(key, ms(), list(pods.values()), svcs, set(), T0)
    fresh, fsvcs = world(ms(uid="u-2"))
    for p in fresh.values():
        p["metadata"]["uid"] += "-2"
    assert rec.step(key, ms(uid="u-2"), list(fresh.values()), fsvcs, set(), T0).delete_pods == []


def test_backoff_grows_resets_and_never_holds_back_a_retry() -> None:
    assert [backoff_delay(c) for c in (1, 2, 3, 6, 7)] == [10, 20, 40, 300, 300]
    m = ms()
    unit = Unit("llm-0", "decode", "decode-0")
    pods, svcs = world(m)
    fail(pods["llm-0-decode-0-0"])
    hist = {unit: Backoff(2, T0, frozenset({"older"}))}
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=5), history=hist)
    assert d.delete_pods == [] and d.postponed == [(unit, 15.0)] and 15 <= (d.requeue_after or 0) < 15.2
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=20), history=hist)
    assert names(d.delete_pods) == ["llm-0-decode-0-0"]
    assert record(hist, d, T0 + timedelta(seconds=20))[unit].count == 3
    # the same trigger again (a reconcile that failed half-way): not held back, not counted
    hist = {unit: Backoff(1, T0, frozenset({"uid-llm-0-decode-0-0"}))}
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=1), history=hist)
    assert names(d.delete_pods) == ["llm-0-decode-0-0"]
    assert record(hist, d, T0 + timedelta(seconds=1))[unit].count == 1
    # quiet for 10 minutes: back to an immediate recovery
    hist = {unit: Backoff(5, T0, frozenset({"older"}))}
    d = decide(m, list(pods.values()), svcs, T0 + timedelta(seconds=600), history=hist)
    assert d.delete_pods and record(hist, d, T0 + timedelta(seconds=600))[unit].count == 1


def test_flapping_crash_loop_is_backed_off() -> None:
    """Each new incarnation of a role replica fails at once: one recovery, then one per
    growing backoff step, however often the controller reconciles meanwhile."""
    m = ms(replicas=1)
    key = ("ns1", "llm")
    rec = Recovery()
    pods, svcs = world(m)
    deletions: list[int] = []
    ours: set[str] = set()
    for t in range(100):
        fail(pods["llm-0-decode-0-0"])
        d = rec.step(key, m, list(pods.values()), svcs, ours, T0 + timedelta(seconds=t))
        ours = {p["metadata"]["uid"] for p in d.delete_pods}
        if d.delete_pods:
            deletions.append(t)
            for p in d.delete_pods:  # recreated (a new uid), and failing again
                pods[p["metadata"]["name"]] = new = copy.deepcopy(p)
                new["metadata"]["uid"] += f"-{t}"
    assert deletions == [0, 10, 30, 70]


def test_lost_pod_waits_for_backoff_then_recreates_its_unit() -> None:
    m = ms(replicas=1)
    key = ("ns1", "llm")
    rec = Recovery()
    pods, svcs = world(m)
    rec.step(key, m, list(pods.values()), svcs, set(), T0)
    pods.pop("llm-0-prefill-0-0")
    d = rec.step(key, m, list(pods.values()), svcs, set(), T0)
    assert d.delete_pods  # first: at once
    rec.applied(key, d)
    pods, svcs = world(m)
    for p in pods.values():
        if p["metadata"]["name"].startswith("llm-0-prefill-0-"):
            p["metadata"]["uid"] += "-b"  # the recreated role replica
    d = rec.step(key, m, list(pods.values()), svcs, {"uid-llm-0-prefill-0-1"}, T0 + timedelta(seconds=1))
    assert d.delete_pods == [] and d.postponed == []
    pods.pop("llm-0-prefill-0-0")
    d = rec.step(key, m, list(pods.values()), svcs, set(), T0 + timedelta(seconds=2))
    assert d.delete_pods == [] and d.postponed  # held back, remembered
    d = rec.step(key, m, list(pods.values()), svcs, set(), T0 + timedelta(seconds=11))
    assert names(d.delete_pods) == ["llm-0-prefill-0-1"]
    rec.applied(key, d)
    pods.pop("llm-0-prefill-0-1")
    d = rec.step(key, m, list(pods.values()), svcs, {"uid-llm-0-prefill-0-1-b"}, T0 + timedelta(seconds=12))
    assert d.delete_pods == [] and d.postponed == []


def test_informer_trim_keeps_container_restarts_and_states() -> None:
    pod = {"metadata": {"name": "p", "uid": "u", "labels": {n.LABEL_GROUP: "g"}, "managedFields": [{}]},
           "spec": {"containers": [{"name": "c"}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}], "podIP": "10.0.0.1",
                      "containerStatuses": [{"name": "c", "restartCount": 3, "ready": False, "image": "x",
                                             "imageID": "sha", "containerID": "cid",
                                             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                             "lastState": {"terminated": {"exitCode": 1, "finishedAt": iso(T0)}}}]}}
    t = _trim_pod(pod)
    assert "spec" not in t and "managedFields" not in t["metadata"]
    assert t["status"]["podIP"] == "10.0.0.1"  # the autoscaler scrapes the pod's metrics there
    assert t["status"]["containerStatuses"] == [{"name": "c", "restartCount": 3, "ready": False,
                                                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                                 "lastState": {"terminated": {"exitCode": 1,
                                                                              "finishedAt": iso(T0)}}}]
    assert "initContainerStatuses" not in t["status"]
    assert is_errored(t) and trouble_since(t) == T0
