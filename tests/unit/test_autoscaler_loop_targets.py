"""The autoscaler loop's pure parts around the target: replica counts, metric pod selection,
label selectors, the scale and role patches, and the policy status."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from controller import mergepatch
from controller.autoscaler.status import Round, Scaled, desired_status
from controller.autoscaler.targets import (
    TargetError, current_replicas, matches, metric_pods, role_replicas, roles_patch, scale_patch,
)

NAME, ENTRY, ROLE = "modelserving.volcano.sh/name", "modelserving.volcano.sh/entry", "modelserving.volcano.sh/role"


def _ms(replicas: int | None = 2, roles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"roles": roles or [{"name": "worker", "replicas": 1}]}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"metadata": {"name": "ms", "namespace": "ns", "resourceVersion": "41"}, "spec": spec}


def test_current_replicas_defaults_to_one() -> None:
    assert current_replicas(_ms(3)) == 3
    assert current_replicas(_ms(None)) == 1
    assert current_replicas(_ms(0)) == 0


def test_role_replicas() -> None:
    ms = _ms(roles=[{"name": "prefill", "replicas": 2}, {"name": "decode"}, {"name": "other", "replicas": 5}])
    assert role_replicas(ms, ["decode", "prefill"]) == {"prefill": 2, "decode": 1}
    with pytest.raises(TargetError, match="role router not found in ModelServing ns/ms"):
        role_replicas(ms, ["prefill", "router"])


def test_scale_patch() -> None:
    assert scale_patch(4) == {"spec": {"replicas": 4}}


def test_roles_patch_sends_whole_list_with_resource_version() -> None:
    roles = [{"name": "prefill", "replicas": 2, "entryTemplate": {"spec": {"containers": [{"name": "c"}]}}},
             {"name": "decode", "workerReplicas": 1}]
    ms = _ms(roles=roles)
    patch = roles_patch(ms, {"prefill": 2, "decode": 3})
    assert patch == {"metadata": {"resourceVersion": "41"}, "spec": {"template": {"roles": [
        roles[0], {"name": "decode", "workerReplicas": 1, "replicas": 3}]}}}
    assert "replicas" not in roles[1]  # the cached object is not modified
    assert roles_patch(ms, {"prefill": 2, "decode": 1}) is None  # unset = 1: nothing changes
    assert roles_patch(ms, {"prefill": 2}) is None


def test_label_selector_semantics() -> None:
    labels = {"a": "1", "b": "2"}
    assert matches(None, labels) and matches({}, labels)
    assert matches({"matchLabels": {"a": "1"}}, labels)
    assert not matches({"matchLabels": {"a": "2"}}, labels)
    assert matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}, labels)
    assert not matches({"matchExpressions": [{"key": "c", "operator": "In", "values": ["1"]}]}, labels)
    assert matches({"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["1"]}]}, labels)
    assert not matches({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, labels)
    assert matches({"matchExpressions": [{"key": "b", "operator": "Exists"}]}, labels)
    assert matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, labels)
    assert not matches({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["0"]}]}, labels)


def _pod(name: str, *, ns: str = "ns", ms: str = "ms", entry: bool = True, role: str | None = None,
         phase: str = "Running", ready: bool = True, ip: str = "10.0.0.1", restarts: int = 0,
         deleting: bool = False) -> dict[str, Any]:
    labels = {NAME: ms}
    if entry:
        labels[ENTRY] = "true"
    if role:
        labels[ROLE] = role
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip,
                                         "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                                         "containerStatuses": [{"name": "c", "restartCount": restarts}]}}


def test_metric_pods_selection() -> None:
    pods = [_pod("a", ip="10.0.0.1"), _pod("b", ip="10.0.0.2", ready=False), _pod("w", entry=False),
            _pod("x", ns="other"), _pod("y", ms="ms2"), _pod("p", role="prefill"), _pod("d", role="decode")]
    ps = metric_pods(pods, "ns", "ms", None, None)
    assert ps.ready == (("a", "10.0.0.1"), ("d", "10.0.0.1"), ("p", "10.0.0.1"))
    assert ps.unready == ("b",) and not ps.errored
    ps = metric_pods(pods, "ns", "ms", "decode", None)
    assert ps.ready == (("d", "10.0.0.1"),) and ps.unready == ()
    assert metric_pods(pods, "ns", "nope", None, None).empty


def test_metric_pods_errored() -> None:
    assert metric_pods([_pod("a"), _pod("b", restarts=2)], "ns", "ms", None, None).errored
    assert metric_pods([_pod("a"), _pod("b", phase="Failed", ready=False)], "ns", "ms", None, None).errored
    ps = metric_pods([_pod("a"), _pod("b", deleting=True)], "ns", "ms", None, None)
    assert ps.errored and ps.ready == (("a", "10.0.0.1"),)


# --- status ----------------------------------------------------------------------------------

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
T1 = datetime(2026, 12, 1, 12, 0, 15, tzinfo=timezone.utc)


def _policy(status: dict[str, Any] | None = None, generation: int = 3) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "generation": generation}, "status": status or {}}


def _conds(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


def test_homogeneous_status_and_transitions() -> None:
    r = Round(True, "Reconciled", "scaled 1 -> 3", True, kind="homogeneous",
              scaled=(Scaled("", 1, 3, "Stable", True),))
    st = desired_status(_policy(), r, T0)
    assert st["observedGeneration"] == 3
    assert st["homogeneousStatus"] == {"currentReplicas": 1, "desiredReplicas": 3, "mode": "Stable",
                                       "lastScaleTime": "2026-12-01T12:00:00Z"}
    c = _conds(st)
    assert c["Ready"]["status"] == "True" and c["Ready"]["message"] == "scaled 1 -> 3"
    assert c["TargetFound"]["status"] == "True" and "RatioConstraintViolated" not in c
    # next round, nothing written: lastScaleTime and the transition times stay
    r2 = Round(True, "Reconciled", "kept", True, kind="homogeneous", scaled=(Scaled("", 3, 3, "Stable", False),))
    st2 = desired_status(_policy(st), r2, T1)
    assert st2["homogeneousStatus"]["lastScaleTime"] == "2026-12-01T12:00:00Z"
    assert _conds(st2)["Ready"]["lastTransitionTime"] == "2026-12-01T12:00:00Z"
    patch = mergepatch.diff(st, st2)
    assert set(patch) == {"homogeneousStatus", "conditions"}
    # the same round again: no change at all (no write)
    assert mergepatch.diff(st2, desired_status(_policy(st2), r2, T1)) == {}
    # target gone: Ready False transitions, the scaling state is kept
    r3 = Round(False, "TargetInvalid", "ModelServing ns/ms not found", False, "ModelServing ns/ms not found")
    st3 = desired_status(_policy(st2), r3, T1)
    assert _conds(st3)["Ready"]["lastTransitionTime"] == "2026-12-01T12:00:15Z"
    assert _conds(st3)["TargetFound"]["reason"] == "TargetInvalid"
    assert st3["homogeneousStatus"] == st2["homogeneousStatus"]


def test_invalid_policy_keeps_target_condition_and_foreign_conditions() -> None:
    other = {"type": "Custom", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t"}
    st = desired_status(_policy(), Round(True, "Reconciled", "ok", True, kind="homogeneous",
                                         scaled=(Scaled("", 1, 1, "Stable", False),)), T0)
    st["conditions"].append(other)
    st2 = desired_status(_policy(st, generation=4), Round(False, "InvalidPolicy", "spec.metrics: bad", None), T1)
    c = _conds(st2)
    assert c["Ready"]["reason"] == "InvalidPolicy" and c["Ready"]["observedGeneration"] == 4
    assert c["TargetFound"] == _conds(st)["TargetFound"] and c["Custom"] == other
    assert st2["observedGeneration"] == 4


def test_disaggregated_and_heterogeneous_status() -> None:
    r = Round(True, "Reconciled", "scaled", True, kind="disaggregated",
              scaled=(Scaled("decode", 2, 4, "Stable", True), Scaled("prefill", 1, 2, "Panic", True)),
              ratio=("prefill", "decode", "0.5"), ratio_adjusted=True, ratio_violated=False)
    st = desired_status(_policy(), r, T0)
    assert st["disaggregatedStatus"] == {
        "roles": [{"name": "decode", "currentReplicas": 2, "desiredReplicas": 4, "mode": "Stable",
                   "lastScaleTime": "2026-12-01T12:00:00Z"},
                  {"name": "prefill", "currentReplicas": 1, "desiredReplicas": 2, "mode": "Panic",
                   "lastScaleTime": "2026-12-01T12:00:00Z"}],
        "ratioStatus": {"numeratorRole": "prefill", "denominatorRole": "decode", "currentRatio": "0.5"},
        "ratioAdjusted": True}
    assert _conds(st)["RatioConstraintViolated"]["status"] == "False"
    h = Round(True, "DryRun", "dry run: would scale", True, kind="heterogeneous",
              scaled=(Scaled("a", 1, 2, "Stable", False), Scaled("b", 0, 0, "Stable", False)))
    st2 = desired_status(_policy(st), h, T1)
    assert "disaggregatedStatus" not in st2 and "RatioConstraintViolated" not in _conds(st2)
    assert st2["heterogeneousStatus"] == [
        {"name": "a", "currentReplicas": 1, "desiredReplicas": 2, "mode": "Stable"},
        {"name": "b", "currentReplicas": 0, "desiredReplicas": 0, "mode": "Stable"}]
    assert _conds(st2)["Ready"]["reason"] == "DryRun"
