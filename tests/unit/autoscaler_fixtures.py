"""Helpers for the autoscaler unit tests: policy specs and a trace replayer that feeds one
observation per round and applies each recommendation as the next round's current count."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.autoscaler import (
    MetricSample, Observation, Policy, Recommendation, ScalerState, Wake, parse_policy, recommend_homogeneous,
)

PERIOD = 15.0  # Kthena's sync period


def behavior(up: dict[str, Any] | None = None, down: dict[str, Any] | None = None,
             panic: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fully spelled-out behavior block (no defaults involved unless a key is left out)."""
    return {
        "scaleUp": {
            "stablePolicy": {"instances": 4, "percent": 100, "period": "0s", "selectPolicy": "Or",
                             "stabilizationWindow": "0s", **(up or {})},
            "panicPolicy": {"percent": 1000, "period": "0s", "panicThresholdPercent": 200, "panicModeHold": "0s",
                            **(panic or {})},
        },
        "scaleDown": {"instances": 0, "percent": 100, "period": "0s", "selectPolicy": "Or",
                      "stabilizationWindow": "0s", **(down or {})},
    }


def homogeneous(lo: int = 1, hi: int = 10, metrics: Mapping[str, Any] | None = None,
                beh: dict[str, Any] | None = None, tolerance: int | None = None) -> Policy:
    spec: dict[str, Any] = {
        "metrics": [{"name": k, "targetValue": v} for k, v in (metrics or {"load": "10"}).items()],
        "homogeneousTarget": {"target": {"targetRef": {"kind": "ModelServing", "name": "llm"}},
                              "minReplicas": lo, "maxReplicas": hi},
    }
    if beh is not None:
        spec["behavior"] = beh
    if tolerance is not None:
        spec["tolerancePercent"] = tolerance
    return parse_policy(spec)


def ext(**values: float | None) -> Observation:
    """External (Prometheus-style) values by metric name; None = missing."""
    return Observation({k: MetricSample(external=v) for k, v in values.items() if v is not None})


@dataclass
class Step:
    time: float
    current: int
    rec: Recommendation


def replay(policy: Policy, observations: Iterable[Observation], start: int, *, period: float = PERIOD,
           wake: Wake | None = None, state: ScalerState | None = None) -> list[Step]:
    st = state or ScalerState()
    current = start
    steps: list[Step] = []
    for i, obs in enumerate(observations):
        now = 1000.0 + i * period
        rec, st = recommend_homogeneous(policy, st, obs, current, now, wake)
        steps.append(Step(now, current, rec))
        current = rec.replicas
    return steps


def replicas(steps: list[Step]) -> list[int]:
    return [s.rec.replicas for s in steps]


def modes(steps: list[Step]) -> list[str]:
    return [s.rec.mode[0] for s in steps]  # "S" / "P"
