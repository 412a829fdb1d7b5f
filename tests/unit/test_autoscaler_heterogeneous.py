"""Heterogeneous targets: Kthena's cost blocks (cheapest capacity first, geometrically
growing blocks) and the pooled metrics of the members."""

from __future__ import annotations

from typing import Any

from controller.autoscaler import MetricSample, Observation, ScalerState, allocate, parse_policy, \
    recommend_heterogeneous
from controller.autoscaler.heterogeneous import blocks, pool_observations
from tests.unit.autoscaler_fixtures import behavior


def hetero(params: list[tuple[str, int, int, int]], rate: int | None = None, **extra: Any):
    h: dict[str, Any] = {"params": [{"target": {"targetRef": {"name": n}}, "cost": c, "minReplicas": lo,
                                     "maxReplicas": hi} for n, c, lo, hi in params]}
    if rate is not None:
        h["costExpansionRatePercent"] = rate
    return parse_policy({"metrics": [{"name": "load", "targetValue": 10}], "heterogeneousTarget": h, **extra})


def test_kthena_examples_rate_100() -> None:
    p = hetero([("h100", 10, 1, 4), ("a100", 5, 1, 3)], rate=100)
    assert p.heterogeneous is not None
    assert allocate(p.heterogeneous, "ns", 5) == {"ns/a100": 3, "ns/h100": 2}
    assert allocate(p.heterogeneous, "ns", 0) == {"ns/a100": 1, "ns/h100": 1}  # clamped to the mins
    assert allocate(p.heterogeneous, "ns", 99) == {"ns/a100": 3, "ns/h100": 4}  # clamped to the maxes
    assert [(b.key, b.replicas, b.cost) for b in blocks(p.heterogeneous, "ns")] == [("ns/a100", 2, 5),
                                                                                    ("ns/h100", 3, 10)]


def test_geometric_blocks_interleave_cheap_and_expensive_capacity() -> None:
    p = hetero([("a", 100, 0, 7), ("b", 60, 0, 7)])  # default rate 200: blocks 1, 2, 4
    assert p.heterogeneous is not None and p.heterogeneous.cost_expansion_rate_percent == 200
    order = [(b.key[3:], b.replicas, b.cost) for b in blocks(p.heterogeneous, "ns")]
    assert order == [("b", 1, 60), ("a", 1, 100), ("b", 2, 120), ("a", 2, 200), ("b", 4, 240), ("a", 4, 400)]
    seq = [(c["ns/a"], c["ns/b"]) for c in (allocate(p.heterogeneous, "ns", t) for t in range(15))]
    assert seq == [(0, 0), (0, 1), (1, 1), (1, 2), (1, 3), (2, 3), (3, 3), (3, 4), (3, 5), (3, 6), (3, 7),
                   (4, 7), (5, 7), (6, 7), (7, 7)]


def test_blocks_are_cut_to_the_spare_capacity_and_truncated() -> None:
    p = hetero([("a", 1, 2, 10)], rate=150)  # 8 spare: 1, 1 (1.5), 2 (2.25), 3 (3.375), then 1 left
    assert p.heterogeneous is not None
    assert [b.replicas for b in blocks(p.heterogeneous, "ns")] == [1, 1, 1, 2, 3]
    q = hetero([("a", 1, 0, 3)], rate=50)  # lengths shrink below 1: blocks of 1
    assert q.heterogeneous is not None
    assert [b.replicas for b in blocks(q.heterogeneous, "ns")] == [1, 1, 1]


def test_the_set_scales_as_one_unit_and_is_spread_by_cost() -> None:
    p = hetero([("big", 100, 0, 4), ("small", 30, 1, 4)], rate=100, behavior=behavior())
    obs = {"ns/small": Observation({"load": MetricSample(pods=(40.0,))}),
           "ns/big": Observation({"load": MetricSample(pods=())})}
    res, state = recommend_heterogeneous(p, ScalerState(), obs, {"ns/small": 1, "ns/big": 0}, 0.0, "ns")
    assert res.total.replicas == 4 and dict(res.replicas) == {"ns/big": 0, "ns/small": 4}
    obs2 = {"ns/small": Observation({"load": MetricSample(pods=(15.0, 15.0, 15.0, 15.0))})}
    res2, _ = recommend_heterogeneous(p, state, obs2, {"ns/small": 4, "ns/big": 0}, 15.0, "ns")
    assert res2.total.replicas == 6 and dict(res2.replicas) == {"ns/big": 2, "ns/small": 4}


def test_pooled_external_metrics_sum_or_weighted_average() -> None:
    pooled = pool_observations(
        {"a": Observation({"rps": MetricSample(external=30), "kv_usage": MetricSample(external=0.9)}, 1),
         "b": Observation({"rps": MetricSample(external=10), "kv_usage": MetricSample(external=0.5)}, 2)},
        {"a": 1, "b": 3})
    assert pooled.metrics["rps"].external == 40
    assert abs((pooled.metrics["kv_usage"].external or 0) - (0.9 * 1 + 0.5 * 3) / 4) < 1e-12
    assert pooled.unready_pods == 3


def test_a_skipped_round_keeps_every_member() -> None:
    p = hetero([("a", 1, 0, 4), ("b", 2, 0, 4)], behavior=behavior())
    res, _ = recommend_heterogeneous(p, ScalerState(), {}, {"ns/a": 2, "ns/b": 1}, 0.0, "ns")
    assert res.total.skipped and dict(res.replicas) == {"ns/a": 2, "ns/b": 1}
