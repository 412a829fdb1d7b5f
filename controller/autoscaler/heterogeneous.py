"""Heterogeneous targets: one replica count for the whole set, spread over the ModelServings
cheapest capacity first (Kthena's Optimizer). Pure.

The set is scaled as one unit (recommend.scale_one) with bounds sum(min)..sum(max), the
current count being the sum of the members' counts and the metrics pooled: per-pod values
of all members together; external values summed, or replica-weighted averaged when the
metric's name ends in _utilization, _usage, _ratio, _percent or _saturation (Kthena's rule).

The count is then spread (RestoreReplicasOfEachBackend): every member starts at its
minReplicas; the rest is poured into "blocks" in order of block cost. Each member's spare
capacity (max - min) is cut into blocks of 1, r, r^2, ... replicas (r =
costExpansionRatePercent / 100, each length truncated to an integer and at least 1, the last
one cut to what is left), a block costing cost x length; with r = 1 (100 %) the member's
spare capacity is a single block costing cost (not x length, as Kthena). Ties on cost go to
the member listed first. So with rate 200, a cheap member's first replicas come before an
expensive member's, but a large cheap block (cost x 4) can come after a small expensive one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .metrics import MetricSample, Observation
from .policy import Heterogeneous, Policy
from .recommend import Recommendation, ScalerState, Wake, scale_one

__all__ = ["Block", "HeterogeneousResult", "allocate", "blocks", "pool_observations", "recommend_heterogeneous"]

_RATIO_SUFFIXES = ("_utilization", "_usage", "_ratio", "_percent", "_saturation")


@dataclass(frozen=True)
class Block:
    key: str
    index: int
    replicas: int
    cost: int


def blocks(target: Heterogeneous, namespace: str) -> list[Block]:
    """Kthena's ScalingOrder: the spare capacity of every member in cost order."""
    rate = target.cost_expansion_rate_percent
    out: list[Block] = []
    for index, p in enumerate(target.params):
        key = p.target.key(namespace)
        spare = p.max_replicas - p.min_replicas
        if spare <= 0:
            continue
        if rate == 100:
            out.append(Block(key, index, spare, p.cost))
            continue
        length = 1.0
        while spare > 0:
            size = min(spare, max(int(length), 1))
            out.append(Block(key, index, size, p.cost * size))
            spare -= size
            length = length * rate / 100
    return sorted(out, key=lambda b: (b.cost, b.index))  # stable: equal blocks keep their order


def allocate(target: Heterogeneous, namespace: str, total: int) -> dict[str, int]:
    """Spread `total` replicas over the members (clamped to the set's bounds)."""
    counts = {p.target.key(namespace): p.min_replicas for p in target.params}
    lo = sum(p.min_replicas for p in target.params)
    hi = sum(p.max_replicas for p in target.params)
    rest = min(max(total, lo), hi) - lo
    for block in blocks(target, namespace):
        if rest <= 0:
            break
        take = min(rest, block.replicas)
        counts[block.key] += take
        rest -= take
    return counts


def _ratio_metric(name: str) -> bool:
    return name.lower().endswith(_RATIO_SUFFIXES)


def pool_observations(observations: Mapping[str, Observation], current: Mapping[str, int]) -> Observation:
    """The members' observations as one (Kthena's Optimize aggregation)."""
    names = sorted({n for o in observations.values() for n in o.metrics})
    pooled: dict[str, MetricSample] = {}
    for name in names:
        samples = [(key, o.metrics[name]) for key, o in observations.items() if name in o.metrics]
        externals = [(s.external, current.get(key, 0)) for key, s in samples if s.external is not None]
        if externals:
            if not _ratio_metric(name):
                value = sum(v for v, _ in externals)
            elif sum(r for _, r in externals) > 0:
                value = sum(v * r for v, r in externals) / sum(r for _, r in externals)
            else:
                value = sum(v for v, _ in externals) / len(externals)
            pooled[name] = MetricSample(external=value)
        else:
            pods = tuple(v for _, s in samples for v in s.pods)
            pooled[name] = MetricSample(pods=pods, missing_pods=sum(s.missing_pods for _, s in samples))
    return Observation(pooled, sum(o.unready_pods for o in observations.values()))


@dataclass(frozen=True)
class HeterogeneousResult:
    total: Recommendation  # the set as one unit
    replicas: Mapping[str, int]  # per member key (namespace/name); current counts when skipped


def recommend_heterogeneous(policy: Policy, state: ScalerState, observations: Mapping[str, Observation],
                            current: Mapping[str, int], now: float, namespace: str,
                            wake: Wake | None = None) -> tuple[HeterogeneousResult, ScalerState]:
    target = policy.heterogeneous
    if target is None:
        raise ValueError("policy has no heterogeneousTarget")
    keys = [p.target.key(namespace) for p in target.params]
    now_total = sum(current.get(k, 0) for k in keys)
    lo = sum(p.min_replicas for p in target.params)
    hi = sum(p.max_replicas for p in target.params)
    pooled = pool_observations({k: observations[k] for k in keys if k in observations}, current)
    rec, new_state = scale_one(policy.behavior, policy.metrics, policy.tolerance, lo, hi, state, pooled, now_total,
                               now, wake)
    if rec.skipped:
        return HeterogeneousResult(rec, {k: current.get(k, 0) for k in keys}), new_state
    return HeterogeneousResult(rec, allocate(target, namespace, rec.replicas)), new_state
