"""Disaggregated targets: the roles of one ModelServing scaled together (Kthena's
DisaggregatedAutoscaler). Pure.

Each role is a unit of its own (recommend.scale_one with the role's bounds, its own metrics
or spec.metrics, its own history and panic state). A fixed role (minReplicas ==
maxReplicas > 0) is not autoscaled: it is asked for its fixed count and needs no metrics.
If any autoscaled role has no metric data the whole round is skipped (Kthena: one role
alone cannot be moved without breaking the pair). Then the ratio constraint (ratio.py)
adjusts the corrected counts; the histories record the pre-ratio corrected counts, as
Kthena's (the next round's current counts carry the ratio's effect).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .metrics import Observation
from .policy import Policy
from .ratio import enforce_ratio
from .recommend import PANIC, STABLE, Recommendation, ScalerState, Wake, scale_one

__all__ = ["DisaggregatedResult", "RoleResult", "recommend_disaggregated"]


@dataclass(frozen=True)
class RoleResult:
    name: str
    current: int
    desired: int  # metric-derived (after the behaviour rules' input), before the ratio
    replicas: int  # final: what to write to the role
    mode: str
    reason: str


@dataclass(frozen=True)
class DisaggregatedResult:
    roles: tuple[RoleResult, ...]  # sorted by role name
    skipped: bool  # no data for some autoscaled role: write nothing
    ratio_adjusted: bool
    ratio_met: bool
    current_ratio: str
    reason: str

    def replicas(self) -> dict[str, int]:
        return {r.name: r.replicas for r in self.roles}


def recommend_disaggregated(policy: Policy, states: Mapping[str, ScalerState],
                            observations: Mapping[str, Observation], current: Mapping[str, int], now: float,
                            wake: Mapping[str, Wake] | None = None
                            ) -> tuple[DisaggregatedResult, dict[str, ScalerState]]:
    target = policy.disaggregated
    if target is None:
        raise ValueError("policy has no disaggregatedTarget")
    corrected: dict[str, int] = {}
    recs: dict[str, Recommendation] = {}
    new_states: dict[str, ScalerState] = dict(states)
    bounds = {role: (p.min_replicas, p.max_replicas) for role, p in target.roles.items()}
    for role in sorted(target.roles):
        param = target.roles[role]
        if param.fixed:
            corrected[role] = param.min_replicas
            recs[role] = Recommendation(param.min_replicas, param.min_replicas, STABLE, "fixed role")
            continue
        rec, st = scale_one(policy.behavior, param.metrics, policy.tolerance, param.min_replicas, param.max_replicas,
                            states.get(role, ScalerState()), observations.get(role, Observation()),
                            current.get(role, 0), now, (wake or {}).get(role))
        if rec.skipped:
            roles = tuple(RoleResult(r, current.get(r, 0), current.get(r, 0), current.get(r, 0),
                                     PANIC if states.get(r, ScalerState()).in_panic(now) else STABLE, "")
                          for r in sorted(target.roles))
            return (DisaggregatedResult(roles, True, False, True, "", f"role {role}: {rec.reason}"), dict(states))
        corrected[role] = rec.replicas
        recs[role] = rec
        new_states[role] = st
    ratio = enforce_ratio(corrected, bounds, target.ratio)
    roles = tuple(RoleResult(role, current.get(role, 0), recs[role].desired if recs[role].desired is not None else 0,
                             ratio.replicas[role], recs[role].mode, recs[role].reason)
                  for role in sorted(target.roles))
    reason = "ratio constraint adjusted the roles" if ratio.adjusted else ""
    if not ratio.met:
        reason = "ratio constraint cannot be met within the roles' bounds"
    return DisaggregatedResult(roles, False, ratio.adjusted, ratio.met, ratio.current_ratio, reason), new_states
