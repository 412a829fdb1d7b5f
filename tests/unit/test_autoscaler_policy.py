"""AutoscalingPolicy spec -> typed model: the CRD's field defaults, Kthena's webhook block
defaults, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from controller.autoscaler.policy import AND, OR, PolicyError, default_behavior, parse_policy, parse_quantity

TARGET = {"homogeneousTarget": {"target": {"targetRef": {"name": "llm"}}, "minReplicas": 1, "maxReplicas": 4},
          "metrics": [{"name": "load", "targetValue": "10"}]}


def spec(**extra: Any) -> dict[str, Any]:
    return {**TARGET, **extra}


def test_no_behavior_gets_the_webhook_defaults() -> None:
    p = parse_policy(spec())
    assert p.tolerance_percent == 10 and p.metrics == {"load": 10.0}
    b = p.behavior
    assert (b.scale_up.instances, b.scale_up.percent, b.scale_up.period, b.scale_up.select_policy,
            b.scale_up.stabilization_window) == (4, 100, 60.0, OR, 0.0)
    assert (b.scale_down.instances, b.scale_down.percent, b.scale_down.period,
            b.scale_down.stabilization_window) == (0, 100, 60.0, 300.0)
    assert (b.panic.percent, b.panic.period, b.panic.threshold_percent, b.panic.hold) == (0, 0.0, 200, 0.0)


def test_present_blocks_get_the_crd_field_defaults() -> None:
    p = parse_policy(spec(behavior={"scaleUp": {"stablePolicy": {}, "panicPolicy": {"period": "10s"}},
                                    "scaleDown": {"selectPolicy": "And"}}))
    b = p.behavior
    # a present stablePolicy gets the CRD's defaults, and the webhook's 0s window
    assert (b.scale_up.instances, b.scale_up.percent, b.scale_up.period, b.scale_up.stabilization_window) == (
        1, 100, 15.0, 0.0)
    assert (b.panic.percent, b.panic.period, b.panic.threshold_percent, b.panic.hold) == (1000, 10.0, 200, 60.0)
    assert (b.scale_down.select_policy, b.scale_down.instances, b.scale_down.stabilization_window) == (AND, 1, 300.0)


def test_an_empty_scale_up_gets_the_webhook_scale_up() -> None:
    b = parse_policy(spec(behavior={"scaleUp": {}, "scaleDown": {"instances": 2}})).behavior
    assert b.scale_up.instances == 4 and b.scale_up.period == 60.0 and b.panic.hold == 0.0
    assert b.scale_down.instances == 2 and b.scale_down.period == 15.0


def test_defaulting_is_idempotent() -> None:
    once = default_behavior({"scaleUp": {"stablePolicy": {"percent": 50}}})
    assert default_behavior(once) == once


def test_quantities() -> None:
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("2k") == 2000.0
    assert parse_quantity("1Ki") == 1024.0
    assert parse_quantity("1e3") == 1000.0
    assert parse_quantity(3) == 3.0
    with pytest.raises(ValueError):
        parse_quantity("ten")


@pytest.mark.parametrize("bad, field", [
    ({"homogeneousTarget": None}, "exactly one of"),
    ({"heterogeneousTarget": {"params": [{"minReplicas": 0, "maxReplicas": 1,
                                          "target": {"targetRef": {"name": "b"}}}]}}, "exactly one of"),
    ({"metrics": []}, "spec.metrics: at least one"),
    ({"metrics": [{"name": "a", "targetValue": "0"}]}, "spec.metrics[0].targetValue"),
    ({"metrics": [{"name": "a", "targetValue": 1}, {"name": "a", "targetValue": 2}]}, "spec.metrics[1].name"),
    ({"tolerancePercent": 101}, "spec.tolerancePercent"),
    ({"behavior": {"scaleUp": {"panicPolicy": {"percent": 10}}}}, "spec.behavior.scaleUp.panicPolicy.period"),
    ({"behavior": {"scaleDown": {"period": "31m"}}}, "spec.behavior.scaleDown.period"),
    ({"behavior": {"scaleDown": {"selectPolicy": "Xor"}}}, "spec.behavior.scaleDown.selectPolicy"),
    ({"behavior": {"scaleUp": {"panicPolicy": {"period": "1s", "panicThresholdPercent": 100}}}},
     "panicPolicy.panicThresholdPercent"),
    ({"homogeneousTarget": {"target": {"targetRef": {"name": "x"}}, "minReplicas": 5, "maxReplicas": 4}},
     "spec.homogeneousTarget: minReplicas 5"),
    ({"homogeneousTarget": {"target": {"targetRef": {"name": "x", "kind": "Deployment"}}, "minReplicas": 1,
                            "maxReplicas": 4}}, "spec.homogeneousTarget.target.targetRef.kind"),
])
def test_errors_name_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(spec(**bad))
    assert field in str(e.value)


def _disagg(roles: dict[str, Any], ratio: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"targetRef": {"name": "pd"}, "roles": roles}
    if ratio is not None:
        d["ratioConstraint"] = ratio
    return {"disaggregatedTarget": d, **extra}


def test_disaggregated_roles_inherit_or_override_metrics() -> None:
    p = parse_policy(_disagg({"prefill": {"minReplicas": 1, "maxReplicas": 4},
                              "decode": {"minReplicas": 1, "maxReplicas": 8,
                                         "metrics": [{"name": "kv", "targetValue": "0.8"}]}},
                             {"numeratorRole": "prefill", "denominatorRole": "decode", "minRatio": "250m",
                              "maxRatio": 1}, metrics=[{"name": "load", "targetValue": 10}]))
    d = p.disaggregated
    assert d is not None and d.ratio is not None
    assert d.roles["prefill"].metrics == {"load": 10.0} and d.roles["decode"].metrics == {"kv": 0.8}
    assert (d.ratio.min_ratio, d.ratio.max_ratio) == (0.25, 1.0)
    fixed = parse_policy(_disagg({"decode": {"minReplicas": 2, "maxReplicas": 2}}))
    assert fixed.disaggregated is not None and fixed.disaggregated.roles["decode"].fixed


@pytest.mark.parametrize("roles, ratio, field", [
    ({"p": {"minReplicas": 1, "maxReplicas": 2}}, None, "spec.disaggregatedTarget.roles.p: an autoscaled role"),
    ({"p": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]},
      "d": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]}},
     {"numeratorRole": "p", "denominatorRole": "x", "minRatio": 1, "maxRatio": 2}, "denominatorRole"),
    ({"p": {"minReplicas": 0, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]},
      "d": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]}},
     {"numeratorRole": "p", "denominatorRole": "d", "minRatio": 1, "maxRatio": 2}, "scalable to zero together"),
    ({"p": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]},
      "d": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]}},
     {"numeratorRole": "p", "denominatorRole": "d", "minRatio": 3, "maxRatio": 4}, "not achievable"),
    ({"p": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]},
      "d": {"minReplicas": 1, "maxReplicas": 2, "metrics": [{"name": "a", "targetValue": 1}]}},
     {"numeratorRole": "p", "denominatorRole": "d", "minRatio": 2, "maxRatio": 1}, "ratioConstraint.minRatio"),
])
def test_disaggregated_errors(roles: dict[str, Any], ratio: dict[str, Any] | None, field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(_disagg(roles, ratio))
    assert field in str(e.value)
