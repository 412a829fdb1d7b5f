"""Properties of the autoscaler over random policies and metric traces (hypothesis): the
bounds always hold, no scale-down while panicking or on partial data, the ratio constraint
is met whenever some pair within the bounds meets it, the cost allocation is consistent."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.autoscaler import (
    PANIC, MetricSample, Observation, ScalerState, Wake, allocate, enforce_ratio, parse_policy,
    recommend_disaggregated, recommend_homogeneous,
)
from controller.autoscaler.policy import RatioConstraint
from controller.autoscaler.ratio import ratio_met

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

durations = st.sampled_from(["0s", "15s", "30s", "45s", "60s", "2m"])
stable = st.fixed_dictionaries({
    "instances": st.integers(0, 5), "percent": st.integers(0, 300), "period": durations,
    "selectPolicy": st.sampled_from(["Or", "And"]), "stabilizationWindow": durations})
panic = st.fixed_dictionaries({
    "percent": st.integers(0, 1000), "period": durations, "panicThresholdPercent": st.integers(110, 400),
    "panicModeHold": durations})
behaviors = st.one_of(st.none(), st.fixed_dictionaries({
    "scaleUp": st.fixed_dictionaries({"stablePolicy": stable, "panicPolicy": panic}), "scaleDown": stable}))


@st.composite
def bounds(draw: Any, lo_min: int = 0) -> tuple[int, int]:
    lo = draw(st.integers(lo_min, 6))
    return lo, draw(st.integers(max(lo, 1), 12))


# one metric value per round: an external total, per-pod values, or missing (None)
values = st.one_of(st.none(), st.floats(0, 400, allow_nan=False), st.lists(st.floats(0, 60), min_size=1, max_size=6))


def observe(load: Any, kv: Any) -> Observation:
    metrics: dict[str, MetricSample] = {}
    for name, v in (("load", load), ("kv", kv)):
        if isinstance(v, float):
            metrics[name] = MetricSample(external=v)
        elif isinstance(v, list):
            metrics[name] = MetricSample(pods=tuple(v))
    return Observation(metrics)


@SETTINGS
@given(b=bounds(), beh=behaviors, tol=st.integers(0, 50), start=st.integers(0, 20),
       trace=st.lists(st.tuples(values, values), min_size=1, max_size=25),
       gaps=st.lists(st.sampled_from([5.0, 15.0, 15.0, 40.0]), min_size=25, max_size=25))
def test_bounds_panic_and_missing_data(b: tuple[int, int], beh: Any, tol: int, start: int,
                                       trace: list[tuple[Any, Any]], gaps: list[float]) -> None:
    spec: dict[str, Any] = {"tolerancePercent": tol,
                            "metrics": [{"name": "load", "targetValue": 10}, {"name": "kv", "targetValue": "0.5"}],
                            "homogeneousTarget": {"target": {"targetRef": {"name": "x"}}, "minReplicas": b[0],
                                                  "maxReplicas": b[1]}}
    if beh is not None:
        spec["behavior"] = beh
    policy = parse_policy(spec)
    state, current, now = ScalerState(), start, 0.0
    for (load, kv), gap in zip(trace, gaps):
        obs = observe(load, kv)
        rec, state = recommend_homogeneous(policy, state, obs, current, now)
        in_bounds = b[0] <= current <= b[1]
        if rec.skipped:
            assert rec.replicas == current and in_bounds
        else:
            assert b[0] <= rec.replicas <= b[1]
        if in_bounds and rec.mode == PANIC:
            assert rec.replicas >= current, rec.reason
        if in_bounds and len(obs.metrics) < 2:
            assert rec.replicas >= current, rec.reason  # never down on missing data
        current, now = rec.replicas, now + gap


@SETTINGS
@given(b=bounds(lo_min=1), up=stable, down=stable, pan=panic, hold=st.sampled_from(["15s", "30s", "60s", "2m"]),
       trace=st.lists(st.floats(0, 300, allow_nan=False), min_size=2, max_size=25))
def test_no_scale_down_while_panicking(b: tuple[int, int], up: Any, down: Any, pan: Any, hold: str,
                                       trace: list[float]) -> None:
    policy = parse_policy({"metrics": [{"name": "load", "targetValue": 10}],
                           "behavior": {"scaleUp": {"stablePolicy": up, "panicPolicy": {**pan, "panicModeHold": hold}},
                                        "scaleDown": down},
                           "homogeneousTarget": {"target": {"targetRef": {"name": "x"}}, "minReplicas": b[0],
                                                 "maxReplicas": b[1]}})
    state, current = ScalerState(), b[0]
    for i, load in enumerate(trace):
        rec, state = recommend_homogeneous(policy, state, Observation({"load": MetricSample(external=load)}),
                                           current, i * 15.0)
        if rec.mode == PANIC:
            assert rec.replicas >= current, rec.reason
        assert b[0] <= rec.replicas <= b[1]
        current = rec.replicas


@SETTINGS
@given(hi=st.integers(1, 8), trace=st.lists(st.tuples(values, st.one_of(st.none(), st.integers(0, 3))),
                                            min_size=1, max_size=20))
def test_wake_signal_keeps_a_replica_while_requests_wait(hi: int, trace: list[tuple[Any, Any]]) -> None:
    policy = parse_policy({"metrics": [{"name": "load", "targetValue": 10}],
                           "homogeneousTarget": {"target": {"targetRef": {"name": "x"}}, "minReplicas": 0,
                                                 "maxReplicas": hi}})
    state, current = ScalerState(), 0
    for i, (load, pending) in enumerate(trace):
        obs = observe(load, None)
        if pending is not None:
            obs = Observation({**obs.metrics, "pending": MetricSample(external=float(pending))})
        rec, state = recommend_homogeneous(policy, state, obs, current, i * 15.0, Wake("pending"))
        if pending:
            assert rec.replicas >= 1
        if pending is None and current >= 1:
            assert rec.replicas >= 1
        assert 0 <= rec.replicas <= hi
        current = rec.replicas


def feasible(nb: tuple[int, int], db: tuple[int, int], c: RatioConstraint) -> bool:
    return any(ratio_met(n, d, c) for n in range(nb[0], nb[1] + 1) for d in range(max(db[0], 1), db[1] + 1))


ratios = st.sampled_from([0.0, 0.25, 0.3, 0.5, 2 / 3, 1.0, 1.5, 2.0, 3.0, 4.0])


@SETTINGS
@given(nb=bounds(), db=bounds(), lo=ratios, span=ratios, n=st.integers(0, 20), d=st.integers(0, 20))
def test_ratio_is_met_whenever_it_can_be(nb: tuple[int, int], db: tuple[int, int], lo: float, span: float, n: int,
                                         d: int) -> None:
    hi = lo + span if lo + span > 0 else 0.5
    c = RatioConstraint("p", "d", lo, hi)
    res = enforce_ratio({"p": n, "d": d}, {"p": nb, "d": db}, c)
    fp, fd = res.replicas["p"], res.replicas["d"]
    assert nb[0] <= fp <= nb[1] and db[0] <= fd <= db[1]
    assert res.met == ratio_met(fp, fd, c)
    both_zero = fp == 0 and fd == 0
    if feasible(nb, db, c):
        assert res.met
    if both_zero:
        assert min(n, nb[1]) == 0 and min(d, db[1]) == 0  # only a coupled scale to zero stays at 0/0


@SETTINGS
@given(nb=bounds(lo_min=1), db=bounds(lo_min=1), lo=ratios, span=ratios,
       trace=st.lists(st.tuples(values, values), min_size=1, max_size=12))
def test_disaggregated_rounds_keep_bounds_and_ratio(nb: tuple[int, int], db: tuple[int, int], lo: float,
                                                    span: float, trace: list[tuple[Any, Any]]) -> None:
    hi = lo + span if lo + span > 0 else 0.5
    c = RatioConstraint("prefill", "decode", lo, hi)
    if not feasible(nb, db, c):
        return
    policy = parse_policy({
        "metrics": [{"name": "load", "targetValue": 10}],
        "disaggregatedTarget": {"targetRef": {"name": "pd"}, "roles": {
            "prefill": {"minReplicas": nb[0], "maxReplicas": nb[1]},
            "decode": {"minReplicas": db[0], "maxReplicas": db[1]}},
            "ratioConstraint": {"numeratorRole": "prefill", "denominatorRole": "decode",
                                "minRatio": repr(lo), "maxRatio": repr(hi)}}})
    states: dict[str, ScalerState] = {}
    current = {"prefill": nb[0], "decode": db[0]}
    for i, (p, d) in enumerate(trace):
        res, states = recommend_disaggregated(policy, states, {"prefill": observe(p, None), "decode": observe(d, None)},
                                              current, i * 15.0)
        got = res.replicas()
        if not res.skipped:
            assert nb[0] <= got["prefill"] <= nb[1] and db[0] <= got["decode"] <= db[1]
            assert res.ratio_met and ratio_met(got["prefill"], got["decode"], c)
        current = got


@SETTINGS
@given(params=st.lists(st.tuples(st.integers(0, 100), bounds()), min_size=1, max_size=4),
       rate=st.sampled_from([0, 50, 100, 150, 200, 300]))
def test_allocation_is_monotone_and_within_bounds(params: list[tuple[int, tuple[int, int]]], rate: int) -> None:
    policy = parse_policy({"metrics": [{"name": "load", "targetValue": 10}], "heterogeneousTarget": {
        "costExpansionRatePercent": rate,
        "params": [{"target": {"targetRef": {"name": f"m{i}"}}, "cost": cost, "minReplicas": b[0],
                    "maxReplicas": b[1]} for i, (cost, b) in enumerate(params)]}})
    h = policy.heterogeneous
    assert h is not None
    lo, hi = sum(b[0] for _, b in params), sum(b[1] for _, b in params)
    prev: dict[str, int] | None = None
    for total in range(0, hi + 2):
        got = allocate(h, "ns", total)
        assert sum(got.values()) == min(max(total, lo), hi)
        for i, (_, b) in enumerate(params):
            assert b[0] <= got[f"ns/m{i}"] <= b[1]
        if prev is not None:
            assert all(got[k] >= prev[k] for k in got)
        prev = got
