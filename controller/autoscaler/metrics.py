"""From metric values to a replica count (Kthena's RecommendedInstancesAlgorithm), before
any behaviour rule. Pure.

Each metric has a target value per replica. A metric arrives either per pod (the ready
pods that reported it, plus how many ready pods did not) or as one external value for the
whole target (a Prometheus query). Per metric:

- external: desired = ceil(value / target); kept at the current count when
  |desired_raw / current - 1| <= tolerance;
- per pod (Kubernetes HPA's rules, as Kthena's getDesiredInstancesForSingleInstanceMetric):
  ratio = mean(reported values) / target. Without unready or silent pods: within the
  tolerance keep the current count, else ceil(ratio x reporting pods). Otherwise silent
  pods count as exactly on target when the ratio says scale down (so they damp it) and as
  zero when it says scale up; unready pods count as zero on a scale-up; and if that flips
  the direction, or lands within the tolerance, or moves the other way than the raw
  ratio, the current count is kept.
Several metrics: the largest desired count wins. The result is clamped to [min, max]; a
current count outside the bounds is answered with the bound before any metric is read.

Missing data (never a scale-down because of it):
- no metric has any value (all sources failed, no ready pods): no recommendation at all
  (Kthena skips the round: nothing is written, nothing recorded);
- some metrics have values, others none: the recommendation of those present, but never
  below the current count. Kthena here would take the max of the present ones only, which
  can scale down on partial data; Kubernetes' HPA refuses to, and so do we.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["MetricSample", "Observation", "RawRecommendation", "desired_for_external", "desired_for_pods",
           "raw_recommendation"]

_BOUND = 1_000_000_000  # Kthena's cap on a computed count


@dataclass(frozen=True)
class MetricSample:
    """One metric of one target at one instant."""
    pods: tuple[float, ...] = ()  # values of the ready pods that reported it
    missing_pods: int = 0  # ready pods that did not report it
    external: float | None = None  # one value for the whole target (takes precedence)

    @property
    def present(self) -> bool:
        return self.external is not None or bool(self.pods)

    def total(self) -> float:
        return self.external if self.external is not None else sum(self.pods)


@dataclass(frozen=True)
class Observation:
    """What the collector saw for one target: metrics by name (absent name = missing)."""
    metrics: Mapping[str, MetricSample] = field(default_factory=dict)
    unready_pods: int = 0  # pods of the target that are not running and ready


@dataclass(frozen=True)
class RawRecommendation:
    replicas: int | None  # None: no metric had data; skip the round
    by_metric: Mapping[str, int]  # the desired count of each metric that had data
    missing: tuple[str, ...]  # metrics without data this round
    reason: str


def _ceil(value: float) -> int:
    if math.isnan(value):
        return 0
    value = math.ceil(value)
    return max(0, int(value)) if value < _BOUND else _BOUND


def _direction(ratio: float) -> int:
    return 1 if ratio >= 1.0 else -1


def desired_for_external(current: int, tolerance: float, target: float, value: float) -> int:
    desired = value / target
    if current > 0 and abs(desired / current - 1.0) <= tolerance:
        return current
    return _ceil(desired)  # from zero replicas any demand counts (Go: x/0 = +Inf, beyond tolerance)


def desired_for_pods(current: int, tolerance: float, target: float, sample: MetricSample, unready: int) -> int | None:
    reporting = len(sample.pods)
    if reporting == 0:
        return None
    total = sum(sample.pods)
    ratio = total / reporting / target
    add_unready = unready > 0 and _direction(ratio) > 0
    missing = sample.missing_pods
    if not add_unready and missing == 0:
        if abs(ratio - 1.0) <= tolerance:
            return current
        return _ceil(ratio * reporting)
    count = reporting + missing
    if _direction(ratio) < 0:
        total += missing * target  # silent pods assumed on target: damps the scale-down
    if add_unready:
        count += unready  # unready pods assumed idle: damps the scale-up
    new_ratio = total / count / target
    if abs(new_ratio - 1.0) <= tolerance or _direction(ratio) != _direction(new_ratio):
        return current
    desired = _ceil(new_ratio * count)
    if (_direction(new_ratio) < 0 < desired - current) or (_direction(new_ratio) > 0 > desired - current):
        return current
    return desired


def raw_recommendation(targets: Mapping[str, float], observation: Observation, current: int, lo: int, hi: int,
                       tolerance: float) -> RawRecommendation:
    if current < lo:
        return RawRecommendation(lo, {}, (), f"current {current} is below minReplicas {lo}")
    if current > hi:
        return RawRecommendation(hi, {}, (), f"current {current} is above maxReplicas {hi}")
    by_metric: dict[str, int] = {}
    missing: list[str] = []
    for name in sorted(targets):
        sample = observation.metrics.get(name)
        desired: int | None = None
        if sample is not None and sample.external is not None:
            desired = desired_for_external(current, tolerance, targets[name], sample.external)
        elif sample is not None:
            desired = desired_for_pods(current, tolerance, targets[name], sample, observation.unready_pods)
        if desired is None:
            missing.append(name)
        else:
            by_metric[name] = desired
    if not by_metric:
        return RawRecommendation(None, {}, tuple(missing), "no metric data: " + ", ".join(missing or ["no metrics"]))
    name = max(by_metric, key=lambda k: (by_metric[k], k))
    replicas = by_metric[name]
    reason = f"metric {name} wants {replicas}"
    if missing and replicas < current:
        replicas = current
        reason = f"metrics missing ({', '.join(missing)}): no scale-down on partial data"
    return RawRecommendation(min(max(replicas, lo), hi), by_metric, tuple(missing), reason)
