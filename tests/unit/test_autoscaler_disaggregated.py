"""Disaggregated targets: Kthena's ratio repair (its own test table), our search when the
repair misses, and whole rounds over prefill/decode roles."""

from __future__ import annotations

from typing import Any

import pytest

from controller.autoscaler import MetricSample, Observation, ScalerState, enforce_ratio, parse_policy, \
    recommend_disaggregated
from controller.autoscaler.policy import RatioConstraint
from tests.unit.autoscaler_fixtures import behavior

PD = RatioConstraint("prefill", "decode", 0.25, 1.0)
BOUNDS = {"prefill": (0, 8), "decode": (0, 16)}


@pytest.mark.parametrize("given, bounds, want, adjusted, ratio", [
    ({"prefill": 2, "decode": 4}, BOUNDS, {"prefill": 2, "decode": 4}, False, "0.5"),
    ({"prefill": 1, "decode": 8}, BOUNDS, {"prefill": 2, "decode": 8}, True, "0.25"),
    ({"prefill": 6, "decode": 2}, BOUNDS, {"prefill": 6, "decode": 6}, True, "1"),
    ({"prefill": 2, "decode": 20}, {"prefill": (0, 3), "decode": (0, 20)}, {"prefill": 3, "decode": 12}, True,
     "0.25"),
    ({"prefill": 0, "decode": 4}, BOUNDS, {"prefill": 1, "decode": 4}, True, "0.25"),
    ({"prefill": 4, "decode": 0}, BOUNDS, {"prefill": 4, "decode": 4}, True, "1"),
    ({"prefill": 0, "decode": 0}, BOUNDS, {"prefill": 0, "decode": 0}, False, ""),
])
def test_kthena_ratio_table(given: dict[str, int], bounds: dict[str, tuple[int, int]], want: dict[str, int],
                            adjusted: bool, ratio: str) -> None:
    res = enforce_ratio(given, bounds, PD)
    assert (res.replicas, res.adjusted, res.current_ratio, res.met) == (want, adjusted, ratio, True)


def test_no_constraint_only_clamps() -> None:
    res = enforce_ratio({"prefill": 10, "decode": 4}, BOUNDS, None)
    assert res.replicas == {"prefill": 8, "decode": 4} and not res.adjusted and res.current_ratio == ""


def test_a_narrow_interval_kthena_misses_is_met_by_the_search() -> None:
    c = RatioConstraint("p", "d", 1.5, 1.5)
    # Kthena: ceil(1.5 * 3) = 5 -> 5/3 != 1.5. The feasible pairs are (3, 2), (6, 4), (9, 6)...;
    # (6, 4) keeps all the wanted capacity (p 4, d 3) with the fewest replicas added.
    res = enforce_ratio({"p": 4, "d": 3}, {"p": (1, 10), "d": (1, 10)}, c)
    assert res.met and res.replicas == {"p": 6, "d": 4} and res.current_ratio == "1.5"


def test_an_infeasible_constraint_is_reported() -> None:
    c = RatioConstraint("p", "d", 1.5, 1.5)
    res = enforce_ratio({"p": 1, "d": 1}, {"p": (1, 1), "d": (1, 3)}, c)
    assert not res.met and res.replicas == {"p": 1, "d": 1}


def pd_policy(ratio: dict[str, Any] | None = None, **roles: Any):
    d: dict[str, Any] = {"targetRef": {"name": "pd"}, "roles": roles}
    if ratio:
        d["ratioConstraint"] = ratio
    return parse_policy({"metrics": [{"name": "load", "targetValue": 10}], "behavior": behavior(),
                         "disaggregatedTarget": d})


def obs(total: float) -> Observation:
    return Observation({"load": MetricSample(external=total)})


def test_roles_scale_on_their_own_metrics_then_the_ratio_repairs() -> None:
    p = pd_policy({"numeratorRole": "prefill", "denominatorRole": "decode", "minRatio": "0.5", "maxRatio": "1"},
                  prefill={"minReplicas": 1, "maxReplicas": 8},
                  decode={"minReplicas": 1, "maxReplicas": 8, "metrics": [{"name": "kv", "targetValue": "0.5"}]})
    observations = {"prefill": obs(10), "decode": Observation({"kv": MetricSample(external=3.0)})}
    res, states = recommend_disaggregated(p, {}, observations, {"prefill": 1, "decode": 2}, 0.0)
    # prefill wants 1, decode wants 6: 1/6 < 0.5 -> prefill raised to 3
    assert res.replicas() == {"decode": 6, "prefill": 3}
    assert [(r.name, r.desired) for r in res.roles] == [("decode", 6), ("prefill", 1)]
    assert res.ratio_adjusted and res.ratio_met and res.current_ratio == "0.5" and not res.skipped
    assert set(states) == {"prefill", "decode"}


def test_a_fixed_role_needs_no_metrics_and_a_missing_role_skips_the_round() -> None:
    p = pd_policy(None, prefill={"minReplicas": 1, "maxReplicas": 8}, decode={"minReplicas": 2, "maxReplicas": 2})
    res, _ = recommend_disaggregated(p, {}, {"prefill": obs(50)}, {"prefill": 1, "decode": 2}, 0.0)
    assert res.replicas() == {"decode": 2, "prefill": 5}
    skipped, states = recommend_disaggregated(p, {"prefill": ScalerState()}, {}, {"prefill": 3, "decode": 2}, 0.0)
    assert skipped.skipped and skipped.replicas() == {"decode": 2, "prefill": 3}
    assert states == {"prefill": ScalerState()}


def test_roles_keep_separate_histories() -> None:
    p = parse_policy({"metrics": [{"name": "load", "targetValue": 10}],
                      "behavior": behavior(down={"stabilizationWindow": "60s"}),
                      "disaggregatedTarget": {"targetRef": {"name": "pd"},
                                              "roles": {"a": {"minReplicas": 1, "maxReplicas": 8},
                                                        "b": {"minReplicas": 1, "maxReplicas": 8}}}})
    states: dict[str, ScalerState] = {}
    cur = {"a": 4, "b": 4}
    seq = []
    for i, (la, lb) in enumerate([(40, 40), (10, 40), (10, 10)]):
        res, states = recommend_disaggregated(p, states, {"a": obs(la), "b": obs(lb)}, cur, i * 15.0)
        cur = res.replicas()
        seq.append(cur)
    # each role's stabilization window remembers its own 4
    assert seq == [{"a": 4, "b": 4}, {"a": 4, "b": 4}, {"a": 4, "b": 4}]
    res, _ = recommend_disaggregated(p, states, {"a": obs(10), "b": obs(10)}, cur, 75.0)
    assert res.replicas() == {"a": 1, "b": 4}  # a's last 4 was at 0 s, b's at 15 s
