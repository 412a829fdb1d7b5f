"""The autoscaler (AutoscalingPolicy): the algorithm as pure functions, (policy, state,
observed metrics, current replicas, now) -> (recommendation, new state), and the controller
loop around it (controller.py: informer, periodic rounds, metric collection, scale writes,
status; docs/autoscaler.md). This package's top level exports the algorithm only."""

from .disaggregated import DisaggregatedResult, RoleResult, recommend_disaggregated
from .heterogeneous import HeterogeneousResult, allocate, recommend_heterogeneous
from .metrics import MetricSample, Observation
from .policy import Policy, PolicyError, parse_policy
from .ratio import RatioResult, enforce_ratio
from .recommend import PANIC, STABLE, Recommendation, ScalerState, Wake, recommend_homogeneous, scale_one

__all__ = [
    "PANIC", "STABLE", "DisaggregatedResult", "HeterogeneousResult", "MetricSample", "Observation", "Policy",
    "PolicyError", "RatioResult", "Recommendation", "RoleResult", "ScalerState", "Wake", "allocate",
    "enforce_ratio", "parse_policy", "recommend_disaggregated", "recommend_heterogeneous", "recommend_homogeneous",
    "scale_one",
]
